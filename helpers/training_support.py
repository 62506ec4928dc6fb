"""What notebook 04's training loop calls in one line, kept out of the lesson.

The loop a learner reads (``train_func_per_worker``) is the minimal correct
Ray Train loop. Around it, and called from it in one visible line each:

* :func:`check_params`: every training parameter checked in the driver, before
  any worker starts, in one :class:`~helpers.settings.ParameterError`;
* :class:`ShardCache`: after the first epoch a worker trains from its shard in
  memory instead of asking Ray Data for every batch again;
* :func:`maybe_fail`: the fault a learner injects with ``fail_at_epoch``, to see
  the run resume from its last checkpoint.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from helpers.settings import ParameterError, check_count, check_fraction, check_positive

MODELS = ("mlp", "cnn")
OPTIMIZERS = ("adam", "sgd")
LR_SCHEDULES = ("onecycle", "none")
ACTIVATION_NAMES = ("relu", "tanh")


def _one_of(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ParameterError(f"{name} must be one of {list(allowed)}, not {value!r}.")


def check_params(params: Mapping[str, Any]) -> Mapping[str, Any]:
    """``params`` when every training parameter has an allowed value; else one :class:`ParameterError` naming it.

    Checked in the driver before any run starts, not deep inside torch on a worker.
    """
    check_count("epochs", params["epochs"], 10_000)
    check_positive("lr", params["lr"], maximum=10.0)
    check_fraction("momentum", params.get("momentum", 0.0))
    check_count("batch_size_per_worker", params.get("batch_size_per_worker", 128), 100_000)
    check_count("checkpoint_every", params.get("checkpoint_every", 1), 10_000)
    check_count("seed", params.get("seed", 0), 2**32 - 1, minimum=0)
    if not isinstance(params.get("cache_shard", False), bool):
        raise ParameterError(f"cache_shard must be True or False, not {params['cache_shard']!r}.")
    hidden = params.get("hidden_sizes", (256, 128))
    if isinstance(hidden, (str, bytes)) or not hasattr(hidden, "__len__") or not len(hidden):
        raise ParameterError(f"hidden_sizes must be a list of layer widths such as [256, 128], not {hidden!r}.")
    for width in hidden:
        check_count("each of hidden_sizes", width, 100_000)
    dropout = params.get("dropout", 0.0)
    if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or not 0.0 <= dropout < 1.0:
        raise ParameterError(f"dropout must be a number in [0, 1), not {dropout!r}.")
    _one_of("model", params.get("model", "mlp"), MODELS)
    _one_of("optimizer", params.get("optimizer", "adam"), OPTIMIZERS)
    _one_of("lr_schedule", params.get("lr_schedule", "onecycle"), LR_SCHEDULES)
    _one_of("activation", params.get("activation", "relu"), ACTIVATION_NAMES)
    return params


class ShardCache:
    """A worker's training shard, kept in memory after the first epoch when ``config["cache_shard"]`` is on.

    Ray Data prepares every batch in the worker's own process, which for a model this small takes about
    as long as the step itself. With the cache on, the first epoch streams the shard and keeps its rows;
    later epochs shuffle and slice those rows in memory, seeded per epoch. The shard must fit in the
    worker's memory; with the cache off every epoch streams.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.enabled, self.batch_size = bool(config.get("cache_shard")), int(config["batch_size_per_worker"])
        self.rows: tuple[torch.Tensor, torch.Tensor] | None = None

    def epoch(self, streamed: Iterable[dict[str, torch.Tensor]], seed: int) -> Iterator[dict[str, torch.Tensor]]:
        """This epoch's batches: ``streamed`` (Ray Data's, not started when cached rows are used) or the rows kept."""
        if self.rows is not None:
            x, y = self.rows
            order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed)).to(y.device)
            for start in range(0, len(order), self.batch_size):
                rows = order[start:start + self.batch_size]
                yield {"X": x[rows], "y": y[rows]}
            return
        kept = []
        for batch in streamed:
            if self.enabled:
                kept.append(batch)
            yield batch
        if kept:
            self.rows = (torch.cat([batch["X"] for batch in kept]), torch.cat([batch["y"] for batch in kept]))


class InjectedFault(RuntimeError):
    """Raised on purpose by ``fail_at_epoch``, to show that training resumes from the last checkpoint."""


def maybe_fail(config: Mapping[str, Any], epoch: int, rank: int) -> None:
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


def require_gpus(num_workers: int) -> None:
    """Refuse ``use_gpu=True`` on a Ray without a GPU per worker, in one line: Ray would wait for them for ever."""
    import ray

    gpus = ray.cluster_resources().get("GPU", 0) if ray.is_initialized() else 0
    if gpus < num_workers:
        raise ParameterError(f"use_gpu=True needs {num_workers} GPUs, one per worker; this Ray has {gpus:g}. "
                             "Use use_gpu=False, fewer workers, or a Ray cluster with GPUs (RAY_ADDRESS).")
