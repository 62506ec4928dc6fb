"""MLflow tracking for distributed training: the driver owns the run, workers log into it (notebook 04).

MLflow's fluent API (``mlflow.start_run()``) keeps the active run in the
driver's process state; Ray Train workers are other processes and never see
it. So the driver creates the run and passes its **run id and tracking URI in
the train loop config**, and rank 0 logs per-epoch metrics with
``MlflowClient(uri).log_metric(run_id, ...)`` (or the REST call the seed
used, :func:`log_metric_rest`). Ray's own
``ray.air.integrations.mlflow.setup_mlflow`` is the packaged alternative.

If the tracking server cannot be reached, tracking turns itself off with one
message and training goes on: nothing of the training result is lost.
"""

from __future__ import annotations

import json
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_REQUEST_TIMEOUT_S = 3.0


def tracking_available(uri: str, timeout: float = _REQUEST_TIMEOUT_S) -> tuple[bool, str]:
    """Whether an MLflow server answers ``GET <uri>/health``; the reason when not."""
    if not uri:
        return False, "no MLFLOW_TRACKING_URI is configured"
    if not uri.startswith(("http://", "https://")):
        return True, ""  # a local file or database store needs no server
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as response:
            return response.status == 200, f"HTTP {response.status}"
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        return False, f"the MLflow server at {uri} is not reachable ({reason})"


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


@dataclass
class RunHandle:
    """An MLflow run owned by the driver; ``run_id`` is None when tracking is off."""

    uri: str
    run_id: str | None
    experiment_id: str | None = None
    reason_off: str = ""

    @property
    def enabled(self) -> bool:
        """Tracking is on."""
        return self.run_id is not None

    @property
    def url(self) -> str:
        """Link to the run in the MLflow UI ('' when tracking is off)."""
        if not self.enabled or not self.uri.startswith("http"):
            return ""
        return f"{self.uri.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.run_id}"

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log parameters (values stringified, lists as JSON)."""
        if self.enabled:
            from mlflow.entities import Param

            items = [Param(k, json.dumps(v) if isinstance(v, (list, tuple, dict)) else str(v))
                     for k, v in params.items()]
            _client(self.uri).log_batch(self.run_id, params=items)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Log numeric metrics at ``step``."""
        if self.enabled:
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            items = [Metric(k, float(v), now, step or 0) for k, v in metrics.items()]
            _client(self.uri).log_batch(self.run_id, metrics=items)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Set run tags."""
        if self.enabled:
            client = _client(self.uri)
            for key, value in tags.items():
                client.set_tag(self.run_id, key, str(value))

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a local file (through the server's artifact proxy)."""
        if self.enabled:
            _client(self.uri).log_artifact(self.run_id, str(path), artifact_path)

    def log_figure(self, figure: Any, name: str) -> None:
        """Save a matplotlib figure as a PNG artifact."""
        if self.enabled:
            with tempfile.TemporaryDirectory() as folder:
                path = Path(folder) / name
                figure.savefig(path, dpi=100, bbox_inches="tight")
                self.log_artifact(path)

    def end(self, status: str = "FINISHED") -> None:
        """Mark the run finished (or FAILED)."""
        if self.enabled:
            _client(self.uri).set_terminated(self.run_id, status=status)


def _experiment_id(client, name: str) -> str:
    """The experiment's id, created if missing (safe when parallel workers create it at the same time)."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return client.get_experiment_by_name(name).experiment_id


def start_run(uri: str, experiment: str, run_name: str, params: Mapping[str, Any] | None = None,
              tags: Mapping[str, str] | None = None) -> RunHandle:
    """Create an MLflow run (driver side) and log its parameters, or return a handle with tracking off.

    Args:
        uri: tracking URI (``settings.mlflow_tracking_uri``).
        experiment: experiment name, created if missing.
        run_name: the run's display name.
        params: parameters to log.
        tags: run tags.

    Returns:
        A :class:`RunHandle`; when the server is unreachable its ``run_id`` is
        None and ``reason_off`` says why (printed once).
    """
    ok, reason = tracking_available(uri)
    if not ok:
        print(f"MLflow tracking is off: {reason}. Training goes on; start it with `python -m helpers.stack up`.")
        return RunHandle(uri, None, reason_off=reason)
    client = _client(uri)
    experiment_id = _experiment_id(client, experiment)
    run = client.create_run(experiment_id, run_name=run_name, tags=dict(tags or {}))
    handle = RunHandle(uri, run.info.run_id, experiment_id)
    handle.log_params(params or {})
    return handle


class WorkerTracker:
    """What a training worker uses to log into the driver's run; only rank 0 logs.

    Any tracking failure turns logging off for this worker with one printed
    line; training itself never fails because of tracking.
    """

    def __init__(self, uri: str | None, run_id: str | None, rank: int) -> None:
        self.uri, self.run_id = uri, run_id
        self.enabled = bool(uri and run_id) and rank == 0

    def logged_steps(self, key: str) -> set[int]:
        """Steps already logged for ``key`` (to fill gaps after a resume without duplicates)."""
        if not self.enabled:
            return set()
        try:
            return {m.step for m in _client(self.uri).get_metric_history(self.run_id, key)}
        except Exception as err:  # noqa: BLE001 - tracking must never stop training
            self._off(err)
            return set()

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Log one epoch's metrics at ``step``."""
        if not self.enabled:
            return
        try:
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            _client(self.uri).log_batch(self.run_id, metrics=[Metric(k, float(v), now, step)
                                                              for k, v in metrics.items()])
        except Exception as err:  # noqa: BLE001 - tracking must never stop training
            self._off(err)

    def _off(self, err: Exception) -> None:
        print(f"MLflow tracking is off for this worker: {type(err).__name__}: {str(err)[:200]}")
        self.enabled = False


def log_metric_rest(uri: str, run_id: str, key: str, value: float, step: int = 0,
                    timestamp_ms: int | None = None, timeout: float = _REQUEST_TIMEOUT_S) -> None:
    """Log one metric with MLflow's REST API, as the seed did (``POST /api/2.0/mlflow/runs/log-metric``).

    Works from any process that can reach the server, with no MLflow package.

    Raises:
        RuntimeError: the server answered with an error (its message is included).
    """
    body = json.dumps({"run_id": run_id, "key": key, "value": float(value), "step": int(step),
                       "timestamp": int(timestamp_ms if timestamp_ms is not None else time.time() * 1000)}).encode()
    request = urllib.request.Request(f"{uri.rstrip('/')}/api/2.0/mlflow/runs/log-metric", data=body,
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"MLflow refused the metric {key!r}: HTTP {err.code} {err.read()[:200]!r}") from None


def metric_history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """``(step, value)`` pairs of one metric, ordered by step (notebook 04 plots them)."""
    history = _client(uri).get_metric_history(run_id, key)
    return sorted((m.step, m.value) for m in history)


def run_metrics(uri: str, run_id: str) -> dict[str, float]:
    """The latest value of every metric of a run."""
    return dict(_client(uri).get_run(run_id).data.metrics)
