"""Joining a Ray named by ``RAY_ADDRESS``: one clear line within seconds when nothing answers there, or when it
asks for a token this driver does not send; never ``ray.init``'s minutes of retries."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from helpers import cluster, stack_ray
from helpers.settings import project_root, state_dir
from workshop import runner, stack_ports


def a_closed_port() -> int:
    port = stack_ports.free_ports(["nothing"])["nothing"]
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0
    return port


def test_nothing_at_ray_address_is_one_line_within_seconds(settings, monkeypatch):
    port = a_closed_port()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    started = time.monotonic()
    with pytest.raises(cluster.RayUnavailable) as err:
        cluster.init_ray()
    assert time.monotonic() - started < 10
    assert str(err.value).startswith(f"No Ray answers at RAY_ADDRESS=127.0.0.1:{port}.")
    assert "unset RAY_ADDRESS" in str(err.value) and "ray start --head" in str(err.value)


def driver(code: str, env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=project_root())


JOIN = """
from helpers import cluster
try:
    cluster.init_ray()
    import ray
    print("joined", ray.get_runtime_context().gcs_address)
except cluster.RayUnavailable as err:
    print(f"RayUnavailable: {err}")
"""


@pytest.mark.slow
def test_a_token_protected_ray_at_ray_address_names_the_variables_to_set(settings):
    service = stack_ray.read_service(state_dir())  # the stack's Ray: Ray's default, token authentication
    assert service["auth"] == "token"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}  # a driver without token mode
    env["RAY_ADDRESS"] = service["address"]
    started = time.monotonic()
    result = driver(JOIN, env)
    assert time.monotonic() - started < 30, "bounded, not ray.init's retries"
    said = [line for line in result.stdout.splitlines() if line.strip()]
    assert said == [f"RayUnavailable: The Ray at RAY_ADDRESS={service['address']} uses token authentication and "
                    f"asks for a token: {cluster.TOKEN_HINT}."], result.stdout + result.stderr[-2000:]
    # what the line says to do is enough (the stack's Ray's token is in its state folder, as the line says)
    joined = driver(JOIN, {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": service["token_file"]})
    assert f"joined {service['address']}" in joined.stdout, joined.stdout + joined.stderr[-2000:]


@pytest.mark.slow
def test_make_lab_with_nothing_at_ray_address_stops_in_one_line(settings):
    port = a_closed_port()
    ports = stack_ports.free_ports(["jupyter", "dashboard", "sign_in"])
    result = subprocess.run([sys.executable, "-m", "workshop.lab", "--no-jupyter", "--dashboard-port",
                             str(ports["dashboard"]), "--sign-in-port", str(ports["sign_in"])],
                            env={**os.environ, "RAY_ADDRESS": f"127.0.0.1:{port}"}, capture_output=True, text=True,
                            timeout=120, cwd=project_root())
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: No Ray answers at RAY_ADDRESS=127.0.0.1:{port}. Start one there (`ray start --head --port={port}`), "
        "or unset RAY_ADDRESS to use the embedded stack's Ray (`python -m workshop.stack up`)."]


@pytest.mark.slow
@pytest.mark.parametrize("name, parameters", [
    ("03", {"smoke_test_size": 60}),
    ("04", {"smoke_test_size": 60, "epochs": 1}),
    ("05", {"smoke_test_size": 60, "num_samples": 1, "epochs": 1}),
])
@pytest.mark.timeout(90)
def test_a_ray_notebook_with_nothing_at_ray_address_ends_in_one_line(bucket, tmp_path, monkeypatch, name,
                                                                     parameters):
    port = a_closed_port()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")  # the kernel inherits it
    notebook = runner.notebook_paths(pattern=f"{name}*.ipynb")[0]
    started = time.monotonic()
    result = runner.execute(notebook, tmp_path / "out.ipynb", {"bucket": bucket, **parameters})
    assert time.monotonic() - started < 30
    assert result.status == "failed" and result.message.startswith("RayUnavailable: No Ray answers at RAY_ADDRESS=")
    shown = [o for c in json.loads((tmp_path / "out.ipynb").read_text())["cells"] for o in c.get("outputs", [])
             if o.get("output_type") == "error"]
    assert len(shown) == 1 and "Traceback" not in json.dumps(shown)


def test_the_serve_shutdown_retry_line_is_left_out_of_a_notebook_and_other_lines_are_kept():
    """serve.shutdown()'s controller kills itself; Ray's line about retrying that call is not printed."""
    from ray._private import ray_logging

    cluster.quiet_ray()
    cluster.quiet_ray()  # twice: the pattern is added once
    noise = ("Task ServeController.graceful_shutdown failed. There are infinite retries remaining, so the task "
             "will be retried. Error: The actor is dead because it was killed by `ray.kill`.")
    batch = {"ip": "127.0.0.1", "pid": "raylet", "job": "01", "is_err": False,
             "lines": [noise, "epoch 3: loss 0.12 from a training worker"]}
    printed = [line for out in ray_logging.stdout_deduplicator.deduplicate(batch) for line in out["lines"]]
    assert printed == ["epoch 3: loss 0.12 from a training worker"]
    assert ray_logging.stdout_deduplicator.skip_re.pattern.count("graceful_shutdown") == 1
