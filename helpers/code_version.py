"""Which code a run ran: the git commit, and whether the working tree held changes it does not (04-06, runner).

A commit alone names the wrong code when the tree has uncommitted changes: lineage then points at a
version that never ran. :func:`current` says whether the tree is dirty and hashes the changes, so two
runs from the same dirty tree carry the same hash and a run from a clean tree carries none.

Outputs are not code: a notebook whose cells' sources equal the commit's (only its outputs, execution
counts or metadata changed, as after running it in JupyterLab) does not make the tree dirty.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from helpers.settings import project_root


@dataclass(frozen=True)
class CodeVersion:
    """The commit, whether the tree differs from it (beyond notebook outputs), and a hash of the differences."""

    commit: str
    dirty: bool
    diff_sha256: str = ""
    changed: tuple[str, ...] = ()


def _git(*args: str, root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, timeout=20)


def _cell_sources(text: bytes) -> list[tuple[str, str]] | None:
    """A notebook's ``(cell type, source)`` pairs: what a notebook's code is; None if it is not a notebook."""
    try:
        cells = json.loads(text)["cells"]
        return [(c["cell_type"], "".join(c["source"]) if isinstance(c["source"], list) else c["source"])
                for c in cells]
    except (ValueError, KeyError, TypeError):
        return None


def _only_outputs_changed(path: str, root: Path) -> bool:
    if not path.endswith(".ipynb"):
        return False
    committed = _git("show", f"HEAD:{path}", root=root)
    file = root / path
    if committed.returncode != 0 or not file.is_file():
        return False
    before, after = _cell_sources(committed.stdout), _cell_sources(file.read_bytes())
    return before is not None and before == after


def current(root: Path | None = None) -> CodeVersion | None:
    """The code version of the checkout at ``root`` (the project's by default); None outside a git checkout."""
    root = root or project_root()
    try:
        head = _git("rev-parse", "HEAD", root=root)
        if head.returncode != 0:
            return None
        commit = head.stdout.decode().strip()
        listing = _git("status", "--porcelain=v1", "-z", "--untracked-files=all", root=root).stdout.decode()
    except (OSError, subprocess.SubprocessError):
        return None
    entries = [entry for entry in listing.split("\0") if entry]
    changed, untracked = [], []
    skip_next = False
    for entry in entries:
        if skip_next:  # the original path of a rename
            skip_next = False
            continue
        status, path = entry[:2], entry[3:]
        skip_next = "R" in status or "C" in status
        if status == "??":
            untracked.append(path)
        elif not _only_outputs_changed(path, root):
            changed.append(path)
    if not changed and not untracked:
        return CodeVersion(commit, False)
    digest = hashlib.sha256()
    if changed:
        digest.update(_git("diff", "HEAD", "--binary", "--", *changed, root=root).stdout)
    for path in sorted(untracked):
        digest.update(path.encode() + b"\0")
        file = root / path
        if file.is_file():
            digest.update(file.read_bytes())
    return CodeVersion(commit, True, digest.hexdigest(), tuple(sorted(changed + untracked)))
