"""The lakeFS server binary for the embedded stack: found where it is installed, or fetched once.

``make run`` starts the stack with ``python -m helpers.stack up --download-lakefs``:
where no ``lakefs`` binary is found, the release pinned for docker compose
(:data:`LAKEFS_VERSION`) is fetched from lakeFS's releases with the ``lakefs``
SDK's downloader into ``~/.lakefs/bin`` and checked with ``lakefs --version``
before it is put in place. Offline, the stack starts without lakeFS and
notebook 06 is skipped with one line that says so.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

LAKEFS_VERSION = "1.88.0"  # the compose image's tag and the pinned lakefs-sdk's version
RELEASES_URL = "https://github.com/treeverse/lakeFS/releases/download/"
RELEASES_URL_ENV = "LAKEFS_RELEASES_URL"  # a mirror of the releases (or a local server) instead of GitHub
INSTALL_DIR = Path.home() / ".lakefs" / "bin"


class DownloadError(RuntimeError):
    """The lakeFS release could not be fetched, unpacked or run (the message says which and why)."""


def find() -> Path | None:
    """The ``lakefs`` server binary on PATH, in this environment's bin folder or ``~/.lakefs/bin`` (None if absent)."""
    found = shutil.which("lakefs")
    candidates = [Path(found)] if found else []
    candidates += [Path(sys.exec_prefix) / "bin" / "lakefs", INSTALL_DIR / "lakefs"]
    return next((path for path in candidates if path.is_file() and os.access(path, os.X_OK)), None)


def release_url(version: str = LAKEFS_VERSION, base_url: str | None = None) -> str:
    """Where the release archive for this machine's OS and CPU is published."""
    from lakefs.__main__ import _get_platform_info  # the SDK's downloader names the archives this way

    try:
        platform = _get_platform_info()
    except ValueError as err:
        raise DownloadError(f"no lakeFS release for this machine ({err})") from None
    base = (base_url or os.environ.get(RELEASES_URL_ENV) or RELEASES_URL).rstrip("/") + "/"
    suffix = "zip" if platform.system == "windows" else "tar.gz"
    return f"{base}v{version}/lakeFS_{version}_{platform.system}_{platform.machine}.{suffix}"


def verify(binary: Path, version: str = LAKEFS_VERSION, timeout: float = 30.0) -> str:
    """Run ``lakefs --version``; returns what it printed. Raises DownloadError unless it names ``version``."""
    try:
        result = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=timeout,
                                check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise DownloadError(f"{binary} does not run: {err}") from None
    printed = (result.stdout + result.stderr).strip()
    if result.returncode != 0 or version not in printed:
        raise DownloadError(f"{binary} --version said {printed[-200:]!r} (exit {result.returncode}), "
                            f"not lakeFS {version}")
    return printed


def download(version: str = LAKEFS_VERSION, target: Path | None = None, base_url: str | None = None,
             timeout: float = 60.0) -> Path:
    """Fetch, unpack and check the lakeFS release; returns the installed ``lakefs`` binary.

    The binaries are unpacked and run in a temporary folder first, so an
    interrupted or broken download never leaves a half binary in ``target``.

    Raises:
        DownloadError: no internet, no such release, a broken archive, or a binary that does not run.
    """
    from lakefs.__main__ import _extract_binaries, _get_platform_info

    url, target = release_url(version, base_url), Path(target or INSTALL_DIR)
    request = urllib.request.Request(url, headers={"User-Agent": "mnist-object-storage lakeFS downloader"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - https or a chosen mirror
            archive = response.read()
    except urllib.error.HTTPError as err:
        raise DownloadError(f"could not fetch {url}: HTTP {err.code} {err.reason}") from None
    except (urllib.error.URLError, OSError) as err:
        raise DownloadError(f"could not fetch {url}: {getattr(err, 'reason', err)}") from None
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target, prefix=".download-") as unpacked:
        try:
            _extract_binaries(io.BytesIO(archive), unpacked, _get_platform_info())
        except (RuntimeError, KeyError) as err:
            raise DownloadError(f"{url} is not a lakeFS release archive ({err})") from None
        verify(Path(unpacked) / "lakefs", version)
        for name in ("lakefs", "lakectl"):
            os.replace(Path(unpacked) / name, target / name)
    return target / "lakefs"
