"""Throwaway learners on one machine: each a Unix user with a checkout of this project and a ``make lab`` of their
own (``tests/platform/test_shared_server.py``, ``benchmarks/bench_rooms.py``). Needs root."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from helpers.settings import load_settings, project_root

USER_PREFIX = "tutorial-room-"
URL_LINE = re.compile(r"\s{2}(JupyterLab|Ray dashboard|MLflow|lakeFS)\s+(\S+)(?: \(signs this browser in to (\S+)\))?")


@dataclass
class Room:
    """One learner: their account, their checkout and the lab they started."""

    user: str
    home: Path
    checkout: Path
    created: bool
    lab: subprocess.Popen | None = None
    output: list[str] = field(default_factory=list)
    urls: dict[str, str] = field(default_factory=dict)

    @property
    def state(self) -> Path:
        return self.checkout / ".stack"

    def env(self) -> dict[str, str]:
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(self.home), "USER": self.user,
                "LANG": "C.UTF-8", "LAKEFS_RELEASES_URL": "http://127.0.0.1:9/",  # offline: no lakeFS download
                # the checkout's own helpers in every process, kernels too (the one environment's editable
                # install names this project's)
                "PYTHONPATH": str(self.checkout)}

    def command(self, *args: str) -> list[str]:
        """``args`` run as this learner, in their checkout, with nothing of root's environment."""
        return ["runuser", "-u", self.user, "--", "env", "-i", *(f"{k}={v}" for k, v in self.env().items()),
                "sh", "-c", f'cd "{self.checkout}" && exec "$@"', "sh", *args]

    def ports(self) -> dict[str, int]:
        return {k: v for k, v in json.loads((self.state / "ports.json").read_text()).items() if isinstance(v, int)}

    def address_book(self) -> dict:
        """What another learner may know of this room: its addresses, no secret."""
        settings = load_settings(environ={}, stack_state=self.state)
        return {"s3": settings.s3_endpoint, "mlflow": settings.mlflow_tracking_uri, "ports": self.ports(),
                "dashboard": self.urls["dashboard"], "sign_in": self.urls["Ray dashboard"].split("/?")[0],
                "jupyter": self.urls["JupyterLab"].split("/lab?")[0], "state": str(self.state)}


def make_room(number: int, top: Path) -> Room:
    """A throwaway learner with a checkout of this project (its files, and the one virtual environment)."""
    user = f"{USER_PREFIX}{number}"
    created = False
    try:
        pwd.getpwnam(user)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", user], check=True, capture_output=True)
        created = True
    home = Path(pwd.getpwnam(user).pw_dir)
    checkout = top / user / "checkout"
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=project_root(),
                           capture_output=True, text=True, check=True).stdout.splitlines()
    for name in files:
        source = project_root() / name
        if source.is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, checkout / name)
    (checkout / ".venv").symlink_to(project_root() / ".venv")
    subprocess.run(["chown", "-R", f"{user}:", str(top / user)], check=True)
    (top / user).chmod(0o700)
    return Room(user, home, checkout, created)


def start_lab(room: Room) -> None:
    """``make lab`` as the learner, with no flags; returns once it printed its URLs."""
    # -o: the shared environment counts as installed (the learner may not install into it)
    room.lab = subprocess.Popen(room.command("make", "-o", ".venv/.installed", "lab"), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
    deadline = time.monotonic() + 420
    while time.monotonic() < deadline:
        line = room.lab.stdout.readline()
        if not line:
            break
        room.output.append(line.rstrip("\n"))
        found = URL_LINE.match(line)
        if found:
            room.urls[found.group(1)] = found.group(2)
            if found.group(3):
                room.urls["dashboard"] = found.group(3)
        if line.startswith("Ctrl-C stops"):
            threading.Thread(target=lambda: [room.output.append(x.rstrip("\n")) for x in room.lab.stdout],
                             daemon=True).start()
            return
    raise AssertionError(f"{room.user}'s make lab printed no URLs:\n" + "\n".join(room.output[-25:]))


def stop_room(room: Room) -> None:
    if room.lab is not None and room.lab.poll() is None:
        os.killpg(room.lab.pid, signal.SIGINT)
        try:
            room.lab.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(room.lab.pid, signal.SIGKILL)
    subprocess.run(room.command(".venv/bin/python", "-m", "workshop.stack", "down"), capture_output=True, timeout=120)
    if room.created:
        subprocess.run(["userdel", "--remove", room.user], capture_output=True)
