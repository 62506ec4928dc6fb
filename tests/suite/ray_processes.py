"""The processes of one Ray cluster on this machine, told apart from the other test process's Ray."""

from __future__ import annotations

import psutil


def ray_processes(gcs_address: str, title: str) -> list[psutil.Process]:
    """Live processes of the Ray at ``gcs_address`` whose title names a Ray actor class (``ray::...<Class>...``).

    Only the descendants of that cluster's raylet count: the other test process runs its own Ray, whose
    Ray Train runs and pipelines are none of a test's business.
    """
    gcs_flag = f"--gcs-address={gcs_address}"
    found = []
    for raylet in psutil.process_iter():
        try:
            if "raylet" not in raylet.name() or gcs_flag not in raylet.cmdline():
                continue
            children = raylet.children(recursive=True)
        except psutil.Error:
            continue
        for proc in children:
            try:  # a worker that ends meanwhile is not counted, and the others still are
                command = " ".join(proc.cmdline())  # "ray::TrainController...", "ray::MapWorker(...Class)..."
                if command.startswith("ray::") and title in command and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except psutil.Error:
                continue
    return found
