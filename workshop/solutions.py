"""Exercises and their solutions (every notebook's "Try it" section, and ``make solutions``).

An exercise is three cells: the question (markdown), a code cell tagged ``exercise`` for the learner to
write in (comments only, so "Restart and run all" runs nothing there), and a markdown cell tagged
``solution`` holding the solution folded in a ``<details>`` block: JupyterLab shows a closed
"Solution" line that opens on a click, and no run of the notebook ever executes it or shows its output.

:func:`with_solutions` turns a notebook into the same notebook with each solution's code inserted as a
code cell right after its folded block, where a learner would paste it: ``make solutions`` runs those
copies for an instructor, and the tests run every solution against the notebook's own state.
"""

from __future__ import annotations

import copy
import re
import uuid
from typing import Any

from helpers.errors import TutorialError

EXERCISE_TAG = "exercise"
SOLUTION_TAG = "solution"
RAN_TAG = "solution-run"  # an inserted solution, in a copy the runner executes
_FENCE = re.compile(r"```python\n(.*?)```", re.DOTALL)


class SolutionError(TutorialError, ValueError):
    """A solution cell is not in the expected form (the message names the cell)."""


def tags(cell: dict[str, Any]) -> list[str]:
    """The cell's tags."""
    return list(cell.get("metadata", {}).get("tags", []))


def source(cell: dict[str, Any]) -> str:
    """The cell's source as one string (notebook files may store it as a list of lines)."""
    text = cell.get("source", "")
    return text if isinstance(text, str) else "".join(text)


def solution_code(cell: dict[str, Any]) -> str:
    """The Python code folded in a solution cell (every ```python block, joined).

    Raises:
        SolutionError: the cell holds no ``<details>`` block or no Python code.
    """
    text = source(cell)
    blocks = _FENCE.findall(text)
    if "<details>" not in text or not blocks:
        raise SolutionError(f"solution cell {cell.get('id', '?')} must hold a <details> block with a ```python "
                            "code block")
    return "\n".join(block.rstrip("\n") for block in blocks) + "\n"


def exercises(nb: dict[str, Any]) -> list[tuple[int, int]]:
    """``(exercise cell index, solution cell index)`` of every exercise, in order.

    Raises:
        SolutionError: an exercise cell not followed by its solution cell, or a solution without an exercise.
    """
    cells, pairs = nb["cells"], []
    for index, cell in enumerate(cells):
        if EXERCISE_TAG in tags(cell):
            following = cells[index + 1] if index + 1 < len(cells) else None
            if following is None or SOLUTION_TAG not in tags(following) or following["cell_type"] != "markdown":
                raise SolutionError(f"exercise cell {index} must be followed by a markdown cell tagged "
                                    f"{SOLUTION_TAG!r}")
            pairs.append((index, index + 1))
        elif SOLUTION_TAG in tags(cell) and not (index and EXERCISE_TAG in tags(cells[index - 1])):
            raise SolutionError(f"solution cell {index} must follow a code cell tagged {EXERCISE_TAG!r}")
    return pairs


def with_solutions(nb: dict[str, Any]) -> dict[str, Any]:
    """A copy of notebook ``nb`` with each solution's code as a code cell after its folded block."""
    out = copy.deepcopy(nb)
    for _, solution in reversed(exercises(nb)):
        cell = {"cell_type": "code", "execution_count": None, "id": f"solution-{uuid.uuid4().hex[:8]}",
                "metadata": {"tags": [RAN_TAG]}, "outputs": [], "source": solution_code(nb["cells"][solution])}
        out["cells"].insert(solution + 1, cell)
    return out
