"""Files only their owner may read, written whole (the embedded stack's state, the stack's Ray's record).

Low-level on purpose: ``workshop.stack`` and ``workshop.ray_service`` both write such files, and neither
imports the other for it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from helpers.errors import TutorialError


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, readable by the owner only (0600 from the start).

    A reader sees the old file or the new one, never half of one: the text goes
    to a temporary file in the same folder first, which then replaces ``path``.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(tmp, 0o600)  # an existing temporary file keeps its mode through O_CREAT
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def private_folder(folder: Path) -> None:
    """Create ``folder`` (and its parents) readable by the owner only; an existing one is made so too."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)  # also a folder an older version created 0755


# The most bytes a Unix socket's path may have: sun_path holds 108 on Linux and 104 on macOS (and the BSDs),
# its last byte a NUL. Ray, SeaweedFS and the lab's kernels all listen on sockets in folders made here.
UNIX_SOCKET_LIMITS = {"linux": 107, "darwin": 103}


def unix_socket_limit(platform: str | None = None) -> int:
    """How many bytes a Unix socket's path may have on ``platform`` (default: this one): 107 on Linux, else 103."""
    return UNIX_SOCKET_LIMITS.get("linux" if (platform or sys.platform).startswith("linux") else "darwin")


class SocketPathError(TutorialError, OSError):
    """No temporary folder is short enough for the sockets that must go in it (the message says what to set)."""


def short_temp_root(room: int, platform: str | None = None) -> Path:
    """The temporary folder for something whose sockets add ``room`` bytes to its path: ``$TMPDIR``, else /tmp.

    macOS gives every user a ``$TMPDIR`` of about 49 bytes (``/var/folders/xx/<30 characters>/T/``), and a
    Unix socket's path there may have 103 bytes: Ray's, which add about 90 to the folder they live in, cannot
    fit under it, which is why Ray itself keeps to /tmp. So does this, where ``$TMPDIR`` is too long.

    Raises:
        SocketPathError: not even /tmp leaves ``room`` bytes.
    """
    import tempfile

    limit = unix_socket_limit(platform)
    candidates = list(dict.fromkeys([Path(tempfile.gettempdir()), Path("/tmp")]))
    for root in candidates:
        if len(str(root).encode()) + room <= limit:
            return root
    raise SocketPathError(f"a Unix socket in {candidates[-1]} would have {len(str(candidates[-1]).encode()) + room} "
                          f"bytes, over this system's limit of {limit}: set TMPDIR to a short folder you own "
                          "(export TMPDIR=/tmp) and start again")


def private_temp_folder(name: str, room: int = 0) -> Path:
    """This user's own folder in the system's temporary folder: ``<tmp>/<name>-<uid>``, 0700.

    For what needs a short path and must not be shared: Ray, for one, makes its session folders writable by
    everyone, so its temporary folder has to be private. ``room`` is how many bytes the sockets made inside
    add to the folder's path: where ``$TMPDIR`` leaves too few, the folder goes in /tmp
    (:func:`short_temp_root`). Where another user holds that name already (made first, to get in), a new
    folder of a unique name.
    """
    import stat
    import tempfile

    leaf = f"{name}-{os.getuid()}"
    root = short_temp_root(room + len(leaf) + 1 + len("-xxxxxxxx"))  # + the unique suffix of the fallback below
    folder = root / leaf
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return Path(tempfile.mkdtemp(prefix=f"{leaf}-", dir=root))
    folder.chmod(0o700)
    return folder
