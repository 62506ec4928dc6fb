"""The stack's Ray: one local Ray that ``python -m workshop.stack up`` keeps running for every notebook.

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
import threading
from pathlib import Path

from helpers.stack_ray import SERVICE_FILE, refuses_clients_without_token, settings_digest, token_file, use_token_auth

PORT_ENV = "RAY_GCS_SERVER_PORT"  # Ray's own variable: the port a new head's GCS listens on


def command(state: Path, num_cpus: int | None, dashboard_port: int | None = None) -> list[str]:
    """The command line that runs this module as the stack's Ray service."""
    cpus = ["--num-cpus", str(num_cpus)] if num_cpus else []
    dashboard = ["--dashboard-port", str(dashboard_port)] if dashboard_port is not None else []
    return [sys.executable, "-m", "workshop.ray_service", "--state", str(state), *cpus, *dashboard]


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


def _new_token(state: Path) -> None:
    """A token of this start's own for the Ray about to start, which every process it starts inherits.

    A token that lived on from one Ray to the next (``~/.ray/auth_token``) would open the next Ray to
    whoever heard it once: a program that took a dead Ray's port heard it from the processes still calling.
    """
    from ray._private.authentication.authentication_token_generator import generate_new_authentication_token

    from helpers.private_files import write_private

    write_private(token_file(state), generate_new_authentication_token())
    use_token_auth(token_file(state))


def _listening_ports(pid: int) -> list[int]:
    """The TCP ports process ``pid`` listens on."""
    import psutil

    with contextlib.suppress(psutil.Error):
        return [c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN]
    return []


def _hold(port: int) -> socket.socket | None:
    """Listen on ``port`` of 127.0.0.1, accepting nothing, so no other program takes it; None where one has."""
    door = socket.socket()
    door.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        door.bind(("127.0.0.1", port))
        door.listen(64)
        return door
    except OSError:
        door.close()
        return None


def _fate_shared(state: Path, stopping: threading.Event, dashboard: bool) -> None:
    """Stop every process of this Ray, this one last, when its GCS, raylet or dashboard dies, holding its ports.

    Killed alone (the out-of-memory killer picks one process), it leaves the others calling its ports with the
    token, and any user may bind a port the moment it is free: the dead process's ports are taken here first,
    so that what still calls them reaches no one until every process of this Ray has stopped. Not while
    ``stopping`` (a clean stop).
    """
    import psutil
    from ray._private import ray_constants, worker

    kinds = (ray_constants.PROCESS_TYPE_GCS_SERVER, ray_constants.PROCESS_TYPE_RAYLET,
             *([ray_constants.PROCESS_TYPE_DASHBOARD] if dashboard else []))  # else Ray's own, not required
    core = [(kind, info.process) for kind in kinds for info in worker._global_node.all_processes.get(kind, [])
            if info.process.poll() is None]
    doors = {process.pid: _listening_ports(process.pid) for _, process in core}

    def watch(kind: str, process) -> None:
        process.wait()
        if stopping.is_set():
            return
        (state / SERVICE_FILE).unlink(missing_ok=True)  # no driver joins a Ray that is going
        held = [_hold(port) for port in doors[process.pid]]
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
        taken = [port for port, door in zip(doors[process.pid], held, strict=True) if door is None]
        print(f"Ray's {kind} (pid {process.pid}) died: every process of this Ray stopped, so that none calls its "
              "ports again; `python -m workshop.stack up` starts a new Ray with a new token."
              + (f" Another program took its port(s) {taken} first." if taken else ""), flush=True)
        os._exit(1)

    for kind, process in core:
        threading.Thread(target=watch, args=(kind, process), daemon=True, name=f"fate-{kind}").start()


def _temp_folder_of_its_own(state: Path) -> None:
    """A temporary folder no other Ray of the machine shares (``RAY_TMPDIR``, which its workers inherit).

    A submitted job's entrypoint joins Ray's ``"auto"``: the address file in its Ray's folder, else any GCS
    running on the machine. In a shared folder a job joined another Ray, where its files were not.
    """
    from helpers import worker_env

    worker_env.private_ray_tmpdir()  # this user's own, not the /tmp/ray every user of the machine shares
    own = Path(os.environ["RAY_TMPDIR"]) / f"stack-{hashlib.sha256(str(state).encode()).hexdigest()[:8]}"
    own.mkdir(mode=0o700, exist_ok=True)  # worker_env.RAY_SOCKETS: 107 bytes on Linux, 103 on macOS (darwin)
    os.environ["RAY_TMPDIR"] = str(own)


def serve(state: Path, num_cpus: int | None, dashboard_port: int | None = None) -> None:
    """Start a local Ray with the stack's settings, record its address, and keep it running until SIGTERM.

    With ``dashboard_port`` it also runs Ray's dashboard on 127.0.0.1 (``make lab``); its URL goes into the record.
    """
    import ray
    from ray._private.utils import write_ray_address

    from helpers import timings, worker_env
    from helpers.private_files import write_private
    from helpers.settings import load_settings

    os.environ.pop("RAY_ADDRESS", None)  # not for this Ray's workers: a cluster left in the environment of `up`
    for name, value in worker_env.local_ray_defaults().items():
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
    _new_token(state)
    _temp_folder_of_its_own(state)
    _agent_port_of_its_own()
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=dashboard_port is not None,
             dashboard_host="127.0.0.1", dashboard_port=dashboard_port, log_to_driver=False,
             logging_level=logging.ERROR)
    if not refuses_clients_without_token(ray.get_runtime_context().gcs_address):
        ray.shutdown()
        sys.exit("error: Ray started without token authentication, open to every user of this machine, and was "
                 "stopped. Unset RAY_AUTH_MODE, or set it to token, and run `python -m workshop.stack up` again.")
    # The address file "auto" reads (`ray start` writes one, `ray.init` does not; its name is Ray's business).
    write_ray_address(ray.get_runtime_context().gcs_address, ray._private.worker._global_node.get_temp_dir_path())
    dashboard = f"http://127.0.0.1:{dashboard_port}" if dashboard_port is not None else None
    info = {"address": ray.get_runtime_context().gcs_address, "pid": os.getpid(), "dashboard": dashboard,
            "auth": os.environ.get("RAY_AUTH_MODE", "disabled"), "token_file": str(token_file(state)),
            "settings": settings_digest(env), "cpus": int(ray.cluster_resources().get("CPU", 0)),
            "timings": os.environ.get(timings.TIMINGS_ENV, "")}  # a benchmark's span file, which workers write to

    def stop(signum, frame):  # noqa: ARG001 (signal handler signature)
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    stopping = threading.Event()
    try:
        _fate_shared(state, stopping, dashboard is not None)
        write_private(state / SERVICE_FILE, json.dumps(info, indent=2))
        print(f"Ray is up at {info['address']} with {info['cpus']} CPUs", flush=True)
        while True:
            signal.pause()
    finally:
        stopping.set()
        (state / SERVICE_FILE).unlink(missing_ok=True)
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    """``python -m workshop.ray_service --state DIR [--num-cpus N]`` (started by ``workshop.stack up``)."""
    parser = argparse.ArgumentParser(prog="python -m workshop.ray_service", description=__doc__.split("\n")[0])
    parser.add_argument("--state", type=Path, required=True, help="the stack's state folder")
    parser.add_argument("--num-cpus", type=int, help="CPUs Ray may use (default: all)")
    parser.add_argument("--dashboard-port", type=int, help="also run Ray's dashboard on this port (make lab)")
    args = parser.parse_args(argv)
    serve(args.state.resolve(), args.num_cpus, args.dashboard_port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
