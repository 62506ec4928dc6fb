"""Ray Train + MLflow end to end on the real local services, with notebook 04's exported code."""

import dataclasses
import os
import re
import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest
import ray.train
from mlflow.tracking import MlflowClient

from helpers import cluster, interrupts, listing, preprocess, storage, tracking, training, upload
from tests.suite.mnist_buckets import uploaded_bucket
from tests.suite.session import assert_ctrl_c_interrupts
from workshop import stack_ports

SMOKE = 300
PARAMS = {**training.DEFAULT_PARAMS, "epochs": 5, "hidden_sizes": [64], "batch_size_per_worker": 32}
pytestmark = pytest.mark.slow


@dataclasses.dataclass
class Trained:
    run_name: str
    run_id: str | None
    history: list
    checkpoint_uri: str
    test_accuracy: float
    test_images: object
    test_labels: object
    fault_marker: object = None


def train_and_test(settings, bucket, params, num_workers=2, experiment="tests-train", run_id=None, **extra):
    """Notebook 04's driver: an MLflow run, make_trainer + fit, the model loaded back and tested."""
    resources = cluster.init_ray(settings)
    train_ds, val_ds, test_ds = preprocess.load_datasets(bucket, SMOKE, settings)
    client = MlflowClient(settings.mlflow_tracking_uri)
    run_name = training.unique_run_name("test")
    if run_id is None:
        run_id = client.create_run(tracking.experiment_id(client, experiment), run_name=run_name).info.run_id
        client.log_batch(run_id, params=tracking.as_params({**params, "num_workers": num_workers}))
    config = {**params, "validate": True, "tracking_uri": settings.mlflow_tracking_uri, "run_id": run_id, **extra}
    trainer = training.make_trainer(config, {"train": train_ds, "validation": val_ds}, num_workers, run_name,
                                    f"{bucket}/ray-results", cluster_cpus=resources["CPU"], settings=settings)
    with interrupts.stop_cleanly("Training", trainer=trainer):
        result = trainer.fit()
    net, state = training.load_checkpoint(result.checkpoint)
    images, labels = preprocess.dataset_to_numpy(test_ds)
    accuracy = training.accuracy(training.predict(net, images), labels)
    return Trained(run_name, run_id, state["history"], f"s3://{result.checkpoint.path}", accuracy, images, labels)


@pytest.fixture(scope="module")
def train_bucket(client):
    with uploaded_bucket(client, "train", SMOKE) as name:
        yield name


@pytest.fixture(scope="module")
def trained(settings, train_bucket, tmp_path_factory):
    """The module's one training run, through a fault: rank 1 dies in epoch 4 of 5, a checkpoint every 2 epochs.

    The run goes back to epoch 2's checkpoint. Rank 0 logs each epoch to MLflow as it ends, so epoch 3
    (run twice) is logged once, by the first run, and epoch 4 by the second. The shards are cached: the
    restarted workers stream their first epoch (3) again and train from memory after it. Every test of the
    module checks the run's end state.
    """
    marker = tmp_path_factory.mktemp("fault") / "failed-once"
    result = train_and_test(settings, train_bucket, {**PARAMS, "checkpoint_every": 2, "cache_shard": True},
                            fail_at_epoch=4, fail_rank=1, fail_marker=str(marker))
    return dataclasses.replace(result, fault_marker=marker)


def test_loss_goes_down_over_epochs(trained):
    assert [row["epoch"] for row in trained.history] == [1, 2, 3, 4, 5]  # epochs count from 1
    assert trained.history[0]["train_loss"] > trained.history[-1]["train_loss"]
    assert all(row["samples"] == SMOKE for row in trained.history)  # both workers' shards, all-reduced
    assert all(0 < row["val_accuracy"] <= 1 for row in trained.history)  # on notebook 02's validation images


def test_ctrl_c_interrupts_again_after_a_fit(trained):
    # fit() leaves Ray Train's own handler installed, which would abort the ended run instead
    assert_ctrl_c_interrupts()


def test_reported_accuracy_equals_accuracy_recomputed_from_the_stored_checkpoint(trained, settings):
    path = trained.checkpoint_uri.removeprefix("s3://")
    net, state = training.load_checkpoint(ray.train.Checkpoint(path, filesystem=storage.s3_filesystem(settings)))
    assert state["epoch"] == 5 and state["params"]["hidden_sizes"] == [64]
    recomputed = training.accuracy(training.predict(net, trained.test_images), trained.test_labels)
    assert recomputed == trained.test_accuracy
    assert trained.test_accuracy >= 0.5  # smoke floor, 300 training images and 5 epochs (chance: 0.1)
    assert len(trained.test_labels) == 1000


def test_checkpoint_is_in_the_bucket(trained, client, train_bucket):
    keys = listing.get_object_list(train_bucket, client=client)
    mine = [k for k in keys if k.startswith(f"ray-results/{trained.run_name}/")
            and k.endswith(training.CHECKPOINT_FILE)]
    assert mine, "a checkpoint file under the run's prefix"
    assert any(trained.checkpoint_uri.endswith(k.rsplit("/", 1)[0]) for k in mine), "the result's checkpoint"


def test_rank_0_logs_one_value_per_epoch_into_the_drivers_run(trained, settings):
    uri, run_id = settings.mlflow_tracking_uri, trained.run_id
    run = MlflowClient(uri).get_run(run_id)
    assert run.data.params["lr"] == str(PARAMS["lr"]) and run.data.params["epochs"] == "5"
    assert run.data.params["num_workers"] == "2" and run.data.params["hidden_sizes"] == "[64]"
    for key in ("train_loss", "train_accuracy"):
        assert [step for step, _ in tracking.metric_history(uri, run_id, key)] == [1, 2, 3, 4, 5]
    logged = dict(tracking.metric_history(uri, run_id, "train_loss"))
    # epoch 3 ran twice (the resume went back to epoch 2): MLflow keeps the value logged as it first ended
    kept = {row["epoch"]: row["train_loss"] for row in trained.history if row["epoch"] != 3}
    assert {step: logged[step] for step in kept} == pytest.approx(kept)
    stamps = [m.timestamp for m in sorted(MlflowClient(uri).get_metric_history(run_id, "train_loss"),
                                          key=lambda m: m.step)]
    assert stamps == sorted(set(stamps)), "each epoch logged as it ended, one call per epoch"


def test_each_worker_logs_its_own_system_metrics_into_the_drivers_run(trained, settings):
    from helpers import worker_metrics

    client = MlflowClient(settings.mlflow_tracking_uri)
    names = [k for k in client.get_run(trained.run_id).data.metrics if k.startswith("system/")]
    workers = {name.split("/")[1] for name in names}
    assert len(workers) == 2 and all(re.fullmatch(r"rank[01]-[0-9a-f]{8}", w) for w in workers), workers
    for worker in workers:  # MLflow's own machine metrics and this worker's process, each under its id
        assert {f"system/{worker}/cpu_utilization_percentage", f"system/{worker}/system_memory_usage_megabytes",
                *(f"system/{worker}/{key}" for key in worker_metrics.PROCESS_KEYS)} <= set(names)
    series = worker_metrics.per_worker(client, trained.run_id)
    memory = series["process_memory_rss_megabytes"]
    assert set(memory) == workers and all(points and 50 < points[-1][1] < 20_000 for points in memory.values())


def test_checkpoints_at_the_cadence_and_always_after_the_last_epoch():
    due = [epoch for epoch in range(1, 8) if training.checkpoint_due(epoch, {"epochs": 7, "checkpoint_every": 3})]
    assert due == [3, 6, 7]
    assert [e for e in range(1, 4) if training.checkpoint_due(e, {"epochs": 3})] == [1, 2, 3]  # default: every epoch


def test_a_killed_worker_resumes_from_the_checkpoint(trained, settings):
    assert trained.fault_marker.exists(), "the fault fired"
    assert [row["epoch"] for row in trained.history] == [1, 2, 3, 4, 5]
    assert {row["samples"] for row in trained.history} == {SMOKE}  # every epoch, every row, also after the restart
    assert trained.history[-1]["train_loss"] < trained.history[0]["train_loss"]
    steps = [step for step, _ in tracking.metric_history(settings.mlflow_tracking_uri, trained.run_id, "train_loss")]
    assert steps == [1, 2, 3, 4, 5], "every epoch logged exactly once"
    assert [row["epoch"] for row in trained.history if row.get("resumed_from_here")] == [2], "where it resumed"


def test_a_cached_shard_gives_later_epochs_the_same_rows_in_a_new_order_without_ray_data(settings):
    import ray.data
    import torch

    from helpers.training_support import ShardCache

    cluster.init_ray(settings)
    shard = ray.data.from_items([{"X": np.full(4, i, np.float32), "y": i} for i in range(50)])
    stream = lambda: shard.iter_torch_batches(batch_size=8)  # noqa: E731
    rows = lambda batches: torch.cat([b["y"] for b in batches]).tolist()  # noqa: E731
    cache = ShardCache({"cache_shard": True, "batch_size_per_worker": 8})
    first = list(cache.epoch(stream(), seed=2))
    assert sorted(rows(first)) == list(range(50))
    x, y = cache.rows
    assert torch.equal(x[:, 0].long(), y) and sorted(y.tolist()) == list(range(50))

    def refused():  # a stream that fails if a cached epoch ever starts it
        raise AssertionError("a cached epoch asked Ray Data for batches")
        yield

    second = list(cache.epoch(refused(), seed=3))
    assert sorted(rows(second)) == list(range(50)) and rows(second) != rows(first)
    assert [len(b["y"]) for b in second] == [8] * 6 + [2]
    assert all(torch.equal(b["X"][:, 0].long(), b["y"]) for b in second)  # images stay with their labels
    assert rows(cache.epoch(refused(), seed=3)) == rows(second)  # seeded by epoch
    assert rows(cache.epoch(refused(), seed=4)) != rows(second)
    off = ShardCache({"cache_shard": False, "batch_size_per_worker": 8})
    assert sorted(rows(list(off.epoch(stream(), seed=2)))) == list(range(50)) and off.rows is None
    assert sorted(rows(list(off.epoch(stream(), seed=3)))) == list(range(50))  # streamed again


def test_rest_variant_logs_into_the_same_run(settings):
    uri = settings.mlflow_tracking_uri
    client = tracking.connect(uri)
    run_id = client.create_run(tracking.experiment_id(client, "tests-rest"), run_name="rest").info.run_id
    training.log_metric_rest(uri, run_id, "loss", 0.5, step=3)
    assert tracking.metric_history(uri, run_id, "loss") == [(3, 0.5)]
    with pytest.raises(RuntimeError, match="refused"):
        training.log_metric_rest(uri, "no-such-run", "loss", 0.5)
    client.set_terminated(run_id)


def test_a_refused_log_turns_worker_logging_off_with_one_line(settings, capsys):
    client = MlflowClient(settings.mlflow_tracking_uri)
    assert training.log_epochs(client, "no-such-run", [{"epoch": 0, "train_loss": 1.0}]) is False
    assert capsys.readouterr().out.count("MLflow tracking is off") == 1
    assert training.worker_mlflow_client({"run_id": "x", "tracking_uri": "http://127.0.0.1:9"}, 0) is None
    assert "127.0.0.1:9" in capsys.readouterr().out
    assert training.worker_mlflow_client({"run_id": "x", "tracking_uri": settings.mlflow_tracking_uri}, 1) is None
    with pytest.raises(tracking.TrackingUnavailable, match="127.0.0.1:9.*python -m workshop.stack up"):
        tracking.connect("http://127.0.0.1:9")


def test_parallel_runs_can_log_the_same_dataset(settings):
    from concurrent.futures import ThreadPoolExecutor

    client = MlflowClient(settings.mlflow_tracking_uri)
    experiment = tracking.experiment_id(client, f"tests-datasets-{uuid.uuid4().hex[:6]}")
    runs = [client.create_run(experiment).info.run_id for _ in range(8)]
    source = f"s3://t-{uuid.uuid4().hex[:6]}/train/"  # new to the server: every run inserts it at once
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda run_id: training.log_dataset(client, run_id, "mnist-train", source, 60, "training"), runs))
    for run_id in runs:
        (logged,) = client.get_run(run_id).inputs.dataset_inputs
        assert logged.dataset.name == "mnist-train" and source in logged.dataset.source
        assert {t.key: t.value for t in logged.tags} == {"mlflow.data.context": "training", "objects": "60"}


def test_run_names_are_unique_and_resources_never_take_every_cpu():
    assert len({training.unique_run_name() for _ in range(200)}) == 200
    assert training.worker_resources(2, False, 2.0) == {"CPU": 0.5}
    assert training.worker_resources(2, False, 16.0) == {"CPU": 1.0}
    assert training.worker_resources(1, True, 8.0) == {"CPU": 1.0, "GPU": 1.0}


def test_bad_parameters_are_one_clear_error():
    with pytest.raises(training.ParameterError, match="optimizer"):
        training.make_optimizer("rmsprop", [], 0.1, 0.9)
    with pytest.raises(training.ParameterError, match="activation"):
        training.MNISTModel(activation="gelu")
    with pytest.raises(training.ParameterError, match="model"):
        training.build_model("transformer")


def test_training_data_is_shuffled_not_sorted_by_label(settings, client):
    name = f"t-order-{uuid.uuid4().hex[:8]}"
    upload.upload_mnist(name, 600, client=client, progress=False)
    try:
        x, y, *_ = listing.get_train_test_data(name, client=client)  # key order: all zeros first
        assert y[:50] == [0] * 50
        cluster.init_ray(settings)  # load_datasets reads on the caller's Ray
        train_ds, _, _ = preprocess.load_datasets(name, 0, settings)
        _, labels = preprocess.dataset_to_numpy(train_ds)
        assert len(set(labels[:60].tolist())) >= 8, "the first batch holds most digits"
        assert sorted(labels.tolist()) == sorted(listing.split_validation(x, y)[0][1])  # validation held out
    finally:
        storage.delete_bucket(client, name)


# --- hardening: bounded tracking, runs that always end, bad parameters before any work -----------------------


def test_mlflow_calls_give_up_in_seconds_when_the_server_is_gone():
    import time

    assert tracking.bounded_requests()["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"
    started = time.monotonic()
    with pytest.raises(Exception, match="127.0.0.1:9"):
        MlflowClient("http://127.0.0.1:9").get_metric_history("some-run", "train_loss")
    assert time.monotonic() - started < 30  # MLflow's defaults: 7 retries, backoff factor 2, minutes


@pytest.mark.timeout(400)
def test_mlflow_killed_mid_training_loses_nothing(settings, train_bucket, tmp_path, capsys):
    """MLflow dies after the first epoch is logged, then the worker in the last epoch: the training result is whole.

    The restarted worker starts with MLflow unreachable (its check says so in one line and it trains on).
    """
    import threading
    import time

    from workshop import stack

    state = tmp_path / "stack"
    session = os.environ.get("STACK_STATE_DIR")
    if session:  # the login this process and its Ray workers already send (MLflow reads it from the environment)
        state.mkdir(mode=0o700)
        shutil.copy(Path(session) / "mlflow-auth.json", state / "mlflow-auth.json")
    stack.up(state, ports=stack_ports.free_ports(list(stack_ports.DEFAULT_PORTS)), with_lakefs=False, with_ray=False)
    try:
        private = dataclasses.replace(settings, mlflow_tracking_uri=load_private_uri(state))
        client = MlflowClient(private.mlflow_tracking_uri)
        run_id = client.create_run(tracking.experiment_id(client, "tests-outage")).info.run_id
        killed, killed_at = threading.Event(), []

        def kill_after_the_first_epoch() -> None:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and not killed.is_set():
                try:
                    if client.get_metric_history(run_id, "train_loss"):
                        stack.kill_service("mlflow", state)
                        killed_at.append(time.time())
                        killed.set()
                        return
                except Exception:  # noqa: BLE001 - the run is still being created
                    pass
                time.sleep(0.2)

        watcher = threading.Thread(target=kill_after_the_first_epoch, daemon=True)
        watcher.start()
        marker = tmp_path / "failed-once"
        result = train_and_test(private, train_bucket, {**PARAMS, "epochs": 8}, num_workers=1, run_id=run_id,
                                fail_at_epoch=8, fail_rank=0, fail_marker=str(marker))
        watcher.join(timeout=5)
        assert killed.is_set(), "MLflow was killed while training ran"
        assert marker.exists(), "the worker died too"
        # Its restart (a new worker group: 6 s and more after the fault) came after MLflow was gone.
        assert killed_at[0] < marker.stat().st_mtime + 5, "MLflow was still up when the worker restarted"
        assert [row["epoch"] for row in result.history] == list(range(1, 9))  # the training result is whole
        assert 0 < result.test_accuracy <= 1
        capsys.readouterr()
        assert tracking.still_up(private.mlflow_tracking_uri) is False
        assert tracking.still_up(private.mlflow_tracking_uri) is False
        said = capsys.readouterr().out
        assert said.count("MLflow tracking is off from here on") == 1 and "training result is kept" in said
    finally:
        stack.down(state)


def load_private_uri(state) -> str:
    from helpers.settings import load_settings

    return load_settings(environ={}, stack_state=state).mlflow_tracking_uri


def test_a_run_ends_failed_on_an_error_and_killed_on_an_interrupt(settings):
    client = MlflowClient(settings.mlflow_tracking_uri)
    experiment = tracking.experiment_id(client, "tests-end")
    for error, status in ((None, "FINISHED"), (ValueError("x"), "FAILED"), (KeyboardInterrupt(), "KILLED"),
                          (SystemExit(0), "FINISHED"), (SystemExit(1), "KILLED")):  # SystemExit(0): Tune's early stop
        run_id = client.create_run(experiment).info.run_id
        tracking.end_run(client, run_id, error)
        assert client.get_run(run_id).info.status == status
    tracking.end_run(MlflowClient("http://127.0.0.1:9"), "gone", ValueError("x"))  # an outage never hides the error


def test_only_a_run_an_outage_stopped_with_the_same_parameters_is_resumed(settings):
    """04 run again beside finished and failed runs of the same parameters starts a run of its own: only one an
    object-store outage tagged, with equal parameters, is reopened (the rerun nbval's second run used to guard)."""
    client = MlflowClient(settings.mlflow_tracking_uri)
    experiment = tracking.experiment_id(client, f"tests-resume-{uuid.uuid4().hex[:6]}")
    params = {"epochs": 10, "lr": 0.003, "num_workers": 2}

    def run_with(error, logged) -> str:
        run_id = client.create_run(experiment).info.run_id
        client.log_batch(run_id, params=tracking.as_params(logged))
        tracking.end_run(client, run_id, error)
        return run_id

    run_with(None, params)  # finished: 04's earlier run, as nbval's first run leaves it
    run_with(ValueError("a bug"), params)  # failed, not by an outage
    assert tracking.interrupted_run(client, experiment, params) is None
    outage = RuntimeError("Worker failed: AWS Error NETWORK_CONNECTION during PutObject operation: curlCode: 7, "
                          "Couldn't connect to server")  # what Ray Train reports when the store stops answering
    assert storage.outage_during(outage) is not None
    run_with(outage, {**params, "epochs": 20})  # an outage, other parameters
    assert tracking.interrupted_run(client, experiment, params) is None
    stopped = run_with(outage, params)
    assert tracking.interrupted_run(client, experiment, params).info.run_id == stopped


@pytest.mark.parametrize("change, message", [
    ({"epochs": 0}, "epochs=0 is out of range"),
    ({"epochs": "3"}, "epochs must be a whole number"),
    ({"lr": -0.1}, "lr=-0.1 is out of range"),
    ({"lr": float("nan")}, "lr must be a number above 0"),
    ({"momentum": 1.5}, "momentum must be a number from 0"),
    ({"batch_size_per_worker": 0}, "batch_size_per_worker=0 is out of range"),
    ({"checkpoint_every": 0}, "checkpoint_every=0 is out of range"),
    ({"cache_shard": "yes"}, "cache_shard must be True or False, not 'yes'"),
    ({"hidden_sizes": []}, "hidden_sizes must be a list"),
    ({"hidden_sizes": [64, 0]}, "each of hidden_sizes=0"),
    ({"optimizer": "rmsprop"}, "optimizer must be"),
    ({"model": "resnet"}, "model must be"),
    ({"activation": "gelu"}, "activation must be"),
    ({"dropout": 1.0}, "dropout must be"),
    ({"seed": -1}, "seed=-1 is out of range"),
])
def test_bad_training_parameters_fail_before_any_run(change, message):
    with pytest.raises(training.ParameterError, match=message):
        training.check_params({**PARAMS, **change})
    with pytest.raises(training.ParameterError, match=message):
        training.make_trainer({**PARAMS, **change}, {}, 1, "x", "b/p", settings=None)


def test_bad_worker_counts_and_a_gpu_that_is_not_there(settings):
    cluster.init_ray(settings)
    for workers in (0, -2, "2"):
        with pytest.raises(training.ParameterError, match="num_workers"):
            training.make_trainer(PARAMS, {}, workers, "x", "b/p", settings=settings)
    with pytest.raises(training.ParameterError, match="use_gpu=True needs 2 GPUs.*this Ray has 0"):
        training.make_trainer(PARAMS, {}, 2, "x", "b/p", use_gpu=True, settings=settings)  # Ray would wait for ever


@pytest.mark.timeout(500)
def test_an_object_store_outage_mid_training_is_one_line_and_the_rerun_resumes_from_the_last_checkpoint(
        settings, train_bucket, tmp_path):
    """The store that holds the checkpoints dies while notebook 04's fit runs, then comes back.

    The fit ends in one line naming the store and the fix; the same cells run again reopen the stopped
    run, Ray Train restores its last checkpoint from the bucket, and MLflow holds every epoch once.
    """
    import threading
    import time

    from helpers import interrupts, notebook
    from helpers.settings import load_settings
    from workshop import stack

    state = tmp_path / "store"
    stack.up(state, ports=stack_ports.free_ports(list(stack_ports.DEFAULT_PORTS)), with_mlflow=False, with_lakefs=False,
             with_ray=False)
    try:
        private = load_settings(environ={}, stack_state=state)  # the checkpoints' store; the data stays in memory
        storage.ensure_bucket(storage.get_client(private), "ckpt")
        resources = cluster.init_ray(settings)
        train_ds, _, _ = preprocess.load_datasets(train_bucket, SMOKE, settings)
        client = MlflowClient(settings.mlflow_tracking_uri)
        experiment = tracking.experiment_id(client, f"tests-store-outage-{uuid.uuid4().hex[:6]}")
        params = {**PARAMS, "epochs": 60, "checkpoint_every": 2}
        logged = {**params, "num_workers": 2}

        made = {}

        def fit_like_notebook_04():
            """Notebook 04's cells: reopen an interrupted run or create one, then make_trainer and fit."""
            interrupted = tracking.interrupted_run(client, experiment, logged)
            if interrupted:
                run_id, run_name = tracking.resume_run(client, interrupted)
            else:
                run_name = training.unique_run_name("outage")
                run_id = client.create_run(experiment, run_name=run_name).info.run_id
                client.log_batch(run_id, params=tracking.as_params(logged))
            config = {**params, "tracking_uri": settings.mlflow_tracking_uri, "run_id": run_id}
            trainer = training.make_trainer(config, {"train": train_ds}, 2, run_name, "ckpt/ray-results",
                                            cluster_cpus=resources["CPU"], settings=private)
            made["trainer"] = trainer
            try:
                with interrupts.stop_cleanly("Training", trainer=trainer):
                    return run_id, trainer.fit()
            except BaseException as error:
                tracking.mark_resumable(client, run_id, error)
                client.set_terminated(run_id, status=tracking.end_status(error))
                raise

        def kill_once_epoch_four_is_checkpointed() -> None:  # as Ray Train recorded it, in the bucket
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                if "trainer" in made and (interrupts.latest_checkpoint_epoch(made["trainer"]) or 0) >= 4:
                    stack.kill_service("seaweedfs", state)
                    return
                time.sleep(0.1)

        watcher = threading.Thread(target=kill_once_epoch_four_is_checkpointed, daemon=True)
        watcher.start()
        with pytest.raises(Exception) as failed:
            fit_like_notebook_04()
        watcher.join(timeout=5)
        assert notebook.user_error_line(failed.value) == (
            f"ObjectStoreUnreachable: The object store at {private.s3_url} stopped answering during training. "
            "Start it again (`python -m workshop.stack up`), then run the cells again: a training run resumes "
            "from its last checkpoint in the bucket, a sweep starts over.")
        stopped = client.search_runs([experiment])[0]
        assert stopped.info.status == "FAILED" and stopped.data.tags[tracking.RESUMABLE_TAG] == "true"

        stack.up(state, with_mlflow=False, with_lakefs=False, with_ray=False)  # the store is back
        run_id, result = fit_like_notebook_04()
        assert run_id == stopped.info.run_id, "the stopped run was reopened, not a new one started"
        _, saved = training.load_checkpoint(result.checkpoint)
        resumed = [row["epoch"] for row in saved["history"] if row.get("resumed_from_here")]
        assert resumed and resumed[-1] >= 4 and resumed[-1] % 2 == 0, "resumed from a checkpoint, not from scratch"
        assert [row["epoch"] for row in saved["history"]] == list(range(1, 61))
        steps = [step for step, _ in tracking.metric_history(settings.mlflow_tracking_uri, run_id, "train_loss")]
        assert steps == list(range(1, 61)), "every epoch logged once across the outage"
        assert client.get_run(run_id).info.status == "RUNNING"  # the notebook's later cells end it
    finally:
        stack.down(state)


def test_an_accuracy_s_interval_is_wilson_s():
    """One accuracy's uncertainty; two models are compared by the paired test (tests/lessons/test_comparisons.py)."""
    low, high = training.accuracy_interval(0.9, 100)
    assert (round(low, 4), round(high, 4)) == (0.8256, 0.9448)  # the Wilson score interval, z = 1.96
    assert training.accuracy_interval(1.0, 50)[1] == pytest.approx(1.0) and training.accuracy_interval(0.0, 0) == (0, 1)
    assert training.with_interval(0.9, 100) == "90.00% (95% interval 82.6%-94.5%, 100 images)"
