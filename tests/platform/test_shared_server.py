"""A shared workshop server: three learners, each a Unix user with a checkout of their own, run ``make lab`` with
no flags and notebook 04 headless, all at the same time; then each tries every door of the others.

Notebook 04 is what each room runs: it uploads what is missing into the learner's bucket, reads it with Ray
Data, trains with Ray Train's workers and logs to MLflow, so every kind of process a notebook starts is there
while the command lines are watched. (Notebook 03 as another user is the browser test's non-root learner.)

Needs root (to make the throwaway users) and, like the non-root learner test, a checkout and Python that
other users can reach (``.ci/run`` opens the folders); where either is missing it is skipped, and under
``TUTORIAL_REQUIRE_BROWSER`` (``.ci/run``) that is a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers.settings import load_settings, project_root
from tests.platform.rooms import Room, make_room, start_lab, stop_room
from tests.suite.machine_share import run_folder, whole_machine
from tests.suite.secrets_scan import on_command_lines, stack_secrets

pytestmark = pytest.mark.notebook  # runs notebooks end to end: not in make test-quick

REQUIRE_ENV = "TUTORIAL_REQUIRE_BROWSER"  # set by .ci/run: what would be a skip is a failure
ROOMS = 3
def fail_or_skip(why: str) -> None:
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="module")
def rooms():
    """Three learners whose labs were started at the same moment; everything is stopped and removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("making throwaway users needs root")
    probe = subprocess.run(["runuser", "-u", "nobody", "--", sys.executable, "-c", "import workshop.lab"],
                           capture_output=True, text=True, cwd=project_root())
    if probe.returncode != 0:
        fail_or_skip(f"another user cannot run {sys.executable} with this checkout ({probe.stderr.strip()[-200:]}); "
                     ".ci/run opens the folders on the way")
    top = Path(tempfile.mkdtemp(prefix="rooms-"))
    top.chmod(0o711)
    made: list[Room] = []
    try:
        made += [make_room(number, top) for number in range(1, ROOMS + 1)]
        with ThreadPoolExecutor(ROOMS) as pool:
            list(pool.map(start_lab, made))
        yield made
    finally:
        with ThreadPoolExecutor(ROOMS) as pool:
            list(pool.map(stop_room, made))
        shutil.rmtree(top, ignore_errors=True)


def all_secrets(rooms: list[Room]) -> dict[str, str]:
    return {f"{room.user}: {what}": value for room in rooms
            for what, value in stack_secrets(room.state, room.home).items()}


def test_three_learners_start_make_lab_at_once_with_no_flags_each_on_ports_of_their_own(rooms):
    for room in rooms:
        assert {"JupyterLab", "Ray dashboard", "MLflow", "dashboard"} <= set(room.urls), room.output
        assert not any("Running as root" in line for line in room.output)
    in_use = [{port for name, port in room.ports().items() if name != "lakefs" or "lakeFS" in room.urls}
              for room in rooms]  # lakeFS's port only where a lakeFS runs
    ports = [in_use[i] | {int(re.search(r":(\d+)", room.urls[name]).group(1))
                         for name in ("JupyterLab", "Ray dashboard", "dashboard")}
             for i, room in enumerate(rooms)]
    for i, mine in enumerate(ports):
        for theirs in ports[i + 1:]:
            assert not mine & theirs, "two learners share a port"
    for room in rooms:  # each stack's state and the Ray token are the learner's own, closed to the others
        assert room.state.stat().st_uid == room.home.stat().st_uid and room.state.stat().st_mode & 0o077 == 0
        token = room.state / "ray_token"
        assert token.stat().st_uid == room.home.stat().st_uid and token.stat().st_mode & 0o077 == 0


@pytest.mark.timeout(1500)
def test_each_learner_runs_notebook_04_headless_at_the_same_time(rooms, request):
    import psutil

    leaks: list[str] = []
    peak: dict = {"used": 0, "biggest": ""}
    done = threading.Event()

    def watch_command_lines() -> None:  # every half second while the notebooks run; and the memory they use
        secrets = all_secrets(rooms)
        while not done.wait(0.5):
            leaks.extend(on_command_lines(secrets))
            memory = psutil.virtual_memory()
            if memory.total - memory.available > peak["used"]:
                peak.update(used=memory.total - memory.available, biggest=biggest_processes())

    # Small (120 images, 2 epochs): every kind of process still runs (Ray Data's actors, two training workers,
    # MLflow's logging, the model logged), which is what the watcher and the doors below need.
    notebooks = {"04_distributed": ("-p", "smoke_test_size", "120", "-p", "epochs", "2", "-p", "checkpoint_every",
                                    "2")}

    def run_notebooks(room: Room) -> dict[str, subprocess.CompletedProcess]:
        runner = [".venv/bin/python", "-m", "workshop.runner", "--only"]
        return {name: subprocess.run(room.command(*runner, name, *args), capture_output=True, text=True,
                                     timeout=1200) for name, args in notebooks.items()}

    # Three rooms at their peak need most of a 24 GB machine: the other test process waits meanwhile.
    with whole_machine(run_folder(request.config)):
        watcher = threading.Thread(target=watch_command_lines, daemon=True)
        watcher.start()
        try:
            with ThreadPoolExecutor(ROOMS) as pool:
                results = list(pool.map(run_notebooks, rooms))
        finally:
            done.set()
            watcher.join()
    used = f"the machine's memory in use at its peak: {peak['used'] / 2**30:.1f} of " \
           f"{psutil.virtual_memory().total / 2**30:.1f} GiB; resident then, by user and program: {peak['biggest']}"
    print(used)
    for room, runs in zip(rooms, results, strict=True):
        for name, run in runs.items():
            assert run.returncode == 0, f"{room.user}, {name} ({used}): {run.stdout[-1500:]}{run.stderr[-1500:]}"
            assert re.search(r"ok in [\d.]+ s", run.stdout), run.stdout
    assert sorted(set(leaks)) == [], "a secret on a command line"
    for room in rooms:  # the run went into the learner's own MLflow
        settings = load_settings(environ={}, stack_state=room.state)
        search = urllib.request.Request(
            f"{settings.mlflow_tracking_uri}/api/2.0/mlflow/experiments/get-by-name?experiment_name=mnist-ray-train",
            headers=basic_auth(settings.mlflow_username, settings.mlflow_password))
        with urllib.request.urlopen(search, timeout=15) as answer:
            assert json.loads(answer.read())["experiment"]["name"] == "mnist-ray-train"


def biggest_processes(count: int = 12) -> str:
    """The machine's resident memory by user and program, the largest first (where a peak's memory went)."""
    import collections

    import psutil

    resident: collections.Counter = collections.Counter()
    for proc in psutil.process_iter(["username", "cmdline", "name", "memory_info"]):
        with contextlib.suppress(psutil.Error, TypeError, IndexError):
            words = proc.info["cmdline"] or [proc.info["name"]]
            program = words[0] if words[0].startswith("ray::") else " ".join(
                Path(w).name for w in words[:3] if not w.startswith("-"))
            resident[f"{proc.info['username']} {program[:40]}"] += proc.info["memory_info"].rss
    return "; ".join(f"{who} {rss / 2**30:.2f}" for who, rss in resident.most_common(count))


def basic_auth(user: str, password: str) -> dict[str, str]:
    import base64

    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def what_is_there(room: Room) -> dict:
    """The room as its learner sees it (read here as root, with their keys): to compare before and after."""
    from helpers import storage

    settings = load_settings(environ={}, stack_state=room.state)
    client = storage.get_client(settings)
    objects = {b.name: sorted(o.object_name for o in client.list_objects(b.name, recursive=True))
               for b in client.list_buckets()}

    def get(url: str, headers: dict[str, str]) -> object:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=15) as answer:
            return json.loads(answer.read())

    login = basic_auth(settings.mlflow_username, settings.mlflow_password)
    mlflow = settings.mlflow_tracking_uri
    ray_token = (room.state / "ray_token").read_text().strip()
    jupyter_token = (room.state / "jupyter-token").read_text().strip()
    jupyter = room.urls["JupyterLab"].split("/lab?")[0]
    return {
        "objects": objects,
        "experiments": sorted(e["name"] for e in get(f"{mlflow}/api/2.0/mlflow/experiments/search?max_results=100",
                                                      login).get("experiments", [])),
        "models": get(f"{mlflow}/api/2.0/mlflow/registered-models/search", login).get("registered_models", []),
        "ray jobs": [job for job in get(f"{room.urls['dashboard']}/api/jobs/", {"Authorization": f"Bearer {ray_token}"})
                     if job.get("type") == "SUBMISSION"],  # the notebooks' own drivers are listed too
        "kernels": sorted(k["id"] for k in get(f"{jupyter}/api/kernels", {"Authorization": f"token {jupyter_token}"})),
    }


def test_every_door_of_another_learner_s_room_refuses_them_and_nothing_of_it_changes(rooms):
    before = {room.user: what_is_there(room) for room in rooms}
    assert all(len(there["objects"]["mnist"]) >= 720 for there in before.values())  # 120 + 200 + 400 images
    intruder = str(project_root() / "tests" / "platform" / "room_intruder.py")
    verdicts = {}
    for me in rooms:
        for them in rooms:
            if me is not them:
                tried = subprocess.run(me.command(".venv/bin/python", intruder), input=json.dumps(them.address_book()),
                                       capture_output=True, text=True, timeout=300)
                assert tried.returncode == 0, tried.stderr[-2000:]
                verdicts[f"{me.user} -> {them.user}"] = json.loads(tried.stdout.strip().splitlines()[-1])
    opened = {pair: {door: verdict for door, verdict in doors.items() if not verdict.startswith("refused")}
              for pair, doors in verdicts.items()}
    assert opened == dict.fromkeys(verdicts, {}), json.dumps(opened, indent=1)
    assert len(next(iter(verdicts.values()))) >= 18
    assert {room.user: what_is_there(room) for room in rooms} == before
