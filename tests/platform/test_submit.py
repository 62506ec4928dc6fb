"""``make submit``: notebook 04 as a Ray Job on the lab's Ray (its dashboard and token) and on a two-node cluster on
loopback, a failing notebook, and the per-worker metrics a job's training run leaves in MLflow."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

from helpers import worker_metrics
from helpers.ports import port_is_free
from helpers.settings import project_root
from workshop import lab, processes, stack_ports

pytestmark = pytest.mark.notebook  # runs notebooks end to end: not in make test-quick

NOTEBOOK = "04_distributed_training.ipynb"
SMALL = ["-p", "smoke_test_size", "300", "-p", "epochs", "2", "-p", "checkpoint_every", "2"]


def submit(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m workshop.submit`` (what ``make submit`` runs), from the project root."""
    return subprocess.run([sys.executable, "-m", "workshop.submit", *args], cwd=project_root(), capture_output=True,
                          text=True, timeout=900, env=env or dict(os.environ))


def executed_notebook(output: str) -> Path:
    found = re.search(r"The executed notebook: (runs/submitted/\S+) \(also at s3://ray/notebook-runs/", output)
    assert found, output[-3000:]
    return project_root() / found.group(1)


def run_facts(path: Path) -> dict:
    """What the executed notebook's summary cell printed (its last JSON line), plus any error it stopped at."""
    cells = json.loads(path.read_text())["cells"]
    outputs = [o for c in cells if c["cell_type"] == "code" for o in c.get("outputs", [])]
    errors = [f"{o['ename']}: {o['evalue']}" for o in outputs if o["output_type"] == "error"]
    texts = ["".join(o.get("text", "")) for o in outputs if o["output_type"] == "stream"]
    return {"errors": errors, "text": "\n".join(texts)}


def wait_for_port(port: int, timeout: float = 60) -> None:
    """Until something listens on ``127.0.0.1:port`` or ``timeout`` s passed."""
    deadline = time.monotonic() + timeout
    while port_is_free(port) and time.monotonic() < deadline:
        time.sleep(0.2)


@pytest.fixture(scope="module")
def lab_ray(settings):
    """The session stack's Ray with its dashboard, as ``make lab`` runs it; put back as it was afterwards."""
    state = Path(os.environ["STACK_STATE_DIR"])
    port = stack_ports.free_ports(["dashboard"])["dashboard"]
    _, dashboard = lab.ray_with_dashboard(state, port, None)
    yield dashboard
    lab.restore_stack_ray(state)


@pytest.fixture
def results():
    """Remove what the tests' submissions brought back into runs/submitted/."""
    before = set((project_root() / "runs" / "submitted").glob("*"))
    yield
    for folder in set((project_root() / "runs" / "submitted").glob("*")) - before:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_make_submit_runs_04_on_the_lab_s_ray_streams_its_log_and_brings_the_notebook_back(lab_ray, settings,
                                                                                          results):
    from mlflow.tracking import MlflowClient

    experiment = f"t-submit-{uuid.uuid4().hex[:8]}"
    done = submit("04", *SMALL, "-p", "experiment", experiment)  # the lab's dashboard, found in the stack's state
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert f"Submitted {NOTEBOOK} to {lab_ray} as job notebook-04-" in done.stdout
    assert f"running {NOTEBOOK} with {{'smoke_test_size': 300, 'epochs': 2" in done.stdout  # the job's log, here
    assert re.search(rf"{NOTEBOOK}: ok in [\d.]+ s", done.stdout) and done.stdout.rstrip().endswith("SUCCEEDED.")
    facts = run_facts(executed_notebook(done.stdout))
    tested = re.search(r"test accuracy: [\d.]+% \(95% interval [\d.]+%-[\d.]+%, [\d,]+ images\)", facts["text"])
    assert facts["errors"] == [] and tested, facts["text"]
    client = MlflowClient(settings.mlflow_tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert run.data.params["epochs"] == "2" and run.info.status == "FINISHED"
    workers = set(worker_metrics.per_worker(client, run.info.run_id)["process_cpu_utilization_percentage"])
    assert len(workers) == 2, workers  # notebook 04's two workers, each under its own node id


def test_a_notebook_that_fails_on_the_cluster_fails_make_submit_and_still_comes_back(lab_ray, results):
    failed = submit("04", "-p", "smoke_test_size", "-5")
    assert failed.returncode == 1, failed.stdout[-2000:]
    assert f"{NOTEBOOK}: failed" in failed.stdout and failed.stdout.rstrip().endswith("FAILED.")
    assert any("smoke_test_size" in error for error in run_facts(executed_notebook(failed.stdout))["errors"])


def test_a_job_joins_the_ray_it_was_submitted_to_while_another_ray_runs_on_the_machine(lab_ray):
    """Another Ray of this user, started by ``ray start`` in Ray's default temporary folder, is where Ray's
    ``"auto"`` points by default; a job submitted to the lab's Ray must still join the lab's Ray (its notebook
    joined the other one, where the job's files are not, and failed)."""
    from helpers import stack_ray, worker_env
    from workshop import submit

    worker_env.private_ray_tmpdir()
    port = stack_ports.free_ports(["ray"])["ray"]
    # a token of its own: whatever Ray this process joined before, if any
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    other = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "ray"), "start", "--head",
                              f"--port={port}", "--num-cpus=1", "--node-ip-address=127.0.0.1",
                              "--include-dashboard=false", "--disable-usage-stats", "--block"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    marker = Path(os.environ["RAY_TMPDIR"]) / "ray" / "ray_current_cluster"
    try:
        deadline = time.monotonic() + 90
        while not (marker.is_file() and marker.read_text().strip().endswith(f":{port}")):  # ray start's last step
            assert other.poll() is None and time.monotonic() < deadline, "the other Ray did not start"
            time.sleep(0.5)
        client = submit._client(lab_ray)
        job = client.submit_job(entrypoint="python -c \"import os; print('joins', os.environ['RAY_ADDRESS'])\"")
        deadline = time.monotonic() + 120
        while not client.get_job_status(job).is_terminal():
            assert time.monotonic() < deadline, "the job did not end in 120 s"
            time.sleep(0.5)
        lab_address = stack_ray.read_service(Path(os.environ["STACK_STATE_DIR"]))["address"]
        assert f"joins {lab_address}" in client.get_job_logs(job), (client.get_job_logs(job), lab_address)
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            processes.stop_group(psutil.Process(other.pid), timeout=3)
        with contextlib.suppress(OSError):
            if marker.read_text().strip().endswith(f":{port}"):  # `ray start` leaves it; ours only
                marker.unlink()


def test_no_dashboard_and_no_such_notebook_are_one_line_each(settings):
    closed = f"http://127.0.0.1:{stack_ports.free_ports(['x'])['x']}"
    nowhere = submit("04", "--address", closed)
    assert nowhere.returncode == 1 and nowhere.stderr.count("\n") == 1
    assert nowhere.stderr.startswith(f"error: The Ray dashboard at {closed} refused or did not answer")
    missing = submit("42", "--address", closed)
    assert missing.returncode == 1 and missing.stderr.strip().startswith("error: no notebook '42': NB must be one of")
    no_lab = submit("04", env={**os.environ, "STACK_STATE_DIR": str(project_root() / "no-such-stack")})
    assert no_lab.returncode == 1 and "start `make lab`" in no_lab.stderr and "Traceback" not in no_lab.stderr


@pytest.mark.slow
def test_make_submit_runs_04_on_a_two_node_cluster_on_loopback(settings, results):
    from mlflow.tracking import MlflowClient

    venv_bin = os.path.dirname(sys.executable)
    ray_bin = os.path.join(venv_bin, "ray")
    port, dashboard = stack_ports.free_ports(["ray", "dashboard"]).values()
    # The nodes get the settings as a cluster's nodes do (here: the session stack's state); the token is on, the
    # cluster's own, which its nodes and make submit share.
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
           "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}"}
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    common = ["--num-cpus=1", "--node-ip-address=127.0.0.1", "--disable-usage-stats", "--block"]
    nodes = []
    folders = [tempfile.mkdtemp(prefix=f"ray-{role}-", dir="/tmp") for role in ("head", "worker")]  # short: sockets
    experiment = f"t-submit-2n-{uuid.uuid4().hex[:8]}"
    try:
        nodes.append(subprocess.Popen([ray_bin, "start", "--head", f"--port={port}", "--include-dashboard=true",
                                       "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}", *common,
                                       f"--temp-dir={folders[0]}"],
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True))
        wait_for_port(port)
        # Each node its own temporary folder, as on two machines: one folder for both would let the worker node
        # delete the job's working folder (its copy of the project) under the head's running job.
        nodes.append(subprocess.Popen([ray_bin, "start", f"--address=127.0.0.1:{port}", *common,
                                       f"--temp-dir={folders[1]}"], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        wait_for_port(dashboard)
        done = submit("04", *SMALL, "-p", "experiment", experiment, "-p", "num_workers", "2",
                      "--address", f"http://127.0.0.1:{dashboard}", env=env)
    finally:
        for proc in reversed(nodes):
            with contextlib.suppress(psutil.NoSuchProcess):
                processes.stop_group(psutil.Process(proc.pid), timeout=3)
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert run_facts(executed_notebook(done.stdout))["errors"] == []
    client = MlflowClient(settings.mlflow_tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    workers = set(worker_metrics.per_worker(client, run.info.run_id)["process_memory_rss_megabytes"])
    # rank0-<node> and rank1-<node>: each worker's series, and the node it ran on (Ray Train packs both workers
    # onto one node where they fit, as here: each node has 1 CPU and each worker asks for half of one)
    assert len(workers) == 2 and all(re.fullmatch(r"rank[01]-[0-9a-f]{8}", w) for w in workers), workers


def test_the_lab_s_dashboard_is_known_by_its_port_whether_named_localhost_or_127_0_0_1():
    """make submit sends the lab's Ray's own token only to the lab's dashboard, however the learner names it."""
    from workshop.submit import _same_local_address

    lab = "http://127.0.0.1:8265"
    assert _same_local_address("http://localhost:8265", lab) and _same_local_address("127.0.0.1:8265/", lab)
    assert not _same_local_address("http://127.0.0.1:8266", lab)
    assert not _same_local_address("http://10.0.0.5:8265", lab), "another machine's dashboard: not the lab's"
