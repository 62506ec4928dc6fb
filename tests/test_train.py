"""Ray Train + MLflow end to end on the real local services."""

import dataclasses
import uuid

import pytest
import ray.train

from conftest import uploaded_bucket
from helpers import data, model, storage, tracking, train

SMOKE = 300
PARAMS = {"epochs": 5, "lr": 0.05, "momentum": 0.9, "hidden_sizes": [64], "batch_size_per_worker": 32}
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def train_bucket(client):
    with uploaded_bucket(client, "train", SMOKE) as name:
        yield name


@pytest.fixture(scope="module")
def trained(settings, train_bucket):
    return train.distributed_training(PARAMS, num_workers=2, bucket=train_bucket, smoke_test_size=SMOKE,
                                      experiment="tests-train", settings=settings, verbose=False)


def test_loss_goes_down_over_epochs(trained):
    assert [row["epoch"] for row in trained.history] == [0, 1, 2, 3, 4]
    assert trained.history[0]["train_loss"] > trained.history[-1]["train_loss"]
    assert all(row["samples"] == SMOKE for row in trained.history)  # both workers' shards, all-reduced


def test_reported_accuracy_equals_accuracy_recomputed_from_the_stored_checkpoint(trained, settings):
    path = trained.checkpoint_uri.removeprefix("s3://")
    net, state = train.load_checkpoint(ray.train.Checkpoint(path, filesystem=data.s3_filesystem(settings)))
    assert state["epoch"] == 4
    recomputed = model.accuracy(model.predict(net, trained.test_images), trained.test_labels)
    assert recomputed == trained.test_accuracy
    assert trained.test_accuracy > 0.6  # smoke floor: 300 images, 5 epochs
    assert len(trained.test_labels) == 50


def test_checkpoint_is_in_the_bucket(trained, client, train_bucket):
    keys = storage.get_object_list(train_bucket, client=client)
    mine = [k for k in keys if k.startswith(f"ray-results/{trained.run_name}/") and k.endswith(train.CHECKPOINT_FILE)]
    assert mine, "a checkpoint file under the run's prefix"
    assert any(trained.checkpoint_uri.endswith(k.rsplit("/", 1)[0]) for k in mine), "the result's checkpoint"


def test_mlflow_run_has_params_one_value_per_epoch_and_artifacts(trained, settings):
    uri, run_id = settings.mlflow_tracking_uri, trained.mlflow_run_id
    client = tracking._client(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["lr"] == "0.05" and run.data.params["epochs"] == "5"
    assert run.data.params["num_workers"] == "2"
    for key in ("train_loss", "train_accuracy"):
        assert [step for step, _ in tracking.metric_history(uri, run_id, key)] == [0, 1, 2, 3, 4]
    logged = [value for _, value in tracking.metric_history(uri, run_id, "train_loss")]
    assert logged == pytest.approx([row["train_loss"] for row in trained.history])
    assert run.data.metrics["test_accuracy"] == pytest.approx(trained.test_accuracy)
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    artifacts |= {a.path for a in client.list_artifacts(run_id, "model")}
    assert {"confusion_matrix.png", "model/checkpoint.pt"} <= artifacts
    assert run.data.tags["checkpoint"] == trained.checkpoint_uri


def test_a_killed_worker_resumes_from_the_checkpoint(settings, train_bucket, tmp_path):
    marker = tmp_path / "failed-once"
    result = train.distributed_training(
        PARAMS, num_workers=2, bucket=train_bucket, smoke_test_size=SMOKE, experiment="tests-train-fault",
        fault={"fail_at_epoch": 1, "fail_rank": 1, "fail_marker": str(marker)}, settings=settings, verbose=False)
    assert marker.exists(), "the fault fired"
    assert [row["epoch"] for row in result.history] == [0, 1, 2, 3, 4]
    steps = [step for step, _ in tracking.metric_history(settings.mlflow_tracking_uri, result.mlflow_run_id,
                                                         "train_loss")]
    assert steps == [0, 1, 2, 3, 4], "every epoch logged exactly once"


def test_training_goes_on_when_mlflow_is_unreachable(settings, train_bucket, capsys):
    offline = dataclasses.replace(settings, mlflow_tracking_uri="http://127.0.0.1:9")
    result = train.distributed_training({**PARAMS, "epochs": 1}, num_workers=1, bucket=train_bucket,
                                        smoke_test_size=SMOKE, settings=offline, verbose=False)
    out = capsys.readouterr().out
    assert out.count("MLflow tracking is off") == 1 and "127.0.0.1:9" in out
    assert result.mlflow_run_id is None and result.mlflow_url == ""
    assert len(result.history) == 1 and 0 < result.test_accuracy <= 1


def test_rest_variant_logs_into_the_same_run(settings):
    run = tracking.start_run(settings.mlflow_tracking_uri, "tests-rest", "rest", {"a": 1})
    tracking.log_metric_rest(run.uri, run.run_id, "loss", 0.5, step=3)
    assert tracking.metric_history(run.uri, run.run_id, "loss") == [(3, 0.5)]
    with pytest.raises(RuntimeError, match="refused"):
        tracking.log_metric_rest(run.uri, "no-such-run", "loss", 0.5)
    run.end()


def test_run_names_are_unique_and_resources_never_take_every_cpu():
    assert len({train.unique_run_name() for _ in range(200)}) == 200
    assert train.worker_resources(2, False, 2.0) == {"CPU": 0.5}
    assert train.worker_resources(2, False, 16.0) == {"CPU": 1.0}
    assert train.worker_resources(1, True, 8.0) == {"CPU": 1.0, "GPU": 1.0}


def test_bad_parameters_are_one_clear_error():
    with pytest.raises(train.ParameterError, match="optimizer"):
        train.make_optimizer("rmsprop", [], 0.1, 0.9)
    with pytest.raises(model.ParameterError, match="activation"):
        model.MNISTModel(activation="gelu")


def test_training_data_is_shuffled_not_sorted_by_label(settings, client):
    name = f"t-order-{uuid.uuid4().hex[:8]}"
    storage.upload_mnist(name, 600, client=client, progress=False)
    try:
        x, y, *_ = storage.get_train_test_data(name, client=client)  # key order: all zeros first
        assert y[:50] == [0] * 50
        train_ds, _ = train.load_datasets(name, 0, settings)
        _, labels = train.dataset_to_numpy(train_ds)
        assert len(set(labels[:60].tolist())) >= 8, "the first batch holds most digits"
        assert sorted(labels.tolist()) == sorted(y)
    finally:
        storage.delete_bucket(client, name)
