"""Generated from notebooks/04_distributed_training.ipynb by `python -m workshop.export`: edit the notebook.

Lesson 04 · Distributed training with Ray Train, tracked in MLflow. Above each definition, the cell that teaches it.
"""
import base64
import io
import json
import math
import os
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import ray.train
import torch
from ray.train.torch import TorchTrainer, prepare_model
from torch import nn

from helpers import tracking
from helpers.settings import ParameterError, Settings, check_count
from helpers.storage import s3_filesystem
from helpers.worker_metrics import worker_system_metrics
from helpers.training_support import ShardCache, check_params, maybe_fail, require_gpus


ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh}


# From notebooks/04_distributed_training.ipynb, cell 8 (id e490c6c6).
class MNISTModel(nn.Module):
    """The original article's multilayer perceptron: 784 -> hidden layers -> 10 log-probabilities."""

    def __init__(self, input_size: int = 784, hidden_sizes: Sequence[int] = (128, 64), output_size: int = 10,
                 dropout: float = 0.0, activation: str = "relu") -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ParameterError(f"activation must be one of {sorted(ACTIVATIONS)}, not {activation!r}.")
        if not 0.0 <= dropout < 1.0:
            raise ParameterError(f"dropout must be in [0, 1), not {dropout}.")
        layers: list[nn.Module] = [nn.Flatten()]
        width = input_size
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, int(hidden)), ACTIVATIONS[activation]()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = int(hidden)
        layers += [nn.Linear(width, output_size), nn.LogSoftmax(dim=1)]
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Log-probabilities ``[batch, 10]`` for images ``[batch, 1, 28, 28]``."""
        return self.net(x)


# From notebooks/04_distributed_training.ipynb, cell 10 (id 1f4b0627).
class MNISTConvNet(nn.Module):
    """A small CNN (two conv blocks), about 99% test accuracy on full MNIST."""

    def __init__(self, channels: Sequence[int] = (16, 32), hidden: int = 64, dropout: float = 0.0) -> None:
        super().__init__()
        c1, c2 = channels
        self.net = nn.Sequential(
            nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(c2 * 7 * 7, hidden), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(hidden, 10), nn.LogSoftmax(dim=1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Log-probabilities ``[batch, 10]`` for images ``[batch, 1, 28, 28]``."""
        return self.net(x.reshape(-1, 1, 28, 28))


# From notebooks/04_distributed_training.ipynb, cell 12 (id c28c8ed2).
def build_model(model: str = "mlp", hidden_sizes: Sequence[int] = (128, 64), dropout: float = 0.0,
                activation: str = "relu") -> nn.Module:
    """A fresh model by name: ``"mlp"`` (:class:`MNISTModel`) or ``"cnn"`` (:class:`MNISTConvNet`)."""
    if model == "mlp":
        return MNISTModel(784, hidden_sizes, 10, dropout=dropout, activation=activation)
    if model == "cnn":
        return MNISTConvNet(dropout=dropout)
    raise ParameterError(f"model must be 'mlp' or 'cnn', not {model!r}.")


CHECKPOINT_FILE = "checkpoint.pt"  # one name for saving and loading (the original article used two)
DEFAULT_PARAMS: dict[str, Any] = {
    "epochs": 10, "lr": 0.003, "momentum": 0.9, "optimizer": "adam", "lr_schedule": "onecycle", "model": "mlp",
    "hidden_sizes": [256, 128], "dropout": 0.0, "activation": "relu", "batch_size_per_worker": 128, "seed": 0,
    "cache_shard": False,
}
MODEL_KEYS = ("model", "hidden_sizes", "dropout", "activation")  # what rebuilds the network
DEFAULT_NUM_WORKERS = 2  # num_workers: a step takes 2 x batch_size_per_worker images, the global batch


# From notebooks/04_distributed_training.ipynb, cell 17 (id 66df3bd2).
def make_optimizer(name: str, parameters, lr: float, momentum: float = 0.9) -> torch.optim.Optimizer:
    """``"adam"``, or ``"sgd"`` with momentum (the original article's)."""
    if name == "adam":
        return torch.optim.Adam(parameters, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=lr, momentum=momentum)
    raise ParameterError(f"optimizer must be 'adam' or 'sgd', not {name!r}.")


# From notebooks/04_distributed_training.ipynb, cell 19 (id 8ceeeaed).
def lr_schedule(optimizer: torch.optim.Optimizer, config: dict[str, Any]):
    """A one-cycle learning-rate schedule stepped once per batch, or None (``lr_schedule="none"``: a fixed rate)."""
    if config.get("lr_schedule", "onecycle") == "none":
        return None
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=config["lr"], epochs=int(config["epochs"]),
                                               steps_per_epoch=int(config["steps_per_epoch"]))


# From notebooks/04_distributed_training.ipynb, cell 21 (id c542dca2).
def model_from_params(params: dict[str, Any]) -> nn.Module:
    """A fresh model built from the training parameters (those in ``MODEL_KEYS``)."""
    return build_model(params.get("model", "mlp"), params.get("hidden_sizes", (128, 64)),
                       params.get("dropout", 0.0), params.get("activation", "relu"))


# From notebooks/04_distributed_training.ipynb, cell 23 (id 576f0a63).
def checkpoint_state(net: nn.Module, optimizer, epoch: int, history: list, params: dict[str, Any],
                     schedule=None) -> dict[str, Any]:
    """What every checkpoint holds (04's runs, 05's trials, 06's experiments): plain tensors and numbers."""
    module = net.module if hasattr(net, "module") else net  # the model inside Ray Train's parallel wrapper
    return {"model": module.state_dict(), "optimizer": optimizer.state_dict() if optimizer else None,
            "schedule": schedule.state_dict() if schedule else None, "epoch": epoch, "history": history,
            "params": {k: params[k] for k in MODEL_KEYS if k in params}}


# From notebooks/04_distributed_training.ipynb, cell 25 (id b7f8ffd7).
def load_checkpoint(source) -> tuple[nn.Module, dict[str, Any]]:
    """The model, ready for inference, and the saved state, from a Ray ``Checkpoint``, a file path or bytes."""
    if isinstance(source, ray.train.Checkpoint):
        with source.as_directory() as folder:
            return load_checkpoint(Path(folder) / CHECKPOINT_FILE)
    state = torch.load(io.BytesIO(source) if isinstance(source, bytes) else source, map_location="cpu",
                       weights_only=True)  # never runs code from the file
    net = model_from_params(state["params"])
    net.load_state_dict(state["model"])
    return net.eval(), state


# From notebooks/04_distributed_training.ipynb, cell 27 (id b1d57811).
def worker_mlflow_client(config: dict[str, Any], rank: int):
    """An ``MlflowClient`` for rank 0 when the config names a run and the server answers, else None."""
    from mlflow.tracking import MlflowClient

    if rank != 0 or not config.get("run_id"):
        return None
    ok, reason = tracking.tracking_available(config.get("tracking_uri", ""))  # a quick check, not MLflow's retries
    if not ok:
        print(f"MLflow tracking is off for this worker: {reason}")
        return None
    return MlflowClient(config["tracking_uri"])


TRACKED = ("train_loss", "train_accuracy", "val_accuracy")  # what a worker logs to MLflow per epoch


# From notebooks/04_distributed_training.ipynb, cell 29 (id df878946).
def log_epochs(mlflow_client, run_id: str, rows: list[dict[str, Any]]) -> bool:
    """Log the tracked metrics of history ``rows`` into run ``run_id`` in one call; False (and one line) on failure."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [Metric(key, float(row[key]), now, int(row["epoch"])) for row in rows for key in TRACKED if key in row]
    try:
        mlflow_client.log_batch(run_id, metrics=metrics)
        return True
    except Exception as err:  # noqa: BLE001 - tracking must never stop training
        print(f"MLflow tracking is off for this worker: {type(err).__name__}: {str(err)[:200]}")
        return False


# From notebooks/04_distributed_training.ipynb, cell 31 (id 7b52009b).
def all_reduce_sum(values: list[float]) -> torch.Tensor:
    """Sum ``values`` over all workers, on this worker's device (as they are outside Ray Train)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return torch.tensor(values, dtype=torch.float64)
    tensor = torch.tensor(values, dtype=torch.float64, device=ray.train.torch.get_device())  # CUDA for NCCL
    torch.distributed.all_reduce(tensor)
    return tensor


# From notebooks/04_distributed_training.ipynb, cell 33 (id ad1d2538).
@torch.no_grad()
def validate(net: nn.Module) -> float:
    """Accuracy on this worker's ``"validation"`` shard, all-reduced over the workers; then back to training mode."""
    net.eval()
    correct = count = 0.0
    for batch in ray.train.get_dataset_shard("validation").iter_torch_batches(batch_size=1000):
        correct += float((net(batch["X"]).argmax(dim=1) == batch["y"]).sum())
        count += len(batch["y"])
    net.train()
    correct, count = all_reduce_sum([correct, count]).tolist()
    return correct / max(count, 1)


# From notebooks/04_distributed_training.ipynb, cell 35 (id 5b276ab9).
def resume(checkpoint, net: nn.Module, optimizer, schedule, mlflow_client, run_id: str | None) -> tuple[int, list, int]:
    """After a failure: the checkpoint's weights, optimizer and schedule state put back.

    Returns the next epoch, the history, and the last epoch MLflow holds (the epochs since the checkpoint run
    again but are not logged twice).
    """
    _, state = load_checkpoint(checkpoint)
    (net.module if hasattr(net, "module") else net).load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if schedule and state.get("schedule"):
        schedule.load_state_dict(state["schedule"])
    history = state["history"]
    history[-1]["resumed_from_here"] = history[-1].get("resumed_from_here", 0) + 1  # where a restart began
    logged = tracking.backfill_epochs(mlflow_client, run_id, history, TRACKED) if mlflow_client else state["epoch"]
    return state["epoch"] + 1, history, logged


# From notebooks/04_distributed_training.ipynb, cell 37 (id c086a405).
def checkpoint_due(epoch: int, config: dict[str, Any]) -> bool:
    """Whether ``epoch`` ends with a checkpoint: every ``checkpoint_every`` epochs, and always the last."""
    return epoch % int(config.get("checkpoint_every", 1)) == 0 or epoch == int(config["epochs"])


# From notebooks/04_distributed_training.ipynb, cell 39 (id 38b021c7).
def train_epoch(net: nn.Module, optimizer, schedule, batches) -> list[float]:
    """One pass over ``batches``, a step each; this worker's ``[loss sum, correct, images]``."""
    loss_sum = correct = count = 0.0
    for batch in batches:
        optimizer.zero_grad()
        output = net(batch["X"])
        loss = nn.functional.nll_loss(output, batch["y"], reduction="sum")
        (loss / len(batch["y"])).backward()  # the gradient of the batch mean
        optimizer.step()
        if schedule:
            schedule.step()  # one-cycle: the rate moves every batch
        loss_sum, count = loss_sum + float(loss), count + len(batch["y"])
        correct += float((output.argmax(dim=1) == batch["y"]).sum())
    return [loss_sum, correct, count]


# From notebooks/04_distributed_training.ipynb, cell 41 (id 34fee604).
def train_func_per_worker(config: dict[str, Any]) -> None:
    """The loop Ray Train runs in every worker: train on this worker's shard, report every epoch, checkpoint."""
    torch.set_num_threads(config["torch_threads"])
    torch.manual_seed(config["seed"])
    rank = ray.train.get_context().get_world_rank()
    net = prepare_model(model_from_params(config))  # wrapped for data parallelism
    optimizer = make_optimizer(config["optimizer"], net.parameters(), config["lr"], config["momentum"])
    schedule = lr_schedule(optimizer, config)
    run_id, mlflow_client = config.get("run_id"), worker_mlflow_client(config, rank)
    stop_metrics = worker_system_metrics(config, rank)  # this worker's CPU and memory into the run, every 2 s
    start_epoch, history, logged_through = 1, [], 0
    if ray.train.get_checkpoint():  # a restart after a failure: go on from the last checkpoint
        start_epoch, history, logged_through = resume(ray.train.get_checkpoint(), net, optimizer, schedule,
                                                      mlflow_client, run_id)
    shard, cache = ray.train.get_dataset_shard("train"), ShardCache(config)
    for epoch in range(start_epoch, config["epochs"] + 1):
        maybe_fail(config, epoch, rank)  # does nothing unless the config asks for a fault (fail_at_epoch)
        started = time.perf_counter()
        batches = shard.iter_torch_batches(batch_size=config["batch_size_per_worker"], local_shuffle_buffer_size=2000,
                                           local_shuffle_seed=config["seed"] + epoch)  # on get_device() (03's X, y)
        sums = train_epoch(net, optimizer, schedule, cache.epoch(batches, config["seed"] + epoch))  # cached: memory
        loss_sum, correct, count = all_reduce_sum(sums).tolist()  # all workers
        metrics = {"train_loss": loss_sum / count, "train_accuracy": correct / count, "samples": count,
                   "epoch_seconds": time.perf_counter() - started}
        if config.get("validate"):  # what notebook 05's sweeps optimise
            metrics["val_accuracy"] = validate(net)
        history.append({"epoch": epoch, **metrics})
        with tempfile.TemporaryDirectory() as folder:  # a fresh folder for every checkpoint
            checkpoint = None
            if rank == 0 and checkpoint_due(epoch, config):
                torch.save(checkpoint_state(net, optimizer, epoch, history, config, schedule),
                           Path(folder) / CHECKPOINT_FILE)
                checkpoint = ray.train.Checkpoint.from_directory(folder)
            ray.train.report({**metrics, "epoch": epoch}, checkpoint=checkpoint)
        if mlflow_client and epoch > logged_through:  # each epoch once, also across a resume
            mlflow_client = mlflow_client if log_epochs(mlflow_client, run_id, [history[-1]]) else None
    stop_metrics()


# From notebooks/04_distributed_training.ipynb, cell 43 (id fa35e192).
def worker_resources(num_workers: int, use_gpu: bool, cluster_cpus: float) -> dict[str, float]:
    """CPUs per training worker that leave one CPU for Ray Data and the Train controller."""
    if use_gpu:
        return {"CPU": 1.0, "GPU": 1.0}
    spare = max(cluster_cpus - 1.0, 0.5)
    return {"CPU": min(1.0, math.floor(spare / num_workers * 100) / 100)}


# From notebooks/04_distributed_training.ipynb, cell 45 (id 18b031fe).
def unique_run_name(prefix: str = "train") -> str:
    """A run name no earlier run has used: reusing one makes Ray Train resume that run."""
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


# From notebooks/04_distributed_training.ipynb, cell 47 (id de8d2dbc).
def make_trainer(config: dict[str, Any], datasets: dict[str, Any], num_workers: int, run_name: str,
                 storage_path: str, use_gpu: bool = False, max_failures: int = 2, cluster_cpus: float = 2.0,
                 *, settings: Settings) -> TorchTrainer:
    """A ``TorchTrainer`` for :func:`train_func_per_worker`, checkpointing into the object store (notebook 04)."""
    check_params(config)  # a bad value fails here, in one line, not later in a worker
    check_count("num_workers", num_workers, 1024)
    check_count("max_failures", max_failures, 100, minimum=0)
    if use_gpu:
        require_gpus(num_workers)  # without them Ray would wait for ever
    resources = worker_resources(num_workers, use_gpu, cluster_cpus)
    config = {**DEFAULT_PARAMS, "torch_threads": max(1, int(resources["CPU"])), **config}
    steps = math.ceil(datasets["train"].count() / num_workers / config["batch_size_per_worker"])  # per worker
    config.setdefault("steps_per_epoch", steps)  # what the one-cycle schedule needs
    return TorchTrainer(
        train_func_per_worker,
        train_loop_config=config,
        datasets=datasets,  # split into one shard per worker; a single worker reads it whole, with no split actor
        dataset_config=ray.train.DataConfig(datasets_to_split="all" if num_workers > 1 else []),
        # Scaling config
        scaling_config=ray.train.ScalingConfig(num_workers=num_workers, use_gpu=use_gpu,
                                               resources_per_worker=resources),
        # Where checkpoints go, how many to keep, how many failures to survive
        run_config=ray.train.RunConfig(
            name=run_name,
            storage_path=storage_path,  # "<bucket>/<prefix>" in the object store
            storage_filesystem=s3_filesystem(settings),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
            failure_config=ray.train.FailureConfig(max_failures=max_failures),
        ),
    )


# From notebooks/04_distributed_training.ipynb, cell 49 (id 1574bddb).
def log_dataset(mlflow_client, run_id: str, name: str, source_uri: str, count: int, context: str,
                tags: dict[str, str] | None = None) -> None:
    """Log a dataset input (its source URI and object count, not the data) into run ``run_id`` (notebooks 04-06)."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import Dataset, DatasetInput, InputTag

    from mlflow.exceptions import MlflowException

    dataset = MetaDataset(resolve_dataset_source(source_uri), name=name)
    input_tags = {"mlflow.data.context": context, "objects": str(count), **(tags or {})}
    entry = DatasetInput(Dataset(**dataset.to_dict()), tags=[InputTag(k, v) for k, v in input_tags.items()])
    for attempt in range(3):
        try:
            mlflow_client.log_inputs(run_id, datasets=[entry])
            return
        except MlflowException as err:
            # Runs logging the same dataset at once race on the server's insert of it; a retry links the stored one.
            if attempt == 2 or "unique constraint" not in str(err).lower():
                raise
            time.sleep(0.2 * (attempt + 1))


# From notebooks/04_distributed_training.ipynb, cell 60 (id e357d8e4).
def log_metric_rest(uri: str, run_id: str, key: str, value: float, step: int = 0, timeout: float = 3.0) -> None:
    """Log one metric with MLflow's REST API, as the original article did; a refusal raises ``RuntimeError``.

    The tracking server asks for its user and password (basic auth): the request carries MLflow's own
    ``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD``, as MLflow's client does.
    """
    body = json.dumps({"run_id": run_id, "key": key, "value": float(value), "step": int(step),
                       "timestamp": int(time.time() * 1000)}).encode()
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME", ""), os.environ.get("MLFLOW_TRACKING_PASSWORD", "")
    headers = {"Content-Type": "application/json"}
    if user:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(f"{uri.rstrip('/')}/api/2.0/mlflow/runs/log-metric", data=body,
                                     headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"MLflow refused the metric {key!r}: HTTP {err.code} {err.read()[:200]!r}") from None


# From notebooks/04_distributed_training.ipynb, cell 64 (id 080239ec).
@torch.no_grad()
def predict(model: nn.Module, images, batch_size: int = 2000) -> np.ndarray:
    """Predicted class of every image, in vectorised batches (no per-image loop)."""
    model.eval()
    x = torch.as_tensor(np.asarray(images, dtype=np.float32))
    out = [model(x[i:i + batch_size]).argmax(dim=1) for i in range(0, len(x), batch_size)]
    return torch.cat(out).numpy() if out else np.zeros(0, dtype=np.int64)


# From notebooks/04_distributed_training.ipynb, cell 66 (id 6d600f3a).
def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of predictions equal to the labels."""
    labels = np.asarray(labels)
    return float((np.asarray(predictions) == labels).mean()) if len(labels) else 0.0


# From notebooks/04_distributed_training.ipynb, cell 68 (id 0e6ac1f5).
def confusion_matrix(predictions: np.ndarray, labels: np.ndarray, classes: int = 10) -> np.ndarray:
    """``[true, predicted]`` counts."""
    matrix = np.zeros((classes, classes), dtype=np.int64)
    np.add.at(matrix, (np.asarray(labels, dtype=np.int64), np.asarray(predictions, dtype=np.int64)), 1)
    return matrix


# From notebooks/04_distributed_training.ipynb, cell 70 (id 0cbd6c2f).
def accuracy_interval(accuracy: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval (95% with ``z=1.96``) of an accuracy measured on ``n`` images."""
    if n <= 0:
        return 0.0, 1.0
    centre = (accuracy + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(accuracy * (1 - accuracy) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


# From notebooks/04_distributed_training.ipynb, cell 72 (id 435af561).
def with_interval(accuracy: float, n: int) -> str:
    """``"90.00% (95% interval 82.6%-94.5%, 100 images)"``."""
    low, high = accuracy_interval(accuracy, n)
    return f"{accuracy:.2%} (95% interval {low:.1%}-{high:.1%}, {n:,} images)"


# From notebooks/04_distributed_training.ipynb, cell 74 (id 7ac706d5).
def mcnemar_p(b: int, c: int) -> float:
    """McNemar's exact test: the two-sided p-value of ``b`` against ``c`` disagreements, each a fair coin toss."""
    n = b + c
    return min(1.0, 2 * sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2**n)


# From notebooks/04_distributed_training.ipynb, cell 76 (id 0f06d542).
def disagreements(new: np.ndarray, old: np.ndarray, labels: np.ndarray) -> tuple[int, int]:
    """``(b, c)``: the images ``new`` gets right and ``old`` wrong, and the reverse (predictions of the same images)."""
    new_right, old_right = np.asarray(new) == np.asarray(labels), np.asarray(old) == np.asarray(labels)
    return int((new_right & ~old_right).sum()), int((~new_right & old_right).sum())


# From notebooks/04_distributed_training.ipynb, cell 78 (id 1ee369bf).
def clearly_better(new: np.ndarray, old: np.ndarray, labels: np.ndarray, alpha: float = 0.05) -> bool:
    """Whether predictions ``new`` beat ``old`` on the same images beyond noise (McNemar's exact test); else a tie."""
    b, c = disagreements(new, old, labels)
    return b > c and mcnemar_p(b, c) < alpha


# From notebooks/04_distributed_training.ipynb, cell 80 (id cf2f3faa).
def paired_test(new: np.ndarray, old: np.ndarray, labels: np.ndarray) -> str:
    """The paired test in words: where the two models disagree, McNemar's p, and the verdict for ``new``."""
    b, c = disagreements(new, old, labels)
    verdict = ("better beyond noise" if clearly_better(new, old, labels)
               else "worse beyond noise" if clearly_better(old, new, labels) else "a tie")
    return (f"right on {b} images the other gets wrong, wrong on {c} it gets right ({b + c:,} disagreements "
            f"in {len(labels):,} images): McNemar's exact p = {mcnemar_p(b, c):.2g}, {verdict}")


# From notebooks/04_distributed_training.ipynb, cell 88 (id 7719a1c7).
def log_torch_model(net: nn.Module, example: np.ndarray, name: str = "model"):
    """Log ``net`` as an MLflow PyTorch model (signature and input example from ``example``) in the active run."""
    import mlflow
    from mlflow.models import infer_signature

    with torch.no_grad():
        output = net(torch.as_tensor(example)).numpy()
    return mlflow.pytorch.log_model(
        net, name=name, input_example=example, signature=infer_signature(example, output),
        pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],  # known: no slow inference of them
    )
