"""Hyperparameter sweeps with Ray Tune, tracked in MLflow (notebook 05).

The seed article swept a Keras model with ``tune.run``,
``ray.tune.suggest.hyperopt`` and ``TuneReportCallback`` from ``ray.tune.
integration.keras``: all gone from current Ray. The same idea today:

* a search space kept recognisable (dropout ``rate``, ``hidden`` width,
  ``activation``, plus ``lr``), searched by ``HyperOptSearch`` that starts
  from the seed's known-good point (or ``OptunaSearch``);
* an ASHA scheduler that stops bad trials early;
* trials that get the data through ``tune.with_parameters`` (put in Ray's
  object store once, not shipped with every trial) and report with
  ``tune.report``;
* results and checkpoints in the object store; each trial a child run of
  one MLflow parent run.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from helpers import data, model, storage, tracking, train
from helpers.config import ParameterError, Settings, load_settings

METRIC, MODE = "mean_accuracy", "max"
KNOWN_GOOD = {"rate": 0.2, "hidden": 128, "activation": "relu", "lr": 0.05}  # the seed's starting point
CHECKPOINT_FILE = "model.pt"


def search_space() -> dict[str, Any]:
    """The seed's space (rate, hidden, activation) plus the learning rate."""
    from ray import tune

    return {
        "rate": tune.uniform(0.1, 0.5),
        "hidden": tune.randint(32, 512),
        "activation": tune.choice(["relu", "tanh"]),
        "lr": tune.loguniform(1e-3, 2e-1),
    }


def make_searcher(name: str, points_to_evaluate: list[dict] | None, seed: int):
    """``"hyperopt"`` (HyperOptSearch) or ``"optuna"`` (OptunaSearch), seeded, starting from known points."""
    if name == "hyperopt":
        from ray.tune.search.hyperopt import HyperOptSearch

        return HyperOptSearch(metric=METRIC, mode=MODE, points_to_evaluate=points_to_evaluate,
                              random_state_seed=seed)
    if name == "optuna":
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        return OptunaSearch(metric=METRIC, mode=MODE, points_to_evaluate=points_to_evaluate, seed=seed)
    raise ParameterError(f"searcher must be 'hyperopt' or 'optuna', not {name!r}.")


def make_scheduler(name: str | None, epochs: int):
    """``"asha"`` (stop the worse trials at each rung) or None (every trial runs all epochs)."""
    if name in (None, "", "none"):
        return None
    if name == "asha":
        from ray.tune.schedulers import ASHAScheduler

        return ASHAScheduler(metric=METRIC, mode=MODE, max_t=epochs, grace_period=1, reduction_factor=2)
    raise ParameterError(f"scheduler must be 'asha' or None, not {name!r}.")


# --- the trainable -------------------------------------------------------------------------

def _build(config: dict[str, Any]) -> nn.Module:
    return model.MNISTModel(784, [int(config["hidden"])], 10, dropout=float(config["rate"]),
                            activation=config["activation"])


def objective(config: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """One trial: train the MLP on the training split, report validation accuracy every epoch.

    ``arrays`` (train/validation tensors) arrive through ``tune.with_parameters``.
    Each epoch reports ``mean_accuracy`` (validation) with a checkpoint, and the
    trial logs its params and metrics into an MLflow child run of the sweep's
    parent run (``config["parent_run_id"]``).
    """
    from ray import tune

    torch.set_num_threads(1)
    torch.manual_seed(int(config.get("seed", 0)))
    net = _build(config)
    optimizer = torch.optim.SGD(net.parameters(), lr=float(config["lr"]), momentum=0.9)
    loss_fn = nn.NLLLoss()
    x, y = torch.as_tensor(arrays["x_train"]), torch.as_tensor(arrays["y_train"], dtype=torch.int64)
    generator = torch.Generator().manual_seed(int(config.get("seed", 0)))
    run = _child_run(config)
    batch_size = int(config.get("batch_size", 64))
    try:
        for epoch in range(int(config["epochs"])):
            net.train()
            order = torch.randperm(len(x), generator=generator)
            total = 0.0
            for i in range(0, len(x), batch_size):
                idx = order[i:i + batch_size]
                optimizer.zero_grad()
                loss = loss_fn(net(x[idx]), y[idx])
                loss.backward()
                optimizer.step()
                total += float(loss) * len(idx)
            accuracy = model.accuracy(model.predict(net, arrays["x_val"]), arrays["y_val"])
            metrics = {METRIC: accuracy, "train_loss": total / len(x)}
            run.log_metrics(metrics, step=epoch)
            with tempfile.TemporaryDirectory() as folder:
                torch.save({"model": net.state_dict(), "config": _model_config(config)}, Path(folder) / CHECKPOINT_FILE)
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))
    finally:
        run.end()  # also when ASHA stops the trial


def _model_config(config: dict[str, Any]) -> dict[str, Any]:
    return {k: config[k] for k in ("rate", "hidden", "activation", "lr")}


def _child_run(config: dict[str, Any]) -> tracking.RunHandle:
    uri, parent = config.get("tracking_uri"), config.get("parent_run_id")
    if not (uri and parent):
        return tracking.RunHandle(uri or "", None)
    from ray import tune

    name = tune.get_context().get_trial_name()
    run = tracking.start_run(uri, config["experiment"], name, _model_config(config),
                             tags={"mlflow.parentRunId": parent, "trial": name})
    return run


def _train_params(config: dict[str, Any]) -> dict[str, Any]:
    """A Tune config in the vocabulary of :mod:`helpers.train`."""
    return {**train.DEFAULT_PARAMS, "epochs": int(config["epochs"]), "lr": float(config["lr"]),
            "hidden_sizes": [int(config["hidden"])], "dropout": float(config["rate"]),
            "activation": config["activation"], "seed": int(config.get("seed", 0))}


def distributed_trial(config: dict[str, Any], datasets: dict[str, Any]) -> None:
    """One trial that is itself a Ray Train run: build a TorchTrainer and fit it (Train V2 pattern).

    ``TuneReportCallback`` forwards every ``ray.train.report`` of the workers
    to Tune, so ASHA and the searcher see each epoch. ``Tuner(trainer)`` is
    the old way and fails with Train V2.
    """
    import ray.train
    from ray import tune
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    run = _child_run(config)
    workers = int(config.get("num_workers", 2))
    trainer = TorchTrainer(
        train.train_func_per_worker,
        train_loop_config={**_train_params(config), "validate": True, "torch_threads": 1,
                           "tracking_uri": run.uri if run.enabled else None, "run_id": run.run_id},
        scaling_config=ray.train.ScalingConfig(num_workers=workers,
                                               resources_per_worker={"CPU": float(config["cpus_per_worker"])}),
        run_config=ray.train.RunConfig(
            name=tune.get_context().get_trial_name(), storage_path=config["storage_path"],
            storage_filesystem=data.s3_filesystem(), callbacks=[TuneReportCallback()],
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=1)),
        datasets=datasets,
    )
    try:
        trainer.fit()
    finally:
        run.end()


def load_trial_model(checkpoint) -> nn.Module:
    """The model saved in a trial's checkpoint (a Tune trial's or a Ray Train run's)."""
    with checkpoint.as_directory() as folder:
        if (Path(folder) / train.CHECKPOINT_FILE).is_file():
            return train.load_checkpoint(checkpoint)[0]
        state = torch.load(Path(folder) / CHECKPOINT_FILE, map_location="cpu", weights_only=False)
    net = _build(state["config"])
    net.load_state_dict(state["model"])
    net.eval()
    return net


# --- the sweep -------------------------------------------------------------------------------

@dataclass
class SweepResult:
    """What :func:`run_sweep` produced."""

    results: Any  # ray.tune.ResultGrid
    table: Any  # pandas.DataFrame, one row per trial
    best_config: dict[str, Any]
    best_validation_accuracy: float
    test_accuracy: float
    seconds: float
    parent_run_id: str | None
    mlflow_url: str
    history: dict[str, list[tuple[int, float]]]


def load_arrays(bucket: str, smoke_test_size: int, settings: Settings, validation_fraction: float = 1 / 6,
                seed: int = 0) -> dict[str, np.ndarray]:
    """Preprocessed train/validation/test arrays (validation split off the shuffled training set)."""
    train_ds, test_ds = train.load_datasets(bucket, smoke_test_size, settings, seed=seed)
    x, y = train.dataset_to_numpy(train_ds)
    x_test, y_test = train.dataset_to_numpy(test_ds)
    cut = int(len(x) * (1 - validation_fraction))
    return {"x_train": x[:cut], "y_train": y[:cut], "x_val": x[cut:], "y_val": y[cut:],
            "x_test": x_test, "y_test": y_test}


def run_sweep(
    num_samples: int = 4,
    max_concurrent_trials: int = 2,
    searcher: str = "hyperopt",
    scheduler: str | None = "asha",
    epochs: int = 4,
    bucket: str = "mnist",
    smoke_test_size: int = 0,
    points_to_evaluate: list[dict] | None = None,
    seed: int = 0,
    experiment: str = "mnist-tune",
    settings: Settings | None = None,
    arrays: dict[str, np.ndarray] | None = None,
    num_workers: int = 0,
    verbose: bool = True,
) -> SweepResult:
    """Run a sweep: HyperOpt (or Optuna) + ASHA over the MLP, tracked in MLflow (notebook 05).

    Args:
        num_samples: trials in total (the first ones are ``points_to_evaluate``).
        max_concurrent_trials: trials at once; one CPU each.
        searcher: ``"hyperopt"`` or ``"optuna"``.
        scheduler: ``"asha"`` or None.
        epochs: epochs per trial (ASHA's ``max_t``).
        bucket: bucket holding the MNIST objects (uploaded if missing).
        smoke_test_size: training images (0 = all 60,000); a sixth is held out for validation.
        points_to_evaluate: known configs tried first (default: the seed's known-good one).
        seed: seeds the searcher and every trial.
        experiment: MLflow experiment of the parent run.
        settings: where the services are.
        arrays: preprocessed arrays from :func:`load_arrays` (loaded here by default).
        num_workers: 0 trains each trial in its own process; N > 0 makes every
            trial a Ray Train run with N workers (:func:`distributed_trial`).
        verbose: print one line per trial and the best result.

    Returns:
        A :class:`SweepResult`: the result grid and its table, the best config,
        its validation accuracy and its test accuracy (restored from its checkpoint).
    """
    from ray import tune

    settings = settings or load_settings()
    if num_samples < 1 or epochs < 1 or max_concurrent_trials < 1:
        raise ParameterError("num_samples, epochs and max_concurrent_trials must be at least 1.")
    points = points_to_evaluate if points_to_evaluate is not None else [KNOWN_GOOD]
    cluster = data.init_ray(settings)
    if arrays is None:
        storage.upload_mnist(bucket, smoke_test_size, client=storage.get_client(settings), progress=False)
        arrays = load_arrays(bucket, smoke_test_size, settings, seed=seed)
    name = train.unique_run_name("sweep")
    parent = tracking.start_run(settings.mlflow_tracking_uri, experiment, name,
                                {"num_samples": num_samples, "searcher": searcher, "scheduler": scheduler or "none",
                                 "epochs": epochs, "smoke_test_size": smoke_test_size, "seed": seed})
    param_space = {**search_space(), "epochs": epochs, "seed": seed, "experiment": experiment,
                   "tracking_uri": parent.uri if parent.enabled else None, "parent_run_id": parent.run_id}
    if num_workers:
        # Each trial is a Ray Train run; the trial itself only waits (a sliver of CPU), its workers
        # share what one CPU of the cluster leaves for Ray Data and the controllers.
        import ray.data

        per_worker = train.worker_resources(num_workers * max_concurrent_trials, False, cluster.get("CPU", 1.0))
        datasets = {
            name: ray.data.from_items([{"X": x, "y": int(label)} for x, label in
                                       zip(arrays[f"x_{part}"], arrays[f"y_{part}"], strict=True)]).materialize()
            for name, part in (("train", "train"), ("validation", "val"))
        }
        trainable = tune.with_resources(tune.with_parameters(distributed_trial, datasets=datasets), {"cpu": 0.01})
        param_space |= {"num_workers": num_workers, "cpus_per_worker": per_worker["CPU"],
                        "storage_path": f"{bucket}/tune-results/{name}-train"}
    else:
        cpus = max(0.5, min(1.0, cluster.get("CPU", 1.0) / max_concurrent_trials))
        trainable = tune.with_resources(tune.with_parameters(objective, arrays=arrays), {"cpu": cpus})
    tuner = tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(
            search_alg=make_searcher(searcher, points, seed), scheduler=make_scheduler(scheduler, epochs),
            num_samples=num_samples, max_concurrent_trials=max_concurrent_trials,
            reuse_actors=True,  # a trial reuses a finished trial's process: no new Python + torch start-up
        ),
        run_config=tune.RunConfig(
            name=name, storage_path=f"{bucket}/tune-results", storage_filesystem=data.s3_filesystem(settings),
            stop={METRIC: 0.99}, verbose=0,
        ),
    )
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # Tune's banners; a compact view is printed below
        results = tuner.fit()
    seconds = time.perf_counter() - started
    if results.errors:
        parent.end("FAILED")
        raise RuntimeError(f"{len(results.errors)} trials failed; first: {results.errors[0]}")

    table = results.get_dataframe()  # one row per trial, in the order trials started; last result each
    best = results.get_best_result(metric=METRIC, mode=MODE, scope="all")
    best_net = load_trial_model(_best_checkpoint(best))
    test_accuracy = model.accuracy(model.predict(best_net, arrays["x_test"]), arrays["y_test"])
    best_config = _model_config(best.config)
    history = {}
    for r in results:
        frame = r.metrics_dataframe
        history[r.metrics["trial_id"]] = list(zip(frame["training_iteration"].astype(int), frame[METRIC],
                                                  strict=True))
    best_validation = float(best.metrics_dataframe[METRIC].max())
    if verbose:
        for _, row in table.iterrows():
            stopped = " (stopped early)" if row["training_iteration"] < epochs else ""
            print(f"trial {row['trial_id']}: hidden {row['config/hidden']:>3}, rate {row['config/rate']:.2f}, "
                  f"{row['config/activation']}, lr {row['config/lr']:.4f} -> accuracy {row[METRIC]:.3f} "
                  f"after {row['training_iteration']} epochs{stopped}")
        shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in best_config.items()}
        print(f"{len(table)} trials in {seconds:.1f} s; best {shown} at {best_validation:.3f} "
              f"(test {test_accuracy:.3f})")
    parent.log_params({f"best_{k}": v for k, v in best_config.items()})
    parent.log_metrics({"best_mean_accuracy": best_validation, "best_test_accuracy": test_accuracy,
                        "sweep_seconds": seconds, "trials": len(table)})
    parent.end()
    return SweepResult(results, table, best_config, best_validation, test_accuracy, seconds,
                       parent.run_id, parent.url, history)


def _best_checkpoint(result):
    """The best checkpoint of a trial: Tune's own, or the Ray Train checkpoint path it reported."""
    import ray.train

    if result.best_checkpoints:
        return result.get_best_checkpoint(metric=METRIC, mode=MODE)
    from ray.tune.integration.ray_train import CHECKPOINT_PATH_KEY

    frame = result.metrics_dataframe
    path = frame.loc[frame[METRIC].idxmax(), CHECKPOINT_PATH_KEY]
    return ray.train.Checkpoint(path, filesystem=data.s3_filesystem())


def child_runs(uri: str, parent_run_id: str) -> list[Any]:
    """The MLflow runs whose parent is ``parent_run_id`` (one per trial)."""
    client = tracking._client(uri)
    parent = client.get_run(parent_run_id)
    return client.search_runs([parent.info.experiment_id],
                              filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'")
