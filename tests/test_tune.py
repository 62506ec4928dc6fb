"""Ray Tune sweeps on the real local Ray, object store and MLflow."""


import pytest

from conftest import uploaded_bucket
from helpers import data, storage, tracking, tune

SMOKE = 300
BAD = {"rate": 0.45, "hidden": 32, "activation": "tanh", "lr": 0.001}  # learns slowly: ASHA stops it
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tune_bucket(client):
    with uploaded_bucket(client, "tune", SMOKE) as name:
        yield name


@pytest.fixture(scope="module")
def arrays(settings, tune_bucket):
    data.init_ray(settings)
    return tune.load_arrays(tune_bucket, SMOKE, settings)


@pytest.fixture(scope="module")
def sweep(settings, tune_bucket, arrays):
    # One trial at a time: the known-good trial sets each ASHA rung before the bad one reaches it,
    # so the early stop is deterministic (with two at once the faster bad trial could reach rungs first).
    return tune.run_sweep(num_samples=4, max_concurrent_trials=1, searcher="hyperopt", scheduler="asha",
                          epochs=4, bucket=tune_bucket, points_to_evaluate=[tune.KNOWN_GOOD, BAD],
                          experiment="tests-tune", settings=settings, arrays=arrays)


def test_validation_split_is_held_out(arrays):
    assert len(arrays["x_train"]) == 250 and len(arrays["x_val"]) == 50 and len(arrays["x_test"]) == 50


def test_tiny_sweep_completes_with_every_trial(sweep):
    assert len(sweep.table) == 4
    assert sweep.table["mean_accuracy"].notna().all()


def test_points_to_evaluate_come_first(sweep):
    first, second = (sweep.table.iloc[i] for i in (0, 1))
    assert {k: first[f"config/{k}"] for k in tune.KNOWN_GOOD} == tune.KNOWN_GOOD
    assert {k: second[f"config/{k}"] for k in BAD} == BAD


def test_asha_stops_the_bad_trial_early(sweep):
    iterations = sweep.table.set_index("trial_id")["training_iteration"]
    assert iterations.min() < 4, "at least one trial stopped before max_t"
    bad_trial = sweep.table.iloc[1]["trial_id"]
    assert iterations[bad_trial] < 4


def test_table_holds_each_trials_last_result(sweep):
    for _, row in sweep.table.iterrows():
        steps, values = zip(*sweep.history[row["trial_id"]], strict=True)
        assert row["training_iteration"] == steps[-1] and row["mean_accuracy"] == pytest.approx(values[-1])


def test_best_result_is_the_max_over_the_trial_histories(sweep):
    best_seen = max(value for points in sweep.history.values() for _, value in points)
    assert sweep.best_validation_accuracy == pytest.approx(best_seen)
    assert 0 < sweep.test_accuracy <= 1


def test_parent_run_has_one_child_per_trial(sweep, settings):
    children = tune.child_runs(settings.mlflow_tracking_uri, sweep.parent_run_id)
    assert len(children) == 4
    for child in children:
        steps = [s for s, _ in tracking.metric_history(settings.mlflow_tracking_uri, child.info.run_id,
                                                        "mean_accuracy")]
        assert steps == list(range(len(steps))) and steps
    parent = tracking._client(settings.mlflow_tracking_uri).get_run(sweep.parent_run_id)
    assert parent.data.params["best_hidden"] == str(sweep.best_config["hidden"])
    assert parent.data.metrics["best_mean_accuracy"] == pytest.approx(sweep.best_validation_accuracy)


def test_results_are_stored_in_the_bucket(sweep, client, tune_bucket):
    keys = storage.get_object_list(tune_bucket, client=client)
    assert any(k.startswith("tune-results/") and k.endswith(tune.CHECKPOINT_FILE) for k in keys)


def test_optuna_searcher_and_bad_parameters(settings, tune_bucket, arrays):
    result = tune.run_sweep(num_samples=2, max_concurrent_trials=2, searcher="optuna", scheduler=None, epochs=1,
                            bucket=tune_bucket, experiment="tests-tune", settings=settings, arrays=arrays)
    assert len(result.table) == 2 and (result.table["training_iteration"] == 1).all()
    first = result.table.iloc[0]
    assert {k: first[f"config/{k}"] for k in tune.KNOWN_GOOD} == tune.KNOWN_GOOD
    with pytest.raises(tune.ParameterError, match="searcher"):
        tune.make_searcher("grid", None, 0)
    with pytest.raises(tune.ParameterError, match="scheduler"):
        tune.make_scheduler("pbt", 3)


def test_distributed_trials_run_ray_train_inside_tune(settings, tune_bucket, arrays):
    result = tune.run_sweep(num_samples=1, max_concurrent_trials=1, scheduler=None, epochs=2, bucket=tune_bucket,
                            experiment="tests-tune", settings=settings, arrays=arrays, num_workers=2)
    row = result.table.iloc[0]
    assert row["training_iteration"] == 2 and {k: row[f"config/{k}"] for k in tune.KNOWN_GOOD} == tune.KNOWN_GOOD
    assert row["samples"] == 250 and 0 < row["mean_accuracy"] <= 1  # both workers' shards, all-reduced
    assert row["checkpoint_path"].startswith(f"{tune_bucket}/tune-results/")
    assert 0 < result.test_accuracy <= 1
    (child,) = tune.child_runs(settings.mlflow_tracking_uri, result.parent_run_id)
    steps = [s for s, _ in tracking.metric_history(settings.mlflow_tracking_uri, child.info.run_id, "val_accuracy")]
    assert steps == [0, 1]
