"""Ray Tune sweeps on the real local Ray, object store and MLflow, with notebook 05's exported code."""

import contextlib
import io
from types import SimpleNamespace

import pytest
from mlflow.tracking import MlflowClient

from helpers import cluster, interrupts, listing, sweeps, tracking, training
from tests.suite.mnist_buckets import uploaded_bucket
from tests.suite.session import assert_ctrl_c_interrupts
from workshop import stack_ports

SMOKE = 300
BAD = {"lr": 0.00001, "dropout": 0.3, "batch_size_per_worker": 64}  # barely learns: ASHA stops it
pytestmark = pytest.mark.slow


def run_sweep(settings, bucket, arrays, num_samples, max_concurrent, searcher="hyperopt", scheduler="asha",
              epochs=4, points=(sweeps.KNOWN_GOOD,), num_workers=0, experiment="tests-tune"):
    """Notebook 05's sweep: a parent run, the trainable, make_tuner, fit, the best trial restored and tested."""
    resources = cluster.init_ray(settings)
    client = MlflowClient(settings.mlflow_tracking_uri)
    name = training.unique_run_name("sweep")
    parent = client.create_run(tracking.experiment_id(client, experiment), run_name=name).info.run_id
    trainable, extra = sweeps.make_trainable(arrays, num_workers, max_concurrent, resources["CPU"],
                                             f"{bucket}/tune-results/{name}-train")
    space = {**sweeps.search_space(), "epochs": epochs, "seed": 0, "experiment": experiment,
             "tracking_uri": settings.mlflow_tracking_uri, "parent_run_id": parent, **extra}
    tuner = sweeps.make_tuner(trainable, space, sweeps.make_searcher(searcher, list(points), 0),
                              sweeps.make_scheduler(scheduler, epochs), num_samples, max_concurrent, name,
                              f"{bucket}/tune-results", settings)
    with contextlib.redirect_stdout(io.StringIO()), interrupts.stop_cleanly("The sweep", tuner=tuner):
        results = tuner.fit()
    client.set_terminated(parent)
    assert not results.errors, results.errors
    best = results.get_best_result(metric=sweeps.METRIC, mode=sweeps.MODE, scope="last")  # as notebook 05
    net, _ = training.load_checkpoint(sweeps.last_checkpoint(best, settings))
    history = {r.metrics["trial_id"]: list(zip(r.metrics_dataframe["training_iteration"].astype(int),
                                               r.metrics_dataframe[sweeps.METRIC], strict=True)) for r in results}
    return SimpleNamespace(table=results.get_dataframe(), history=history, parent_run_id=parent,
                           best_validation_accuracy=float(best.metrics[sweeps.METRIC]),
                           restored_validation_accuracy=training.accuracy(training.predict(net, arrays["x_val"]),
                                                                          arrays["y_val"]),
                           test_accuracy=training.accuracy(training.predict(net, arrays["x_test"]), arrays["y_test"]))


@pytest.fixture(scope="module")
def tune_bucket(client):
    with uploaded_bucket(client, "tune", SMOKE) as name:
        yield name


@pytest.fixture(scope="module")
def arrays(settings, tune_bucket):
    cluster.init_ray(settings)
    return sweeps.load_arrays(tune_bucket, SMOKE, settings)


@pytest.fixture(scope="module")
def sweep(settings, tune_bucket, arrays):
    # One trial at a time: the known-good trial sets each ASHA rung before the bad one reaches it,
    # so the early stop is deterministic (with two at once the faster bad trial could reach rungs first).
    return run_sweep(settings, tune_bucket, arrays, num_samples=4, max_concurrent=1,
                     points=[sweeps.KNOWN_GOOD, BAD])


def test_validation_split_is_held_out(arrays):
    assert (len(arrays["x_train"]), len(arrays["x_val"]), len(arrays["x_test"])) == (300, 500, 1000)


def test_tiny_sweep_completes_with_every_trial(sweep):
    assert len(sweep.table) == 4
    assert sweep.table["val_accuracy"].notna().all()


def test_ctrl_c_interrupts_again_after_a_sweep(sweep):
    # Tuner.fit() leaves Ray Tune's own handler installed, which only sets a flag of the ended sweep
    assert_ctrl_c_interrupts()


def test_points_to_evaluate_come_first(sweep):
    first, second = (sweep.table.iloc[i] for i in (0, 1))
    assert {k: first[f"config/{k}"] for k in sweeps.KNOWN_GOOD} == sweeps.KNOWN_GOOD
    assert {k: second[f"config/{k}"] for k in BAD} == BAD


def test_asha_stops_the_bad_trial_early(sweep):
    iterations = sweep.table.set_index("trial_id")["training_iteration"]
    assert iterations.min() < 4, "at least one trial stopped before max_t"
    bad_trial = sweep.table.iloc[1]["trial_id"]
    assert iterations[bad_trial] < 4


def test_asha_rungs_are_the_halving_points():
    # the first rung is the end of the one-cycle warm-up (30% of the epochs, rounded up), then doublings
    assert sweeps.asha_rungs(10) == [3, 6] and sweeps.asha_rungs(4) == [2] and sweeps.asha_rungs(1) == []
    assert sweeps.asha_rungs(30, reduction_factor=3) == [9, 27] and sweeps.warmup_epochs(20) == 6


def test_table_holds_each_trials_last_result(sweep):
    for _, row in sweep.table.iterrows():
        steps, values = zip(*sweep.history[row["trial_id"]], strict=True)
        assert row["training_iteration"] == steps[-1] and row["val_accuracy"] == pytest.approx(values[-1])


def test_best_result_is_the_max_over_the_trials_last_epochs(sweep):
    best_last = max(points[-1][1] for points in sweep.history.values())
    assert sweep.best_validation_accuracy == pytest.approx(best_last)
    assert 0 < sweep.test_accuracy <= 1


def test_the_restored_model_is_the_one_whose_validation_accuracy_chose_it(sweep):
    # the checkpoint of the chosen trial's last epoch, recomputed on the validation images: the number compared
    assert sweep.restored_validation_accuracy == sweep.best_validation_accuracy


def test_parent_run_has_one_child_per_trial(sweep, settings):
    children = sweeps.child_runs(settings.mlflow_tracking_uri, sweep.parent_run_id)
    assert len(children) == 4
    assert len({c.data.tags["trial"] for c in children}) == 4, "one child run per trial"
    for child in children:
        assert child.info.status == "FINISHED", "ended also when ASHA stopped the trial"
        steps = [s for s, _ in tracking.metric_history(settings.mlflow_tracking_uri, child.info.run_id,
                                                        "val_accuracy")]
        assert steps == list(range(1, len(steps) + 1)) and steps, "epochs count from 1"


def test_results_are_stored_in_the_bucket(sweep, client, tune_bucket):
    keys = listing.get_object_list(tune_bucket, client=client)
    assert any(k.startswith("tune-results/") and k.endswith(sweeps.CHECKPOINT_FILE) for k in keys)


def test_optuna_searcher_and_bad_parameters(settings, tune_bucket, arrays):
    result = run_sweep(settings, tune_bucket, arrays, num_samples=2, max_concurrent=2, searcher="optuna",
                       scheduler=None, epochs=1)
    assert len(result.table) == 2 and (result.table["training_iteration"] == 1).all()
    first = result.table.iloc[0]
    assert {k: first[f"config/{k}"] for k in sweeps.KNOWN_GOOD} == sweeps.KNOWN_GOOD
    with pytest.raises(sweeps.ParameterError, match="searcher"):
        sweeps.make_searcher("grid", None, 0)
    with pytest.raises(sweeps.ParameterError, match="scheduler"):
        sweeps.make_scheduler("pbt", 3)
    with pytest.raises(sweeps.ParameterError, match="num_samples"):
        sweeps.make_tuner(None, {}, None, None, 0, 1, "x", "b/p", settings)
    with pytest.raises(sweeps.ParameterError, match="num_workers"):
        sweeps.make_trainable(arrays, -1, 1, 2.0, "b/p")


def test_distributed_trials_run_ray_train_inside_tune(settings, tune_bucket, arrays):
    result = run_sweep(settings, tune_bucket, arrays, num_samples=1, max_concurrent=1, scheduler=None,
                       epochs=2, num_workers=2)
    row = result.table.iloc[0]
    assert row["training_iteration"] == 2 and {k: row[f"config/{k}"] for k in sweeps.KNOWN_GOOD} == sweeps.KNOWN_GOOD
    assert row["samples"] == 300 and 0 < row["val_accuracy"] <= 1  # both workers' shards, all-reduced
    assert row["checkpoint_path"].startswith(f"{tune_bucket}/tune-results/")
    assert 0 < result.test_accuracy <= 1
    (child,) = sweeps.child_runs(settings.mlflow_tracking_uri, result.parent_run_id)
    steps = [s for s, _ in tracking.metric_history(settings.mlflow_tracking_uri, child.info.run_id, "val_accuracy")]
    assert steps == [1, 2]


def test_a_crashed_trial_s_child_run_ends_failed_not_finished(settings, tune_bucket, arrays):
    from ray import tune

    resources = cluster.init_ray(settings)
    client = MlflowClient(settings.mlflow_tracking_uri)
    name = training.unique_run_name("crash")
    parent = client.create_run(tracking.experiment_id(client, "tests-tune-crash"), run_name=name).info.run_id
    trainable, _ = sweeps.make_trainable(arrays, 0, 1, resources["CPU"], f"{tune_bucket}/tune-results/{name}-t")
    crash = {**sweeps.KNOWN_GOOD, "lr": -1.0}  # torch refuses a negative learning rate inside the trial
    space = {**{k: tune.choice([v]) for k, v in crash.items()}, "epochs": 1, "seed": 0,
             "experiment": "tests-tune-crash", "tracking_uri": settings.mlflow_tracking_uri, "parent_run_id": parent}
    tuner = sweeps.make_tuner(trainable, space, None, None, 1, 1, name, f"{tune_bucket}/tune-results", settings)
    with contextlib.redirect_stdout(io.StringIO()), interrupts.stop_cleanly("The sweep", tuner=tuner):
        results = tuner.fit()
    assert len(results.errors) == 1
    (child,) = sweeps.child_runs(settings.mlflow_tracking_uri, parent)
    assert child.info.status == "FAILED"


def test_bad_sweep_sizes_fail_before_any_work(arrays, tune_bucket, settings):
    with pytest.raises(sweeps.ParameterError, match="max_concurrent=0"):
        sweeps.make_trainable(arrays, 0, 0, 2.0, "b/p")  # was a ZeroDivisionError
    with pytest.raises(sweeps.ParameterError, match="num_samples must be a whole number"):
        sweeps.make_tuner(None, {}, None, None, "4", 1, "x", "b/p", settings)
    with pytest.raises(sweeps.ParameterError, match="smoke_test_size=-1 is out of range"):
        sweeps.load_arrays(tune_bucket, -1, settings)  # checked before anything is loaded


@pytest.mark.timeout(400)
def test_an_object_store_outage_mid_sweep_is_one_line(settings, arrays, tmp_path):
    """The store that holds the sweep's results and checkpoints dies while trials run: notebook 05's check of the
    result grid ends in the same one line as a training run's, naming the store and the fix."""
    import threading
    import time

    from helpers import notebook, storage
    from helpers.settings import load_settings
    from workshop import stack

    state = tmp_path / "store"
    stack.up(state, ports=stack_ports.free_ports(list(stack_ports.DEFAULT_PORTS)), with_mlflow=False, with_lakefs=False,
             with_ray=False)
    try:
        private = load_settings(environ={}, stack_state=state)
        storage.ensure_bucket(storage.get_client(private), "sweeps")
        resources = cluster.init_ray(settings)
        trainable, extra = sweeps.make_trainable(arrays, 0, 1, resources["CPU"], "sweeps/x")
        space = {**sweeps.search_space(), "epochs": 400, "seed": 0, **extra}
        tuner = sweeps.make_tuner(trainable, space, sweeps.make_searcher("hyperopt", [sweeps.KNOWN_GOOD], 0), None,
                                  1, 1, training.unique_run_name("outage"), "sweeps/tune-results", private)
        threading.Thread(target=lambda: (time.sleep(12), stack.kill_service("seaweedfs", state)), daemon=True).start()
        failed = None
        try:
            with contextlib.redirect_stdout(io.StringIO()), interrupts.stop_cleanly("The sweep", tuner=tuner):
                results = tuner.fit()
            if results.errors:  # what notebook 05 does with them
                raise RuntimeError(f"{len(results.errors)} trials failed; first: {results.errors[0]}")
        except Exception as error:  # noqa: BLE001 - Tune may also raise itself
            failed = error
        assert failed is not None, "the sweep noticed the outage"
        assert notebook.user_error_line(failed).startswith(
            f"ObjectStoreUnreachable: The object store at {private.s3_url} stopped answering during training.")
    finally:
        stack.down(state)
