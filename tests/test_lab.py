"""`make lab`: a local Ray with its dashboard on 127.0.0.1, every URL printed, and only its own Ray stopped."""

import socket
import subprocess
import sys

import pytest

from helpers import ray_service, stack
from helpers.config import state_dir


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_lab_starts_ray_with_its_dashboard_prints_the_urls_and_stops_its_ray(settings):
    ports = stack.free_ports(["ray", "dashboard", "jupyter"])
    result = subprocess.run([sys.executable, "-m", "helpers.lab", "--no-jupyter", "--cpus", "1",
                             "--ray-port", str(ports["ray"]), "--dashboard-port", str(ports["dashboard"]),
                             "--jupyter-port", str(ports["jupyter"])],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = {line.split()[0] + (" " + line.split()[1] if line.split()[0] == "Ray" else ""): line
             for line in result.stdout.splitlines() if line.startswith("  ")}
    assert f"http://127.0.0.1:{ports['jupyter']}/lab?token=" in lines["JupyterLab"]
    assert f"http://127.0.0.1:{ports['dashboard']}" in lines["Ray dashboard"]
    assert settings.mlflow_tracking_uri in lines["MLflow"]
    assert "Services: object store" in result.stdout  # which endpoints won, and why
    assert not port_open(ports["dashboard"]) and not port_open(ports["ray"]), "its Ray is stopped again"
    if "The stack's Ray is stopped" in result.stdout:  # one Ray at a time; the stack's is back afterwards
        assert "The stack's Ray is running again." in result.stdout
        assert ray_service.read_service(state_dir()) is not None
