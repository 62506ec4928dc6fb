"""Distributed training with Ray Train: the seed's driver and worker loop, done right (notebook 04).

* :func:`train_func_per_worker` runs on every worker: it trains on its shard,
  all-reduces the epoch's loss and accuracy (so they are means over the whole
  epoch, not the last batch), reports every epoch with a checkpoint from rank 0
  written to a fresh temporary folder, and resumes from the last checkpoint
  after a failure.
* :func:`distributed_training` is the driver: it loads and preprocesses the
  data once (timed as *load time*), trains (timed as *training time*), stores
  checkpoints in the object store, evaluates the model loaded back from the
  result's checkpoint, and tracks everything in one MLflow run.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from helpers import data, model, storage, tracking
from helpers.config import ParameterError, Settings, load_settings

CHECKPOINT_FILE = "checkpoint.pt"  # one name for saving and loading (the seed used two)
DEFAULT_PARAMS: dict[str, Any] = {
    "epochs": 3, "lr": 0.05, "momentum": 0.9, "optimizer": "sgd", "model": "mlp",
    "hidden_sizes": [128, 64], "dropout": 0.0, "activation": "relu", "batch_size_per_worker": 64, "seed": 0,
}


class InjectedFault(RuntimeError):
    """Raised on purpose by the fault-injection option, to show that training resumes."""


# --- model, optimizer and checkpoints ---------------------------------------------------------

def make_optimizer(name: str, parameters, lr: float, momentum: float) -> torch.optim.Optimizer:
    """``"sgd"`` (with momentum, as the seed) or ``"adam"``."""
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=lr, momentum=momentum)
    if name == "adam":
        return torch.optim.Adam(parameters, lr=lr)
    raise ParameterError(f"optimizer must be 'sgd' or 'adam', not {name!r}.")


def model_from_params(params: dict[str, Any]) -> nn.Module:
    """A fresh model built from the training parameters."""
    return model.build_model(params.get("model", "mlp"), params.get("hidden_sizes", (128, 64)),
                             params.get("dropout", 0.0), params.get("activation", "relu"))


def load_checkpoint(checkpoint) -> tuple[nn.Module, dict[str, Any]]:
    """The model (and the saved state: epoch, params, metric history) from a Ray Train checkpoint."""
    with checkpoint.as_directory() as folder:
        state = torch.load(Path(folder) / CHECKPOINT_FILE, map_location="cpu", weights_only=False)
    net = model_from_params(state["params"])
    net.load_state_dict(state["model"])
    net.eval()
    return net, state


def _unwrap(net: nn.Module) -> nn.Module:
    return net.module if hasattr(net, "module") else net


# --- the worker loop -------------------------------------------------------------------------------

def _maybe_fail(config: dict[str, Any], epoch: int, rank: int) -> None:
    """Raise once, in epoch ``fail_at_epoch`` on rank ``fail_rank`` (a marker file makes it once)."""
    marker = config.get("fail_marker")
    if marker and epoch == config.get("fail_at_epoch") and rank == config.get("fail_rank", 0) \
            and not os.path.exists(marker):
        Path(marker).write_text(f"failed at epoch {epoch} on rank {rank}\n")
        raise InjectedFault(f"injected failure in epoch {epoch} on rank {rank}")


def _all_reduce_sum(values: list[float]) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(tensor)
    return tensor.tolist()


def train_func_per_worker(config: dict[str, Any]) -> None:
    """The per-worker training loop Ray Train runs on every worker (notebook 04).

    ``config`` holds the training parameters (see ``DEFAULT_PARAMS``), the
    MLflow ``tracking_uri`` and ``run_id``, ``torch_threads``, and optional
    fault injection (``fail_at_epoch``, ``fail_rank``, ``fail_marker``).
    """
    import ray.train
    import ray.train.torch

    torch.set_num_threads(int(config.get("torch_threads", 1)))
    torch.manual_seed(int(config.get("seed", 0)))
    rank = ray.train.get_context().get_world_rank()
    net = ray.train.torch.prepare_model(model_from_params(config))
    optimizer = make_optimizer(config["optimizer"], net.parameters(), config["lr"], config["momentum"])
    loss_fn = nn.NLLLoss(reduction="sum")
    tracker = tracking.WorkerTracker(config.get("tracking_uri"), config.get("run_id"), rank)

    # Resume after a failure: the controller restarts the workers with the last checkpoint.
    start_epoch, history = 0, []
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            state = torch.load(Path(folder) / CHECKPOINT_FILE, map_location="cpu", weights_only=False)
        _unwrap(net).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch, history = state["epoch"] + 1, state["history"]
        logged = tracker.logged_steps("train_loss")
        for past in history:  # epochs checkpointed but not yet tracked, logged once
            if past["epoch"] not in logged:
                tracker.log({k: past[k] for k in ("train_loss", "train_accuracy")}, step=past["epoch"])

    shard = ray.train.get_dataset_shard("train")
    validation = ray.train.get_dataset_shard("validation") if config.get("validate") else None
    for epoch in range(start_epoch, config["epochs"]):
        _maybe_fail(config, epoch, rank)
        net.train()
        loss_sum = correct = count = 0.0
        data_s = compute_s = 0.0
        started = waited = time.perf_counter()
        for batch in shard.iter_torch_batches(batch_size=config["batch_size_per_worker"],
                                              dtypes={"X": torch.float32, "y": torch.int64},
                                              local_shuffle_buffer_size=config.get("shuffle_buffer", 2000),
                                              local_shuffle_seed=int(config.get("seed", 0)) + epoch):
            got = time.perf_counter()
            data_s += got - waited
            optimizer.zero_grad()
            output = net(batch["X"])
            loss = loss_fn(output, batch["y"])
            (loss / len(batch["y"])).backward()
            optimizer.step()
            loss_sum += float(loss.detach())
            correct += float((output.argmax(dim=1) == batch["y"]).sum())
            count += len(batch["y"])
            waited = time.perf_counter()
            compute_s += waited - got
        loss_sum, correct, count = _all_reduce_sum([loss_sum, correct, count])
        metrics = {"train_loss": loss_sum / max(count, 1), "train_accuracy": correct / max(count, 1),
                   "epoch_seconds": time.perf_counter() - started, "data_seconds": data_s,
                   "compute_seconds": compute_s, "samples": count}
        if validation is not None:
            # "mean_accuracy" is the name the Tune sweeps (and the seed) optimise.
            metrics["val_accuracy"] = metrics["mean_accuracy"] = _validate(net, validation)
        history.append({"epoch": epoch, **{k: metrics[k] for k in (
            "train_loss", "train_accuracy", "epoch_seconds", "data_seconds", "compute_seconds", "samples")}})

        with tempfile.TemporaryDirectory() as folder:  # a fresh folder per report, never a shared one
            checkpoint = None
            if rank == 0:
                torch.save({"model": _unwrap(net).state_dict(), "optimizer": optimizer.state_dict(),
                            "epoch": epoch, "history": history, "params": _model_params(config)},
                           Path(folder) / CHECKPOINT_FILE)
                checkpoint = ray.train.Checkpoint.from_directory(folder)
            ray.train.report({**metrics, "epoch": epoch}, checkpoint=checkpoint)
        # Logged after the checkpoint is stored, so a resume never logs an epoch twice.
        tracker.log({k: metrics[k] for k in ("train_loss", "train_accuracy", "val_accuracy") if k in metrics},
                    step=epoch)


@torch.no_grad()
def _validate(net: nn.Module, shard) -> float:
    """Accuracy on this worker's validation shard, all-reduced over the workers."""
    net.eval()
    correct = count = 0.0
    for batch in shard.iter_torch_batches(batch_size=1000, dtypes={"X": torch.float32, "y": torch.int64}):
        correct += float((net(batch["X"]).argmax(dim=1) == batch["y"]).sum())
        count += len(batch["y"])
    correct, count = _all_reduce_sum([correct, count])
    return correct / max(count, 1)


def _model_params(config: dict[str, Any]) -> dict[str, Any]:
    return {k: config[k] for k in ("model", "hidden_sizes", "dropout", "activation") if k in config}


# --- the driver -----------------------------------------------------------------------------------

@dataclass
class TrainingResult:
    """Everything :func:`distributed_training` produced."""

    run_name: str
    params: dict[str, Any]
    history: list[dict[str, float]]
    test_accuracy: float
    predictions: np.ndarray
    test_labels: np.ndarray
    test_images: np.ndarray
    load_seconds: float
    training_seconds: float
    checkpoint_uri: str
    mlflow_run_id: str | None
    mlflow_url: str
    model: nn.Module | None = field(default=None, repr=False)


def unique_run_name(prefix: str = "train") -> str:
    """A run name no earlier run has used: reusing one makes Ray Train resume that run."""
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def worker_resources(num_workers: int, use_gpu: bool, cluster_cpus: float) -> dict[str, float]:
    """CPUs per training worker that leave one CPU for Ray Data and the Train controller.

    On a 2-core machine two workers with one CPU each would take every CPU,
    and the dataset's own tasks would wait for them forever (a silent hang);
    fractional CPUs let both run.
    """
    if use_gpu:
        return {"CPU": 1.0, "GPU": 1.0}
    spare = max(cluster_cpus - 1.0, 0.5)
    return {"CPU": min(1.0, math.floor(spare / num_workers * 100) / 100)}


def load_datasets(bucket: str, smoke_test_size: int, settings: Settings, num_actors: int = 2, seed: int = 0):
    """Pointers -> preprocessed, materialised Ray Datasets for train and test (the *load time*).

    The training pointers are shuffled first: listings are sorted by key, which means by label.
    """
    x_train, y_train, x_test, y_test, _ = storage.get_train_test_data(bucket, smoke_test_size, listing="manifest",
                                                                      client=storage.get_client(settings))
    x_train, y_train = data.shuffle_pointers(x_train, y_train, seed)
    train_ds = data.preprocess(data.to_ray_dataset(x_train, y_train), bucket, "actors",
                               num_actors=num_actors).materialize()
    test_ds = data.preprocess(data.to_ray_dataset(x_test, y_test), bucket, "actors",
                              num_actors=num_actors).materialize()
    return train_ds, test_ds


def dataset_to_numpy(ds) -> tuple[np.ndarray, np.ndarray]:
    """All ``X`` and ``y`` of a (small, materialised) dataset as numpy arrays."""
    xs, ys = [], []
    for batch in ds.iter_batches(batch_size=None):
        xs.append(batch["X"])
        ys.append(batch["y"])
    return np.concatenate(xs), np.concatenate(ys)


def distributed_training(
    params: dict[str, Any] | None = None,
    num_workers: int = 2,
    use_gpu: bool = False,
    bucket: str = "mnist",
    smoke_test_size: int = 0,
    experiment: str = "mnist-ray-train",
    run_name: str | None = None,
    max_failures: int = 2,
    fault: dict[str, Any] | None = None,
    settings: Settings | None = None,
    verbose: bool = True,
) -> TrainingResult:
    """Train on the bucket's MNIST with Ray Train, track it in MLflow, and test it (notebook 04).

    Args:
        params: training parameters, merged over ``DEFAULT_PARAMS``.
        num_workers: training workers (processes, each with a shard of the data).
        use_gpu: one GPU per worker.
        bucket: bucket holding the MNIST objects (uploaded if missing).
        smoke_test_size: training images to use (0 = all 60,000).
        experiment: MLflow experiment name.
        run_name: unique name of this run (generated by default; reusing one
            would make Ray Train resume that old run).
        max_failures: worker-group failures survived by restarting from the last checkpoint.
        fault: fault injection for tests, e.g. ``{"fail_at_epoch": 1, "fail_rank": 1}``.
        settings: where the services are.
        verbose: print one line per epoch.

    Returns:
        A :class:`TrainingResult` with the metric history, the test accuracy
        recomputed from the loaded checkpoint, timings and where things live.
    """
    import ray.train
    from ray.train.torch import TorchTrainer

    settings = settings or load_settings()
    params = {**DEFAULT_PARAMS, **(params or {})}
    if num_workers < 1 or params["epochs"] < 1:
        raise ParameterError("num_workers and epochs must be at least 1.")
    run_name = run_name or unique_run_name()
    cluster = data.init_ray(settings)

    # Load: list + fetch + decode, materialised so training measures training only.
    started = time.perf_counter()
    storage.upload_mnist(bucket, smoke_test_size, client=storage.get_client(settings), progress=False)
    train_ds, test_ds = load_datasets(bucket, smoke_test_size, settings, seed=params["seed"])
    load_seconds = time.perf_counter() - started

    run = tracking.start_run(settings.mlflow_tracking_uri, experiment, run_name,
                             {**params, "num_workers": num_workers, "use_gpu": use_gpu,
                              "smoke_test_size": smoke_test_size, "train_samples": train_ds.count()})
    resources = worker_resources(num_workers, use_gpu, cluster.get("CPU", 1.0))
    config = {**params, "tracking_uri": run.uri if run.enabled else None, "run_id": run.run_id,
              "torch_threads": max(1, int(resources["CPU"])), **(fault or {})}

    trainer = TorchTrainer(
        train_func_per_worker,
        train_loop_config=config,
        # Scaling config
        scaling_config=ray.train.ScalingConfig(num_workers=num_workers, use_gpu=use_gpu,
                                               resources_per_worker=resources),
        # Checkpoints and results in the object store, under a unique run name
        run_config=ray.train.RunConfig(
            name=run_name, storage_path=f"{bucket}/ray-results", storage_filesystem=data.s3_filesystem(settings),
            failure_config=ray.train.FailureConfig(max_failures=max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
        ),
        datasets={"train": train_ds},
    )
    started = time.perf_counter()
    try:
        result = trainer.fit()
    except Exception:
        run.end("FAILED")
        raise
    training_seconds = time.perf_counter() - started

    # Test: the model loaded back from the result's checkpoint, evaluated in vectorised batches.
    net, state = load_checkpoint(result.checkpoint)
    test_images, test_labels = dataset_to_numpy(test_ds)
    predictions = model.predict(net, test_images)
    test_accuracy = model.accuracy(predictions, test_labels)
    history = state["history"]
    if verbose:
        for row in history:
            print(f"epoch {row['epoch']}: loss {row['train_loss']:.4f}  accuracy {row['train_accuracy']:.4f}  "
                  f"({row['samples']:.0f} samples in {row['epoch_seconds']:.1f} s, "
                  f"{row['data_seconds']:.1f} s waiting for data)")
        print(f"test accuracy {test_accuracy:.4f} | load {load_seconds:.1f} s | training {training_seconds:.1f} s")

    run.log_metrics({"test_accuracy": test_accuracy, "load_seconds": load_seconds,
                     "training_seconds": training_seconds})
    checkpoint_uri = f"s3://{result.checkpoint.path}"
    run.set_tags({"checkpoint": checkpoint_uri, "ray_run_name": run_name})
    if run.enabled:
        with result.checkpoint.as_directory() as folder:
            run.log_artifact(Path(folder) / CHECKPOINT_FILE, "model")
        from helpers import plots

        figure = plots.confusion_matrix_figure(model.confusion_matrix(predictions, test_labels))
        run.log_figure(figure, "confusion_matrix.png")
        import matplotlib.pyplot as plt

        plt.close(figure)
    run.end()
    return TrainingResult(run_name, params, history, test_accuracy, predictions, test_labels, test_images,
                          load_seconds, training_seconds, checkpoint_uri, run.run_id, run.url, model=net)
