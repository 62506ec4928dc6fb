"""Files only their owner may read, written whole (the embedded stack's state, the stack's Ray's record).

Low-level on purpose: ``workshop.stack`` and ``workshop.ray_service`` both write such files, and neither
imports the other for it.
"""

from __future__ import annotations

import os
from pathlib import Path


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


def private_temp_folder(name: str) -> Path:
    """This user's own folder in the system's temporary folder: ``<tmp>/<name>-<uid>``, 0700.

    For what needs a short path (Unix sockets: 107 bytes at most) and must not be shared: Ray, for one,
    makes its session folders writable by everyone, so its temporary folder has to be private. Where
    another user holds that name already (made first, to get in), a new folder of a unique name.
    """
    import stat
    import tempfile

    folder = Path(tempfile.gettempdir()) / f"{name}-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return Path(tempfile.mkdtemp(prefix=f"{name}-{os.getuid()}-"))
    folder.chmod(0o700)
    return folder
