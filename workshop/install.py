"""``make install``: the locked packages into .venv, from the package registry or from a workshop kit.

* ``make install`` (no kit): pip installs ``requirements.lock``, every file checked against its hashes.
* ``make install KIT=<folder>`` (a USB stick, a copied folder): first every wheel this machine needs is
  checked against the kit's manifest (a missing wheel, or one with a changed byte, is named in one line
  and nothing is installed), then uv, itself from the kit, installs the lock from that folder alone.
* ``make install INDEX=http://<instructor>:<port>/<key>/`` (``make kit-serve``): the same, over the
  instructor's read-only server, with uv checking every file against the lock's hashes as it arrives.

From a kit the lakeFS binary comes from the kit too, checked against its pinned SHA-256, into .venv/bin.
From the kit's folder, uv installed the lock in 85 s here, where pip took 325 s from the registry
(``benchmarks/results/kit.json``); from the registry pip keeps whatever configuration a learner's machine
gives it (mirrors, proxies, certificates).

This runs before anything is installed, so it needs the standard library only (and helpers.errors, which
needs nothing else).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from helpers.errors import TutorialError

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
MANIFEST = "manifest.json"  # = workshop.kit.MANIFEST


class InstallError(TutorialError, RuntimeError):
    """The install cannot go on (the message, one line, says what to do)."""


def platform_name(system: str | None = None, machine: str | None = None) -> str:
    """This machine as the lock and the kit name it: ``linux-x86_64``, ``linux-aarch64`` or ``macos-arm64``.

    Raises:
        InstallError: a machine the lock is not resolved for (an Intel Mac, Windows outside WSL), or a Mac's
            x86-64 Python running under Rosetta.
    """
    system, machine = (system or platform.system()).lower(), (machine or platform.machine()).lower()
    name = {("linux", "x86_64"): "linux-x86_64", ("linux", "amd64"): "linux-x86_64",
            ("linux", "aarch64"): "linux-aarch64", ("linux", "arm64"): "linux-aarch64",
            ("darwin", "arm64"): "macos-arm64"}.get((system, machine))
    if name is None and system == "darwin" and machine == "x86_64":
        raise InstallError("this Python is built for Intel Macs: on Apple silicon it runs under Rosetta, and the "
                           "lock is for arm64 (install Homebrew's Python, in /opt/homebrew, and run make again); "
                           "an Intel Mac is not one the lock is for")
    if name is None:
        raise InstallError(f"this machine ({system} {machine}) is not one the lock is for: macOS on Apple silicon, "
                           "Linux on x86-64 or aarch64, or Windows through WSL2 (docs/quickstart.md)")
    return name


def system_too_old() -> str:
    """What is too old on this machine for the lock's wheels (glibc before 2.35, macOS before 14), else ""."""
    if platform.system() == "Linux":
        library, version = platform.libc_ver()
        if library == "glibc" and version and tuple(map(int, version.split(".")[:2])) < (2, 35):
            return (f"glibc {version}: the lock's wheels need 2.35 or later (Ubuntu 22.04, Debian 12); upgrade the "
                    "system, or on Windows install WSL's Ubuntu-24.04")
    if platform.system() == "Darwin":
        release = platform.mac_ver()[0]
        if release and int(release.split(".")[0]) < 14:
            return f"macOS {release}: PyTorch's wheels need macOS 14 or later; update macOS"
    return ""


def python_version() -> str:
    """This interpreter's ``major.minor``."""
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def sha256_of(path: Path) -> str:
    """The SHA-256 of a file, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(text: str, source: str) -> dict:
    """The kit's manifest, checked to be for this checkout's lock.

    Raises:
        InstallError: it is not a kit's manifest, or the kit was made from another lock.
    """
    try:
        manifest = json.loads(text)
        lock_sha256 = manifest["lock_sha256"]
    except (ValueError, KeyError, TypeError):
        raise InstallError(f"{source} is not a workshop kit's manifest: point KIT or INDEX at what `make kit` "
                           "wrote, or `make kit-serve` printed") from None
    if lock_sha256 != sha256_of(LOCK):
        raise InstallError(f"the kit at {source} was made from another requirements.lock than this checkout's: "
                           "use the repository the kit carries (its README says how), or make the kit again")
    return manifest


def wheels_for_here(manifest: dict, source: str) -> list[dict]:
    """The kit's wheels for this machine and Python: ``{"file", "sha256", "size"}`` each.

    Raises:
        InstallError: the kit has none for this platform or Python.
    """
    name, python = platform_name(), python_version()
    held = manifest.get("wheels", {})
    wheels = held.get(name, {}).get(python)
    if not wheels:
        made_for = ", ".join(f"{p} (Python {', '.join(v)})" for p, v in held.items())
        platforms = " ".join(dict.fromkeys([*held, name]))
        pythons = " ".join(sorted({v for by_python in held.values() for v in by_python} | {python}))
        raise InstallError(f"the kit at {source} has no wheels for {name} with Python {python}; it holds "
                           f"{made_for or 'none'}: the instructor adds them with `make kit PLATFORMS=\"{platforms}\" "
                           f"PYTHONS=\"{pythons}\"` (a kit holds what its last build asked for)")
    return wheels


def check_wheel(path: Path, wheel: dict, source: str) -> None:
    """The wheel is there with the hash the kit recorded (the lock's).

    Raises:
        InstallError: it is missing or differs, by name; nothing has been installed then.
    """
    if not path.is_file():
        raise InstallError(f"the kit at {source} is missing {wheel['file']}: copy the kit again, or make it again "
                           "with `make kit`; nothing was installed")
    found = sha256_of(path)
    if found != wheel["sha256"]:
        raise InstallError(f"{wheel['file']} from the kit at {source} fails its hash check (SHA-256 {found}, locked "
                           f"{wheel['sha256']}): the copy is damaged or changed; copy the kit again. Nothing was "
                           "installed")


def check_wheels(kit: Path, wheels: list[dict]) -> None:
    """Every wheel of ``wheels`` in the kit's folder, with its recorded hash (:func:`check_wheel`)."""
    for wheel in wheels:
        check_wheel(kit / "wheels" / wheel["file"], wheel, str(kit))


def pinned_block(name: str) -> str:
    """The lock's entry for ``name``: its ``==`` line and hash lines, as a requirements file of one."""
    found = re.search(rf"^{re.escape(name)}==[^\n]*(?:\n    --hash=[^\n]*)*", LOCK.read_text(), flags=re.MULTILINE)
    if not found:
        raise InstallError(f"{name} is not in requirements.lock: run `make lock`")
    return found[0].replace(" \\\n", " ").replace("\\\n", " ") + "\n"


def run(command: list[str], what: str, env: dict[str, str] | None = None) -> None:
    """Run an installer; where it fails, its own reason in one line.

    Raises:
        InstallError: ``what`` failed, with the installer's reason.
    """
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        lines = [re.sub(r"^[\s×├─╰▶│:]+", "", line).strip() for line in (done.stderr or done.stdout).splitlines()]
        reason = "; ".join(line for line in lines if line and not line.startswith(("help:", "hint:", "WARNING:")))
        raise InstallError(f"{what} failed: {reason[:1500] or f'exit status {done.returncode}'}")


def install_project() -> None:
    """``helpers`` and ``workshop`` themselves, editable, with the setuptools the lock installed."""
    run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "-e", str(ROOT)], "installing this project")


# PyPI's Linux build of torch and what it pulls in for the GPU: what a CPU-only torch leaves out.
TORCH = ("torch", "torchvision")
CUDA_PACKAGES = re.compile(r"^(nvidia-[\w-]+|cuda-[\w-]+|triton)$")


def lock_entries(lock: Path) -> dict[str, list[str]]:
    """The lock's entries by package name: each ``name==version`` line with its hash and comment lines."""
    entries: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lock.read_text().splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            current = entries.setdefault(re.split(r"[=\[ ;]", line, maxsplit=1)[0].lower(), [])
        if current is not None and line and not line.startswith("#"):
            current.append(line)
    return entries


def without_torch(lock: Path) -> str:
    """The lock as a requirements file, less torch, torchvision and the CUDA packages PyPI's Linux torch needs."""
    kept = [lines for name, lines in lock_entries(lock).items() if name not in TORCH and not CUDA_PACKAGES.match(name)]
    return "\n".join(line for lines in kept for line in lines) + "\n"


def from_registry(lock: Path = LOCK, torch_from: str | None = None) -> None:
    """Install the lock from the package registry with pip, hashes required; then this project.

    ``torch_from``: an index of CPU-only builds (PyTorch's own, ``https://download.pytorch.org/whl/cpu``), from
    which torch and torchvision come at the lock's versions, without hashes (that index's files are not in the
    lock), and without the GPU libraries: about 3 GB less on Linux. docker/jupyter.Dockerfile installs so.
    """
    if torch_from:
        versions = [f"{name}=={lock_entries(lock)[name][0].split('==')[1].split()[0]}" for name in TORCH]
        run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--index-url", torch_from, *versions],
            f"installing {' and '.join(versions)} from {torch_from}")
        with tempfile.TemporaryDirectory() as folder:
            rest = Path(folder) / lock.name
            rest.write_text(without_torch(lock))
            run([sys.executable, "-m", "pip", "install", "--quiet", "--require-hashes", "--no-deps", "-r", str(rest)],
                f"installing {lock.name} without torch's GPU build")
    else:
        run([sys.executable, "-m", "pip", "install", "--quiet", "--require-hashes", "--no-deps", "-r", str(lock)],
            f"installing {lock.name}")
    install_project()


def uv_from(find_links: Path) -> list[str]:
    """Install uv (the lock's, hash-checked) from a folder of wheels; the command that runs it."""
    with tempfile.TemporaryDirectory() as folder:
        single = Path(folder) / "uv.txt"
        single.write_text(pinned_block("uv"))
        run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(find_links),
             "--require-hashes", "--no-deps", "-r", str(single)], "installing uv from the kit")
    return [sys.executable, "-m", "uv", "--no-config", "pip", "install", "--quiet", "--python", sys.executable,
            "--require-hashes", "--no-deps"]


def lakefs_from(base_url: str, manifest: dict) -> None:
    """Install the kit's lakeFS binary into this environment's bin folder, where the stack finds it; else one line."""
    archive = manifest.get("lakefs", {}).get(platform_name())
    if not archive:
        print("The kit holds no lakeFS for this machine: notebook 06 will say how to get one; the others run.")
        return
    run([sys.executable, "-m", "workshop.lakefs_binary", "--from", base_url, "--to", str(Path(sys.prefix) / "bin")],
        "installing lakeFS from the kit")


def from_kit(kit: Path) -> None:
    """Check the kit's wheels for this machine, then install the lock from that folder alone."""
    kit = kit.resolve()
    try:
        manifest = read_manifest((kit / MANIFEST).read_text(), str(kit))
    except OSError:
        raise InstallError(f"{kit} holds no {MANIFEST}: KIT names the folder `make kit` wrote") from None
    check_wheels(kit, wheels_for_here(manifest, str(kit)))
    run([*uv_from(kit / "wheels"), "--no-index", "--find-links", str(kit / "wheels"), "-r", str(LOCK)],
        f"installing requirements.lock from {kit}")
    install_project()
    lakefs_from((kit / "lakefs").as_uri() + "/", manifest)


def fetch(url: str, timeout: float = 30.0) -> bytes:
    """GET ``url`` from the instructor's server, bounded.

    Raises:
        InstallError: it does not answer, or answers with an error.
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - the kit's own address
            return response.read()
    except urllib.error.HTTPError as err:
        raise InstallError(f"{url} answered {err.code} {err.reason}: check the address `make kit-serve` "
                           "printed (its key included)") from None
    except (urllib.error.URLError, OSError) as err:
        raise InstallError(f"{url} does not answer ({getattr(err, 'reason', err)}): is `make kit-serve` running, "
                           "and is this machine on the instructor's network?") from None


def from_index(index: str) -> None:
    """Install the lock from a kit served by ``make kit-serve``, every file checked against the lock's hashes."""
    index = index.rstrip("/") + "/"
    manifest = read_manifest(fetch(index + MANIFEST).decode(), index)
    wheels = wheels_for_here(manifest, index)
    uv_wheel = next((w for w in wheels if w["file"].startswith("uv-")), None)
    if uv_wheel is None:
        raise InstallError(f"the kit at {index} holds no uv wheel for this machine: make the kit again")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / uv_wheel["file"]
        path.write_bytes(fetch(index + "wheels/" + uv_wheel["file"]))
        check_wheel(path, uv_wheel, index)
        command = uv_from(Path(folder))
    # A room shares one laptop's server: 8 files at a time, not uv's 50, and patience while others are served.
    run([*command, "--index-url", index + "simple/", "-r", str(LOCK)], f"installing requirements.lock from {index}",
        env={**os.environ, "UV_CONCURRENT_DOWNLOADS": "8", "UV_HTTP_TIMEOUT": "300"})
    install_project()
    lakefs_from(index + "lakefs/", manifest)


def main(argv: list[str] | None = None) -> int:
    """``python -m workshop.install [--kit FOLDER | --index URL]`` (``make install``)."""
    parser = argparse.ArgumentParser(prog="python -m workshop.install", description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--kit", type=Path, help="a workshop kit's folder (make kit)")
    source.add_argument("--index", help="a workshop kit served by make kit-serve: the address it printed")
    source.add_argument("--torch-from", metavar="URL", help="torch and torchvision from this index of CPU-only "
                        "builds (https://download.pytorch.org/whl/cpu), the rest of the lock from the registry")
    args = parser.parse_args(argv)
    os.environ.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    try:
        if args.kit:
            from_kit(args.kit)
        elif args.index:
            from_index(args.index)
        else:
            from_registry(torch_from=args.torch_from)
    except InstallError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
