"""The locked install: every package, pinned with its files' hashes, for the platforms learners bring.

``requirements.txt`` keeps the direct pins where a reader finds them. ``requirements.lock`` (``make lock``)
holds everything they pull in, each version with the SHA-256 of every file PyPI has of it, from one universal
resolution (``uv pip compile --universal``) as PyPI stood on the day written in its header: one file for every
platform, its platform-only packages behind markers. ``make install`` installs exactly that file, hashes
required (:mod:`workshop.install`).

The platforms (:data:`PLATFORMS`) are where learners are: macOS 14 or later on Apple silicon, Linux on x86-64
and aarch64 (WSL2 included), with glibc 2.35 (Ubuntu 22.04) or later, and Python 3.11 or 3.12
(:data:`PYTHONS`). :func:`resolve_for` resolves the lock for one of them from binary wheels only, so a package
without a wheel there is found here, not in a workshop room.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from helpers.errors import TutorialError
from helpers.settings import project_root

REQUIREMENTS, LOCK = "requirements.txt", "requirements.lock"
PYTHONS = ("3.11", "3.12")  # what the lock is resolved and checked for; make picks one of them
# Never installed: jsonschema's format checks pull it in (through JupyterLab's jupyter-events), and importing it
# builds an IRI grammar, 2 s in every process that imports Ray (as Ray imports jsonschema): every kernel and Ray
# worker. Nothing here checks IRIs; jsonschema skips that format without it.
LEFT_OUT = ("rfc3987-syntax",)


@dataclass(frozen=True)
class Platform:
    """A platform the lock is for: its name here, uv's target, pip's wheel tag and its marker values."""

    name: str
    uv_target: str  # uv's --python-platform
    wheel_tag: str  # pip's --platform: the oldest system the wheels must run on
    sys_platform: str
    machine: str
    system: str


PLATFORMS = {p.name: p for p in (
    Platform("linux-x86_64", "x86_64-manylinux_2_35", "manylinux_2_35_x86_64", "linux", "x86_64", "Linux"),
    Platform("linux-aarch64", "aarch64-manylinux_2_35", "manylinux_2_35_aarch64", "linux", "aarch64", "Linux"),
    Platform("macos-arm64", "aarch64-apple-darwin", "macosx_14_0_arm64", "darwin", "arm64", "Darwin"),
)}
MACOS_VERSION = "14.0"  # torch's macOS wheels need 14 or later


class LockError(TutorialError, RuntimeError):
    """The lock cannot be made or resolved (the message says which package and why)."""


@dataclass(frozen=True)
class Pin:
    """One entry of the lock (or a direct pin of requirements.txt)."""

    name: str  # normalised: lower case, runs of -_. as one -
    version: str
    marker: str = ""
    hashes: tuple[str, ...] = ()


def normalise(name: str) -> str:
    """A project name as PyPI compares them (PEP 503): lower case, ``-``, ``_`` and ``.`` runs as one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;\\]+)\s*(?:;\s*([^\\#]+?))?\s*(?:\\|#|$)")


def read_pins(path: Path) -> list[Pin]:
    """The ``name==version`` entries of a requirements file, with their markers and ``--hash`` values."""
    pins, current = [], None
    for line in path.read_text().splitlines():
        if match := _PIN.match(line):
            if current:
                pins.append(current)
            current = Pin(normalise(match[1]), match[3], (match[4] or "").strip())
        elif current and (found := re.search(r"--hash=sha256:([0-9a-f]{64})", line)):
            current = Pin(current.name, current.version, current.marker, (*current.hashes, found[1]))
    return [*pins, current] if current else pins


def drift(requirements: Path, lock: Path) -> list[str]:
    """The direct pins of ``requirements`` that ``lock`` does not hold at their version (empty: in step)."""
    locked = {(pin.name, pin.version) for pin in read_pins(lock)}
    return [f"{pin.name}=={pin.version}" for pin in read_pins(requirements) if (pin.name, pin.version) not in locked]


def uv_binary() -> str:
    """The uv of this environment (a pinned package of requirements.txt)."""
    try:
        from uv import find_uv_bin
    except ImportError:
        raise LockError("uv is not installed in this environment: run `make install`") from None
    return find_uv_bin()


def lock_date(lock: Path) -> str:
    """The moment PyPI was read as of, from the lock's header (``--exclude-newer``)."""
    found = re.search(r"as PyPI stood at (\S+)", lock.read_text())
    if not found:
        raise LockError(f"{lock} has no 'as PyPI stood at <time>' in its header: make it with `make lock`")
    return found[1]


def compile_lock(requirements: Path, output: Path, as_of: str) -> None:
    """Resolve ``requirements`` for every platform into ``output``, hashes included, as PyPI stood at ``as_of``.

    Raises:
        LockError: uv could not resolve them (its reason, shortened).
    """
    command = [uv_binary(), "pip", "compile", "--no-config", "--quiet", str(requirements), "--universal",
               "--python-version", PYTHONS[0], "--generate-hashes", "--no-header", "--exclude-newer", as_of,
               *[arg for name in LEFT_OUT for arg in ("--no-emit-package", name)], "-o", str(output)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise LockError(f"uv could not resolve {requirements.name}: {done.stderr.strip()[-1500:]}")
    body = output.read_text()
    output.write_text(
        f"# {LOCK}: every package {REQUIREMENTS} pulls in, pinned, with the SHA-256 of each of its files,\n"
        f"# for Linux (x86-64, aarch64) and macOS on Apple silicon, Python {' and '.join(PYTHONS)}.\n"
        f"# Resolved as PyPI stood at {as_of} by `make lock` (uv pip compile --universal); do not edit.\n"
        f"# `make install` installs it with hashes required. Left out: {', '.join(LEFT_OUT)} (workshop/lock.py).\n"
        + body)


def resolve_for(platform: Platform, python: str, lock: Path) -> list[Pin]:
    """Resolve ``lock`` for one platform and Python from binary wheels only; the pins that platform installs.

    Every version is fixed by the lock, so this fails where a pinned version has no wheel for the platform.

    Raises:
        LockError: uv's reason, shortened (the package without a wheel).
    """
    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder) / "resolved.txt"
        command = [uv_binary(), "pip", "compile", "--no-config", "--quiet", str(lock), "--python-platform",
                   platform.uv_target, "--python-version", python, "--only-binary", ":all:", "--no-header",
                   "--no-annotate", "--exclude-newer", lock_date(lock), "-o", str(output)]
        done = subprocess.run(command, capture_output=True, text=True, check=False,
                              env={**os.environ, "MACOSX_DEPLOYMENT_TARGET": MACOS_VERSION})
        if done.returncode != 0:
            raise LockError(f"the lock does not resolve for {platform.name} with Python {python} from wheels: "
                            f"{' '.join(done.stderr.split())[-800:]}")
        return read_pins(output)


def main(argv: list[str] | None = None) -> int:
    """``python -m workshop.lock`` (``make lock``): resolve requirements.txt into requirements.lock, as of now."""
    parser = argparse.ArgumentParser(prog="python -m workshop.lock", description=__doc__.split("\n")[0])
    parser.add_argument("--as-of", help="read PyPI as it stood then (RFC 3339; default: the start of today, UTC)")
    args = parser.parse_args(argv)
    as_of = args.as_of or datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT00:00:00Z")
    root = project_root()
    try:
        compile_lock(root / REQUIREMENTS, root / LOCK, as_of)
    except LockError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"{LOCK}: {len(read_pins(root / LOCK))} pins, as PyPI stood at {as_of}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
