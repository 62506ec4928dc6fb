"""The stack's Ray: one local Ray that ``python -m helpers.stack up`` keeps running for every notebook.

Starting Ray costs about ten seconds on a 2-core laptop; joining a running one
(:func:`helpers.cluster.init_ray`, ``ray.init(address=...)`` as for a real
cluster) a fraction of one. This process starts a local Ray on 127.0.0.1 with
the stack's settings in the environment its workers inherit, writes where it
listens to ``ray.json`` in the state folder, and stops Ray on SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import signal
import socket
import sys
from pathlib import Path

SERVICE_FILE = "ray.json"
PORT_ENV = "RAY_GCS_SERVER_PORT"  # Ray's own variable: the port a new head's GCS listens on


def settings_digest(env: dict[str, str]) -> str:
    """A fingerprint of the worker settings (``worker_env.settings_env``): equal digests, same services, same keys."""
    return hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()


def read_service(state: Path) -> dict | None:
    """The stack's Ray: ``address``, ``auth``, ``dashboard``, ``settings``, ``cpus``, ``timings``; None if down.

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


def _agent_port_of_its_own() -> None:
    """Give this Ray's dashboard agent a free port instead of Ray's fixed 52365.

    One machine has one 52365: a second user's Ray (or the tests' second one) found it taken, its agent
    did not start, and every job submitted to it (make submit) failed. ``ray.init`` has no argument for
    it (``ray start --dashboard-agent-listen-port`` has), so the parameters it builds get one.
    """
    from ray._private import parameter

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    class RayParams(parameter.RayParams):
        def __init__(self, *args, **kwargs) -> None:
            kwargs.setdefault("dashboard_agent_listen_port", port)
            super().__init__(*args, **kwargs)

    parameter.RayParams = RayParams


def use_token_auth() -> None:
    """Send Ray's token (``~/.ray/auth_token``, which a local Ray writes) when joining the stack's Ray.

    A driver joining a Ray by address sends its token only in token mode, and Ray reads the mode into its
    configuration when ``ray`` is imported: so it is reloaded, as Ray does itself.
    """
    from ray._raylet import Config

    if os.environ.get("RAY_AUTH_MODE") != "token":
        os.environ["RAY_AUTH_MODE"] = "token"
        Config.initialize("")


def private_token() -> None:
    """Ray's token file there (a Ray told to use tokens makes none) and readable by its owner only.

    One others could read (0644, as a Ray started outside the stack writes it) may have been read: replaced.
    """
    from ray._private.authentication.authentication_token_generator import generate_new_authentication_token

    from helpers.files import write_private

    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or path.is_file() and not path.stat().st_mode & 0o077:
        return
    if path.is_file():
        print(f"Ray's token {path} could be read by other users of this machine: replaced.", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, generate_new_authentication_token())


def refuses_clients_without_token(address: str, timeout: float = 10.0) -> bool:
    """Whether the Ray at ``address`` refuses a call that carries no token, as token authentication must."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            gcs_service_pb2_grpc.InternalKVGcsServiceStub(channel).InternalKVGet(
                gcs_service_pb2.InternalKVGetRequest(key=b"-", namespace=b"-"), timeout=timeout)
        except grpc.RpcError as err:
            return err.code() == grpc.StatusCode.UNAUTHENTICATED
    return False


def _temp_folder_of_its_own(state: Path) -> None:
    """A temporary folder no other Ray of the machine shares (``RAY_TMPDIR``, which its workers inherit).

    A submitted job's entrypoint joins Ray's ``"auto"``: the address file in its Ray's folder, else any GCS
    running on the machine. In a shared folder a job joined another Ray, where its files were not.
    """
    from helpers import worker_env

    worker_env.private_ray_tmpdir()  # this user's own, not the /tmp/ray every user of the machine shares
    own = Path(os.environ["RAY_TMPDIR"]) / f"stack-{hashlib.sha256(str(state).encode()).hexdigest()[:8]}"
    own.mkdir(mode=0o700, exist_ok=True)  # a short path: Ray's socket paths must fit in 107 bytes
    os.environ["RAY_TMPDIR"] = str(own)


def serve(state: Path, num_cpus: int | None, dashboard_port: int | None = None) -> None:
    """Start a local Ray with the stack's settings, record its address, and keep it running until SIGTERM.

    With ``dashboard_port`` it also runs Ray's dashboard on 127.0.0.1 (``make lab``); its URL goes into the record.
    """
    import ray
    from ray._private.utils import write_ray_address

    from helpers import timings, worker_env
    from helpers.config import load_settings
    from helpers.files import write_private

    os.environ.pop("RAY_ADDRESS", None)  # not for this Ray's workers: a cluster left in the environment of `up`
    for name, value in worker_env.LOCAL_RAY_DEFAULTS.items():
        os.environ.setdefault(name, value)
    env = worker_env.settings_env(load_settings(environ={}, stack_state=state))
    worker_env.loopback_only()
    worker_env.use_room_environment()
    # ... and in the processes it starts: the dashboard's agent registered under the machine's address while
    # the head looked for it on 127.0.0.1, and every job submission waited 5 minutes for "an available agent".
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.update(env)  # what every worker this Ray starts inherits
    # A submitted job's entrypoint (`python -m ...`, make submit) finds this environment's Python first.
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    # Token authentication whatever the environment says (a RAY_AUTH_MODE=disabled left there would open this
    # Ray to every user of the machine), so that another user can neither join it nor use its dashboard.
    private_token()
    use_token_auth()
    _temp_folder_of_its_own(state)
    _agent_port_of_its_own()
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=dashboard_port is not None,
             dashboard_host="127.0.0.1", dashboard_port=dashboard_port, log_to_driver=False,
             logging_level=logging.ERROR)
    if not refuses_clients_without_token(ray.get_runtime_context().gcs_address):
        ray.shutdown()
        sys.exit("error: Ray started without token authentication, open to every user of this machine, and was "
                 "stopped. Unset RAY_AUTH_MODE, or set it to token, and run `python -m helpers.stack up` again.")
    # The address file "auto" reads (`ray start` writes one, `ray.init` does not; its name is Ray's business).
    write_ray_address(ray.get_runtime_context().gcs_address, ray._private.worker._global_node.get_temp_dir_path())
    dashboard = f"http://127.0.0.1:{dashboard_port}" if dashboard_port is not None else None
    info = {"address": ray.get_runtime_context().gcs_address, "pid": os.getpid(), "dashboard": dashboard,
            "auth": os.environ.get("RAY_AUTH_MODE", "disabled"), "settings": settings_digest(env),
            "cpus": int(ray.cluster_resources().get("CPU", 0)),
            "timings": os.environ.get(timings.TIMINGS_ENV, "")}  # a benchmark's span file, which workers write to

    def stop(signum, frame):  # noqa: ARG001 (signal handler signature)
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        write_private(state / SERVICE_FILE, json.dumps(info, indent=2))
        print(f"Ray is up at {info['address']} with {info['cpus']} CPUs", flush=True)
        while True:
            signal.pause()
    finally:
        (state / SERVICE_FILE).unlink(missing_ok=True)
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    """``python -m helpers.ray_service --state DIR [--num-cpus N]`` (started by ``helpers.stack up``)."""
    parser = argparse.ArgumentParser(prog="python -m helpers.ray_service", description=__doc__.split("\n")[0])
    parser.add_argument("--state", type=Path, required=True, help="the stack's state folder")
    parser.add_argument("--num-cpus", type=int, help="CPUs Ray may use (default: all)")
    parser.add_argument("--dashboard-port", type=int, help="also run Ray's dashboard on this port (make lab)")
    args = parser.parse_args(argv)
    serve(args.state.resolve(), args.num_cpus, args.dashboard_port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
