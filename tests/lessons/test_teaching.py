"""The teaching layer of the committed notebooks: an opening block, exercises with hidden solutions, clean outputs."""

import ipaddress
import json
import re

import pytest

from helpers.settings import project_root
from workshop import runner

NOTEBOOKS = runner.notebook_paths()
IP = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.])")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def cells(notebook) -> list[dict]:
    return json.loads(notebook.read_text())["cells"]


def text(cell) -> str:
    return "".join(cell["source"])


def test_there_are_eight_notebooks():
    assert [p.name[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05", "06", "07", "08"]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_each_notebook_opens_with_who_it_is_for_objectives_time_services_and_its_source(notebook):
    opening = text(cells(notebook)[1])
    assert opening.startswith("## Before you start")
    for row in ("**For**", "**Know first**", "**Time**", "**Services**", "**Original article"):
        assert row in opening, f"{notebook.name}: no {row} row"
    assert "**After this notebook you can**" in opening
    time_row = next(line for line in opening.splitlines() if line.startswith("| **Time**"))
    assert "smoke size" in time_row and "full size" in time_row and "{" not in time_row, time_row
    assert re.search(r"\d", time_row.split("smoke size")[0]), "a measured smoke-size time"
    if notebook.name[:2] >= "02":
        assert "```mermaid" in opening, "a diagram where the flow is the lesson"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_each_exercise_is_a_question_a_cell_to_write_in_and_a_folded_solution_before_the_summary(notebook):
    import ast

    from workshop import solutions

    nb = json.loads(notebook.read_text())
    all_cells = nb["cells"]
    pairs = solutions.exercises(nb)  # each exercise cell followed by its solution cell, or an error
    assert len(pairs) >= 2, f"{notebook.name}: at least two exercises"
    summary = next(i for i, c in enumerate(all_cells) if "summary" in c["metadata"].get("tags", []))
    for number, (exercise, solution) in enumerate(pairs, start=1):
        assert text(all_cells[exercise - 1]).startswith(f"**Exercise {number}:"), "the question comes first"
        learner = all_cells[exercise]
        assert learner["cell_type"] == "code" and ast.parse(text(learner)).body == [], \
            "the learner's cell holds comments only: run all runs nothing there"
        assert learner["outputs"] == [] and learner["execution_count"] is None
        folded = text(all_cells[solution])
        assert folded.startswith("<details>\n<summary>Solution</summary>") and folded.endswith("</details>")
        ast.parse(solutions.solution_code(all_cells[solution]))  # the folded code is Python
        assert "#@save" not in folded, "a solution is never exported"
        assert solution < summary, "exercises run before the summary (which stops Ray)"
    assert not [c for c in all_cells if c["cell_type"] == "code" and "solution" in c["metadata"].get("tags", [])], \
        "no solution is a code cell that run all would run"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_the_learner_s_text_holds_no_maintainers_sentences(notebook):
    for cell in cells(notebook):
        said = text(cell).lower()
        assert "the tests run" not in said and "tests execute" not in said, text(cell)[:200]


def test_with_solutions_puts_each_solution_after_its_folded_block():
    from workshop import solutions

    nb = json.loads(runner.notebook_paths(pattern="04_*.ipynb")[0].read_text())
    ran = solutions.with_solutions(nb)
    inserted = [i for i, c in enumerate(ran["cells"]) if solutions.RAN_TAG in c["metadata"].get("tags", [])]
    assert len(inserted) == len(solutions.exercises(nb)) == 3
    for index in inserted:
        assert "solution" in ran["cells"][index - 1]["metadata"]["tags"]
        assert ran["cells"][index]["source"] == solutions.solution_code(ran["cells"][index - 1])
    assert len(ran["cells"]) == len(nb["cells"]) + 3 and len(nb["cells"]) == len(json.loads(
        runner.notebook_paths(pattern="04_*.ipynb")[0].read_text())["cells"]), "the original is left as it was"
    broken = {"cells": [{"cell_type": "code", "metadata": {"tags": ["exercise"]}, "source": "# here"}]}
    with pytest.raises(solutions.SolutionError, match="must be followed by a markdown cell"):
        solutions.exercises(broken)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_committed_outputs_hold_no_machine_addresses_widgets_or_blanks(notebook):
    nb = json.loads(notebook.read_text())
    assert "widgets" not in nb["metadata"], "widget state"
    for index, cell in enumerate(nb["cells"]):
        for output in cell.get("outputs", []):
            assert WIDGET_VIEW not in output.get("data", {}), f"cell {index}: a widget view"
            assert runner._has_content(output), f"cell {index}: an empty output"
            shown = json.dumps(output)
            others = [ip for ip in IP.findall(shown) if _is_address(ip) and ip != "127.0.0.1"]
            assert not others, f"cell {index}: addresses {others}"


def _is_address(candidate: str) -> bool:
    try:
        ipaddress.IPv4Address(candidate)
    except ValueError:
        return False
    return True


def test_the_output_check_catches_what_it_must(tmp_path):
    bad = {"cells": [{"cell_type": "code", "metadata": {}, "source": [], "execution_count": 1, "outputs": [
        {"output_type": "stream", "name": "stdout", "text": ["{'node:192.0.2.2': 1.0}\n"]},
        {"output_type": "display_data", "metadata": {}, "data": {"text/html": ["  "]}}]}],
        "metadata": {"widgets": {"state": {}}}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "07_bad.ipynb"
    path.write_text(json.dumps(bad))
    with pytest.raises(AssertionError, match="widget state"):
        test_committed_outputs_hold_no_machine_addresses_widgets_or_blanks(path)
    del bad["metadata"]["widgets"]
    path.write_text(json.dumps(bad))
    with pytest.raises(AssertionError, match="192.0.2.2"):
        test_committed_outputs_hold_no_machine_addresses_widgets_or_blanks(path)
    runner.strip_machine_metadata(path)  # the runner's clean-up drops the blank output, not the address
    assert len(json.loads(path.read_text())["cells"][0]["outputs"]) == 1


def test_readme_names_the_original_articles():
    readme = (project_root() / "README.md").read_text()
    sources = readme[readme.index("## Sources"):]
    for title in ("Distributed Data Processing with Ray Data and MinIO",
                  "Parallel ML Experimentation leveraging MinIO & lakeFS", "Ray Tune與Dataset"):
        assert title in sources


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_every_cell_has_a_unique_id(notebook):
    ids = [cell.get("id") for cell in cells(notebook)]
    assert all(ids) and len(set(ids)) == len(ids), "nbformat 4.5 wants one id per cell"


def test_catch_up_runs_only_the_notebooks_before_the_one_a_learner_joins_at(monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(runner, "execute", lambda notebook, output, parameters, solutions=False: ran.append(
        notebook.name[:2]) or runner.NotebookRun(notebook.name, "ok", 0.0, output))
    assert runner.main(["--before", "04"]) == 0
    assert ran == ["01", "02", "03"] and "03_ray_data_preprocessing.ipynb" in capsys.readouterr().out


# The mermaid flowchart syntax the notebooks use, checked strictly (the browser test renders every diagram
# with JupyterLab's own mermaid as well): a node is an id with an optional quoted label in one of four shapes,
# an edge an arrow with an optional label.
_LABEL = r'"[^"\n]*"'
_NODE = rf'[A-Za-z][A-Za-z0-9_]*(?:\[{_LABEL}\]|\[[A-Za-z0-9 _.-]+\]|\[\({_LABEL}\)\]|\{{{_LABEL}\}})?'
_EDGE = rf'(?:-->|<-->|-\.->)(?:\|(?:{_LABEL}|[A-Za-z0-9 _]+)\|)?'
_STATEMENT = re.compile(rf"\s*{_NODE}(?:\s*{_EDGE}\s*{_NODE})*\s*")


def mermaid_errors(diagram: str) -> list[str]:
    """The lines of a ``flowchart`` that do not follow the syntax above (empty when it parses)."""
    lines = [line for line in diagram.strip().splitlines() if line.strip()]
    if not lines or not re.fullmatch(r"flowchart (LR|RL|TD|TB|BT)", lines[0].strip()):
        return [lines[0] if lines else "(empty diagram)"]
    return [line for line in lines[1:] if not _STATEMENT.fullmatch(line)]


def test_every_mermaid_diagram_parses():
    for notebook in runner.notebook_paths():
        for cell in json.loads(notebook.read_text())["cells"]:
            for diagram in re.findall(r"```mermaid\n(.*?)```", "".join(cell["source"]), re.S):
                assert not mermaid_errors(diagram), f"{notebook.name}: {mermaid_errors(diagram)}"


def test_the_mermaid_check_refuses_what_mermaid_refuses():
    broken = 'flowchart LR\n    TR -->|"tune.report each epoch"| SCASHA rung:<br/>in the top half?\n'  # 05 at 08382ef
    assert mermaid_errors(broken) == ['    TR -->|"tune.report each epoch"| SCASHA rung:<br/>in the top half?']
    assert mermaid_errors('flowchart LR\n    A["x"] -->|"y"| B{"z"}\n    B -.-> C[("d")]') == []
    assert mermaid_errors("graph LR\n    A --> B") == ["graph LR"]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_committed_outputs_hold_no_warning_and_the_checked_cells_show_text(notebook):
    """No warning in what a learner reads (06's raylet warnings had a cause, now gone), and every cell nbval
    checks has an output of text only: no figure, no stderr, which would make the check flaky or empty."""
    ansi = re.compile(r"\x1b\[[0-9;]*m")
    for index, cell in enumerate(cells(notebook)):
        for output in cell.get("outputs", []):
            shown = json.dumps(output)
            assert "WARNING" not in shown and not ansi.search("".join(output.get("text", ""))), f"cell {index}"
        if "nbval-check-output" in cell["metadata"].get("tags", []):
            assert cell["outputs"], f"cell {index}: checked, but has no committed output"
            for output in cell["outputs"]:
                assert output.get("name") != "stderr" and "image/png" not in output.get("data", {}), f"cell {index}"


DATABASE_OR_STATE = re.compile(r"(\.(db|sqlite3?|db-journal|db-wal|pid)$)|(^|/)(\.stack|mlruns|mlartifacts)/")


def test_no_database_or_state_file_is_tracked():
    """A database or a service's state (MLflow's default store, the stack's folder) never goes into git."""
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=project_root(), capture_output=True, text=True,
                             check=True).stdout.splitlines()
    assert "README.md" in tracked, "the listing is of this checkout"
    assert [path for path in tracked if DATABASE_OR_STATE.search(path)] == []


def test_the_check_for_mlflow_s_default_stores_finds_one(tmp_path):
    """The check every notebook run in the tests ends with (tests/suite/notebook_runs.py) finds what it must."""
    from tests.suite.notebook_runs import default_mlflow_stores

    (tmp_path / "notebooks").mkdir()
    assert default_mlflow_stores(tmp_path) == []
    (tmp_path / "notebooks" / "mlflow.db").write_bytes(b"SQLite format 3\0")
    (tmp_path / "mlruns" / "0").mkdir(parents=True)
    (tmp_path / ".venv" / "mlruns").mkdir(parents=True)  # an environment's own files are not the checkout's
    assert default_mlflow_stores(tmp_path) == ["mlruns", "notebooks/mlflow.db"]
    # ... and what the tracked-files check refuses
    assert all(DATABASE_OR_STATE.search(path) for path in ("notebooks/mlflow.db", ".stack/ports.json",
                                                             "mlruns/0/meta.yaml", "ray.pid"))
    assert not DATABASE_OR_STATE.search("workshop/state_files.py")
