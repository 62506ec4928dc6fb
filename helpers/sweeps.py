"""Generated from notebooks/05_tune_sweeps.ipynb by `python -m workshop.export`: edit the notebook.

Lesson 05 · Hyperparameter sweeps with Ray Tune, tracked in MLflow. Above each definition, the cell that teaches it.
"""
import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ray import tune
from torch import nn

from helpers import tracking
from helpers.settings import ParameterError, Settings, check_count
from helpers.preprocess import dataset_to_numpy, load_datasets
from helpers.storage import s3_filesystem
from helpers.training import (CHECKPOINT_FILE, DEFAULT_NUM_WORKERS, DEFAULT_PARAMS, accuracy, checkpoint_state,
                              log_dataset, lr_schedule, make_optimizer, model_from_params, predict,
                              train_func_per_worker, worker_resources)
from helpers.worker_metrics import worker_system_metrics

METRIC, MODE = "val_accuracy", "max"  # what the sweep maximises: accuracy on the held-out validation images
TUNED = ("lr", "dropout", "batch_size_per_worker")  # notebook 04's names for what is searched
KNOWN_GOOD = {name: DEFAULT_PARAMS[name] for name in TUNED}  # notebook 04's defaults: the sweep starts there


# From notebooks/05_tune_sweeps.ipynb, cell 7 (id ecf5f58f).
def load_arrays(bucket: str, smoke_test_size: int, settings: Settings,
                seed: int = 0) -> dict[str, np.ndarray]:
    """Preprocessed train/validation/test arrays: notebook 03's ``load_datasets``, as ``x_train``, ``y_val``, ..."""
    arrays = {}
    for name, dataset in zip(("train", "val", "test"), load_datasets(bucket, smoke_test_size, settings, seed=seed),
                             strict=True):
        arrays[f"x_{name}"], arrays[f"y_{name}"] = dataset_to_numpy(dataset)
    return arrays


# From notebooks/05_tune_sweeps.ipynb, cell 10 (id 902ba3cd).
def search_space() -> dict[str, Any]:
    """Notebook 04's learning rate, dropout and batch size, around its defaults."""
    return {
        "lr": tune.loguniform(1e-3, 1e-2),
        "dropout": tune.uniform(0.0, 0.3),
        "batch_size_per_worker": tune.choice([32, 64, 128]),
    }


# From notebooks/05_tune_sweeps.ipynb, cell 13 (id b1d57811).
def start_child_run(config: dict[str, Any], params: dict[str, Any]):
    """``(MlflowClient, run_id)`` of a new child run of ``config["parent_run_id"]``; ``(None, None)`` when off."""
    from mlflow.tracking import MlflowClient

    if not (config.get("tracking_uri") and config.get("parent_run_id")):
        return None, None
    ok, reason = tracking.tracking_available(config["tracking_uri"])  # a quick check, not MLflow's retries
    if not ok:
        print(f"MLflow tracking is off for this trial: {reason}")
        return None, None
    client = MlflowClient(config["tracking_uri"])
    name = tune.get_context().get_trial_name()
    run = client.create_run(tracking.experiment_id(client, config["experiment"]), run_name=name,
                            tags={"mlflow.parentRunId": config["parent_run_id"], "trial": name,
                                  **config.get("lineage", {})})
    client.log_batch(run.info.run_id, params=tracking.as_params(params))
    for dataset in config.get("inputs", []):  # [name, source URI, objects, context]
        log_dataset(client, run.info.run_id, *dataset)
    return client, run.info.run_id


# From notebooks/05_tune_sweeps.ipynb, cell 15 (id 9ab421ea).
def model_config(config: dict[str, Any]) -> dict[str, Any]:
    """The tuned values of a trial's config."""
    return {name: config[name] for name in TUNED}


# From notebooks/05_tune_sweeps.ipynb, cell 17 (id 15681fc8).
def trial_params(config: dict[str, Any]) -> dict[str, Any]:
    """A trial's config as notebook 04's training parameters: 04's defaults, then the tuned values."""
    return {**DEFAULT_PARAMS, **model_config(config), "epochs": int(config["epochs"]),
            "seed": int(config.get("seed", 0))}


# From notebooks/05_tune_sweeps.ipynb, cell 19 (id a2068ff2).
def objective(config: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """One trial, tracked as a child run that ends FAILED (or KILLED) when the trial crashes, never FINISHED."""
    client, run_id = start_child_run(config, model_config(config))
    stop_metrics = worker_system_metrics({**config, "run_id": run_id}, "trial")  # its CPU and memory, as 04's
    error = None
    try:
        train_trial(config, arrays, client, run_id)
    except BaseException as err:
        error = err
        raise
    finally:
        stop_metrics()
        tracking.end_run(client, run_id, error)


# From notebooks/05_tune_sweeps.ipynb, cell 21 (id 0e7723ab).
def train_trial(config: dict[str, Any], arrays: dict[str, np.ndarray], client, run_id: str | None) -> None:
    """Train on the training split; report validation accuracy and a checkpoint every epoch."""
    params = trial_params(config)
    torch.set_num_threads(1)
    torch.manual_seed(params["seed"])
    x, y = torch.as_tensor(arrays["x_train"]), torch.as_tensor(arrays["y_train"], dtype=torch.int64)
    size = params["batch_size_per_worker"] * DEFAULT_NUM_WORKERS  # 04's global batch: its two workers' step
    net = model_from_params(params)
    optimizer = make_optimizer(params["optimizer"], net.parameters(), params["lr"], params["momentum"])
    schedule = lr_schedule(optimizer, {**params, "steps_per_epoch": math.ceil(len(x) / size)})
    generator = torch.Generator().manual_seed(params["seed"])
    for epoch in range(1, params["epochs"] + 1):  # epochs count from 1, as training_iteration does
        net.train()
        order, total = torch.randperm(len(x), generator=generator), 0.0
        for start in range(0, len(x), size):
            rows = order[start:start + size]
            optimizer.zero_grad()
            loss = nn.functional.nll_loss(net(x[rows]), y[rows])
            loss.backward()
            optimizer.step()
            if schedule:
                schedule.step()
            total += float(loss) * len(rows)
        metrics = {METRIC: accuracy(predict(net, arrays["x_val"]), arrays["y_val"]), "train_loss": total / len(x)}
        if client:
            client.log_batch(run_id, metrics=tracking.as_metrics(metrics, step=epoch))
        with tempfile.TemporaryDirectory() as folder:  # notebook 04's checkpoint format
            torch.save(checkpoint_state(net, optimizer, epoch, [], params, schedule), Path(folder) / CHECKPOINT_FILE)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))


# From notebooks/05_tune_sweeps.ipynb, cell 23 (id 7b52009b).
def distributed_trial(config: dict[str, Any], datasets: dict[str, Any]) -> None:
    """One trial that is itself a Ray Train run of notebook 04's ``train_func_per_worker``, with validation."""
    import ray.train
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    client, run_id = start_child_run(config, model_config(config))
    params, workers = trial_params(config), int(config["num_workers"])
    steps = math.ceil(datasets["train"].count() / workers / params["batch_size_per_worker"])  # per worker, per epoch
    trainer = TorchTrainer(
        train_func_per_worker,
        train_loop_config={**params, "validate": True, "torch_threads": 1, "steps_per_epoch": steps,
                           "tracking_uri": config.get("tracking_uri"), "run_id": run_id},
        scaling_config=ray.train.ScalingConfig(num_workers=workers,
                                               resources_per_worker={"CPU": float(config["cpus_per_worker"])}),
        run_config=ray.train.RunConfig(
            name=tune.get_context().get_trial_name(), storage_path=config["storage_path"],
            storage_filesystem=s3_filesystem(), callbacks=[TuneReportCallback()],
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=1)),
        datasets=datasets,
    )
    error = None
    try:
        trainer.fit()
    except BaseException as err:
        error = err
        raise
    finally:
        tracking.end_run(client, run_id, error)


# From notebooks/05_tune_sweeps.ipynb, cell 25 (id 5f0562d4).
def make_trainable(arrays: dict[str, np.ndarray], num_workers: int, max_concurrent: int,
                   cluster_cpus: float, storage_path: str) -> tuple[Any, dict[str, Any]]:
    """The trainable with its data and resources, and what it adds to the param space.

    ``num_workers=0``: :func:`objective`, one CPU (or a share) per trial. ``num_workers=N``:
    :func:`distributed_trial`; the trial only waits, its workers share what one CPU leaves.
    """
    import ray.data

    check_count("num_workers (0: one process per trial)", num_workers, 1024, minimum=0)
    check_count("max_concurrent", max_concurrent, 1024)
    if num_workers == 0:
        cpus = max(0.5, min(1.0, cluster_cpus / max_concurrent))
        return tune.with_resources(tune.with_parameters(objective, arrays=arrays), {"cpu": cpus}), {}
    per_worker = worker_resources(num_workers * max_concurrent, False, cluster_cpus)
    datasets = {name: ray.data.from_items([{"X": x, "y": int(label)} for x, label in
                                           zip(arrays[f"x_{part}"], arrays[f"y_{part}"], strict=True)]).materialize()
                for name, part in (("train", "train"), ("validation", "val"))}
    trainable = tune.with_resources(tune.with_parameters(distributed_trial, datasets=datasets), {"cpu": 0.01})
    return trainable, {"num_workers": num_workers, "cpus_per_worker": per_worker["CPU"], "storage_path": storage_path}


# From notebooks/05_tune_sweeps.ipynb, cell 27 (id fa35e192).
def make_searcher(name: str, points_to_evaluate: list[dict] | None, seed: int):
    """``"hyperopt"`` (HyperOptSearch) or ``"optuna"`` (OptunaSearch), seeded, starting from known points."""
    if name == "hyperopt":
        from ray.tune.search.hyperopt import HyperOptSearch

        return HyperOptSearch(metric=METRIC, mode=MODE, points_to_evaluate=points_to_evaluate, random_state_seed=seed)
    if name == "optuna":
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        return OptunaSearch(metric=METRIC, mode=MODE, points_to_evaluate=points_to_evaluate, seed=seed)
    raise ParameterError(f"searcher must be 'hyperopt' or 'optuna', not {name!r}.")


# From notebooks/05_tune_sweeps.ipynb, cell 29 (id 60f6c936).
def warmup_epochs(epochs: int) -> int:
    """The epochs of a trial's one-cycle warm-up (its first 30%, rounded up): ASHA judges no trial before they end."""
    return max(1, math.ceil(0.3 * epochs))


# From notebooks/05_tune_sweeps.ipynb, cell 31 (id 3ccfa0c5).
def make_scheduler(name: str | None, epochs: int, reduction_factor: int = 2):
    """``"asha"`` (stop the worse trials at each rung, the first after the warm-up) or None (all run all epochs)."""
    if name in (None, "", "none"):
        return None
    if name == "asha":
        from ray.tune.schedulers import ASHAScheduler

        return ASHAScheduler(metric=METRIC, mode=MODE, max_t=epochs, grace_period=warmup_epochs(epochs),
                             reduction_factor=reduction_factor)
    raise ParameterError(f"scheduler must be 'asha' or None, not {name!r}.")


# From notebooks/05_tune_sweeps.ipynb, cell 33 (id 7cae0db3).
def asha_rungs(epochs: int, reduction_factor: int = 2) -> list[int]:
    """The epochs at which ASHA compares trials: the warm-up's end times ``reduction_factor**k``, below ``epochs``."""
    rungs, rung = [], warmup_epochs(epochs)
    while rung < epochs:
        rungs.append(rung)
        rung *= reduction_factor
    return rungs


# From notebooks/05_tune_sweeps.ipynb, cell 36 (id 0716d970).
def make_tuner(trainable, param_space: dict[str, Any], search_alg, scheduler, num_samples: int,
               max_concurrent: int, name: str, storage_path: str, settings: Settings):
    """A ``tune.Tuner`` over ``param_space`` with results and checkpoints in the object store (notebook 05)."""
    check_count("num_samples", num_samples, 100_000)
    check_count("max_concurrent", max_concurrent, 1024)
    return tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(
            search_alg=search_alg, scheduler=scheduler, num_samples=num_samples,
            max_concurrent_trials=max_concurrent,
            reuse_actors=True,  # a trial reuses a finished trial's process
        ),
        run_config=tune.RunConfig(
            name=name, storage_path=storage_path, storage_filesystem=s3_filesystem(settings),
            stop={METRIC: 0.99}, verbose=0,
            callbacks=[tracking.end_trial_runs_callback()],  # ends the MLflow run of a trial ASHA stopped
            progress_reporter=tune.CLIReporter(),  # plain text (Jupyter's default is an HTML table)
        ),
    )


# From notebooks/05_tune_sweeps.ipynb, cell 46 (id f6e1126c).
def last_checkpoint(result, settings: Settings):
    """The checkpoint of a trial's last report: the epoch whose validation accuracy ``scope="last"`` compared."""
    import ray.train
    from ray.tune.integration.ray_train import CHECKPOINT_PATH_KEY

    if result.checkpoint is not None:  # a one-process trial's: Tune keeps what it reported
        return result.checkpoint
    path = result.metrics_dataframe[CHECKPOINT_PATH_KEY].dropna().iloc[-1]  # a distributed trial's Ray Train run
    return ray.train.Checkpoint(path, filesystem=s3_filesystem(settings))


# From notebooks/05_tune_sweeps.ipynb, cell 48 (id cc1f87a8).
def child_runs(uri: str, parent_run_id: str) -> list[Any]:
    """The MLflow runs whose parent is ``parent_run_id`` (one per trial)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    parent = client.get_run(parent_run_id)
    return client.search_runs([parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'")
