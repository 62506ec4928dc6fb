"""``make lab``: JupyterLab on the notebooks, beside the embedded stack, with Ray's dashboard.

The kernels JupyterLab starts join the stack's Ray as every notebook does (its record in the state
folder, with Ray's token); ``make lab`` restarts that Ray with its dashboard, so the notebooks' tasks,
actors and training workers appear there live. The URLs are printed once JupyterLab answers. Ctrl-C,
SIGTERM or SIGHUP (the terminal closed) stop JupyterLab and start the stack's Ray again without its
dashboard; the stack keeps running (``make stack-down`` stops it).

Ray keeps its own default, token authentication: the dashboard asks every browser for Ray's token. The
dashboard link printed here opens a small sign-in page of the lab's, which hands the browser Ray's own
cookie for 127.0.0.1 and forwards it to the dashboard, so no one pastes a token
(:mod:`workshop.dashboard_sign_in`).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path

from helpers import stack_ray
from helpers.cluster import check_cluster
from helpers.errors import TutorialError
from helpers.ports import port_is_free
from helpers.private_files import short_temp_root, write_private
from helpers.settings import SettingsError, load_settings, project_root, state_dir
from helpers.worker_env import ROOM_ENVIRONMENT
from workshop import dashboard_sign_in, processes, stack, stack_ports, state_files

LAB_RECORD, JUPYTER_RECORD = "lab", "jupyterlab"  # process records in the state folder
LAB_SETTINGS = Path(__file__).parent / "jupyterlab"  # overrides.json: JupyterLab's defaults for the room


class LabError(TutorialError, RuntimeError):
    """``make lab`` could not start; the message says why and what to do."""


class LabStopped(Exception):
    """Ctrl-C, SIGTERM or SIGHUP (the terminal closed) reached ``make lab``: it stops what it started."""


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _stop_on_signal(signum: int, frame) -> None:  # noqa: ARG001 (signal handler signature)
    for sig in STOP_SIGNALS:  # one stop at a time: a second signal must not cut the clean-up short
        signal.signal(sig, signal.SIG_IGN)
    raise LabStopped("Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name)


def exit_with_parent() -> None:
    """Have this process sent SIGTERM when its parent dies: by the kernel on Linux, by a watching thread elsewhere.

    ``make lab`` runs this module as make's child: a ``kill`` of make, or a container stop that
    signals only the first process, would otherwise leave JupyterLab and the lab's Ray running. macOS has
    no ``PR_SET_PDEATHSIG``; there :func:`watch_parent` notices the parent gone within a second.
    """
    parent = os.getppid()
    if parent == 1:  # started detached (nohup, setsid): no parent to outlive
        return
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM) == 0:  # PR_SET_PDEATHSIG
                if os.getppid() != parent:  # it died before the request took effect
                    os.kill(os.getpid(), signal.SIGTERM)
                return
    threading.Thread(target=watch_parent, args=(parent,), daemon=True, name="parent-watch").start()


def watch_parent(parent: int, interval: float = 1.0) -> None:
    """Send this process SIGTERM once ``parent`` is no longer its parent (it died, and the process was adopted)."""
    while os.getppid() == parent:
        time.sleep(interval)
    os.kill(os.getpid(), signal.SIGTERM)


# --- JupyterLab ----------------------------------------------------------------

def jupyter_command(port: int, notebook_dir: Path, as_root: bool, kernel_sockets: Path) -> list[str]:
    """The JupyterLab server's command line: 127.0.0.1 only, no browser, these notebooks.

    Its token is not on it: every user of the machine can read a process's command line (``ps``), so the
    token goes in a file only its owner can read (:func:`start_jupyter`). Its kernels talk over Unix sockets
    in ``kernel_sockets`` (mode 0700): over TCP any user could subscribe to their output (IOPub has no key).
    """
    command = [sys.executable, "-m", "jupyterlab", "--ip=127.0.0.1", f"--port={port}", "--no-browser",
               "--ServerApp.port_retries=0",
               f"--ServerApp.root_dir={notebook_dir}",
               "--KernelManager.transport=ipc", f"--KernelManager.ip={kernel_sockets / 'kernel'}",
               # No calls home (workshops may be offline): no news feed, no check for a newer JupyterLab, and
               # the page does not ask whether to fetch news (workshop/jupyterlab/overrides.json: Never).
               "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
               f"--LabApp.app_settings_dir={LAB_SETTINGS}"]
    return command + (["--allow-root"] if as_root else [])  # JupyterLab refuses to start as root without it


def kernel_environment() -> dict[str, str]:
    """JupyterLab's environment, which its kernels inherit: someone is watching, so progress bars are widgets.

    No usage stats, no telemetry and no pickled models in it (:data:`helpers.worker_env.ROOM_ENVIRONMENT`).
    """
    from helpers.notebook import HEADLESS_ENV

    inherited = {name: value for name, value in os.environ.items() if name not in (HEADLESS_ENV, "JUPYTER_TOKEN")}
    return {**inherited, **ROOM_ENVIRONMENT}


def start_jupyter(command: list[str], token: str, log_path: Path, state: Path) -> subprocess.Popen:
    """Start JupyterLab in a session of its own, logging to a file (Ctrl-C reaches the lab, which stops it).

    Its token is read from a file of the state folder that only its owner can read (``JUPYTER_TOKEN_FILE``),
    never from its command line.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    token_file = state / "jupyter-token"
    write_private(token_file, token)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**kernel_environment(), "JUPYTER_TOKEN_FILE": str(token_file)},
                                start_new_session=True)
    processes.remember_process(state, JUPYTER_RECORD, proc.pid)
    return proc


_LOG_PREFIX = re.compile(r"^\[[A-Z] [0-9-]+ [0-9:.]+ \w+\]\s*")


def last_log_line(log_path: Path) -> str:
    """The last line JupyterLab logged, without its ``[C date time ServerApp]`` prefix."""
    with contextlib.suppress(OSError):
        lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
        if lines:
            return _LOG_PREFIX.sub("", lines[-1])
    return "(it logged nothing)"


def wait_until_answers(proc: subprocess.Popen, port: int, token: str, log_path: Path,
                       timeout: float = 120.0) -> None:
    """Return once JupyterLab answers to ``token`` (sent only once it listens on ``port``) and refuses no token.

    Raises:
        LabError: it exited (the message is its last log line), did not answer in time, or answered without a token.
    """
    deadline, status = time.monotonic() + timeout, f"http://127.0.0.1:{port}/api/status"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LabError(f"JupyterLab exited at start: {last_log_line(log_path)} (log: {log_path})")
        with contextlib.suppress(OSError):
            if stack_ray.listens_under(proc.pid, port):  # not yet bound, or another program's: no token
                urllib.request.urlopen(urllib.request.Request(status, headers={"Authorization": f"token {token}"}),
                                       timeout=2).close()
                break
        time.sleep(0.3)
    else:
        raise LabError(f"JupyterLab did not answer on port {port} within {timeout:.0f} s (log: {log_path}).")
    with contextlib.suppress(urllib.error.HTTPError):
        urllib.request.urlopen(status, timeout=5).close()
        raise LabError(f"JupyterLab answered without its token on port {port}: a Jupyter config sets an empty token "
                       "or password (`jupyter --paths` lists where they are). Remove that setting and start again.")


def stop_process(proc, timeout: float = 20.0) -> None:
    """Stop a process and its process group: SIGTERM (JupyterLab then shuts its kernels down), then SIGKILL."""
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        processes.stop_group(proc if isinstance(proc, psutil.Process) else psutil.Process(proc.pid), timeout,
                         leader_first=True)
    if isinstance(proc, subprocess.Popen):
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def claim_state(state: Path) -> None:
    """Record this lab, after stopping what an earlier lab that was killed left behind.

    Raises:
        LabError: another ``make lab`` is running on this state folder.
    """
    with state_files.state_lock(state):  # two labs started at the same moment: one claims the state, the other is told
        other = processes.remembered_process(state, LAB_RECORD)
        if other is not None and other.pid != os.getpid():
            raise LabError(f"make lab is already running (pid {other.pid}): use the URLs it printed, or stop it "
                           f"first (Ctrl-C in its terminal, or `kill {other.pid}`).")
        processes.remember_process(state, LAB_RECORD, os.getpid())
    leftover = processes.remembered_process(state, JUPYTER_RECORD)
    if leftover is not None:
        stop_process(leftover)
        print(f"Stopped the JupyterLab an earlier make lab left running (pid {leftover.pid}).")


# --- Ray and its dashboard ---------------------------------------------------------

def ray_with_dashboard(state: Path, dashboard_port: int, cpus: int | None):
    """The stack (started where it is not running) with its Ray's dashboard on ``dashboard_port``.

    A stack's Ray without that dashboard is restarted with it. Returns the settings and the dashboard's URL.
    """
    url = f"http://127.0.0.1:{dashboard_port}"
    service = stack_ray.read_service(state)
    if service is not None and service.get("dashboard") != url and stack.down(state, only=("ray",)):
        print("The stack's Ray restarts with its dashboard while the lab runs.")
    settings = stack.ensure_stack(ray_dashboard_port=dashboard_port, ray_cpus=cpus)
    deadline = time.monotonic() + 60
    # Asked with this user's token: another user's dashboard on the same port refuses it.
    token = ray_token(state) if (stack_ray.read_service(state) or {}).get("auth") == "token" else ""
    ours = urllib.request.Request(f"{url}/api/jobs/", headers={"Authorization": f"Bearer {token}"} if token else {})
    while time.monotonic() < deadline:  # its dashboard comes up a moment after Ray
        with contextlib.suppress(OSError), urllib.request.urlopen(ours, timeout=2):
            return settings, url
        time.sleep(0.3)
    raise LabError(f"Ray's dashboard did not answer {url} within 60 s (log: {state / 'logs' / 'ray.log'}).")


def refuse_to_stop_jobs(state: Path, dashboard_port: int) -> None:
    """Raise :class:`LabError` where starting the lab's dashboard would restart a stack's Ray that runs jobs.

    A ``make run``, a ``make catch-up`` or a notebook of another terminal works on the stack's Ray: restarting
    it (to add the dashboard) would stop them mid-run.
    """
    service = stack_ray.read_service(state)
    if service is None or service.get("dashboard") == f"http://127.0.0.1:{dashboard_port}":
        return
    busy = running_jobs(service)
    if busy:
        raise LabError(f"The stack's Ray runs {len(busy)} job(s) ({', '.join(busy)}: a `make run`, `make catch-up` "
                       "or a notebook): the lab would restart it with its dashboard and stop them. Run make lab "
                       "once they are done, or stop them first.")


def running_jobs(service: dict) -> list[str]:
    """The drivers connected to the stack's Ray (notebooks, ``make run``), but the service's own: ``"pid N"`` each."""
    from ray._raylet import GcsClient

    stack_ray.send_its_token(service)
    try:
        jobs = GcsClient(address=service["address"]).get_all_job_info(timeout=10)
    except Exception:  # noqa: BLE001 - a Ray that does not answer runs nothing worth keeping
        return []
    own = service.get("pid")
    return [f"pid {job.driver_pid}" for job in jobs.values() if not job.is_dead and job.driver_pid not in (own, 0)]


def restore_stack_ray(state: Path) -> None:
    """Start the stack's Ray again as ``stack up`` does, without a dashboard."""
    stack.down(state, only=("ray",))
    stack.up(state)
    print("The stack's Ray is running again, without its dashboard.")


def ray_token(state: Path) -> str:
    """The token of the stack's Ray, new at each of its starts (:func:`helpers.stack_ray.token_file`)."""
    try:
        return stack_ray.read_token(state)
    except OSError as err:
        raise LabError(f"Could not read the token of the stack's Ray ({err}): run `make lab` again.") from None


LAB_FILE = "lab.json"  # in the state folder, 0600: the port of the dashboard's sign-in


def sign_in_link(state: Path) -> str:
    """A new one-time sign-in link for the running lab's dashboard (``python -m workshop.lab --sign-in-link``).

    Raises:
        LabError: no ``make lab`` runs on this state folder.
    """
    if processes.remembered_process(state, LAB_RECORD) is None or not (state / LAB_FILE).is_file():
        raise LabError("make lab is not running: start it (`make lab`), it prints a sign-in link.")
    port = json.loads((state / LAB_FILE).read_text())["sign_in_port"]
    return f"http://127.0.0.1:{port}/?key={dashboard_sign_in.new_key(state)}"


def urls(settings, jupyter_port: int, token: str, dashboard: str | None, sign_in: str | None) -> dict[str, str]:
    """What to open, by name."""
    out = {"JupyterLab": f"http://127.0.0.1:{jupyter_port}/lab?token={token}"}
    if dashboard:
        out["Ray dashboard"] = f"{sign_in} (signs this browser in to {dashboard})" if sign_in else dashboard
    out["MLflow"] = (f"{settings.mlflow_tracking_uri} (user {settings.mlflow_username}; its password: "
                     "python -m workshop.stack env)" if settings.mlflow_username else settings.mlflow_tracking_uri)
    if settings.lakefs_endpoint:
        out["lakeFS"] = f"{settings.lakefs_endpoint} (keys: python -m workshop.stack env)"
    return out


def print_urls(found: dict[str, str]) -> None:
    """The URLs, one per line, and how to stop."""
    print("\nOpen:")
    for name, url in found.items():
        print(f"  {name:<14} {url}")
    print("Ctrl-C stops JupyterLab and the dashboard; the stack keeps running (make stack-down stops it).\n",
          flush=True)


# --- the command ---------------------------------------------------------------------

DEFAULT_PORTS = {"jupyter": 8888, "dashboard": 8265, "sign_in": 8266}


def lab_ports(jupyter: int | None, dashboard: int | None, sign_in: int | None) -> dict[str, int]:
    """The lab's ports: those given, else the defaults where free, else free ones (another learner holds them).

    Raises:
        StackError: a given port is not a port number, or two are the same.
    """
    given = {"jupyter": jupyter, "dashboard": dashboard, "sign_in": sign_in}

    def flags(values: dict[str, int | None]) -> dict[str, int]:
        return {f"--{name.replace('_', '-')}-port": port for name, port in values.items() if port is not None}

    stack_ports.check_ports(flags(given))
    ports = {name: port if port is not None else DEFAULT_PORTS[name] for name, port in given.items()}
    taken = [name for name, port in ports.items() if given[name] is None and not port_is_free(port)]
    if taken:
        free = stack_ports.free_ports(taken)
        ports.update(free)
        print("Ports another program holds, the lab takes free ones: "
              + ", ".join(f"{name} {DEFAULT_PORTS[name]} -> {free[name]}" for name in taken))
    stack_ports.check_ports(flags(ports))  # a given port equal to another's default
    return ports


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workshop.lab", description=__doc__.split("\n")[0])
    parser.add_argument("--cpus", type=int, help="CPUs the lab's Ray may use (default: all)")
    parser.add_argument("--dashboard-port", type=int, help="default 8265, or a free one where that is taken")
    parser.add_argument("--sign-in-port", type=int, help="the dashboard's sign-in link (default 8266, or a free one)")
    parser.add_argument("--jupyter-port", type=int, help="default 8888, or a free one where that is taken")
    parser.add_argument("--notebook-dir", type=Path, default=None, help="default: the project's notebooks/")
    parser.add_argument("--no-jupyter", action="store_true", help="start Ray's dashboard, print the URLs, stop")
    parser.add_argument("--sign-in-link", action="store_true",
                        help="print a new one-time sign-in link for the running lab's dashboard, and exit")
    return parser


def _print_sign_in_link(state: Path) -> int:
    try:
        print(sign_in_link(state))
        return 0
    except LabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    """``python -m workshop.lab [--no-jupyter]``: exits 0 when stopped, 1 when something could not start."""
    args = _parser().parse_args(argv)
    state = state_dir()
    if args.sign_in_link:
        return _print_sign_in_link(state)
    for sig in STOP_SIGNALS:
        signal.signal(sig, _stop_on_signal)
    started: dict[str, object] = {}  # what clean_up stops, whenever the lab ends (Ctrl-C in start-up too)
    restore = False
    try:
        ports = lab_ports(args.jupyter_port, args.dashboard_port, args.sign_in_port)
        exit_with_parent()
        claim_state(state)
        cluster_address = load_settings().ray_address
        if not cluster_address:  # before anything starts: a lab that may not restart the stack's Ray starts nothing
            refuse_to_stop_jobs(state, ports["dashboard"])
        log_path = state / "logs" / "jupyterlab.log"
        if not args.no_jupyter:  # first: a JupyterLab that cannot start costs no Ray restart
            on_a_free_port("jupyter", ports, args.jupyter_port, lambda port: jupyter_answering(
                port, args.notebook_dir, log_path, state, started))
        token = started.get("token") or secrets.token_hex(16)
        dashboard = sign_in = None
        if cluster_address:
            settings = stack.ensure_stack()
            check_cluster(settings.ray_address)
            print(f"RAY_ADDRESS is set: the notebooks use the Ray at {settings.ray_address}; open its own "
                  "dashboard (unset RAY_ADDRESS to use the stack's).")
        else:
            restore = True  # from here on, the stack's Ray is put back as it was, whatever ends the lab
            settings, dashboard = on_a_free_port("dashboard", ports, args.dashboard_port,
                                                 lambda port: ray_with_dashboard(state, port, args.cpus))
            server = started["sign_in"] = dashboard_sign_in.start(ports["sign_in"], state, ray_token(state), dashboard)
            write_private(state / LAB_FILE, json.dumps({"sign_in_port": server.server_address[1]}))
            sign_in = f"http://127.0.0.1:{server.server_address[1]}/?key={dashboard_sign_in.new_key(state)}"
        print_urls(urls(settings, ports["jupyter"], token, dashboard, sign_in))
        jupyter = started.get("jupyter")
        if jupyter is not None and jupyter.wait() != 0:
            raise LabError(f"JupyterLab stopped: {last_log_line(log_path)} (log: {log_path})")
        return 0
    except (KeyboardInterrupt, LabStopped) as stop:
        print(f"\nStopping ({stop or 'Ctrl-C'}) ...", flush=True)
        return 0
    except (LabError, stack.StackError, SettingsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        clean_up(state, started.get("jupyter"), started.get("sign_in"), restore)
        if "kernel_sockets" in started:
            shutil.rmtree(started["kernel_sockets"], ignore_errors=True)


def on_a_free_port(name: str, ports: dict[str, int], given: int | None, start):
    """``start(ports[name])``; where it fails because another program took that port meanwhile, on a free one.

    Two learners whose labs start at the same moment can both find a default port free; one gets it. A
    port the user gave is never moved. ``ports`` keeps the port used.
    """
    for attempt in range(3):
        try:
            return start(ports[name])
        except (LabError, stack.StackError):
            if given is not None or attempt == 2 or port_is_free(ports[name]):
                raise
            taken, ports[name] = ports[name], stack_ports.free_ports([name])[name]
            print(f"Another program took port {taken} ({name}) while the lab started: it takes {ports[name]}.",
                  flush=True)
    raise AssertionError("unreachable")


# A kernel's sockets: <folder>/kernel-<n>, in a folder "lab-kernels-" and 8 random characters.
KERNEL_SOCKETS = "/lab-kernels-01234567/kernel-65535"


def kernel_sockets_folder() -> Path:
    """A new private folder (0700) for the kernels' Unix sockets, short enough on Linux (107 bytes) and macOS (103).

    macOS's ``$TMPDIR`` is long; :func:`helpers.private_files.short_temp_root` falls back to /tmp where a
    kernel's socket would not fit under it.
    """
    return Path(tempfile.mkdtemp(prefix="lab-kernels-", dir=short_temp_root(len(KERNEL_SOCKETS))))


def jupyter_answering(port: int, notebook_dir: Path | None, log_path: Path, state: Path,
                      started: dict[str, object]) -> subprocess.Popen:
    """JupyterLab started (``--allow-root`` for root, said in one line) and answering on ``port``.

    It goes into ``started`` as soon as it runs, so a Ctrl-C while it starts up stops it too; with a new
    token (``started["token"]``) on each attempt, as one sent to a port another program took is spent.
    """
    as_root = hasattr(os, "geteuid") and os.geteuid() == 0
    if as_root:
        print("Running as root: JupyterLab starts with --allow-root (it refuses root otherwise).")
    folder = (notebook_dir or project_root() / "notebooks").resolve()
    sockets = started.get("kernel_sockets") or kernel_sockets_folder()
    token = started["token"] = secrets.token_hex(16)
    started["kernel_sockets"], command = sockets, jupyter_command(port, folder, as_root, sockets)
    jupyter = started["jupyter"] = start_jupyter(command, token, log_path, state)
    wait_until_answers(jupyter, port, token, log_path)
    return jupyter


def _jupyter_child():
    """This lab's JupyterLab process, found by its command line (None where it has none)."""
    import psutil

    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if child.cmdline()[1:3] == ["-m", "jupyterlab"]:
                return child
    return None


def clean_up(state: Path, jupyter: subprocess.Popen | None, sign_in_server: ThreadingHTTPServer | None,
             restore: bool) -> None:
    """Stop what the lab started and put the stack's Ray back, whatever ended the lab; no signal cuts it short."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if jupyter is None:  # a stop that came as JupyterLab started, before it was noted: it is this lab's child
        jupyter = _jupyter_child()
    if jupyter is not None:
        stop_process(jupyter)
        (state / f"{JUPYTER_RECORD}.pid").unlink(missing_ok=True)
    if sign_in_server is not None:
        sign_in_server.shutdown()
        for name in (dashboard_sign_in.KEYS_FILE, LAB_FILE):  # the links this lab printed sign nobody in any more
            (state / name).unlink(missing_ok=True)
    if restore:
        try:
            restore_stack_ray(state)
        except stack.StackError as err:
            print(f"error: the stack's Ray did not start again: {err}", file=sys.stderr)
    recorded = processes.remembered_process(state, LAB_RECORD)
    if recorded is not None and recorded.pid == os.getpid():
        (state / f"{LAB_RECORD}.pid").unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
