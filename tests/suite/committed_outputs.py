"""A notebook run compared with the committed outputs the way nbval compares them, wherever it ran.

nbval (``make test``, ``--nbval-lax``) compares the cells tagged ``nbval-check-output`` with their committed
outputs, after the replacements of ``tests/suite/nbval_sanitize.cfg`` in both. A run made elsewhere, such as
the browser test's *Restart and run all* in JupyterLab, is checked here by the same rules: nbval's own markers,
stream merging and sanitize file, and what nbval leaves out of the comparison. So one run of a notebook serves
both the browser's checks and the committed outputs'.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import nbformat
from nbval.plugin import (
    coalesce_streams,
    find_comment_markers,
    find_metadata_tags,
    get_sanitize_patterns,
    transform_streams_for_comparison,
)

from helpers.settings import project_root

SANITIZE = project_root() / "tests" / "suite" / "nbval_sanitize.cfg"
# What nbval never compares (its defaults without nbdime): metadata, counters, widget ids, images.
NOT_COMPARED = frozenset({"metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
                          "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg"})


def sanitize_patterns(path: Path = SANITIZE) -> list[tuple[str, str]]:
    """The (regex, replacement) pairs of nbval's sanitize file, in its order."""
    return get_sanitize_patterns(path.read_text())


def is_checked(cell: nbformat.NotebookNode) -> bool:
    """Whether nbval in lax mode compares this cell's outputs: tagged or marked to, and run in the committed file."""
    if cell.cell_type != "code" or cell.get("execution_count") is None:
        return False
    options = dict(find_metadata_tags(cell.metadata))
    options.update(find_comment_markers(cell.source))
    return bool(options.get("check")) and not options.get("skip")


def flattened(outputs: list, patterns: list[tuple[str, str]]) -> dict[str, list]:
    """Each compared key (a stream's name, a MIME type, an error's name and value) with its sanitized values."""
    found: dict[str, list] = defaultdict(list)
    for output in transform_streams_for_comparison(coalesce_streams(outputs)):
        for key, value in output.items():
            pairs = value.items() if key == "data" else [(key, value)]
            for name, item in pairs:
                if name not in NOT_COMPARED:
                    found[name].append(sanitized(item, patterns))
    return found


def sanitized(value: object, patterns: list[tuple[str, str]]) -> object:
    """A text with every sanitize replacement made; anything else as it is."""
    if isinstance(value, str):
        for regex, replacement in patterns:
            value = re.sub(regex, replacement, value)
    return value


def differences(ran: Path, committed: Path, patterns: list[tuple[str, str]] | None = None) -> list[str]:
    """Where the checked cells of the notebook at ``ran`` differ from the committed one's; empty when they agree."""
    patterns = sanitize_patterns() if patterns is None else patterns
    ran_cells = {cell.get("id"): cell for cell in nbformat.read(ran, as_version=4).cells}
    found = []
    for index, cell in enumerate(nbformat.read(committed, as_version=4).cells):
        if not is_checked(cell):
            continue
        first_line = cell.source.splitlines()[0] if cell.source else ""
        where = f"{committed.name}, cell {index} ({first_line[:60]!r})"
        if cell.get("id") not in ran_cells:
            found.append(f"{where}: not in the run")
            continue
        expected, got = flattened(cell.outputs, patterns), flattened(ran_cells[cell.get("id")].outputs, patterns)
        if expected != got:
            keys = sorted(set(expected) | set(got))
            key = next(k for k in keys if expected.get(k) != got.get(k))
            found.append(f"{where}: {key} differs\n  committed: {str(expected.get(key))[:800]!s}\n"
                         f"  run:       {str(got.get(key))[:800]!s}")
    return found
