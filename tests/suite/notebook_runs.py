"""Executing a notebook as the tests do, and reading what it produced (its summary, a solution's output)."""

import json
import os
from pathlib import Path

from helpers import listing
from helpers.settings import project_root
from workshop import runner

# MLflow's own stores, made in the working folder by a client that was given no tracking URI.
DEFAULT_MLFLOW_STORES = ("mlflow.db", "mlruns", "mlartifacts")
NOT_THE_CHECKOUT = (".venv", ".git", ".stack", "runs", "node_modules")  # environments, state, run outputs


def default_mlflow_stores(root: Path | None = None) -> list[str]:
    """MLflow's default stores (``mlflow.db``, ``mlruns/``, ``mlartifacts/``) anywhere in the checkout."""
    root = root or project_root()
    found = []
    for folder, folders, files in os.walk(root):
        if Path(folder) == root:
            folders[:] = [name for name in folders if name not in NOT_THE_CHECKOUT]
        found += [str(Path(folder, name).relative_to(root)) for name in folders + files
                  if name in DEFAULT_MLFLOW_STORES]
    return sorted(found)


def summary(output) -> dict:
    """The JSON facts the notebook's cell tagged 'summary' displayed."""
    nb = json.loads(output.read_text())
    cells = [c for c in nb["cells"] if "summary" in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, "a notebook has exactly one summary cell"
    return next(o["data"]["application/json"] for o in cells[0]["outputs"] if "application/json" in o.get("data", {}))


def run(name, tmp_path, **parameters):
    """Execute a notebook with every exercise's solution (the only execution of it in the test run) and check
    what every run must show: each solution ran, after the learner's cell, without an error."""
    from workshop.solutions import RAN_TAG

    notebook = runner.notebook_paths(pattern=f"{name}*.ipynb")[0]
    result = runner.execute(notebook, tmp_path / notebook.name, parameters, solutions=True)
    assert result.status == "ok", result.message
    assert not default_mlflow_stores(), "an MLflow call without a tracking URI made a store in the checkout"
    cells = json.loads(result.output.read_text())["cells"]
    solutions = [c for c in cells if RAN_TAG in c.get("metadata", {}).get("tags", [])]
    assert solutions and all(c["execution_count"] for c in solutions), "every exercise's solution ran"
    assert not [o for c in solutions for o in c["outputs"] if o["output_type"] == "error"]
    return summary(result.output)


def solution_output(output, number: int) -> str:
    """What the solution of exercise ``number`` printed, in an executed notebook."""
    from workshop.solutions import RAN_TAG

    cells = [c for c in json.loads(output.read_text())["cells"] if RAN_TAG in c.get("metadata", {}).get("tags", [])]
    return "".join("".join(o.get("text", "")) for o in cells[number - 1]["outputs"] if o["output_type"] == "stream")


def assert_lineage(run, inputs: dict[str, tuple[str, str]]) -> None:
    """The run names its data (dataset inputs with a source and an object count) and its code (git commit)."""
    from helpers import tracking

    logged = {i.dataset.name: (json.loads(i.dataset.source)["uri"], {t.key: t.value for t in i.tags}["objects"])
              for i in run.inputs.dataset_inputs}
    assert logged == inputs
    assert tracking.lineage_tags(), "the tests run from a git checkout"
    assert run.data.tags[tracking.GIT_COMMIT_TAG] == tracking.lineage_tags()[tracking.GIT_COMMIT_TAG]


def load_test_images(bucket: str, count: int):
    """The first ``count`` test images of the bucket, decoded the way the notebooks do, with their labels."""
    import numpy as np

    from helpers import preprocess, storage

    _, _, keys, labels, _ = listing.get_train_test_data(bucket, listing="manifest")
    keys, labels = listing.smoke_subset(keys, labels, count)  # the first, by id
    client = storage.get_client()
    images = preprocess.decode_images([storage.read_object(client, bucket, key) for key in keys])
    return images, np.asarray(labels)


def run_plain(name, tmp_path, **parameters):
    """Execute a notebook as run all does (no solutions) and return its summary."""
    notebook = runner.notebook_paths(pattern=f"{name}*.ipynb")[0]
    result = runner.execute(notebook, tmp_path / notebook.name, parameters)
    assert result.status == "ok", result.message
    said = json.dumps([c.get("outputs", []) for c in json.loads(result.output.read_text())["cells"]])
    assert "Live mode:" in said
    return summary(result.output)
