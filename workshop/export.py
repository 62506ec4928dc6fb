"""Write the lesson modules of ``helpers`` from the notebooks' ``#@save`` cells (``python -m workshop.export``).

The code a later notebook reuses is written once, in the notebook that
teaches it, in a code cell whose first line is ``#@save``. This command
collects those cells, in order, into one module per notebook (see
:data:`EXPORTS`), so ``from helpers.training import train_func_per_worker``
runs exactly the code notebook 04 shows. ``--check`` (and the test suite)
fails when a module differs from its notebook.

A saved cell may hold imports, constants, functions and classes only:
anything that would run on import is refused with the cell's number. A saved
cell is also at most :data:`MAX_CELL_LINES` lines: a lesson is read a definition
at a time, and what does not fit belongs in a hand-written ``helpers`` module
the cell calls in one line.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

from helpers.errors import TutorialError
from helpers.settings import project_root

MARK = "#@save"
# notebook -> generated module (helpers/<name>.py)
EXPORTS = {
    "01_upload_mnist.ipynb": "upload",
    "02_list_and_split.ipynb": "listing",
    "03_ray_data_preprocessing.ipynb": "preprocess",
    "04_distributed_training.ipynb": "training",
    "05_tune_sweeps.ipynb": "sweeps",
    "06_lakefs_parallel_experiments.ipynb": "lakefs_experiments",
    "07_batch_inference.ipynb": "inference",
    "08_serve_the_champion.ipynb": "serving",
}
MAX_CELL_LINES = 40  # the whole cell, its #@save line included
_ALLOWED = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)


class ExportError(TutorialError, ValueError):
    """A ``#@save`` cell holds code that would run on import."""


def saved_cells(notebook: Path) -> list[tuple[int, str, str]]:
    """``(cell index, cell id, source without the mark)`` of every ``#@save`` code cell, in notebook order."""
    cells = json.loads(notebook.read_text())["cells"]
    out = []
    for index, cell in enumerate(cells):
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and source.startswith(MARK):
            out.append((index, cell.get("id", ""), source[len(MARK):].lstrip("\n").rstrip() + "\n"))
    return out


def origin(notebook: Path, index: int, cell_id: str) -> str:
    """The comment above each generated definition that says where it is taught (and edited)."""
    return f"# From notebooks/{notebook.name}, cell {index} (id {cell_id})."


def _with_origins(notebook: Path, index: int, cell_id: str, source: str) -> str:
    """``source`` with :func:`origin` above every function and class (above its decorators)."""
    lines = source.splitlines()
    starts = sorted({min([node.lineno] + [d.lineno for d in node.decorator_list]) for node in ast.parse(source).body
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}, reverse=True)
    for start in starts:
        lines.insert(start - 1, origin(notebook, index, cell_id))
    return "\n".join(lines) + "\n"


def _check_cell(notebook: Path, index: int, source: str) -> None:
    lines = len(source.rstrip("\n").splitlines()) + 1  # and the mark
    if lines > MAX_CELL_LINES:
        raise ExportError(f"{notebook.name} cell {index}: a #@save cell holds {lines} lines, more than "
                          f"{MAX_CELL_LINES}; split it into one definition per cell, or move what the lesson does "
                          "not teach into a hand-written helpers module.")
    for node in ast.parse(source).body:
        docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if not (isinstance(node, _ALLOWED) or docstring):
            raise ExportError(f"{notebook.name} cell {index}: a #@save cell may only define things "
                              f"(line {node.lineno} is a {type(node).__name__}); move that code to another cell.")


def _title(notebook: Path) -> str:
    """The notebook's first heading, e.g. ``04 · Distributed training with Ray Train``."""
    for cell in json.loads(notebook.read_text())["cells"]:
        for line in "".join(cell["source"]).splitlines():
            if cell["cell_type"] == "markdown" and line.startswith("# "):
                return line[2:].strip()
    return notebook.stem


def module_source(notebook: Path) -> str:
    """The module text generated from ``notebook``'s saved cells."""
    cells = saved_cells(notebook)
    for index, _, source in cells:
        _check_cell(notebook, index, source)
    header = (f'"""Generated from notebooks/{notebook.name} by `python -m workshop.export`: edit the notebook.\n\n'
              f"Lesson {_title(notebook)}. Above each definition, the cell that teaches it.\n"
              '"""\n')
    return header + "\n\n".join(_with_origins(notebook, index, cell_id, source) for index, cell_id, source in cells)


def module_path(root: Path, notebook_name: str) -> Path:
    """Where the module generated from ``notebook_name`` lives."""
    return root / "helpers" / f"{EXPORTS[notebook_name]}.py"


def stale_modules(root: Path | None = None) -> list[str]:
    """Generated modules whose text differs from what their notebook gives now (empty when in sync)."""
    root = root or project_root()
    stale = []
    for name in EXPORTS:
        path = module_path(root, name)
        if not path.is_file() or path.read_text() != module_source(root / "notebooks" / name):
            stale.append(str(path.relative_to(root)))
    return stale


def write_modules(root: Path | None = None) -> list[str]:
    """(Re)write every generated module; returns the ones whose text changed."""
    root = root or project_root()
    changed = []
    for name in EXPORTS:
        path, text = module_path(root, name), module_source(root / "notebooks" / name)
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            changed.append(str(path.relative_to(root)))
    return changed


def main(argv: list[str] | None = None) -> int:
    """Write the modules, or with ``--check`` exit 1 naming the ones out of date."""
    parser = argparse.ArgumentParser(prog="python -m workshop.export", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only report modules that differ from their notebook")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_modules()
        for path in stale:
            print(f"{path} differs from its notebook: run `python -m workshop.export`.")
        return 1 if stale else 0
    for path in write_modules():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
