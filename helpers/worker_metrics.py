"""What each training worker's process costs, logged into the driver's MLflow run (notebooks 04 and 05).

MLflow's system metrics (``mlflow.start_run(log_system_metrics=True)``) watch the machine the driver runs
on, as one series. A Ray Train run has a process per worker, maybe on other nodes, so each worker
starts MLflow's own monitor on the driver's run with a node id of its own, ``rank<r>-<ray node>``: its
numbers arrive as ``system/rank0-1a2b3c4d/...``. Besides the machine's numbers (CPU, memory, disk,
network, and GPUs where there are any), the monitor records the worker process itself:
``process_cpu_utilization_percentage`` and ``process_memory_rss_megabytes``, the numbers that differ
between two workers on one laptop.

The monitor stops when the worker calls the function it returned (which sends the last samples too),
and by itself once the driver ends the run.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

SAMPLING_SECONDS = 2.0  # a smoke-size training run lasts seconds: MLflow's 10 s default would miss it
PROCESS_KEYS = ("process_cpu_utilization_percentage", "process_memory_rss_megabytes")


def _process_monitor():
    """A monitor of this process (CPU % of one core, resident memory), in MLflow's monitor interface."""
    import psutil
    from mlflow.system_metrics.metrics.base_metrics_monitor import BaseMetricsMonitor

    class ProcessMonitor(BaseMetricsMonitor):
        def __init__(self) -> None:
            super().__init__()
            self._process = psutil.Process()
            self._process.cpu_percent(None)  # the first reading only starts the clock

        def collect_metrics(self) -> None:
            with self._process.oneshot():
                self._metrics[PROCESS_KEYS[0]].append(self._process.cpu_percent(None))
                self._metrics[PROCESS_KEYS[1]].append(self._process.memory_info().rss / 2**20)

        def aggregate_metrics(self) -> dict[str, float]:
            return {key: round(sum(values) / len(values), 1) for key, values in self._metrics.items() if values}

    return ProcessMonitor()


def worker_system_metrics(config: dict[str, Any], rank: int | str) -> Callable[[], None]:
    """Start logging this worker's system metrics into ``config["run_id"]``; returns the call that stops it.

    Nothing is started (and the returned call does nothing) without a run id and tracking URI in the
    config, or where MLflow's monitor cannot start; a training run never fails over its metrics.
    """
    run_id, uri = config.get("run_id"), config.get("tracking_uri")
    if not run_id or not uri:
        return lambda: None
    try:
        import ray
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"
        series = f"rank{rank}" if isinstance(rank, int) else rank  # one series per worker, and where it ran
        os.environ.pop("MLFLOW_SYSTEM_METRICS_NODE_ID", None)  # it would override the id given here
        monitor = SystemMetricsMonitor(run_id, sampling_interval=config.get("metrics_seconds", SAMPLING_SECONDS),
                                       node_id=f"{series}-{node[:8]}", tracking_uri=uri)
        monitor.monitors.append(_process_monitor())
        monitor.start()
    except Exception as err:  # noqa: BLE001 - no psutil, no server: train without them, and say so
        print(f"System metrics are off for worker {rank}: {type(err).__name__}: {err}")
        return lambda: None

    def stop() -> None:
        monitor.finish()  # MLflow's monitor drops the samples since its last interval: they are sent here
        with contextlib.suppress(Exception):
            monitor.publish_metrics(monitor.aggregate_metrics())
            monitor.mlflow_logger.flush()

    return stop


def per_worker(mlflow_client, run_id: str, keys: tuple[str, ...] = PROCESS_KEYS) -> dict[str, dict[str, list]]:
    """``{key: {node id: [(seconds since the first sample, value), ...]}}`` of a run's per-worker metrics."""
    run = mlflow_client.get_run(run_id)
    series: dict[str, dict[str, list]] = {key: {} for key in keys}
    for name in run.data.metrics:
        parts = name.split("/")
        if len(parts) == 3 and parts[0] == "system" and parts[2] in keys:
            history = sorted(mlflow_client.get_metric_history(run_id, name), key=lambda m: m.timestamp)
            series[parts[2]][parts[1]] = [(m.timestamp, m.value) for m in history]
    start = min((points[0][0] for by_node in series.values() for points in by_node.values() if points), default=0)
    return {key: {node: [((t - start) / 1000, v) for t, v in points] for node, points in sorted(by_node.items())}
            for key, by_node in series.items()}
