"""Notebook 06 executed by papermill with smoke parameters, with lakeFS and without (apart from 01-05: a long run).

Notebook 07 runs first and alone in tests/lessons/test_serving.py, where notebook 08 serves the model it trained.
"""

import json

import pytest

from tests.suite.mnist_buckets import lakefs_images
from tests.suite.notebook_runs import assert_lineage, run
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
