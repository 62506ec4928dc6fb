"""The comparison of a run with the committed outputs, as nbval makes it (tests/suite/committed_outputs.py)."""

import copy

import nbformat
import pytest

from helpers.settings import project_root
from tests.suite.committed_outputs import differences, is_checked

NOTEBOOKS = sorted((project_root() / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def checked_stream_cell(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The first checked cell that printed something."""
    return next(c for c in notebook.cells if is_checked(c) and any(o.output_type == "stream" for o in c.outputs))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_a_committed_notebook_agrees_with_itself_and_every_one_has_checked_cells(path):
    assert sum(is_checked(c) for c in nbformat.read(path, as_version=4).cells) >= 3
    assert differences(path, path) == []


def test_a_changed_word_differs_and_a_port_or_a_time_does_not(tmp_path):
    path = NOTEBOOKS[0]
    notebook = nbformat.read(path, as_version=4)
    run = copy.deepcopy(notebook)
    stream = next(o for o in checked_stream_cell(run).outputs if o.output_type == "stream")
    stream.text += "at 127.0.0.1:40123 in 3.5 s\n"
    ran = tmp_path / path.name
    nbformat.write(run, ran)
    expected = copy.deepcopy(notebook)
    first = next(o for o in checked_stream_cell(expected).outputs if o.output_type == "stream")
    first.text += "at 127.0.0.1:8333 in 12 s\n"
    committed = tmp_path / "committed" / path.name
    committed.parent.mkdir()
    nbformat.write(expected, committed)
    assert differences(ran, committed) == []  # nbval's sanitize file: ports and seconds may differ
    stream.text += "one line more\n"
    nbformat.write(run, ran)
    [found] = differences(ran, committed)
    assert found.startswith(f"{path.name}, cell ") and "stdout differs" in found and "one line more" in found


def test_streams_split_in_two_outputs_are_one_as_nbval_merges_them(tmp_path):
    path = NOTEBOOKS[0]
    run = nbformat.read(path, as_version=4)
    cell = checked_stream_cell(run)
    index = next(i for i, o in enumerate(cell.outputs) if o.output_type == "stream")
    text = cell.outputs[index].text
    half = len(text) // 2
    cell.outputs[index].text = text[:half]
    cell.outputs.insert(index + 1, nbformat.v4.new_output("stream", name=cell.outputs[index].name, text=text[half:]))
    nbformat.write(run, tmp_path / path.name)
    assert differences(tmp_path / path.name, path) == []
