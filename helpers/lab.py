"""``make lab``: JupyterLab on the notebooks, beside the embedded stack, with Ray's dashboard.

The kernels JupyterLab starts join the stack's Ray as every notebook does (its record in the state
folder, with Ray's token); ``make lab`` restarts that Ray with its dashboard, so the notebooks' tasks,
actors and training workers appear there live. The URLs are printed once JupyterLab answers. Ctrl-C,
SIGTERM or SIGHUP (the terminal closed) stop JupyterLab and start the stack's Ray again without its
dashboard; the stack keeps running (``make stack-down`` stops it).

Ray keeps its own default, token authentication: the dashboard asks every browser for Ray's token. The
dashboard link printed here opens a small sign-in page of the lab's, which hands the browser Ray's own
cookie for 127.0.0.1 and forwards it to the dashboard, so no one pastes a token.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hmac
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from helpers import ray_service, stack
from helpers.cluster import check_cluster
from helpers.config import ConfigError, load_settings, project_root, state_dir

# The cookie Ray's dashboard reads its token from (ray._private.authentication.authentication_constants).
RAY_TOKEN_COOKIE = "ray-authentication-token"
LAB_RECORD, JUPYTER_RECORD = "lab", "jupyterlab"  # process records in the state folder


class LabError(RuntimeError):
    """``make lab`` could not start; the message says why and what to do."""


class LabStopped(Exception):
    """Ctrl-C, SIGTERM or SIGHUP (the terminal closed) reached ``make lab``: it stops what it started."""


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _stop_on_signal(signum: int, frame) -> None:  # noqa: ARG001 (signal handler signature)
    for sig in STOP_SIGNALS:  # one stop at a time: a second signal must not cut the clean-up short
        signal.signal(sig, signal.SIG_IGN)
    raise LabStopped("Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name)


def exit_with_parent() -> None:
    """Have the kernel send this process SIGTERM when its parent dies (Linux).

    ``make lab`` runs this module as make's child: a ``kill`` of make, or a container stop that
    signals only the first process, would otherwise leave JupyterLab and the lab's Ray running.
    """
    if not sys.platform.startswith("linux") or os.getppid() == 1:  # started detached (nohup, setsid): no parent
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


# --- JupyterLab ----------------------------------------------------------------

def jupyter_command(port: int, token: str, notebook_dir: Path, as_root: bool) -> list[str]:
    """The JupyterLab server's command line: 127.0.0.1 only, this token, no browser, these notebooks."""
    command = [sys.executable, "-m", "jupyterlab", "--ip=127.0.0.1", f"--port={port}", "--no-browser",
               f"--IdentityProvider.token={token}", "--ServerApp.port_retries=0",
               f"--ServerApp.root_dir={notebook_dir}",
               # No calls home (workshops may be offline): no news feed, no check for a newer JupyterLab.
               "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    return command + (["--allow-root"] if as_root else [])  # JupyterLab refuses to start as root without it


def kernel_environment() -> dict[str, str]:
    """JupyterLab's environment, which its kernels inherit: someone is watching, so progress bars are widgets."""
    from helpers.notebook import HEADLESS_ENV

    return {name: value for name, value in os.environ.items() if name != HEADLESS_ENV}


def start_jupyter(command: list[str], log_path: Path, state: Path) -> subprocess.Popen:
    """Start JupyterLab in a session of its own, logging to a file (Ctrl-C reaches the lab, which stops it)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=kernel_environment(), start_new_session=True)
    stack.remember_process(state, JUPYTER_RECORD, proc.pid)
    return proc


_LOG_PREFIX = re.compile(r"^\[[A-Z] [0-9-]+ [0-9:.]+ \w+\]\s*")


def last_log_line(log_path: Path) -> str:
    """The last line JupyterLab logged, without its ``[C date time ServerApp]`` prefix."""
    with contextlib.suppress(OSError):
        lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
        if lines:
            return _LOG_PREFIX.sub("", lines[-1])
    return "(it logged nothing)"


def wait_until_answers(proc: subprocess.Popen, port: int, log_path: Path, timeout: float = 120.0) -> None:
    """Return once JupyterLab answers on ``port``.

    Raises:
        LabError: it exited first (the message is its last log line), or did not answer in time.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LabError(f"JupyterLab exited at start: {last_log_line(log_path)} (log: {log_path})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api", timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise LabError(f"JupyterLab did not answer on port {port} within {timeout:.0f} s (log: {log_path}).")


def stop_process(proc, timeout: float = 20.0) -> None:
    """Stop a process and its process group: SIGTERM (JupyterLab then shuts its kernels down), then SIGKILL."""
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        stack.stop_group(proc if isinstance(proc, psutil.Process) else psutil.Process(proc.pid), timeout,
                         leader_first=True)
    if isinstance(proc, subprocess.Popen):
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def claim_state(state: Path) -> None:
    """Record this lab, after stopping what an earlier lab that was killed left behind.

    Raises:
        LabError: another ``make lab`` is running on this state folder.
    """
    other = stack.remembered_process(state, LAB_RECORD)
    if other is not None and other.pid != os.getpid():
        raise LabError(f"make lab is already running (pid {other.pid}): use the URLs it printed, or stop it "
                       f"first (Ctrl-C in its terminal, or `kill {other.pid}`).")
    leftover = stack.remembered_process(state, JUPYTER_RECORD)
    if leftover is not None:
        stop_process(leftover)
        print(f"Stopped the JupyterLab an earlier make lab left running (pid {leftover.pid}).")
    stack.remember_process(state, LAB_RECORD, os.getpid())


# --- Ray and its dashboard ---------------------------------------------------------

def ray_with_dashboard(state: Path, dashboard_port: int, cpus: int | None):
    """The stack (started where it is not running) with its Ray's dashboard on ``dashboard_port``.

    A stack's Ray without that dashboard is restarted with it. Returns the settings and the dashboard's URL.
    """
    url = f"http://127.0.0.1:{dashboard_port}"
    service = ray_service.read_service(state)
    if service is not None and service.get("dashboard") != url and stack.down(state, only=("ray",)):
        print("The stack's Ray restarts with its dashboard while the lab runs.")
    settings = stack.ensure_stack(ray_dashboard_port=dashboard_port, ray_cpus=cpus)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # its dashboard comes up a moment after Ray
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/api/gcs_healthz", timeout=2):
            return settings, url
        time.sleep(0.3)
    raise LabError(f"Ray's dashboard did not answer {url} within 60 s (log: {state / 'logs' / 'ray.log'}).")


def restore_stack_ray(state: Path) -> None:
    """Start the stack's Ray again as ``stack up`` does, without a dashboard."""
    stack.down(state, only=("ray",))
    stack.up(state)
    print("The stack's Ray is running again, without its dashboard.")


def ray_token() -> str:
    """Ray's authentication token as Ray itself finds it (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``, ``~/.ray``)."""
    ray_cli = Path(sys.executable).with_name("ray")
    result = subprocess.run([str(ray_cli) if ray_cli.exists() else "ray", "get-auth-token"],
                            capture_output=True, text=True, timeout=60, check=False)
    token = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    if result.returncode != 0 or not token:
        raise LabError(f"Could not read Ray's token (`ray get-auth-token`): {result.stderr.strip()[-300:]}")
    return token


def start_dashboard_sign_in(port: int, key: str, token: str, dashboard_url: str) -> ThreadingHTTPServer:
    """Serve the dashboard's sign-in link on 127.0.0.1:``port`` (``port`` 0: any free one).

    ``GET /?key=<key>`` sets Ray's own token cookie, as the dashboard's token prompt would, and forwards the
    browser to the dashboard. Cookies belong to a host, not a port, so the dashboard on 127.0.0.1 receives it.
    Without the key the page says where the link is, and sets nothing.
    """

    class SignIn(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            given = parse_qs(urlsplit(self.path).query).get("key", [""])[0]
            if not hmac.compare_digest(given.encode(), key.encode()):
                self.send_error(403, "Open the Ray dashboard link that make lab printed: it carries the key.")
                return
            self.send_response(303)
            self.send_header("Set-Cookie", f"{RAY_TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict")
            self.send_header("Location", f"{dashboard_url}/#/actors")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - quiet: the terminal shows the URLs
            pass

    try:
        server = ThreadingHTTPServer(("127.0.0.1", port), SignIn)
    except OSError:  # the port is taken: any free one, the printed link says which
        server = ThreadingHTTPServer(("127.0.0.1", 0), SignIn)
    threading.Thread(target=server.serve_forever, name="dashboard-sign-in", daemon=True).start()
    return server


def urls(settings, jupyter_port: int, token: str, dashboard: str | None, sign_in: str | None) -> dict[str, str]:
    """What to open, by name."""
    out = {"JupyterLab": f"http://127.0.0.1:{jupyter_port}/lab?token={token}"}
    if dashboard:
        out["Ray dashboard"] = f"{sign_in} (signs this browser in to {dashboard})" if sign_in else dashboard
    out["MLflow"] = settings.mlflow_tracking_uri
    if settings.lakefs_endpoint:
        out["lakeFS"] = f"{settings.lakefs_endpoint} (keys: python -m helpers.stack env)"
    return out


def print_urls(found: dict[str, str]) -> None:
    """The URLs, one per line, and how to stop."""
    print("\nOpen:")
    for name, url in found.items():
        print(f"  {name:<14} {url}")
    print("Ctrl-C stops JupyterLab and the dashboard; the stack keeps running (make stack-down stops it).\n",
          flush=True)


# --- the command ---------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """``python -m helpers.lab [--no-jupyter]``: exits 0 when stopped, 1 when something could not start."""
    parser = argparse.ArgumentParser(prog="python -m helpers.lab", description=__doc__.split("\n")[0])
    parser.add_argument("--cpus", type=int, help="CPUs the lab's Ray may use (default: all)")
    parser.add_argument("--dashboard-port", type=int, default=8265)
    parser.add_argument("--sign-in-port", type=int, default=8266, help="the dashboard's sign-in link")
    parser.add_argument("--jupyter-port", type=int, default=8888)
    parser.add_argument("--notebook-dir", type=Path, default=None, help="default: the project's notebooks/")
    parser.add_argument("--no-jupyter", action="store_true", help="start Ray's dashboard, print the URLs, stop")
    args = parser.parse_args(argv)
    for sig in STOP_SIGNALS:
        signal.signal(sig, _stop_on_signal)
    state, jupyter, sign_in_server, restore = state_dir(), None, None, False
    try:
        stack.check_ports({"--jupyter-port": args.jupyter_port, "--dashboard-port": args.dashboard_port,
                           "--sign-in-port": args.sign_in_port})
        exit_with_parent()
        claim_state(state)
        token = secrets.token_hex(16)
        log_path = state / "logs" / "jupyterlab.log"
        if not args.no_jupyter:  # first: a JupyterLab that cannot start costs no Ray restart
            jupyter = jupyter_answering(args.jupyter_port, token, args.notebook_dir, log_path, state)
        dashboard = sign_in = None
        if load_settings().ray_address:
            settings = stack.ensure_stack()
            check_cluster(settings.ray_address)
            print(f"RAY_ADDRESS is set: the notebooks use the Ray at {settings.ray_address}; open its own "
                  "dashboard (unset RAY_ADDRESS to use the stack's).")
        else:
            restore = True
            settings, dashboard = ray_with_dashboard(state, args.dashboard_port, args.cpus)
            key = secrets.token_urlsafe(16)
            sign_in_server = start_dashboard_sign_in(args.sign_in_port, key, ray_token(), dashboard)
            sign_in = f"http://127.0.0.1:{sign_in_server.server_address[1]}/?key={key}"
        print_urls(urls(settings, args.jupyter_port, token, dashboard, sign_in))
        if jupyter is not None and jupyter.wait() != 0:
            raise LabError(f"JupyterLab stopped: {last_log_line(log_path)} (log: {log_path})")
        return 0
    except (KeyboardInterrupt, LabStopped) as stop:
        print(f"\nStopping ({stop or 'Ctrl-C'}) ...", flush=True)
        return 0
    except (LabError, stack.StackError, ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        clean_up(state, jupyter, sign_in_server, restore)


def jupyter_answering(port: int, token: str, notebook_dir: Path | None, log_path: Path,
                      state: Path) -> subprocess.Popen:
    """JupyterLab started (``--allow-root`` for root, said in one line) and answering on ``port``."""
    as_root = hasattr(os, "geteuid") and os.geteuid() == 0
    if as_root:
        print("Running as root: JupyterLab starts with --allow-root (it refuses root otherwise).")
    folder = (notebook_dir or project_root() / "notebooks").resolve()
    jupyter = start_jupyter(jupyter_command(port, token, folder, as_root), log_path, state)
    wait_until_answers(jupyter, port, log_path)
    return jupyter


def clean_up(state: Path, jupyter: subprocess.Popen | None, sign_in_server: ThreadingHTTPServer | None,
             restore: bool) -> None:
    """Stop what the lab started and put the stack's Ray back, whatever ended the lab; no signal cuts it short."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if jupyter is not None:
        stop_process(jupyter)
        (state / f"{JUPYTER_RECORD}.pid").unlink(missing_ok=True)
    if sign_in_server is not None:
        sign_in_server.shutdown()
    if restore:
        try:
            restore_stack_ray(state)
        except stack.StackError as err:
            print(f"error: the stack's Ray did not start again: {err}", file=sys.stderr)
    recorded = stack.remembered_process(state, LAB_RECORD)
    if recorded is not None and recorded.pid == os.getpid():
        (state / f"{LAB_RECORD}.pid").unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
