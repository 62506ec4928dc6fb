"""Notebooks 06 and 07 executed by papermill with smoke parameters (apart from 01-05: the longest runs)."""

import ast
import contextlib
import json
import tempfile
from pathlib import Path

import pytest

from helpers import listing
from tests.suite.mnist_buckets import lakefs_images
from tests.suite.notebook_runs import assert_lineage, load_test_images, run, solution_output
from workshop import runner

pytestmark = pytest.mark.notebook


@pytest.mark.lakefs
def test_06_runs_parallel_experiments_on_lakefs_branches(bucket, tmp_path, lakefs_kind, client, settings):
    import lakefs

    from helpers import lakefs_experiments, upload, versioning
    from helpers.settings import load_settings

    repo_name, suffix = f"t-nb-{bucket[2:10]}", bucket[2:12]
    # the bucket holds more than the smoke size names: 06 must train, validate and test on the 180 + 300 + 600
    # images notebooks 04, 05 and 07 use at that size, not on everything it imports
    upload.upload_mnist(bucket, 240, progress=False, verify=False)
    facts = run("06", tmp_path, bucket=bucket, repo_name=repo_name, smoke_test_size=180,
                optimizers=["sgd", "adam"], epochs=[1, 2], registered_model=f"t-06-{suffix}",
                experiment=f"t-06-{suffix}", training_experiment=f"t-06-none-{suffix}",
                sweep_experiment=f"t-06-none-{suffix}")
    repo = lakefs.Repository(repo_name, client=versioning.connect(load_settings()))
    try:
        assert facts["objects imported"] == 240 + 400 + 800  # the whole bucket is versioned
        assert facts["bucket objects after import"] == facts["bucket objects before import"]
        assert facts["bucket bytes after import"] == facts["bucket bytes before import"]
        assert facts["experiments"] == 4 and facts["all metrics match"] is True
        assert facts["starting point"].startswith("notebook 04's defaults")  # no sweep in that experiment
        for branch, commit_id in facts["experiment commits"].items():  # what the notebook says is in lakeFS
            commit = repo.ref(commit_id).get_commit()
            assert commit.metadata["experiment"] == branch and repo.branch(branch).get_commit().id == commit_id
            assert lakefs_experiments.decode_metadata(commit.metadata, "metric") == lakefs_experiments.read_json(
                repo, commit_id, lakefs_experiments.METRICS_PATH)
        chosen = facts["experiment commits"][facts["chosen"]]
        committed = lakefs_experiments.read_json(repo, chosen, lakefs_experiments.METRICS_PATH)["val_accuracy"]
        assert facts["chosen val_accuracy"] == round(committed, 4)
        assert facts["recomputed val_accuracy"] == facts["chosen val_accuracy"]
        assert set(facts["chosen against the others"]) == set(facts["experiment commits"]) - {facts["chosen"]}
        assert set(facts["chosen against the others"].values()) <= {"a tie", "better beyond noise"}
        assert facts["chosen is the winner"] is all(
            verdict == "better beyond noise" for verdict in facts["chosen against the others"].values())
        x_test, y_test = lakefs_images(repo, chosen, "test", 180)  # measured once, for the report, on 600 images
        assert len(y_test) == 600
        import mlflow

        mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
        chosen_model = mlflow.pyfunc.load_model(repo.ref(chosen).get_commit().metadata["mlflow_model_uri"])
        assert facts["chosen test_accuracy (measured once)"] == round(float(
            (chosen_model.predict(x_test).argmax(axis=1) == y_test).mean()), 4)
        assert facts["files changed by the chosen experiment"] == sorted(lakefs_experiments.EXPERIMENT_FILES)
        assert facts["tag"] == "model-v1" and repo.tag("model-v1").get_commit().id == facts["merge commit"]
        assert facts["reproduced"] is True
        # the champion: a registered model version with its lakeFS lineage, loadable by alias anywhere
        from mlflow.tracking import MlflowClient

        name = facts["registered model"]
        version = MlflowClient().get_model_version_by_alias(name, "champion")
        assert name == f"t-06-{suffix}" and version.version == str(facts["champion version"]) == "1"
        assert facts["registered version"] == facts["champion version"]  # no champion before: the alias moved
        assert version.tags["lakefs.commit"] == facts["merge commit"] and version.tags["lakefs.tag"] == "model-v1"
        champion = mlflow.pyfunc.load_model(f"models:/{name}@champion")
        x_val, y_val = lakefs_images(repo, facts["merge commit"], "validation", 180)
        assert len(y_val) == facts["validation images"] == 300
        recomputed = float((champion.predict(x_val).argmax(axis=1) == y_val).mean())
        assert recomputed == committed and facts["champion val_accuracy"] == round(committed, 4)
        assert set(facts["day's validation accuracies"]) == {"champion"}  # no 04 or 05 runs in those experiments
        assert facts["clearly better than the champion"] == []
        for commit_id in facts["experiment commits"].values():
            metadata = repo.ref(commit_id).get_commit().metadata
            experiment_run = MlflowClient().get_run(metadata["mlflow_run_id"])
            data = metadata["param.data_commit"].strip('"')
            assert_lineage(experiment_run, {"mnist-train": (f"s3://{repo_name}/{data}/train/", "180"),
                                            "mnist-validation": (f"s3://{repo_name}/{data}/train/", "300"),
                                            "mnist-test": (f"s3://{repo_name}/{data}/test/", "600")})
            assert metadata["mlflow_model_uri"].startswith("models:/")
    finally:
        repo.delete()


def test_07_runs_first_and_alone_and_the_parquet_accuracy_is_the_model_s(bucket, tmp_path, settings, client):
    """No model anywhere (a registry name and experiment nobody used): 07 trains one with 04 first, then predicts."""
    import mlflow
    import pyarrow.parquet as pq
    from mlflow.tracking import MlflowClient

    from helpers import storage, training

    suffix = bucket[2:12]
    facts = run("07", tmp_path, bucket=bucket, smoke_test_size=300, registered_model=f"t-none-{suffix}",
                sweep_experiment=f"t-07-none-{suffix}",
                training_experiment=f"t-07-train-{suffix}", experiment=f"t-07-{suffix}")
    # 04 ran first, headless; its model, the best of the day, became the champion by notebook 06's rule
    assert facts["model source"] == f"t-none-{suffix} version 1 (@champion, registered by notebook 07)"
    assert not catch_up_copies(suffix), "04's executed copy is removed once it ran to the end"
    # the predictions are in the bucket under the run's prefix, and the MLflow run names that prefix
    run_tags = MlflowClient(settings.mlflow_tracking_uri).get_run(facts["MLflow run id"]).data.tags
    assert run_tags["predictions"] == facts["predictions"] and run_tags["model_uri"] == facts["model"]
    prefix = facts["predictions"].removeprefix(f"s3://{bucket}/")
    files = [o.object_name for o in client.list_objects(bucket, prefix=prefix, recursive=True)
             if not o.object_name.endswith("/")]  # pyarrow leaves a folder marker
    assert files[-1] == f"{prefix}_SUCCESS" and all(name.endswith(".parquet") for name in files[:-1])
    table = pq.read_table(facts["predictions"].removeprefix("s3://"), filesystem=storage.s3_filesystem(settings))
    assert table.column_names == ["key", "label", "predicted", "confidence"] and table.num_rows == 1000
    parquet_accuracy = float((table["label"].to_numpy() == table["predicted"].to_numpy()).mean())
    # the same model, recomputed here on the same test images without Ray
    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
    images, labels = load_test_images(bucket, 1000)
    import torch

    with torch.no_grad():
        predicted = mlflow.pytorch.load_model(facts["model"])(torch.as_tensor(images)).argmax(dim=1).numpy()
    recomputed = training.accuracy(predicted, labels)
    assert parquet_accuracy == recomputed and round(recomputed, 4) == facts["test_accuracy from the Parquet"]
    assert facts["recorded test_accuracy"] == facts["test_accuracy from the Parquet"]  # what notebook 04 logged
    assert sorted(table["key"].to_pylist()) == sorted(listing.get_train_test_data(bucket, 300, "manifest")[2])
    assert facts["driver predictions equal"] is True and facts["wrong"] == round((1 - recomputed) * 1000)
    # exercise 3: on the 300 images it trained on (no validation image among them), the model does better
    by_split = ast.literal_eval(solution_output(tmp_path / "07_batch_inference.ipynb", 3).strip())
    assert set(by_split) == {"train", "test"} and by_split["train"] > by_split["test"], by_split


def test_06_without_lakefs_stops_at_its_first_cell_and_is_reported_as_skipped(bucket, tmp_path, monkeypatch):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("LAKEFS_ENDPOINT", f"http://127.0.0.1:{port}")  # the kernel inherits it: nothing listens
    monkeypatch.setenv("LAKEFS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("LAKEFS_SECRET_ACCESS_KEY", "secret")
    notebook = runner.notebook_paths(pattern="06*.ipynb")[0]
    result = runner.execute(notebook, tmp_path / notebook.name, {"bucket": bucket})
    assert result.status == "skipped", result.message
    nb = json.loads((tmp_path / notebook.name).read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"
            and not {"parameters", "injected-parameters"} & set(c["metadata"].get("tags", []))]
    errors = [o for c in code for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert len(errors) == 1 and errors[0]["ename"] == "NotebookSkipped"
    assert any(o["output_type"] == "error" for o in code[0]["outputs"]), "it stops at its first cell"
    message = json.dumps(errors[0])
    assert "docker compose up" in message and "Traceback" not in message and len(message) < 1500


def catch_up_copies(suffix: str) -> list[Path]:
    """The executed copies of notebook 04 that a catch-up run for this test left in the temporary folder."""
    found = []
    for copy in Path(tempfile.gettempdir()).glob("catch-up-04-*/*.ipynb"):
        with contextlib.suppress(OSError, ValueError):
            parameters = json.loads(copy.read_text())["metadata"]["papermill"]["parameters"]
            if any(suffix in str(value) for value in parameters.values()):
                found.append(copy)
    return found
