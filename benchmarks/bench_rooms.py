"""How many learners fit on one machine: N learners' rooms, idle and then each running notebook 04.

Each room is a throwaway Unix user with a checkout of this project who runs ``make lab`` with no flags
(``tests/platform/rooms.py``, as the shared-server test does): SeaweedFS, MLflow, Ray with its dashboard, and
JupyterLab, each room its own. For each N of ``--rooms`` (default 1 2 3) the N labs start at once; then:

1. **idle**: for ``--idle`` seconds nothing runs, and every process of each room's user is sampled every
   second: its proportional memory (PSS, which adds up across processes that share pages) and its CPU time;
2. **peak**: each room runs notebook 04 at its smoke defaults, headless (``workshop.runner``), all at once,
   sampled every half second.

Each process is counted under the service it belongs to (object store, MLflow, Ray, JupyterLab and its
kernels, the notebook's run). A room's memory is the sum over its processes at one sample; idle is the
median sample, peak the largest. Its cores are CPU seconds over wall seconds. Needs root (``useradd``),
and a checkout and interpreter the learners can reach, as ``.ci/run`` opens them:

    bash -c 'source .ci/folder_modes.sh; trap restore_folder_modes EXIT
             open_for_traversal "$PWD" "$(python3 -c "import os, sys; print(os.path.realpath(sys.executable))")"
             .venv/bin/python benchmarks/bench_rooms.py [--rooms 1 2 3] [--idle 30]'

Writes ``benchmarks/results/rooms.json``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
from common import print_table, write_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.platform.rooms import Room, make_room, start_lab, stop_room  # noqa: E402 - the project's root first

# The service a room's process belongs to: the first whose word its command line holds.
SERVICES = (("object store", ("weed",)), ("MLflow", ("mlflow",)),
            ("notebook run", ("workshop.runner", "ipykernel")),
            ("JupyterLab", ("jupyter",)),
            ("Ray", ("ray::", "ray_service", "raylet", "gcs_server", "/ray/", "dashboard", "ray.")))


def service_of(command: str) -> str:
    """Which service a process with this command line belongs to (``other``: the lab's own make and shell)."""
    return next((name for name, words in SERVICES if any(word in command for word in words)), "other")


class Sampler:
    """Every process of the rooms' users, sampled in a thread: memory per sample, CPU seconds per process."""

    def __init__(self, rooms: list[Room], every: float) -> None:
        self.users = {room.user for room in rooms}
        self.every, self.samples, self.times = every, [], []
        self.cpu: dict[tuple[str, str, int, float], float] = {}  # (user, service, pid, start) -> CPU seconds
        self.first_cpu: dict[tuple[str, str, int, float], float] = {}  # at the first sample: what came before
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.seconds = self.times[-1] - self.times[0]  # between the first sample and the last

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            sample: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
            for proc in psutil.process_iter(["username", "cmdline", "create_time"]):
                with contextlib.suppress(psutil.Error, TypeError):
                    if proc.info["username"] not in self.users:
                        continue
                    service = service_of(" ".join(proc.info["cmdline"] or [proc.name()]))
                    sample[proc.info["username"]][service] += proc.memory_full_info().pss
                    times = proc.cpu_times()
                    self.cpu[(proc.info["username"], service, proc.pid, proc.info["create_time"])] = \
                        times.user + times.system
            self.samples.append(sample)
            self.times.append(time.monotonic())
            if len(self.samples) == 1:
                self.first_cpu = dict(self.cpu)

    def cpu_by_service(self, user: str, before: dict | None = None) -> dict[str, float]:
        """CPU seconds each service of ``user`` spent after ``before`` (default: this sampler's first sample)."""
        before = self.first_cpu if before is None else before
        spent: collections.Counter = collections.Counter()
        for (who, service, pid, start), seconds in self.cpu.items():
            if who == user:
                spent[service] += seconds - before.get((who, service, pid, start), 0.0)
        return dict(spent)


def room_row(n: int, phase: str, room: Room, sampler: Sampler) -> dict:
    """One room's memory (MB, by service and in all) and cores in one phase."""
    mine = [sample[room.user] for sample in sampler.samples]
    if phase == "idle":
        at = {name: statistics.median(s[name] for s in mine) for name in {name for s in mine for name in s}}
        total = statistics.median(sum(s.values()) for s in mine)
    else:
        at = max(mine, key=lambda s: sum(s.values()))
        total = sum(at.values())
    cpu = sampler.cpu_by_service(room.user)
    return {"rooms": n, "phase": phase, "room": room.user, "MB": round(total / 2**20),
            "MB by service": {name: round(value / 2**20) for name, value in sorted(at.items())},
            "cores": round(sum(cpu.values()) / sampler.seconds, 2),
            "CPU seconds by service": {name: round(value, 1) for name, value in sorted(cpu.items())},
            "seconds": round(sampler.seconds, 1)}


def measure(n: int, idle_seconds: float) -> list[dict]:
    """N rooms started at once, sampled idle and while each runs notebook 04; everything stopped afterwards."""
    top = Path(tempfile.mkdtemp(prefix="bench-rooms-"))
    top.chmod(0o711)
    rooms: list[Room] = []
    try:
        rooms = [make_room(number, top) for number in range(1, n + 1)]
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(start_lab, rooms))
        time.sleep(10)  # the labs' first seconds: kernels' and dashboards' start-up, not idle
        with Sampler(rooms, 1.0) as idle:
            time.sleep(idle_seconds)
        runner = [".venv/bin/python", "-m", "workshop.runner", "--only", "04_distributed"]
        with Sampler(rooms, 0.5) as peak, ThreadPoolExecutor(n) as pool:
            runs = list(pool.map(lambda room: subprocess.run(room.command(*runner), capture_output=True, text=True,
                                                             timeout=1800), rooms))
        for room, run in zip(rooms, runs, strict=True):
            if run.returncode != 0:
                raise SystemExit(f"{room.user}'s notebook 04 failed:\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
        return [row for room in rooms for row in (room_row(n, "idle", room, idle),
                                                  room_row(n, "notebook 04", room, peak))]
    finally:
        with ThreadPoolExecutor(max(len(rooms), 1)) as pool:
            list(pool.map(stop_room, rooms))
        shutil.rmtree(top, ignore_errors=True)


def sizing(rows: list[dict], cores: int = 16, gigabytes: int = 64, reserved_gb: int = 4) -> dict:
    """Learners per server from the largest room measured: memory and cores, idle and all at their peak at once."""
    per = {phase: {"MB": max(r["MB"] for r in rows if r["phase"] == phase),
                   "cores": max(r["cores"] for r in rows if r["phase"] == phase)} for phase in ("idle", "notebook 04")}
    usable_mb = (gigabytes - reserved_gb) * 1024
    fit = {phase: {"by memory": usable_mb // v["MB"],
                   "by cores": int(round(cores / v["cores"], 6)) if v["cores"] else None}  # 16 / 0.2 is 79.999...
           for phase, v in per.items()}
    return {"server": f"{cores} cores, {gigabytes} GB ({reserved_gb} GB kept for the system)", "per learner": per,
            "learners that fit": fit}


def main(argv: list[str] | None = None) -> int:
    """Measure every N of ``--rooms`` in turn and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rooms", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--idle", type=float, default=30.0, help="seconds sampled with nothing running")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench_rooms.py makes throwaway users: run it as root")
    probe = subprocess.run(["runuser", "-u", "nobody", "--", sys.executable, "-c", "import workshop.lab"],
                           capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    if probe.returncode != 0:
        raise SystemExit(f"another user cannot run {sys.executable} with this checkout: open the folders on the way "
                         "for traversal, as .ci/run does (.ci/folder_modes.sh), then run this again")
    rows = []
    for n in args.rooms:
        print(f"{n} room(s) ...", flush=True)
        rows += measure(n, args.idle)
        print_table(f"{n} room(s)", [r for r in rows if r["rooms"] == n], ["room", "phase", "MB", "cores", "seconds"])
    path = write_results("rooms", {"rows": rows, "sizing": sizing(rows)})
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
