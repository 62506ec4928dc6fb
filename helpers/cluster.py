"""Ray start-up for laptops and clusters: one call that every Ray notebook makes (notebooks 03-06).

Where Ray runs, in this order: ``RAY_ADDRESS`` joins a cluster (shipping ``helpers``); else the
stack's Ray (:mod:`workshop.ray_service`) is joined; else a local Ray starts. Every worker gets the
object-store and MLflow settings as environment variables: a cluster's in the job's ``runtime_env``,
the others inherited as Ray starts (a ``runtime_env`` only where the driver's settings differ).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers import stack_ray, timings, worker_env
from helpers.settings import Settings, SettingsError, load_settings, state_dir
from helpers.worker_env import (
    WORKER_SETTINGS,
    keys_from_cluster,
    local_ray_defaults,
    loopback_only,
    settings_env,
    use_room_environment,
)


def cluster_runtime_env(settings: Settings) -> dict[str, Any]:
    """A Ray cluster job's ``runtime_env``: the settings (keys unless ``S3_KEYS_FROM_CLUSTER``) and ``helpers``."""
    import helpers

    return {"env_vars": settings_env(settings, with_keys=not keys_from_cluster()),
            "py_modules": [str(Path(helpers.__file__).parent)]}


@contextlib.contextmanager
def inherited_environment(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in this process's environment while a local Ray starts, then restore it.

    Its workers then see the settings without a job ``runtime_env``, which would keep them from using
    the workers Ray starts ahead of time (a Ray Data pipeline after the first: 2.8 s instead of 0.4 s).
    """
    names = {*values, *WORKER_SETTINGS}
    saved = {name: os.environ.get(name) for name in names}
    for name in names:
        os.environ.pop(name, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def quiet_ray() -> None:
    """Keep Ray's log lines, Ray Data's progress bars and execution banners out of notebook outputs."""
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.enable_operator_progress_bars = False
    ctx.print_on_execution_start = False
    ctx.enable_auto_log_stats = False
    for name in ("ray", "ray.data", "ray.train", "ray.tune", "ray.serve"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # Ray hands read-only numpy blocks to torch; harmless here, noisy in every notebook.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    _skip_ray_log_lines(SERVE_SHUTDOWN_NOISE)


# serve.shutdown() asks Serve's controller to stop, and the controller ends by killing itself; Ray then
# reports the call it is still answering as failed and retried, a raylet line in the notebook (08) about
# nothing that went wrong.
SERVE_SHUTDOWN_NOISE = r"Task ServeController\.graceful_shutdown failed"


def _skip_ray_log_lines(pattern: str) -> None:
    """Leave lines matching ``pattern`` out of the worker and raylet logs Ray prints in this driver.

    Ray's own ``RAY_DEDUP_LOGS_SKIP_REGEX`` does this but is read once, when Ray is imported; a pattern
    already set there is kept.
    """
    import re

    from ray._private import ray_logging

    for deduplicator in (ray_logging.stdout_deduplicator, ray_logging.stderr_deduplicator):
        known = deduplicator.skip_re.pattern if deduplicator.skip_re is not None else None
        if known is None or pattern not in known:
            deduplicator.skip_re = re.compile(pattern if known is None else f"(?:{known})|(?:{pattern})")


def stack_ray_runtime_env(settings: Settings, service: dict[str, Any]) -> dict[str, Any] | None:
    """A job's ``runtime_env`` on the stack's Ray: None when its workers already have these settings.

    A driver pointed at other services than the stack's, or with another span file
    (``SMOKE_TIMINGS``), sends its own. A job with a ``runtime_env`` waits for workers of
    its own: measured 1.5-3 s more for every pipeline of actors.
    """
    wanted = settings_env(settings)
    env_vars = dict(wanted) if stack_ray.settings_digest(wanted) != service.get("settings") else {}
    spans = os.environ.get(timings.TIMINGS_ENV, "")
    if spans and spans != service.get("timings", ""):
        env_vars[timings.TIMINGS_ENV] = spans
    return {"env_vars": env_vars} if env_vars else None


class RayUnavailable(SettingsError):
    """The Ray that ``RAY_ADDRESS`` names cannot be joined; the message says why and what to do."""


TOKEN_HINT = ("set RAY_AUTH_MODE=token and the cluster's token in RAY_AUTH_TOKEN (or in a file named by "
              "RAY_AUTH_TOKEN_PATH, or in ~/.ray/auth_token; the stack's Ray's is in .stack/ray_token), then run "
              "it again")


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a Ray address (``host:port`` or ``ray://host:port``); None for ``auto`` or ``local``."""
    if address in ("auto", "local"):
        return None
    client = address.startswith("ray://")
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host:
        return address.removeprefix("ray://"), 10001 if client else 6379
    return host, int(port) if port.isdigit() else (10001 if client else 6379)


def _answers(host: str, port: int, timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def check_cluster(address: str, timeout: float = 25.0) -> bool:
    """Make sure the Ray at ``address`` can be joined, within seconds; returns whether it listens on loopback only.

    ``ray.init`` retries a Ray that does not answer, or that refuses this driver's token, for minutes,
    printing the same lines again and again. Here a connection attempt (3 s) and, once the address
    answers, a trial join in a child process (``RAY_NUM_REDIS_GET_RETRIES=5``) decide first.

    Raises:
        RayUnavailable: nothing listens there, it asks for a token this driver lacks, or it did not let
            this driver join in time.
    """
    where = _host_port(address)
    if where is None:
        return False
    host, port = where
    if not _answers(host, port):
        raise RayUnavailable(
            f"No Ray answers at RAY_ADDRESS={address}. Start one there (`ray start --head --port={port}`), "
            "or unset RAY_ADDRESS to use the embedded stack's Ray (`python -m workshop.stack up`).")
    loopback = not address.startswith("ray://") and (host == "localhost" or host.startswith("127."))
    if loopback:
        import ray.util

        # Ray joins 127.0.0.1 by this machine's network address; a Ray that listens on loopback only
        # (this project's) is reached only if the driver keeps to 127.0.0.1 as well.
        loopback = not _answers(ray.util.get_node_ip_address(), port, timeout=1.0)
    command = [sys.executable, "-m", "helpers.cluster", "join", address, *(["--loopback-only"] if loopback else [])]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                env={**os.environ, "RAY_NUM_REDIS_GET_RETRIES": "5"})
    except subprocess.TimeoutExpired:
        raise RayUnavailable(f"The Ray at RAY_ADDRESS={address} answers but did not let this driver join within "
                             f"{timeout:.0f} s. Check that it is a Ray head's GCS port, or unset RAY_ADDRESS."
                             ) from None
    said = result.stdout + result.stderr
    if result.returncode != 0 and ("AuthenticationError" in said or "InvalidAuthToken" in said):
        mode = "a token this driver does not have" if os.environ.get("RAY_AUTH_MODE") == "token" else "a token"
        raise RayUnavailable(f"The Ray at RAY_ADDRESS={address} uses token authentication and asks for {mode}: "
                             f"{TOKEN_HINT}.")
    if result.returncode != 0:
        last = (said.strip().splitlines() or ["(no output)"])[-1][:300]
        raise RayUnavailable(f"Could not join the Ray at RAY_ADDRESS={address}: {last}")
    return loopback


@dataclass
class RayConnection:
    """What ``ray.init`` needs to join (or start) the right Ray: see :func:`ray_connection`."""

    address: str  # a cluster's "host:port", or "local" for a fresh Ray in this process
    runtime_env: dict[str, Any] | None  # the service settings every worker gets
    environment: contextlib.AbstractContextManager  # what a local Ray inherits, entered around ray.init
    local_options: dict[str, Any] = field(default_factory=dict)  # num_cpus, include_dashboard for a local Ray


def ray_connection(settings: Settings | None = None, address: str | None = None, num_cpus: int | None = None,
                   dashboard: bool = False) -> RayConnection:
    """Where to join Ray and with what, checked within seconds (notebooks 03-06).

    ``address``: a cluster to join, or ``"local"``; by default ``RAY_ADDRESS`` from the settings, else the
    stack's Ray when it is up (with its token), else ``"local"``. A cluster that does not answer raises
    :class:`RayUnavailable` in one line instead of Ray's endless retries.
    """
    settings = settings or load_settings()
    address = address or settings.ray_address  # a cluster; else the stack's Ray (its ray.json record), or "local"
    service = None if address else stack_ray.read_service(state_dir())
    address = address or (service["address"] if service else "local")
    use_room_environment()  # in the driver too: Ray Data starts its usage actor from it, and it loads models
    if address == "local":
        loopback_only()
        defaults = {name: value for name, value in local_ray_defaults().items() if name not in os.environ}
        return RayConnection(address, None, inherited_environment({**defaults, **settings_env(settings)}),
                             {"num_cpus": num_cpus, "include_dashboard": dashboard})
    if service is not None:
        loopback_only()  # the driver's node is 127.0.0.1, where the stack's Ray listens
        stack_ray.send_its_token(service)
        return RayConnection(address, stack_ray_runtime_env(settings, service), contextlib.nullcontext())
    if check_cluster(address):  # a cluster: RAY_ADDRESS (or the address argument)
        loopback_only()
    return RayConnection(address, cluster_runtime_env(settings), contextlib.nullcontext())


def joined(quiet: bool = True, started: float | None = None) -> dict[str, Any]:
    """After ``ray.init``: Ray Data's defaults for a laptop, Ray's log lines hidden; the cluster's resources."""
    import ray
    import ray.data

    if started is not None:
        timings.record("ray start", started)
    ctx = ray.data.DataContext.get_current()
    # A map function's own error (an object that is not an image, say) reaches the driver as itself,
    # not wrapped in "UDF failed to process a data block": the notebooks show it in one line.
    ctx.raise_original_map_exception = True
    # An actor pool starts all its actors before it hands out batches, so the batches spread over every
    # actor (by default the first actor up takes them all while the others start: one pid at smoke size).
    # A cluster that cannot fit the pool fails after this many seconds instead of waiting for ever.
    ctx.wait_for_min_actors_s = 120
    if quiet:
        quiet_ray()
    return ray.cluster_resources()


def init_ray(settings: Settings | None = None, num_cpus: int | None = None, quiet: bool = True,
             dashboard: bool = False, log_to_driver: bool = False, address: str | None = None) -> dict[str, Any]:
    """Join or start Ray with the service settings passed to every worker; the cluster's resources.

    What notebook 03 shows in the open (:func:`ray_connection`, ``ray.init``, :func:`joined`), in one call
    for notebooks 04-06. A Ray already started here is kept as it is.
    """
    import ray

    if ray.is_initialized():
        return ray.cluster_resources()
    worker_env.private_ray_tmpdir()  # not the /tmp/ray every user of the machine shares
    where = ray_connection(settings, address, num_cpus, dashboard)
    started = time.time()
    with where.environment:
        ray.init(address=where.address, runtime_env=where.runtime_env, log_to_driver=log_to_driver,
                 logging_level=logging.ERROR if quiet else logging.INFO, ignore_reinit_error=True,
                 **where.local_options)
    return joined(quiet, started)


def shutdown_ray() -> None:
    """Stop the local Ray (or leave the cluster): call it at the end of a notebook so papermill can exit."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    """``python -m helpers.cluster join ADDRESS [--loopback-only]``: the trial join of :func:`check_cluster`."""
    parser = argparse.ArgumentParser(prog="python -m helpers.cluster")
    parser.add_argument("command", choices=["join"])
    parser.add_argument("address")
    parser.add_argument("--loopback-only", action="store_true")
    args = parser.parse_args(argv)
    import ray

    if args.loopback_only:
        loopback_only()
    ray.init(address=args.address, logging_level=logging.ERROR, log_to_driver=False)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
