"""The stack's Ray as a driver joins it: its record, proven the stack's own, and its token.

:mod:`workshop.ray_service` runs that Ray and writes ``ray.json`` and ``ray_token`` into the stack's
private state folder; the notebooks (:mod:`helpers.cluster`), the lab and ``make submit`` read them here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

SERVICE_FILE = "ray.json"
TOKEN_FILE = "ray_token"  # beside it: new at every start


def settings_digest(env: dict[str, str]) -> str:
    """A fingerprint of the worker settings (``worker_env.settings_env``): equal digests, same services, same keys."""
    return hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()


def read_service(state: Path) -> dict | None:
    """The stack's Ray: ``address``, ``auth``, ``token_file``, ``dashboard``, ``settings``, ``cpus``, ``timings``.

    The record survives a SIGKILL or a reboot, and any user can bind a port the moment it is free: the address
    counts only while the recorded process, or one it started (Ray's GCS), listens on it. Nothing is sent to
    it to ask, not even a connection: a remembered address whose process is gone is forgotten.
    """
    try:
        info = json.loads((state / SERVICE_FILE).read_text())
        port = int(info["address"].rpartition(":")[2])
        return info if listens_under(int(info["pid"]), port) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def listens_under(pid: int, port: int) -> bool:
    """Whether process ``pid`` of this user, or a process it started, listens on TCP ``port``."""
    import psutil

    try:
        root = psutil.Process(pid)
        if root.uids().real != os.getuid():
            return False
        family = [root, *root.children(recursive=True)]
    except psutil.Error:
        return False
    for process in family:
        with contextlib.suppress(psutil.Error):
            if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in process.net_connections("tcp")):
                return True
    return False


def use_token_auth(token_file: Path | None = None) -> None:
    """Send Ray's token when joining a Ray: the stack's own ``token_file``, else the one Ray finds itself.

    A driver joining a Ray by address sends its token only in token mode, and Ray reads the mode into its
    configuration when ``ray`` is imported: so it is reloaded, as Ray does itself. Ray also keeps the token
    it read: forgotten here, so that a driver joining the stack's Ray after a restart sends the new one.
    """
    from ray._raylet import AuthenticationTokenLoader, Config

    if token_file is not None:
        os.environ.pop("RAY_AUTH_TOKEN", None)  # it would win over the file: a cluster's token, not this Ray's
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(token_file)
    if os.environ.get("RAY_AUTH_MODE") != "token":
        os.environ["RAY_AUTH_MODE"] = "token"
        Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def send_its_token(service: dict) -> None:
    """Send the token of the stack's Ray (its record, :func:`read_service`) when joining it, if it asks for one."""
    if service.get("auth") == "token":
        use_token_auth(Path(service["token_file"]) if service.get("token_file") else None)


def token_file(state: Path) -> Path:
    """The token of the stack's Ray: new at every start, in the private state folder (0600)."""
    return state / TOKEN_FILE


def read_token(state: Path) -> str:
    """The token of the stack's Ray that runs now (see :func:`token_file`)."""
    return token_file(state).read_text().strip()


def refuses_clients_without_token(address: str, timeout: float = 10.0, wrong_token: str | None = None) -> bool:
    """Whether the Ray at ``address`` refuses a call that carries no token (or ``wrong_token``), as it must."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            gcs_service_pb2_grpc.InternalKVGcsServiceStub(channel).InternalKVGet(
                gcs_service_pb2.InternalKVGetRequest(key=b"-", namespace=b"-"), timeout=timeout,
                metadata=[("authorization", f"Bearer {wrong_token}")] if wrong_token else None)
        except grpc.RpcError as err:
            return err.code() == grpc.StatusCode.UNAUTHENTICATED
    return False
