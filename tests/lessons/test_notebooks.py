"""Every notebook executed by papermill with smoke parameters, asserting on what it produced."""

import ast
import json
import re

import pytest

from helpers import listing
from tests.suite.notebook_runs import assert_lineage, load_test_images, run, solution_output
from workshop import runner

pytestmark = pytest.mark.notebook


def with_a_stray(client, bucket: str, smoke_test_size: int | None = None) -> None:
    """A README someone dropped into ``train/`` next to the images (after uploading ``smoke_test_size`` of them)."""
    import io

    from helpers import storage, upload

    if smoke_test_size:
        upload.upload_mnist(bucket, smoke_test_size, client=client, progress=False)
    storage.ensure_bucket(client, bucket)
    client.put_object(bucket, "train/notes.txt", io.BytesIO(b"read me first"), 13)


def outputs_of(path) -> str:
    """Every output of an executed notebook, as one text to search."""
    return json.dumps([c.get("outputs", []) for c in json.loads(path.read_text())["cells"]])


def assert_the_stray_was_never_read(path) -> None:
    """03-05 read the manifest, which never held the stray object: no image of its kind was decoded."""
    said = outputs_of(path)
    assert "txt images" not in said and "image_format='txt'" not in said


def test_01_uploads_the_smoke_set(client, bucket, tmp_path):
    facts = run("01", tmp_path, bucket=bucket, smoke_test_size=120)
    # 120 training images, 200 validation images (train/, from index 50,000), 400 test images
    assert facts["objects"] == 720 and facts["train objects"] == 320 and facts["test objects"] == 400
    # the first image went up alone (put_object), the other 719 in parallel; the second run sends nothing
    assert facts["uploaded in parallel"] == 719 and facts["uploaded on the second run"] == 0
    keys = listing.list_objects_parallel(bucket, client=client)
    assert len(keys) == len(set(keys)) == 720


def test_02_runs_first_and_alone_and_splits_and_names_a_stray_object_once(client, bucket, tmp_path):
    with_a_stray(client, bucket)  # no image in the bucket yet: 02 uploads them itself
    facts = run("02", tmp_path, bucket=bucket, smoke_test_size=60)
    said = outputs_of(tmp_path / "02_list_and_split.ipynb")
    assert "Skipped 1 object in bucket" in said and "'train/notes.txt'" in said
    assert (facts["train pointers"], facts["test pointers"]) == (160, 200)  # 60 + 100 validation; 200 test
    assert facts["first pointer in key order"] == "train/0/00001.png" and facts["its label"] == 0  # key-sorted
    smoke = (facts["smoke train pointers"], facts["smoke validation pointers"], facts["smoke test pointers"])
    assert smoke == (60, 100, 200)
    assert facts["validation pointers"] == 100  # ids 50,000 to 50,099: the same held out at every size
    assert facts["manifest listing s"] > 0
    assert len(listing.list_objects_from_manifest(bucket, client=client)) == 360


@pytest.mark.parametrize("parameters, message", [  # each bad value's message: tests/lessons/test_parameters.py
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


def test_03_preprocesses_with_tasks_actors_and_both_readers(client, bucket, tmp_path):
    with_a_stray(client, bucket, 450)
    facts = run("03", tmp_path, bucket=bucket, smoke_test_size=450, batch_size=400)
    assert_the_stray_was_never_read(tmp_path / "03_ray_data_preprocessing.ipynb")
    assert facts["pointers"] == 450 and facts["torch batches"] == 2
    assert facts["preprocessing batches"] >= 4  # 450 rows in batches of 400: two or more each for tasks and actors
    assert facts["batch shape"] == [400, 1, 28, 28]
    assert facts["rows (tasks / actors / read_images / parquet)"] == [450] * 4
    # the pid-stamped log: tasks ran in Ray's worker processes, and each of the two actors got batches
    assert facts["task processes"] >= 1 and facts["actor processes"] == 2
    assert all(facts[f"{name} images/s"] > 0 for name in ("tasks", "actors", "read_images", "parquet"))
    # exercise 2's answer: most pixels are background (-1), which pulls the mean far below 0
    said = solution_output(tmp_path / "03_ray_data_preprocessing.ipynb", 2)
    printed = re.fullmatch(r"mean (-?[\d.]+); background \(-1\.0\): (\d+)% of the pixels", said.strip())
    mean, background = printed.groups()
    assert float(mean) < -0.5 and int(background) > 50, said
    # exercise 3's answer: the learner's step after the actors is an operator of its own, not fused into them
    said = solution_output(tmp_path / "03_ray_data_preprocessing.ipynb", 3)
    operators = ast.literal_eval(said.split("operators that ran: ", 1)[1].strip())  # the printed list of names
    assert any(name.endswith(" MapBatches(ObjectPreprocessor)") for name in operators), operators
    assert any(name.endswith(" MapBatches(drop_faint)") for name in operators), operators


def test_04_trains_tracks_and_tests_and_resumes_after_a_killed_worker(client, bucket, tmp_path, settings,
                                                                       monkeypatch):
    import mlflow
    from mlflow.tracking import MlflowClient

    from helpers import timings, tracking

    monkeypatch.setenv(timings.TIMINGS_ENV, str(tmp_path / "spans.jsonl"))  # what bench_smoke.py reads
    # README's fault demo: fail_at_epoch = 7 at the defaults (10 epochs, a checkpoint every 5)
    with_a_stray(client, bucket, 300)
    facts = run("04", tmp_path, bucket=bucket, smoke_test_size=300, hidden_sizes=[64], fail_at_epoch=7)
    assert_the_stray_was_never_read(tmp_path / "04_distributed_training.ipynb")
    spans = timings.read(tmp_path / "spans.jsonl")
    labels = {s["label"] for s in spans}
    assert {"kernel start + imports", "ray start", "load: list + fetch + decode", "training"} <= labels
    assert not [s for s in spans if s["label"].startswith("train: ")], "the taught loop holds no timer"
    # A checkpoint at epoch 5 (and 10); the fault comes in epoch 7, so the run went back to epoch 5: the
    # history in the last checkpoint marks epoch 5 as where a restart began.
    assert facts["injected failure in epoch"] == 7 and facts["resumed from the checkpoint of epoch"] == 5
    assert facts["epochs"] == 10 and facts["last epoch loss"] < facts["first epoch loss"]
    # the paired test on the validation images: the last epoch against the older checkpoint kept (epoch 5's)
    assert facts["last epoch against the older checkpoint"] in ("better beyond noise", "a tie", "worse beyond noise")
    assert facts["test accuracy"] > 0.5 and facts["test images"] == 1000  # 300 training images (chance: 0.1)
    assert (facts["training images"], facts["validation images"]) == (300, 500)
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
                                "mnist-validation": (f"s3://{bucket}/train/", "500"),
                                "mnist-test": (f"s3://{bucket}/test/", "1000")})
    assert facts["accuracy through pyfunc"] == facts["test accuracy"]
    served = mlflow.pyfunc.load_model(facts["MLflow model"])  # the MLflow model, loaded outside the notebook
    images, labels = load_test_images(bucket, 1000)
    assert (served.predict(images).argmax(axis=1) == labels).mean() == pytest.approx(facts["test accuracy"], abs=1e-4)
    _assert_the_hardest_digit_answer(solution_output(tmp_path / "04_distributed_training.ipynb", 1), served, images,
                                     labels)


def _assert_the_hardest_digit_answer(said: str, served, images, labels) -> None:
    """04's exercise 1: the counts per digit, the hardest digit, and every digit tied as its most frequent error."""
    import numpy as np

    predictions = served.predict(images).argmax(axis=1)
    matrix = np.zeros((10, 10), dtype=int)
    np.add.at(matrix, (labels, predictions), 1)
    counts = matrix.sum(axis=1)
    assert f"test images per digit: {counts.tolist()}" in said, said
    hardest = int((matrix.diagonal() / counts.clip(min=1)).argmin())
    wrong = matrix[hardest].copy()
    wrong[hardest] = 0
    tied = [d for d in range(10) if wrong[d] == wrong.max() > 0]
    assert f"hardest: {hardest} (" in said and f"most often taken for: {tied} ({wrong.max()} times each)" in said, said


def test_05_keeps_the_known_good_point_unless_the_paired_test_finds_it_beaten(client, bucket, tmp_path, settings):
    """At the defaults (600 images, 8 trials of 10 epochs), with every exercise's solution."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from helpers import sweeps

    experiment = f"t-05-{bucket[2:12]}"
    with_a_stray(client, bucket, 600)
    facts = run("05", tmp_path, bucket=bucket, experiment=experiment)
    assert_the_stray_was_never_read(tmp_path / "05_tune_sweeps.ipynb")
    assert facts["trials"] == 8 and facts["first trial is the known-good point"] is True
    # the starting point is one of the trials: the sweep's best is at least as good; it replaces the starting
    # point only when the paired test on the validation images (McNemar's) finds it better beyond noise
    assert facts["sweep's best val_accuracy"] >= facts["known-good val_accuracy"]
    verdict = facts["sweep's best against the known-good point"].rsplit(", ", 1)[-1]
    assert facts["clearly better than the known-good point"] is (verdict == "better beyond noise")
    if facts["clearly better than the known-good point"]:
        assert facts["chosen is the known-good point"] is False
        assert facts["chosen val_accuracy"] == facts["sweep's best val_accuracy"]
    else:
        assert verdict == "a tie" and facts["chosen is the known-good point"] is True
        assert facts["chosen val_accuracy"] == facts["known-good val_accuracy"]
    assert 0 < facts["test_accuracy"] <= 1
    assert facts["trials stopped early"] >= 1, "ASHA stops trials at its rungs"
    children = sweeps.child_runs(settings.mlflow_tracking_uri, facts["MLflow parent run id"])
    assert len(children) == facts["MLflow child runs"] == 8
    parent = MlflowClient(settings.mlflow_tracking_uri).get_run(facts["MLflow parent run id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.params["chosen_lr"] == str(facts["chosen config"]["lr"]) or \
        float(parent.data.params["chosen_lr"]) == pytest.approx(facts["chosen config"]["lr"], abs=1e-4)
    assert not [key for key in parent.data.params if key.startswith("best_")], "one name: the chosen configuration"
    assert parent.data.metrics["val_accuracy"] == pytest.approx(facts["chosen val_accuracy"], abs=1e-4)
    assert parent.data.metrics["test_accuracy"] == pytest.approx(facts["test_accuracy"], abs=1e-4)
    assert_lineage(parent, {"mnist-train": (f"s3://{bucket}/train/", "600"),
                            "mnist-validation": (f"s3://{bucket}/train/", "1000"),
                            "mnist-test": (f"s3://{bucket}/test/", "2000")})
    for child in children:
        assert_lineage(child, {"mnist-train": (f"s3://{bucket}/train/", "600"),
                               "mnist-validation": (f"s3://{bucket}/train/", "1000")})
    best = mlflow.pyfunc.load_model(facts["MLflow model"])
    images, labels = load_test_images(bucket, 2000)
    assert (best.predict(images).argmax(axis=1) == labels).mean() == pytest.approx(facts["test_accuracy"], abs=1e-4)
    # exercise 3: the median rule, comparing trials by epoch, stops something (the contrast it asks about)
    said = solution_output(tmp_path / "05_tune_sweeps.ipynb", 3)
    stopped = int(said.split("the median rule stopped ")[1].split(" of ")[0])
    assert stopped >= 1, said
    # ... and its answer names ASHA's rungs as the notebook printed them
    executed = json.loads((tmp_path / "05_tune_sweeps.ipynb").read_text())["cells"]
    printed = next(line for cell in executed for o in cell.get("outputs", [])
                   for line in "".join(o.get("text", "")).splitlines() if "rungs at epochs" in line)
    assert printed.endswith("rungs at epochs [3, 6]") and sweeps.asha_rungs(10) == [3, 6], printed
    answer = next("".join(c["source"]) for c in executed if "MedianStoppingRule(time_attr" in "".join(c["source"])
                  and c["cell_type"] == "markdown")
    assert "(3 and 6 at the defaults" in answer
    # exercise 2 correlates at the first rung, which every trial reached
    assert "with the accuracy after epoch 3:" in solution_output(tmp_path / "05_tune_sweeps.ipynb", 2)
