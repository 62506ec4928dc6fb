"""A lakeFS-shaped release archive for the tests of lakeFS's download, from a server or from a kit."""

from __future__ import annotations

import io
import tarfile


def release_archive(members: dict[str, str]) -> bytes:
    """A ``.tar.gz`` of executable scripts, ``members`` mapping each name to its text."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(text.encode()), 0o755
            archive.addfile(info, io.BytesIO(text.encode()))
    return buffer.getvalue()
