"""Generated from notebooks/04_distributed_training.ipynb by `python -m helpers.export`: edit the notebook.

Lesson 04 · Distributed training with Ray Train, tracked in MLflow. Above each definition, the cell that teaches it.
"""
import contextlib
import json
import math
import os
import signal
import tempfile
import threading
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

from helpers import timings
from helpers.config import ParameterError, Settings, check_count, check_fraction, check_positive, load_settings
from helpers.storage import s3_filesystem

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh}


# From notebooks/04_distributed_training.ipynb, cell 6 (id ac3478d6).
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


# From notebooks/04_distributed_training.ipynb, cell 6 (id ac3478d6).
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


# From notebooks/04_distributed_training.ipynb, cell 6 (id ac3478d6).
def build_model(model: str = "mlp", hidden_sizes: Sequence[int] = (128, 64), dropout: float = 0.0,
                activation: str = "relu") -> nn.Module:
    """A fresh model by name: ``"mlp"`` (:class:`MNISTModel`) or ``"cnn"`` (:class:`MNISTConvNet`)."""
    if model == "mlp":
        return MNISTModel(784, hidden_sizes, 10, dropout=dropout, activation=activation)
    if model == "cnn":
        return MNISTConvNet(dropout=dropout)
    raise ParameterError(f"model must be 'mlp' or 'cnn', not {model!r}.")


# From notebooks/04_distributed_training.ipynb, cell 6 (id ac3478d6).
@torch.no_grad()
def predict(model: nn.Module, images, batch_size: int = 2000) -> np.ndarray:
    """Predicted class of every image, in vectorised batches (no per-image loop)."""
    model.eval()
    x = torch.as_tensor(np.asarray(images, dtype=np.float32))
    out = [model(x[i:i + batch_size]).argmax(dim=1) for i in range(0, len(x), batch_size)]
    return torch.cat(out).numpy() if out else np.zeros(0, dtype=np.int64)


# From notebooks/04_distributed_training.ipynb, cell 6 (id ac3478d6).
def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of predictions equal to the labels."""
    labels = np.asarray(labels)
    return float((np.asarray(predictions) == labels).mean()) if len(labels) else 0.0


# From notebooks/04_distributed_training.ipynb, cell 6 (id ac3478d6).
def confusion_matrix(predictions: np.ndarray, labels: np.ndarray, classes: int = 10) -> np.ndarray:
    """``[true, predicted]`` counts."""
    matrix = np.zeros((classes, classes), dtype=np.int64)
    np.add.at(matrix, (np.asarray(labels, dtype=np.int64), np.asarray(predictions, dtype=np.int64)), 1)
    return matrix


CHECKPOINT_FILE = "checkpoint.pt"  # one name for saving and loading (the original article used two)
DEFAULT_PARAMS: dict[str, Any] = {
    "epochs": 3, "lr": 0.05, "momentum": 0.9, "optimizer": "sgd", "model": "mlp",
    "hidden_sizes": [128, 64], "dropout": 0.0, "activation": "relu", "batch_size_per_worker": 64, "seed": 0,
}
MODEL_KEYS = ("model", "hidden_sizes", "dropout", "activation")


# From notebooks/04_distributed_training.ipynb, cell 9 (id fe5dbbce).
def check_params(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` when every training parameter has an allowed value; else one :class:`ParameterError` naming them.

    Checked in the driver before any run starts, not deep inside torch on a worker.
    """
    check_count("epochs", params["epochs"], 10_000)
    check_positive("lr", params["lr"], maximum=10.0)
    check_fraction("momentum", params.get("momentum", 0.0))
    check_count("batch_size_per_worker", params.get("batch_size_per_worker", 64), 100_000)
    check_count("checkpoint_every", params.get("checkpoint_every", 1), 10_000)
    if not isinstance(params.get("cache_shard", False), bool):
        raise ParameterError(f"cache_shard must be True or False, not {params['cache_shard']!r}.")
    hidden = params.get("hidden_sizes", (128, 64))
    if isinstance(hidden, (str, bytes)) or not hasattr(hidden, "__len__") or not len(hidden):
        raise ParameterError(f"hidden_sizes must be a list of layer widths such as [128, 64], not {hidden!r}.")
    for width in hidden:
        check_count("each of hidden_sizes", width, 100_000)
    make_optimizer(params.get("optimizer", "sgd"), [torch.zeros(1, requires_grad=True)], 0.1, 0.0)
    build_model(params.get("model", "mlp"), hidden, params.get("dropout", 0.0), params.get("activation", "relu"))
    return params


# From notebooks/04_distributed_training.ipynb, cell 9 (id fe5dbbce).
class InjectedFault(RuntimeError):
    """Raised on purpose by ``fail_at_epoch``, to show that training resumes from the last checkpoint."""


# From notebooks/04_distributed_training.ipynb, cell 9 (id fe5dbbce).
def make_optimizer(name: str, parameters, lr: float, momentum: float) -> torch.optim.Optimizer:
    """``"sgd"`` (with momentum, as the original article) or ``"adam"``."""
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=lr, momentum=momentum)
    if name == "adam":
        return torch.optim.Adam(parameters, lr=lr)
    raise ParameterError(f"optimizer must be 'sgd' or 'adam', not {name!r}.")


# From notebooks/04_distributed_training.ipynb, cell 9 (id fe5dbbce).
def model_from_params(params: dict[str, Any]) -> nn.Module:
    """A fresh model built from the training parameters."""
    return build_model(params.get("model", "mlp"), params.get("hidden_sizes", (128, 64)),
                       params.get("dropout", 0.0), params.get("activation", "relu"))


# From notebooks/04_distributed_training.ipynb, cell 9 (id fe5dbbce).
def load_checkpoint(checkpoint) -> tuple[nn.Module, dict[str, Any]]:
    """The model, ready for inference, and the saved state (epoch, params, history) of a Ray Train checkpoint."""
    with checkpoint.as_directory() as folder:
        state = torch.load(Path(folder) / CHECKPOINT_FILE, map_location="cpu", weights_only=True)
    net = model_from_params(state["params"])
    net.load_state_dict(state["model"])
    return net.eval(), state


# From notebooks/04_distributed_training.ipynb, cell 11 (id b1d57811).
def worker_mlflow_client(config: dict[str, Any], rank: int):
    """An ``MlflowClient`` for rank 0 when the config names a run and the server answers, else None."""
    from mlflow.tracking import MlflowClient

    from helpers.tracking import tracking_available

    if rank != 0 or not config.get("run_id"):
        return None
    ok, reason = tracking_available(config.get("tracking_uri", ""))  # a quick check, not MLflow's long retries
    if not ok:
        print(f"MLflow tracking is off for this worker: {reason}")
        return None
    return MlflowClient(config["tracking_uri"])


TRACKED = ("train_loss", "train_accuracy", "val_accuracy")  # what a worker logs to MLflow per epoch


# From notebooks/04_distributed_training.ipynb, cell 11 (id b1d57811).
def log_epochs(mlflow_client, run_id: str, rows: list[dict[str, Any]]) -> bool:
    """Log the tracked metrics of ``rows`` (history rows with an ``"epoch"``) into run ``run_id`` in one call.

    Returns False (with one printed line) when tracking failed.
    """
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [Metric(key, float(row[key]), now, int(row["epoch"])) for row in rows for key in TRACKED if key in row]
    try:
        if metrics:
            mlflow_client.log_batch(run_id, metrics=metrics)
        return True
    except Exception as err:  # noqa: BLE001 - tracking must never stop training
        print(f"MLflow tracking is off for this worker: {type(err).__name__}: {str(err)[:200]}")
        return False


# From notebooks/04_distributed_training.ipynb, cell 11 (id b1d57811).
def log_metric_rest(uri: str, run_id: str, key: str, value: float, step: int = 0, timeout: float = 3.0) -> None:
    """Log one metric with MLflow's REST API, as the original article did (no MLflow package needed).

    Raises:
        RuntimeError: the server refused the metric (its answer is included).
    """
    body = json.dumps({"run_id": run_id, "key": key, "value": float(value), "step": int(step),
                       "timestamp": int(time.time() * 1000)}).encode()
    request = urllib.request.Request(f"{uri.rstrip('/')}/api/2.0/mlflow/runs/log-metric", data=body,
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"MLflow refused the metric {key!r}: HTTP {err.code} {err.read()[:200]!r}") from None


# From notebooks/04_distributed_training.ipynb, cell 13 (id 7b52009b).
def all_reduce_sum(values: list[float]) -> list[float]:
    """Sum ``values`` over all workers (a no-op with one worker or outside Ray Train)."""
    tensor = torch.tensor(values, dtype=torch.float64)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(tensor)
    return tensor.tolist()


# From notebooks/04_distributed_training.ipynb, cell 13 (id 7b52009b).
def epoch_batches(shard, config: dict[str, Any], epoch: int, cache: list | None):
    """This worker's batches for one epoch, as ``{"X", "y"}`` tensors.

    Ray Data streams the shard (``iter_torch_batches``, shuffled locally, seeded per epoch). With
    ``cache`` a list (``config["cache_shard"]``), the first epoch also keeps the shard in it and later
    epochs shuffle and slice it in memory, skipping Ray Data's per-batch work, which takes the worker
    about as long as the step itself for this model; the shard must fit in the worker's memory.
    """
    size, seed = config["batch_size_per_worker"], int(config.get("seed", 0)) + epoch
    if cache:  # later epochs: the first epoch's rows, in a new order
        x, y = cache
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
        for start in range(0, len(order), size):
            rows = order[start:start + size]
            yield {"X": x[rows], "y": y[rows]}
        return
    kept = []
    for batch in shard.iter_torch_batches(batch_size=size, dtypes={"X": torch.float32, "y": torch.int64},
                                          local_shuffle_buffer_size=config.get("shuffle_buffer", 2000),
                                          local_shuffle_seed=seed):
        if cache is not None:
            kept.append(batch)
        yield batch
    if cache is not None and kept:
        cache += [torch.cat([batch["X"] for batch in kept]), torch.cat([batch["y"] for batch in kept])]


# From notebooks/04_distributed_training.ipynb, cell 13 (id 7b52009b).
@torch.no_grad()
def validate(net: nn.Module, shard) -> float:
    """Accuracy on this worker's validation shard, all-reduced over the workers."""
    net.eval()
    correct = count = 0.0
    for batch in shard.iter_torch_batches(batch_size=1000, dtypes={"X": torch.float32, "y": torch.int64}):
        correct += float((net(batch["X"]).argmax(dim=1) == batch["y"]).sum())
        count += len(batch["y"])
    correct, count = all_reduce_sum([correct, count])
    return correct / max(count, 1)


# From notebooks/04_distributed_training.ipynb, cell 13 (id 7b52009b).
def maybe_fail(config: dict[str, Any], epoch: int, rank: int) -> None:
    """Raise once in epoch ``fail_at_epoch`` on rank ``fail_rank``; a marker file makes it happen only once.

    The fault comes a few seconds into the epoch, as a real crash would. Ray Train's controller collects
    the workers' reports every few seconds: a worker that dies before the last report was collected
    loses that checkpoint too, and the run restarts from the one before.
    """
    marker = config.get("fail_marker")
    if marker and epoch == config.get("fail_at_epoch") and rank == config.get("fail_rank", 0) \
            and not os.path.exists(marker):
        Path(marker).write_text(f"failed at epoch {epoch} on rank {rank}\n")
        time.sleep(3 * float(os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "2")))
        raise InjectedFault(f"injected failure in epoch {epoch} on rank {rank}")


# From notebooks/04_distributed_training.ipynb, cell 13 (id 7b52009b).
def resume(checkpoint, module: nn.Module, optimizer, mlflow_client, run_id: str | None) -> tuple[int, list, int]:
    """Load the last checkpoint into the model and optimizer after a failure.

    Returns the next epoch, the history so far (its last row, the checkpointed epoch, counts the runs
    resumed from it in ``"resumed_from_here"``) and the last epoch MLflow holds: the epochs run since the
    checkpoint were logged as they ended, so they run again but are not logged again. A checkpointed
    epoch MLflow missed is logged now.
    """
    with checkpoint.as_directory() as folder:
        state = torch.load(Path(folder) / CHECKPOINT_FILE, map_location="cpu", weights_only=True)
    module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    logged_through = state["epoch"]
    if mlflow_client:
        logged = {m.step for m in mlflow_client.get_metric_history(run_id, "train_loss")}
        log_epochs(mlflow_client, run_id, [past for past in state["history"] if past["epoch"] not in logged])
        logged_through = max(logged | {logged_through})
    history = state["history"]
    history[-1]["resumed_from_here"] = history[-1].get("resumed_from_here", 0) + 1
    return state["epoch"] + 1, history, logged_through


# From notebooks/04_distributed_training.ipynb, cell 13 (id 7b52009b).
def checkpoint_due(epoch: int, config: dict[str, Any]) -> bool:
    """Whether ``epoch`` ends with a checkpoint: every ``checkpoint_every`` epochs, and always the last."""
    return epoch % int(config.get("checkpoint_every", 1)) == 0 or epoch == int(config["epochs"])


# From notebooks/04_distributed_training.ipynb, cell 13 (id 7b52009b).
def train_func_per_worker(config: dict[str, Any]) -> None:
    """The per-worker training loop Ray Train runs on every worker (notebook 04)."""
    entered = time.time()
    torch.set_num_threads(int(config.get("torch_threads", 1)))
    torch.manual_seed(int(config.get("seed", 0)))
    rank = ray.train.get_context().get_world_rank()
    net = prepare_model(model_from_params(config))
    module = net.module if hasattr(net, "module") else net  # the model inside the parallel wrapper
    optimizer = make_optimizer(config["optimizer"], net.parameters(), config["lr"], config["momentum"])
    loss_fn = nn.NLLLoss(reduction="sum")
    run_id, mlflow_client = config.get("run_id"), worker_mlflow_client(config, rank)

    start_epoch, history, logged_through = 1, [], 0  # epochs count from 1, as in Ray Tune's training_iteration
    if ray.train.get_checkpoint():  # after a failure Ray Train restarts the workers from the last checkpoint
        start_epoch, history, logged_through = resume(ray.train.get_checkpoint(), module, optimizer,
                                                      mlflow_client, run_id)
    shard = ray.train.get_dataset_shard("train")
    validation = ray.train.get_dataset_shard("validation") if config.get("validate") else None
    cache = [] if config.get("cache_shard") else None  # filled by the first epoch (epoch_batches)
    timings.record("train: worker set-up", entered)  # model, MLflow client, checkpoint, dataset shards
    for epoch in range(start_epoch, config["epochs"] + 1):
        maybe_fail(config, epoch, rank)
        net.train()
        loss_sum = correct = count = data_s = 0.0
        started = waited = time.perf_counter()
        wall_start = time.time()
        for batch in epoch_batches(shard, config, epoch, cache):
            data_s += time.perf_counter() - waited
            optimizer.zero_grad()
            output = net(batch["X"])
            loss = loss_fn(output, batch["y"])
            (loss / len(batch["y"])).backward()
            optimizer.step()
            loss_sum += float(loss.detach())
            correct += float((output.argmax(dim=1) == batch["y"]).sum())
            count += len(batch["y"])
            waited = time.perf_counter()
        loss_sum, correct, count = all_reduce_sum([loss_sum, correct, count])  # sums over all workers
        metrics = {"train_loss": loss_sum / max(count, 1), "train_accuracy": correct / max(count, 1),
                   "epoch_seconds": time.perf_counter() - started, "data_seconds": data_s, "samples": count}
        if validation is not None:  # "mean_accuracy" is what the sweeps of notebook 05 optimise
            metrics["val_accuracy"] = metrics["mean_accuracy"] = validate(net, validation)
        history.append({"epoch": epoch, **metrics})
        timings.record("train: epoch compute", wall_start)  # where the seconds go (benchmarks/bench_smoke.py)

        keep = checkpoint_due(epoch, config)  # metrics are reported every epoch, a checkpoint when due
        with timings.span("train: checkpoint + report"), tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if rank == 0 and keep:
                torch.save({"model": module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch,
                            "history": history, "params": {k: config[k] for k in MODEL_KEYS if k in config}},
                           Path(folder) / CHECKPOINT_FILE)
                checkpoint = ray.train.Checkpoint.from_directory(folder)
            ray.train.report({**metrics, "epoch": epoch}, checkpoint=checkpoint)
        if mlflow_client and epoch > logged_through:  # as each epoch ends; once, also across a resume
            if not log_epochs(mlflow_client, run_id, [history[-1]]):
                mlflow_client = None
            logged_through = epoch


# From notebooks/04_distributed_training.ipynb, cell 15 (id fa35e192).
def worker_resources(num_workers: int, use_gpu: bool, cluster_cpus: float) -> dict[str, float]:
    """CPUs per training worker that leave one CPU for Ray Data and the Train controller."""
    if use_gpu:
        return {"CPU": 1.0, "GPU": 1.0}
    spare = max(cluster_cpus - 1.0, 0.5)
    return {"CPU": min(1.0, math.floor(spare / num_workers * 100) / 100)}


# From notebooks/04_distributed_training.ipynb, cell 15 (id fa35e192).
def unique_run_name(prefix: str = "train") -> str:
    """A run name no earlier run has used: reusing one makes Ray Train resume that run."""
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


# From notebooks/04_distributed_training.ipynb, cell 15 (id fa35e192).
def make_trainer(config: dict[str, Any], datasets: dict[str, Any], num_workers: int, run_name: str,
                 storage_path: str, use_gpu: bool = False, max_failures: int = 2, cluster_cpus: float = 2.0,
                 settings: Settings | None = None) -> TorchTrainer:
    """A ``TorchTrainer`` for :func:`train_func_per_worker`, checkpointing into the object store (notebook 04).

    Raises:
        ParameterError: a bad parameter or worker count, or ``use_gpu=True`` on a Ray without enough GPUs
            (Ray would wait for them for ever).
    """
    check_params(config)
    check_count("num_workers", num_workers, 1024)
    check_count("max_failures", max_failures, 100, minimum=0)
    if use_gpu:
        gpus = ray.cluster_resources().get("GPU", 0) if ray.is_initialized() else 0
        if gpus < num_workers:
            raise ParameterError(f"use_gpu=True needs {num_workers} GPUs, one per worker; this Ray has {gpus:g}. "
                                 "Use use_gpu=False, fewer workers, or a Ray cluster with GPUs (RAY_ADDRESS).")
    resources = worker_resources(num_workers, use_gpu, cluster_cpus)
    return TorchTrainer(
        train_func_per_worker,
        train_loop_config={"torch_threads": max(1, int(resources["CPU"])), **config},
        datasets=datasets,
        # Scaling config
        scaling_config=ray.train.ScalingConfig(num_workers=num_workers, use_gpu=use_gpu,
                                               resources_per_worker=resources),
        # Where checkpoints go, how many to keep, how many failures to survive
        run_config=ray.train.RunConfig(
            name=run_name,
            storage_path=storage_path,  # "<bucket>/<prefix>" in the object store
            storage_filesystem=s3_filesystem(settings or load_settings()),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
            failure_config=ray.train.FailureConfig(max_failures=max_failures),
        ),
    )


# From notebooks/04_distributed_training.ipynb, cell 17 (id 1574bddb).
def log_dataset(mlflow_client, run_id: str, name: str, source_uri: str, count: int, context: str,
                tags: dict[str, str] | None = None) -> None:
    """Log a dataset input (its source URI and object count, not the data) into run ``run_id`` (notebooks 04-06)."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag

    from mlflow.exceptions import MlflowException

    dataset = MetaDataset(resolve_dataset_source(source_uri), name=name)
    input_tags = {"mlflow.data.context": context, "objects": str(count), **(tags or {})}
    entry = DatasetInput(dataset._to_mlflow_entity(), tags=[InputTag(k, v) for k, v in input_tags.items()])
    for attempt in range(3):
        try:
            mlflow_client.log_inputs(run_id, datasets=[entry])
            return
        except MlflowException as err:
            # Runs logging the same dataset at once race on the server's insert of it; a retry links the stored one.
            if attempt == 2 or "unique constraint" not in str(err).lower():
                raise
            time.sleep(0.2 * (attempt + 1))


# From notebooks/04_distributed_training.ipynb, cell 20 (id 181e1f46).
@contextlib.contextmanager
def interrupt_handler_restored():
    """Put back the process's Ctrl-C (SIGINT) handler when the block ends.

    Ray Train's ``TorchTrainer.fit()`` and Ray Tune's ``Tuner.fit()`` install their own handler, to stop a run
    gracefully, and leave it installed after they return: a later interrupt would then not raise
    ``KeyboardInterrupt``. Only the main thread can set handlers; elsewhere this does nothing.
    """
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main else None
    try:
        yield
    finally:
        if previous is not None:  # None: a handler not set from Python, which cannot be put back
            signal.signal(signal.SIGINT, previous)


# From notebooks/04_distributed_training.ipynb, cell 31 (id 7719a1c7).
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
