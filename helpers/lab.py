"""``make lab``: the embedded stack, a local Ray cluster with its dashboard, and JupyterLab, with every URL printed.

The kernels join this Ray (``RAY_ADDRESS``), so its dashboard shows their tasks, actors and training
workers live; the stack's Ray (no dashboard) is stopped meanwhile. Ctrl-C stops JupyterLab and this
Ray and starts the stack's again; the stack keeps running (``make stack-down`` stops it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

from helpers import stack
from helpers.config import project_root, state_dir


def start_ray(cpus: int, port: int, dashboard_port: int) -> subprocess.Popen:
    """A Ray head on 127.0.0.1 with its dashboard, in its own process group; returns once the dashboard answers."""
    ray = shutil.which("ray", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    command = [ray or "ray", "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
               "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}", f"--num-cpus={cpus}",
               "--disable-usage-stats"]
    log_path = state_dir() / "logs" / "ray-head.log"  # a file, never a pipe nobody reads during a long lab
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    url, deadline = f"http://127.0.0.1:{dashboard_port}/api/gcs_healthz", time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-800:]
            raise stack.StackError(f"Ray did not start (log: {log_path}):\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return proc
        except OSError:
            time.sleep(0.5)
    stop_ray(proc)
    raise stack.StackError(f"Ray's dashboard did not answer {url} within 120 s.")


def stop_ray(proc: subprocess.Popen) -> None:
    """Stop the Ray head this lab started (its process group; ``ray start`` first, which stops its own)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        stack.stop_group(psutil.Process(proc.pid), timeout=30, leader_first=True)
    proc.wait(timeout=10)


def urls(settings, jupyter_port: int, token: str, dashboard_port: int) -> dict[str, str]:
    """What to open, by name."""
    out = {"JupyterLab": f"http://127.0.0.1:{jupyter_port}/lab?token={token}",
           "Ray dashboard": f"http://127.0.0.1:{dashboard_port}",
           "MLflow": settings.mlflow_tracking_uri}
    if settings.lakefs_endpoint:
        out["lakeFS"] = f"{settings.lakefs_endpoint} (keys: python -m helpers.stack env)"
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m helpers.lab [--no-jupyter]``."""
    parser = argparse.ArgumentParser(prog="python -m helpers.lab", description=__doc__.split("\n")[0])
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 2, help="CPUs Ray may use (default: all)")
    parser.add_argument("--ray-port", type=int, default=6379)
    parser.add_argument("--dashboard-port", type=int, default=8265)
    parser.add_argument("--jupyter-port", type=int, default=8888)
    parser.add_argument("--no-jupyter", action="store_true", help="start Ray, print the URLs, stop (a check)")
    args = parser.parse_args(argv)
    settings = stack.ensure_stack()
    # One Ray on this machine at a time: the stack's (no dashboard) stops while this one runs.
    stacks_ray = stack.down(only=("ray",))
    if stacks_ray:
        print("The stack's Ray is stopped while the lab's Ray (with its dashboard) runs.")
    ray_head = start_ray(args.cpus, args.ray_port, args.dashboard_port)
    token = secrets.token_hex(16)
    try:
        print("\nOpen:")
        for name, url in urls(settings, args.jupyter_port, token, args.dashboard_port).items():
            print(f"  {name:<14} {url}")
        print("Ctrl-C stops JupyterLab and Ray; the stack keeps running (make stack-down stops it).\n", flush=True)
        if not args.no_jupyter:
            env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{args.ray_port}"}  # the kernels join this Ray
            jupyter = [sys.executable, "-m", "jupyterlab", "--ip=127.0.0.1", f"--port={args.jupyter_port}",
                       "--no-browser", f"--IdentityProvider.token={token}", "--ServerApp.port_retries=0",
                       f"--notebook-dir={project_root() / 'notebooks'}"]
            subprocess.run(jupyter, env=env, check=False)
    except KeyboardInterrupt:
        pass
    finally:
        stop_ray(ray_head)
        if stacks_ray:
            stack.up()
            print("The stack's Ray is running again.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
