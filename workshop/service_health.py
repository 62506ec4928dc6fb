"""Whether a service of the embedded stack is up, and ours: its health page, its process, our keys.

Any user may bind a port the moment it is free, so a health page that answers proves little: a service is
healthy when the process the stack recorded listens on its port, its health page answers, and it takes this
stack's credentials.
"""

from __future__ import annotations

import base64
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from helpers import stack_ray
from helpers.settings import load_settings
from workshop import seaweedfs_service
from workshop.processes import remembered_process
from workshop.stack_ports import saved_ports
from workshop.state_files import StackError, state_paths

HEALTH_PATHS = {"seaweedfs": "/healthz", "mlflow": "/health", "lakefs": "/api/v1/healthcheck"}


def service_url(service: str, ports: dict[str, int]) -> str:
    """Where ``service`` answers: a URL, or Ray's ``host:port``."""
    port = ports["s3" if service == "seaweedfs" else service]
    return f"127.0.0.1:{port}" if service == "ray" else f"http://127.0.0.1:{port}"


def http_ok(url: str | urllib.request.Request, timeout: float = 2.0) -> bool:
    """Whether ``url`` answers with a 2xx status within ``timeout`` seconds."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError):
        return False


def healthy(service: str, state: Path, url: str) -> bool:
    """Whether the stack's own ``service`` listens on ``url``, answers its health page and knows our keys."""
    if service == "ray":
        return stack_ray.read_service(state) is not None
    # nothing, credentials least of all, goes to a port that the service's recorded process (or one it started)
    # does not listen on
    proc = remembered_process(state, service)
    if proc is None or not stack_ray.listens_under(proc.pid, int(url.rsplit(":", 1)[1])):
        return False
    if not http_ok(url + HEALTH_PATHS[service]):
        return False
    ports = saved_ports(state)  # SeaweedFS's S3 port answers up to 4.5 s before its volume server is known
    if service == "seaweedfs" and not seaweedfs_service.volume_server_registered(ports["master"], ports["volume"]):
        return False
    return knows_our_keys(service, state, url)


def knows_our_keys(service: str, state: Path, url: str) -> bool:
    """Whether the server on the service's port takes this stack's credentials: it is ours, not another's.

    A health page answers anyone. Two stacks started at the same moment can both find a port free; the
    one that lost the port would otherwise take the winner's server for its own (a root user's, even
    bound to the same port at once).
    """
    settings = load_settings(environ={}, stack_state=state)
    if service == "seaweedfs":
        from helpers.storage import get_client

        try:
            get_client(settings, max_connections=1, retries=0).list_buckets()
            return True
        except Exception:  # noqa: BLE001 - refused keys, or no answer: not (yet) ours
            return False
    if service == "mlflow":
        user, password, path = settings.mlflow_username, settings.mlflow_password, "/api/2.0/mlflow/users/current"
    else:
        user, password, path = settings.lakefs_access_key, settings.lakefs_secret_key, "/api/v1/repositories?amount=1"
    signed = base64.b64encode(f"{user}:{password}".encode()).decode()
    return http_ok(urllib.request.Request(url + path, headers={"Authorization": f"Basic {signed}"}))


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def wait_healthy(service: str, url: str, proc: subprocess.Popen | psutil.Process, state: Path,
                 timeout: float) -> None:
    """Wait until ``service`` is healthy; one error with the end of its log if it exits or times out."""
    deadline = time.monotonic() + timeout
    log = state_paths(state)["logs"] / f"{service}.log"
    while time.monotonic() < deadline:
        if healthy(service, state, url):
            return
        exited = proc.poll() is not None if isinstance(proc, subprocess.Popen) else not proc.is_running()
        if exited:
            raise StackError(f"{service} exited during start-up. Last lines of {log}:\n" + _log_tail(log))
        time.sleep(0.3)
    raise StackError(f"{service} did not answer {url} within {timeout:.0f} s; see {state}/logs/{service}.log.")
