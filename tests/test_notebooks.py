"""Every notebook executed by papermill with smoke parameters, asserting on what it produced."""

import json

import pytest

from conftest import lakefs_test_images
from helpers import listing, runner

pytestmark = pytest.mark.notebook


def summary(output) -> dict:
    """The JSON facts the notebook's cell tagged 'summary' displayed."""
    nb = json.loads(output.read_text())
    cells = [c for c in nb["cells"] if "summary" in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, "a notebook has exactly one summary cell"
    return next(o["data"]["application/json"] for o in cells[0]["outputs"] if "application/json" in o.get("data", {}))


def run(name, tmp_path, **parameters):
    """Execute a notebook with every exercise's solution (the only execution of it in the test run) and check
    what every run must show: each solution ran, after the learner's cell, without an error."""
    from helpers.solutions import RAN_TAG

    notebook = runner.notebook_paths(pattern=f"{name}*.ipynb")[0]
    result = runner.execute(notebook, tmp_path / notebook.name, parameters, solutions=True)
    assert result.status == "ok", result.message
    cells = json.loads(result.output.read_text())["cells"]
    solutions = [c for c in cells if RAN_TAG in c.get("metadata", {}).get("tags", [])]
    assert solutions and all(c["execution_count"] for c in solutions), "every exercise's solution ran"
    assert not [o for c in solutions for o in c["outputs"] if o["output_type"] == "error"]
    return summary(result.output)


def solution_output(output, number: int) -> str:
    """What the solution of exercise ``number`` printed, in an executed notebook."""
    from helpers.solutions import RAN_TAG

    cells = [c for c in json.loads(output.read_text())["cells"] if RAN_TAG in c.get("metadata", {}).get("tags", [])]
    return "".join("".join(o.get("text", "")) for o in cells[number - 1]["outputs"] if o["output_type"] == "stream")


def test_01_uploads_the_smoke_set(client, bucket, tmp_path):
    facts = run("01", tmp_path, bucket=bucket, smoke_test_size=120)
    assert facts["objects"] == 140 and facts["train objects"] == 120 and facts["test objects"] == 20
    # the first image went up alone (put_object), the other 139 in parallel; the second run sends nothing
    assert facts["uploaded in parallel"] == 139 and facts["uploaded on the second run"] == 0
    keys = listing.list_objects_parallel(bucket, client=client)
    assert len(keys) == len(set(keys)) == 140


def test_02_runs_first_and_alone_and_splits(client, bucket, tmp_path):
    facts = run("02", tmp_path, bucket=bucket, smoke_test_size=60)  # uploads itself: bucket is empty
    assert (facts["train pointers"], facts["test pointers"]) == (60, 10)
    assert facts["first pointer in key order"] == "train/0/00001.png" and facts["its label"] == 0  # key-sorted
    assert (facts["smoke train pointers"], facts["smoke test pointers"]) == (60, 10)
    assert facts["manifest listing s"] > 0
    assert len(listing.list_objects_from_manifest(bucket, client=client)) == 70


@pytest.mark.parametrize("parameters, message", [
    ({"smoke_test_size": -5}, "smoke_test_size=-5"),
    ({"smoke_test_size": "abc"}, "smoke_test_size must be an integer, not 'abc'"),
    ({"threads": 0}, "threads=0 is out of range"),
    ({"threads": "16"}, "threads must be a whole number"),
    ({"bucket": "Not_A_Valid_Bucket"}, "'Not_A_Valid_Bucket' is not a valid bucket name"),
])
def test_a_bad_parameter_fails_the_run_with_one_clear_line(bucket, tmp_path, parameters, message):
    notebook = runner.notebook_paths(pattern="01*.ipynb")[0]
    result = runner.execute(notebook, tmp_path / "bad.ipynb", {"bucket": bucket, **parameters})
    assert result.status == "failed" and "ParameterError" in result.message and message in result.message
    nb = json.loads((tmp_path / "bad.ipynb").read_text())
    shown = [o for c in nb["cells"] for o in c.get("outputs", []) if message in json.dumps(o)]
    assert shown, "the message is shown in the notebook"
    assert "Traceback" not in json.dumps(shown) and len(json.dumps(shown)) < 1500


def _notebook(tmp_path, *sources):
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "probe.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.mark.parametrize("source, why", [
    ("import os; os._exit(1)", "DeadKernelError"),  # the kernel dies
    ("import time; time.sleep(60)", "CellTimeoutError"),  # a cell hangs
])
def test_a_dead_kernel_or_a_hung_cell_is_one_failed_row_not_a_crash(tmp_path, source, why):
    notebook = _notebook(tmp_path, "print('first cell')", source)
    result = runner.execute(notebook, tmp_path / "out.ipynb", cell_timeout=5)
    assert result.status == "failed" and result.message.startswith(why), result.message
    assert "\n" not in result.message


def test_committed_notebooks_have_parameters_and_no_machine_paths():
    for notebook in runner.notebook_paths():
        nb = json.loads(notebook.read_text())
        tags = [t for c in nb["cells"] for t in c.get("metadata", {}).get("tags", [])]
        assert "parameters" in tags and "summary" in tags, notebook.name
        assert "papermill" not in nb["metadata"], notebook.name
        text = json.dumps([c.get("outputs", []) for c in nb["cells"] if c["cell_type"] == "code"])
        assert "/root/" not in text and "/home/" not in text and "/tmp/" not in text, notebook.name
        assert '"output_type": "error"' not in text, notebook.name


def test_03_preprocesses_with_tasks_actors_and_both_readers(bucket, tmp_path):
    facts = run("03", tmp_path, bucket=bucket, smoke_test_size=450, batch_size=400)
    assert facts["pointers"] == 450 and facts["torch batches"] == 2
    assert facts["preprocessing batches"] >= 4  # 450 rows in batches of 400: two or more each for tasks and actors
    assert facts["batch shape"] == [400, 1, 28, 28]
    assert facts["rows (tasks / actors / read_images / parquet)"] == [450] * 4
    # the pid-stamped log: tasks ran in Ray's worker processes, and each of the two actors got batches
    assert facts["task processes"] >= 1 and facts["actor processes"] == 2
    assert all(facts[f"{name} images/s"] > 0 for name in ("tasks", "actors", "read_images", "parquet"))


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

    _, _, keys, labels, _ = listing.get_train_test_data(bucket, smoke_test_size=count * 6, listing="manifest")
    client = storage.get_client()
    images = preprocess.decode_images([storage.read_object(client, bucket, key) for key in keys])
    return images, np.asarray(labels)


def test_04_trains_tracks_and_tests_and_resumes_after_a_killed_worker(bucket, tmp_path, settings, monkeypatch):
    import mlflow
    from mlflow.tracking import MlflowClient

    from helpers import timings, tracking

    monkeypatch.setenv(timings.TIMINGS_ENV, str(tmp_path / "spans.jsonl"))  # what bench_smoke.py reads
    # README's fault demo: fail_at_epoch = 7 at the defaults (10 epochs, a checkpoint every 5)
    facts = run("04", tmp_path, bucket=bucket, smoke_test_size=300, hidden_sizes=[64], fail_at_epoch=7)
    spans = timings.read(tmp_path / "spans.jsonl")
    labels = {s["label"] for s in spans}
    assert {"kernel start + imports", "ray start", "load: list + fetch + decode", "training"} <= labels
    assert not [s for s in spans if s["label"].startswith("train: ")], "the taught loop holds no timer"
    # A checkpoint at epoch 5 (and 10); the fault comes in epoch 7, so the run went back to epoch 5: the
    # history in the last checkpoint marks epoch 5 as where a restart began.
    assert facts["injected failure in epoch"] == 7 and facts["resumed from the checkpoint of epoch"] == 5
    assert facts["epochs"] == 10 and facts["last epoch loss"] < facts["first epoch loss"]
    assert facts["test accuracy"] > 0.6 and facts["test images"] == 50
    assert facts["checkpoint"].startswith(f"s3://{bucket}/ray-results/")
    uri, run_id = settings.mlflow_tracking_uri, facts["MLflow run id"]
    steps = [step for step, _ in tracking.metric_history(uri, run_id, "train_loss")]
    assert steps == list(range(1, 11)), "every epoch logged once, counted from 1, also across the resume"
    client = MlflowClient(uri)
    stamps = [m.timestamp for m in sorted(client.get_metric_history(run_id, "train_loss"), key=lambda m: m.step)]
    assert stamps == sorted(set(stamps)), "each epoch logged as it ended, not in bursts"
    mlflow_run = client.get_run(run_id)
    assert mlflow_run.info.status == "FINISHED" and mlflow_run.data.tags["checkpoint"] == facts["checkpoint"]
    assert mlflow_run.data.metrics["test_accuracy"] == pytest.approx(facts["test accuracy"], abs=1e-4)
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    artifacts |= {a.path for a in client.list_artifacts(run_id, "model")}
    assert {"confusion_matrix.png", "model/checkpoint.pt"} <= artifacts
    assert_lineage(mlflow_run, {"mnist-train": (f"s3://{bucket}/train/", "300"),
                                "mnist-test": (f"s3://{bucket}/test/", "50")})
    assert facts["accuracy through pyfunc"] == facts["test accuracy"]
    served = mlflow.pyfunc.load_model(facts["MLflow model"])  # the MLflow model, loaded outside the notebook
    images, labels = load_test_images(bucket, 50)
    assert (served.predict(images).argmax(axis=1) == labels).mean() == pytest.approx(facts["test accuracy"], abs=1e-4)


def test_05_sweeps_from_the_known_good_point_and_finds_a_better_one(bucket, tmp_path, settings):
    """At the defaults (600 images, 8 trials of 10 epochs), with every exercise's solution."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from helpers import sweeps

    experiment = f"t-05-{bucket[2:12]}"
    facts = run("05", tmp_path, bucket=bucket, experiment=experiment)
    assert facts["trials"] == 8 and facts["first trial is the known-good point"] is True
    # the search space holds configurations better than the starting point, and the sweep finds one
    assert facts["best is the known-good point"] is False
    assert facts["best val_accuracy"] > facts["known-good val_accuracy"]
    assert 0 < facts["test_accuracy"] <= 1
    assert facts["trials stopped early"] >= 1, "ASHA stops trials at its rungs"
    children = sweeps.child_runs(settings.mlflow_tracking_uri, facts["MLflow parent run id"])
    assert len(children) == facts["MLflow child runs"] == 8
    parent = MlflowClient(settings.mlflow_tracking_uri).get_run(facts["MLflow parent run id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.params["best_lr"] == str(facts["best config"]["lr"]) or \
        float(parent.data.params["best_lr"]) == pytest.approx(facts["best config"]["lr"], abs=1e-4)
    assert parent.data.metrics["val_accuracy"] == pytest.approx(facts["best val_accuracy"], abs=1e-4)
    assert parent.data.metrics["test_accuracy"] == pytest.approx(facts["test_accuracy"], abs=1e-4)
    assert_lineage(parent, {"mnist-train": (f"s3://{bucket}/train/", "500"),
                            "mnist-validation": (f"s3://{bucket}/train/", "100"),
                            "mnist-test": (f"s3://{bucket}/test/", "100")})
    for child in children:
        assert_lineage(child, {"mnist-train": (f"s3://{bucket}/train/", "500"),
                               "mnist-validation": (f"s3://{bucket}/train/", "100")})
    best = mlflow.pyfunc.load_model(facts["MLflow model"])
    images, labels = load_test_images(bucket, 100)
    assert (best.predict(images).argmax(axis=1) == labels).mean() == pytest.approx(facts["test_accuracy"], abs=1e-4)
    # exercise 3: the median rule, comparing trials by epoch, stops something (the contrast it asks about)
    said = solution_output(tmp_path / "05_tune_sweeps.ipynb", 3)
    stopped = int(said.split("the median rule stopped ")[1].split(" of ")[0])
    assert stopped >= 1, said


@pytest.mark.lakefs
def test_06_runs_parallel_experiments_on_lakefs_branches(bucket, tmp_path, lakefs_kind, client, settings):
    import lakefs

    from helpers import experiments, versioning
    from helpers.config import load_settings

    repo_name, suffix = f"t-nb-{bucket[2:10]}", bucket[2:12]
    facts = run("06", tmp_path, bucket=bucket, repo_name=repo_name, smoke_test_size=180,
                optimizers=["sgd", "adam"], epochs=[1, 2], registered_model=f"t-06-{suffix}",
                experiment=f"t-06-{suffix}", training_experiment=f"t-06-none-{suffix}",
                sweep_experiment=f"t-06-none-{suffix}")
    repo = lakefs.Repository(repo_name, client=versioning.connect(load_settings()))
    try:
        assert facts["objects imported"] == 180 + 30
        assert facts["bucket objects after import"] == facts["bucket objects before import"]
        assert facts["bucket bytes after import"] == facts["bucket bytes before import"]
        assert facts["experiments"] == 4 and facts["all metrics match"] is True
        assert facts["starting point"].startswith("notebook 04's defaults")  # no sweep in that experiment
        for branch, commit_id in facts["experiment commits"].items():  # what the notebook says is in lakeFS
            commit = repo.ref(commit_id).get_commit()
            assert commit.metadata["experiment"] == branch and repo.branch(branch).get_commit().id == commit_id
            assert experiments.decode_metadata(commit.metadata, "metric") == experiments.read_json(
                repo, commit_id, experiments.METRICS_PATH)
        winner = facts["experiment commits"][facts["winner"]]
        committed = experiments.read_json(repo, winner, experiments.METRICS_PATH)["test_accuracy"]
        assert facts["winner test_accuracy"] == round(committed, 4)
        assert facts["recomputed test_accuracy"] == facts["winner test_accuracy"]
        assert facts["files changed by the winner"] == sorted(experiments.EXPERIMENT_FILES)
        assert facts["tag"] == "model-v1" and repo.tag("model-v1").get_commit().id == facts["merge commit"]
        assert facts["reproduced"] is True
        # the champion: a registered model version with its lakeFS lineage, loadable by alias anywhere
        import mlflow
        from mlflow.tracking import MlflowClient

        mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
        name = facts["registered model"]
        version = MlflowClient().get_model_version_by_alias(name, "champion")
        assert name == f"t-06-{suffix}" and version.version == str(facts["champion version"]) == "1"
        assert facts["registered version"] == facts["champion version"]  # no champion before: the alias moved
        assert version.tags["lakefs.commit"] == facts["merge commit"] and version.tags["lakefs.tag"] == "model-v1"
        champion = mlflow.pyfunc.load_model(f"models:/{name}@champion")
        x_test, y_test = lakefs_test_images(repo, facts["merge commit"])
        recomputed = float((champion.predict(x_test).argmax(axis=1) == y_test).mean())
        assert recomputed == committed and facts["champion test_accuracy"] == round(committed, 4)
        assert set(facts["day's test accuracies"]) == {"champion"}  # no 04 or 05 runs in those experiments
        for commit_id in facts["experiment commits"].values():
            metadata = repo.ref(commit_id).get_commit().metadata
            experiment_run = MlflowClient().get_run(metadata["mlflow_run_id"])
            data = metadata["param.data_commit"].strip('"')
            assert_lineage(experiment_run, {"mnist-train": (f"s3://{repo_name}/{data}/train/", "180"),
                                 "mnist-test": (f"s3://{repo_name}/{data}/test/", "30")})
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
    assert facts["model source"].startswith("notebook 04's run")  # 04 ran first, headless
    # the predictions are in the bucket under the run's prefix, and the MLflow run names that prefix
    run_tags = MlflowClient(settings.mlflow_tracking_uri).get_run(facts["MLflow run id"]).data.tags
    assert run_tags["predictions"] == facts["predictions"] and run_tags["model_uri"] == facts["model"]
    prefix = facts["predictions"].removeprefix(f"s3://{bucket}/")
    files = [o.object_name for o in client.list_objects(bucket, prefix=prefix, recursive=True)
             if not o.object_name.endswith("/")]  # pyarrow leaves a folder marker
    assert files[-1] == f"{prefix}_SUCCESS" and all(name.endswith(".parquet") for name in files[:-1])
    table = pq.read_table(facts["predictions"].removeprefix("s3://"), filesystem=storage.s3_filesystem(settings))
    assert table.column_names == ["key", "label", "predicted", "confidence"] and table.num_rows == 50
    parquet_accuracy = float((table["label"].to_numpy() == table["predicted"].to_numpy()).mean())
    # the same model, recomputed here on the same test images without Ray
    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
    images, labels = load_test_images(bucket, 50)
    import torch

    with torch.no_grad():
        predicted = mlflow.pytorch.load_model(facts["model"])(torch.as_tensor(images)).argmax(dim=1).numpy()
    recomputed = training.accuracy(predicted, labels)
    assert parquet_accuracy == recomputed and round(recomputed, 4) == facts["test_accuracy from the Parquet"]
    assert facts["recorded test_accuracy"] == facts["test_accuracy from the Parquet"]  # what notebook 04 logged
    assert sorted(table["key"].to_pylist()) == sorted(listing.get_train_test_data(bucket, 300, "manifest")[2])
    assert facts["driver predictions equal"] is True and facts["wrong"] == round((1 - recomputed) * 50)


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


@pytest.fixture(scope="module")
def stray_bucket(client):
    """A smoke bucket with a README someone dropped into train/ next to the images."""
    import io

    from conftest import uploaded_bucket

    with uploaded_bucket(client, "stray", 60) as name:
        client.put_object(name, "train/notes.txt", io.BytesIO(b"read me first"), 13)
        yield name


@pytest.mark.parametrize("name, parameters", [
    ("02", {}),
    ("03", {"batch_size": 40}),
    ("04", {"epochs": 1, "hidden_sizes": [16]}),
    ("05", {"num_samples": 1, "epochs": 1}),
])
def test_a_stray_object_in_the_bucket_is_named_and_the_notebook_runs(stray_bucket, tmp_path, name, parameters):
    """02 lists the bucket and names the stray once; 03-05 read the manifest, which never held it."""
    notebook = runner.notebook_paths(pattern=f"{name}*.ipynb")[0]
    result = runner.execute(notebook, tmp_path / notebook.name, {"bucket": stray_bucket, "smoke_test_size": 60,
                                                                 **parameters})
    assert result.status == "ok", result.message
    said = json.dumps([c.get("outputs", []) for c in json.loads(result.output.read_text())["cells"]])
    if name == "02":
        assert "Skipped 1 object in bucket" in said and "'train/notes.txt'" in said
    assert "txt images" not in said and "image_format='txt'" not in said


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_live_mode_makes_04_s_epochs_and_05_s_trials_last_long_enough_to_watch(bucket, tmp_path, settings):
    """The instructor's setting: 04's epochs reach MLflow spread over at least 20 s, and 05's trials come and go
    (they start at different times, two at a time), where the smoke defaults are over in a few seconds."""
    from mlflow.tracking import MlflowClient

    from helpers import sweeps

    client, suffix = MlflowClient(settings.mlflow_tracking_uri), bucket[2:12]
    facts = run_plain("04", tmp_path, bucket=bucket, live=True, experiment=f"t-live-04-{suffix}")
    assert facts["epochs"] == 20 and facts["test images"] == 2000
    stamps = sorted(m.timestamp for m in client.get_metric_history(facts["MLflow run id"], "train_loss"))
    assert len(stamps) == 20 and (stamps[-1] - stamps[0]) / 1000 >= 20, "the curves grow for 20 s or more"
    facts = run_plain("05", tmp_path, bucket=bucket, live=True, experiment=f"t-live-05-{suffix}")
    assert facts["trials"] == 12
    starts = sorted(r.info.start_time / 1000 for r in sweeps.child_runs(settings.mlflow_tracking_uri,
                                                                       facts["MLflow parent run id"]))
    assert len(starts) == 12 and starts[-1] - starts[0] >= 20, "new trials keep coming for 20 s or more"
    runs = sweeps.child_runs(settings.mlflow_tracking_uri, facts["MLflow parent run id"])
    overlaps = [a for a in runs for b in runs if a.info.run_id < b.info.run_id
                and a.info.start_time < b.info.end_time and b.info.start_time < a.info.end_time]
    assert overlaps, "two trials train at once"


def run_plain(name, tmp_path, **parameters):
    """Execute a notebook as run all does (no solutions) and return its summary."""
    notebook = runner.notebook_paths(pattern=f"{name}*.ipynb")[0]
    result = runner.execute(notebook, tmp_path / notebook.name, parameters)
    assert result.status == "ok", result.message
    said = json.dumps([c.get("outputs", []) for c in json.loads(result.output.read_text())["cells"]])
    assert "Live mode:" in said
    return summary(result.output)
