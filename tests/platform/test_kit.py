"""A workshop room with no internet: a kit built here, then learners who install from it in network namespaces that
have only loopback (``ip netns``: the network cut for real, not by trusting flags), as root.

* Two learners at once: one Mac-shaped, who clones the repository over HTTP from ``make kit-serve`` on loopback
  into a folder more than 60 characters deep, with ``HOME`` elsewhere and ``TMPDIR`` as macOS sets it, and runs
  ``make install INDEX=...``; the other ``make install KIT=...`` from the kit's folder, as from a USB stick. The
  one from the stick then runs notebooks 01 and 02 under papermill; the Mac-shaped one 01-04, 06 (skipped in its
  one line, as this kit could fetch no lakeFS here), and ``make lab`` with a notebook run through it.
* A kit missing a wheel, and one with a changed byte, each stop ``make install`` in one line naming the wheel,
  with nothing installed; ``make kit-serve`` refuses such a kit, and a wheel changed after it started is refused
  by the learner's hash check.

Each learner's .venv is several GB: they are removed as soon as their test ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
import zipfile
from pathlib import Path

import pytest

from helpers.settings import project_root
from workshop import kit as kit_module
from workshop import seaweedfs_security
from workshop.install import platform_name

pytestmark = [pytest.mark.notebook, pytest.mark.slow]

ROOT = project_root()
PYTHON = os.path.realpath(sys._base_executable)  # the interpreter, not this .venv's link to it
MAC_TMPDIR = "/var/folders/zz/zyxvpxvq6csfxvn_n0000000000000/T/"  # as macOS sets it: 49 bytes
DEEP = "Users/learner/Documents/workshops/december-2026/mnist-on-object-storage"
IP = shutil.which("ip") or next((p for p in ("/usr/sbin/ip", "/sbin/ip") if os.access(p, os.X_OK)), None)
REQUIRE_NETNS_ENV = "TUTORIAL_REQUIRE_NETNS"  # set by .ci/run: no network namespaces is a failure there


def learner_env(home: Path, tmpdir: str | None = None) -> dict[str, str]:
    """A learner's shell: none of this test process's settings, their own HOME (and TMPDIR)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(home), "LANG": "C.UTF-8",
           "TUTORIAL_HEADLESS": "1"}
    if tmpdir:
        env["TMPDIR"] = tmpdir
    home.mkdir(parents=True, exist_ok=True)
    return env


class Namespace:
    """A network namespace with loopback only; commands run in it with ``ip netns exec``."""

    def __init__(self) -> None:
        self.name = f"kit-{uuid.uuid4().hex[:8]}"

    def __enter__(self) -> Namespace:
        subprocess.run([IP, "netns", "add", self.name], check=True)
        self.run([IP, "link", "set", "lo", "up"], check=True)
        return self

    def __exit__(self, *exc) -> None:
        pids = subprocess.run([IP, "netns", "pids", self.name], capture_output=True, text=True).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run([IP, "netns", "delete", self.name], check=False)

    def command(self, args: list[str]) -> list[str]:
        return [IP, "netns", "exec", self.name, *args]

    def run(self, args: list[str], **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(args), **kwargs)

    def popen(self, args: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                **kwargs)

    def has_no_route_out(self) -> bool:
        """Nothing but loopback: a connection to a public address fails at once."""
        probe = "import socket; s = socket.socket(); s.settimeout(3); s.connect(('151.101.0.223', 443))"
        return self.run([sys.executable, "-c", probe]).returncode != 0


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    """A kit for this machine's platform and Python 3.11, built as an instructor does (with the registry)."""
    if os.getuid() != 0 or not IP:
        why = "the network namespaces of these tests need root and iproute2 (`ip`)"
        if os.environ.get(REQUIRE_NETNS_ENV):
            pytest.fail(f"{why}; {REQUIRE_NETNS_ENV} is set (.ci/run), so that is a failure")
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("kit")
    # lakeFS's releases from an address where nothing answers, as in a room without internet (the same here
    # whether or not this machine reaches GitHub): the kit says so in one line and runs without notebook 06
    built = subprocess.run([sys.executable, "-m", "workshop.kit", "--kit", str(folder), "--platforms",
                            platform_name(), "--pythons", "3.11", "--lakefs-from", "http://127.0.0.1:9/"],
                           cwd=ROOT, capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    [said] = [line for line in built.stdout.splitlines() if "lakeFS for" in line]
    assert said.endswith("the kit runs without notebook 06 there"), said
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def clone(namespace: Namespace | None, source: str, target: Path, env: dict[str, str]) -> Path:
    """``git clone`` of the kit's repository, as a learner does (from the stick, or over HTTP)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    args = ["git", "clone", "--quiet", source, str(target)]
    done = namespace.run(args, env=env) if namespace else subprocess.run(args, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return target


def make(namespace: Namespace, checkout: Path, env: dict[str, str], *args: str, timeout: float = 1200):
    """``make ...`` in the learner's checkout, inside the namespace."""
    return namespace.run(["make", "--no-print-directory", "-C", str(checkout), *args, f"PYTHON={PYTHON}"], env=env,
                         timeout=timeout)


def installed(checkout: Path) -> list[str]:
    """The distributions in the learner's .venv besides pip (and the setuptools a venv may start with)."""
    found = {p.name.split("-")[0].lower() for p in checkout.glob(".venv/lib/python*/site-packages/*.dist-info")}
    return sorted(found - {"pip", "setuptools"})


def lab_url(lab: subprocess.Popen, deadline: float) -> str:
    """The JupyterLab address ``make lab`` printed (its token in it)."""
    lines = []
    while time.monotonic() < deadline:
        line = lab.stdout.readline()
        if not line:
            break
        lines.append(line)
        if found := re.search(r"(http://127\.0\.0\.1:\d+/lab\?token=\w+)", line):
            return found[1]
    raise AssertionError("make lab printed no JupyterLab address:\n" + "".join(lines[-30:]))


def start_install(namespace: Namespace, checkout: Path, env: dict[str, str], source: str) -> subprocess.Popen:
    """``make install KIT=...`` or ``make install INDEX=...`` in the learner's checkout, started in the namespace."""
    return namespace.popen(["make", "--no-print-directory", "-C", str(checkout), "install", source,
                            f"PYTHON={PYTHON}"], env=env)


def ran_ok(said: str) -> list[str]:
    """The numbers of the notebooks ``workshop.runner``'s table says ran ok."""
    return re.findall(r"^(\d\d)_\w+\.ipynb\s+ok\b", said, flags=re.MULTILINE)


def runner(namespace: Namespace, checkout: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """``python -m workshop.runner ...`` with the learner's .venv, in their checkout."""
    return namespace.run([str(checkout / ".venv" / "bin" / "python"), "-m", "workshop.runner", *args], cwd=checkout,
                         env=env, timeout=1200)


@pytest.mark.timeout(2400)
def test_two_learners_install_at_once_with_the_network_cut_and_run_the_notebooks_and_the_lab(kit, tmp_path):
    tmpdir = Path(MAC_TMPDIR)
    tmpdir.mkdir(parents=True, exist_ok=True)
    tmpdir.chmod(0o1777)
    mac_env = learner_env(tmp_path / "elsewhere" / "home", MAC_TMPDIR)
    mac = tmp_path / DEEP
    assert len(str(mac)) >= 60
    stick_env = learner_env(tmp_path / "stick" / "home")
    stick = tmp_path / "stick" / "mnist-on-object-storage"
    with Namespace() as namespace:
        assert namespace.has_no_route_out()
        server = namespace.popen([sys.executable, "-m", "workshop.kit_serve", "--kit", str(kit), "--port", "0",
                                  "--bind", "127.0.0.1"], cwd=ROOT)
        try:
            printed = "".join(server.stdout.readline() for _ in range(5))
            index = re.search(r"INDEX=(\S+)", printed)[1]
            assert index.startswith("http://127.0.0.1:") and "repository.git" in printed
            # The Mac-shaped learner over the room's network (make kit-serve), the other from the stick, at once
            clone(namespace, index + kit_module.REPOSITORY, mac, mac_env)
            clone(namespace, str(kit / kit_module.REPOSITORY), stick, stick_env)
            with contextlib.ExitStack() as installs:
                running = [installs.enter_context(start_install(namespace, mac, mac_env, f"INDEX={index}")),
                           installs.enter_context(start_install(namespace, stick, stick_env, f"KIT={kit}"))]
                said = [p.communicate(timeout=1800)[0] for p in running]
            assert [p.returncode for p in running] == [0, 0], "\n".join(s[-2000:] for s in said)
            # Each runs notebooks, at a smaller size than their defaults: what they must show here is that they
            # run on this install and these paths. The learner from the stick: 01 and 02, then their venv goes
            try:
                assert make(namespace, stick, stick_env, "stack-up", timeout=300).returncode == 0
                done = runner(namespace, stick, stick_env, "--before", "03", "-p", "smoke_test_size", "120")
                assert ran_ok(done.stdout) == ["01", "02"], done.stdout[-3000:] + done.stderr[-2000:]
            finally:
                make(namespace, stick, stick_env, "stack-down", timeout=300)
                shutil.rmtree(stick.parent, ignore_errors=True)  # several GB: the disk is the other learner's now
            # The Mac-shaped learner: 01-04, Ray Train's sockets among them
            assert make(namespace, mac, mac_env, "stack-up", timeout=300).returncode == 0
            done = runner(namespace, mac, mac_env, "--before", "05", "-p", "smoke_test_size", "120")
            assert ran_ok(done.stdout) == ["01", "02", "03", "04"], done.stdout[-3000:] + done.stderr[-2000:]
            # The learner's own sockets fit macOS's 103 bytes: Ray's went to /tmp, not under the Mac's TMPDIR
            state = mac / ".stack"
            ray = Path("/tmp") / f"ray-{os.getuid()}" / f"stack-{hashlib.sha256(str(state).encode()).hexdigest()[:8]}"
            sockets = [*ray.glob("ray/session_*/sockets/*"), *seaweedfs_security.socket_paths(state).values()]
            assert len(sockets) >= 3 and all(len(str(s)) <= 103 for s in sockets), sockets
            # 06 without lakeFS (this kit could fetch none): skipped in its one line
            done = runner(namespace, mac, mac_env, "--only", "06_")
            assert re.search(r"^06_\w+\.ipynb\s+skipped\b", done.stdout, re.MULTILINE), done.stdout[-3000:]
            assert "NotebookSkipped" in done.stdout and "lakeFS" in done.stdout
            # make lab starts, and a notebook runs through it
            lab = namespace.popen(["make", "--no-print-directory", "-C", str(mac), "lab", f"PYTHON={PYTHON}"],
                                  env=mac_env, start_new_session=True)
            try:
                url = lab_url(lab, time.monotonic() + 300)
                ran = namespace.run([str(mac / ".venv" / "bin" / "python"), str(ROOT / "tests" / "platform" /
                                     "lab_client.py"), url, "02_list_and_split.ipynb"], env=mac_env, timeout=600)
                assert ran.returncode == 0, ran.stdout + ran.stderr
                result = json.loads(ran.stdout.strip().splitlines()[-1])
                assert result["ran"] == result["code cells"] > 5 and not result["errors"]
            finally:
                os.killpg(lab.pid, signal.SIGINT)
                lab.wait(timeout=120)
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=30)
            if (mac / ".venv").exists():
                make(namespace, mac, mac_env, "stack-down", timeout=300)
            shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.fixture
def damaged_kit(kit, tmp_path):
    """A copy of the kit (its files linked, not copied) whose wheels a test may remove or change."""
    copy = tmp_path / "kit"
    subprocess.run(["cp", "-al", str(kit), str(copy)], check=True)
    return copy


def small_wheel(kit: Path) -> Path:
    """A small wheel this machine needs from the kit."""
    manifest = json.loads((kit / "manifest.json").read_text())
    wheels = manifest["wheels"][platform_name()]["3.11"]
    return kit / "wheels" / next(w["file"] for w in wheels if w["file"].startswith("six-"))


def change_a_byte(path: Path) -> None:
    """The wheel, unlinked from the kit it was copied from, with one byte changed and still a valid zip archive
    (its comment): only its hash tells it from the locked one."""
    data = path.read_bytes()
    path.unlink()
    assert data[-2:] == b"\x00\x00", "a wheel ends with an empty archive comment"
    path.write_bytes(data[:-2] + b"\x01\x00" + b"x")  # a comment of one byte
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None and archive.comment == b"x"


@pytest.mark.parametrize("damage, said", [("missing", "is missing six-"), ("changed", "fails its hash check")])
def test_a_kit_missing_a_wheel_or_with_a_changed_byte_stops_the_install_in_one_line(kit, damaged_kit, tmp_path,
                                                                                    damage, said):
    wheel = small_wheel(damaged_kit)
    wheel.unlink() if damage == "missing" else change_a_byte(wheel)
    env = learner_env(tmp_path / "home")
    checkout = clone(None, str(kit / kit_module.REPOSITORY), tmp_path / "mnist-on-object-storage", env)
    with Namespace() as namespace:
        done = make(namespace, checkout, env, "install", f"KIT={damaged_kit}")
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode != 0 and len(errors) == 1, done.stderr
    assert said in errors[0] and wheel.name in errors[0] and "nothing was installed" in errors[0].lower()
    assert installed(checkout) == [], "nothing installed from a damaged kit"
    # kit-serve refuses to serve it, in one line naming the file
    served = subprocess.run([sys.executable, "-m", "workshop.kit_serve", "--kit", str(damaged_kit), "--port", "0",
                             "--bind", "127.0.0.1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert served.returncode == 1 and f"wheels/{wheel.name}" in served.stderr.strip().splitlines()[-1]


def test_a_wheel_changed_while_served_fails_the_learner_s_hash_check_in_one_line(damaged_kit, tmp_path):
    with Namespace() as namespace:
        server = namespace.popen([sys.executable, "-m", "workshop.kit_serve", "--kit", str(damaged_kit), "--port",
                                  "0", "--bind", "127.0.0.1"], cwd=ROOT)
        try:
            index = re.search(r"INDEX=(\S+)", "".join(server.stdout.readline() for _ in range(5)))[1]
            change_a_byte(small_wheel(damaged_kit))  # after the server checked the kit
            env = learner_env(tmp_path / "home")
            checkout = clone(namespace, index + kit_module.REPOSITORY, tmp_path / "mnist-on-object-storage", env)
            done = make(namespace, checkout, env, "install", f"INDEX={index}")
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=30)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode != 0 and len(errors) == 1, done.stderr
    assert "six" in errors[0] and "hash" in errors[0].lower()
    assert [name for name in installed(checkout) if name != "uv"] == [], "nothing installed but the kit's uv"
    shutil.rmtree(tmp_path, ignore_errors=True)
