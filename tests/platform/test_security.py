"""Every door of the embedded stack asks who is knocking: S3 by its keys, MLflow by a login, the store's other
ports refuse or are closed, and no secret shows on a command line (the session's stack)."""

from __future__ import annotations

import io
import json
import os
import socket
import threading
from pathlib import Path

import pytest

from helpers import storage
from tests.platform.room_intruder import basic, http  # one learner's requests at another's doors, here at the stack's
from tests.suite.secrets_scan import on_command_lines, stack_secrets
from workshop import processes, seaweedfs_security, stack_ports


@pytest.fixture(scope="module")
def state(settings) -> Path:
    """The session stack's state folder (the tests look at its ports and secrets)."""
    if not os.environ.get("STACK_STATE_DIR"):
        pytest.skip("the session uses configured endpoints, not an embedded stack")
    return Path(os.environ["STACK_STATE_DIR"])


@pytest.fixture(scope="module")
def ports(state) -> dict[str, int]:
    return {k: v for k, v in json.loads((state / "ports.json").read_text()).items() if isinstance(v, int)}


def test_mlflow_asks_for_its_login(settings):
    url = settings.mlflow_tracking_uri.rstrip("/")
    search = f"{url}/api/2.0/mlflow/experiments/search?max_results=1"
    assert http(search)[0] == 401
    assert http(search, headers=basic(settings.mlflow_username, "not-the-password"))[0] == 401
    assert http(search, headers=basic(settings.mlflow_username, settings.mlflow_password))[0] == 200
    assert http(f"{url}/health")[0] == 200  # what the stack's health check asks, and nothing else


def test_mlflow_checks_the_generated_password_with_one_hash_round_not_scrypt(settings, state):
    """Every MLflow request checks the password: with werkzeug's default scrypt each check cost the server
    100-350 ms of CPU (notebook 05 ran 3x slower); the password is random, so one PBKDF2 round loses nothing."""
    import sqlite3

    with sqlite3.connect(state / "mlflow" / "basic_auth.db") as db:
        (stored,) = db.execute("SELECT password_hash FROM users WHERE username = ?",
                               (settings.mlflow_username,)).fetchone()
    assert stored.startswith("pbkdf2:sha256:1$"), stored.split("$")[0]
    assert len(settings.mlflow_password) >= 32  # 24 random bytes, URL-safe


def test_the_store_s_other_ports_refuse_to_list_or_change_a_bucket(settings, client, bucket, ports):
    storage.ensure_bucket(client, bucket)
    client.put_object(bucket, "train/1/secret.png", io.BytesIO(b"private"), 7)
    attempts = {
        "filer listing": f"http://127.0.0.1:{ports['filer']}/buckets/{bucket}/train/1/",
        "filer read": f"http://127.0.0.1:{ports['filer']}/buckets/{bucket}/train/1/secret.png",
        "master volume lookup": f"http://127.0.0.1:{ports['master']}/dir/status",
        "master token": f"http://127.0.0.1:{ports['master']}/dir/assign",
        "master collection delete": f"http://127.0.0.1:{ports['master']}/col/delete?collection={bucket}",
        "volume read": f"http://127.0.0.1:{ports['volume']}/1,0100000000",
        "volume ui": f"http://127.0.0.1:{ports['volume']}/ui/index.html",
        "admin ui": f"http://127.0.0.1:{ports['admin']}/",
    }
    answers = {what: http(url, headers={"Accept": "application/json"}) for what, url in attempts.items()}
    opened = {what: code for what, (code, body) in answers.items() if 200 <= code < 300 or b"secret.png" in body}
    assert opened == {}, f"answered without credentials: {opened}"
    assert storage.read_object(client, bucket, "train/1/secret.png") == b"private"  # nothing changed


def test_every_grpc_port_of_the_store_asks_for_a_client_certificate(ports):
    grpc = {name: port for name, port in ports.items() if name.endswith("_grpc")}
    assert len(grpc) >= 4
    assert {name: seaweedfs_security.refuses_plain_clients(port) for name, port in grpc.items()} == dict.fromkeys(
        grpc, True)


def test_the_certificate_check_tells_a_plain_text_port_from_a_tls_one():
    """The stack checks TLS is on after each start (SeaweedFS falls back silently); a plain port must fail it."""
    server = socket.create_server(("127.0.0.1", 0))

    def answer_in_plain_text():
        connection, _ = server.accept()
        with connection:
            connection.recv(1024)
            connection.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # an HTTP/2 SETTINGS frame, no TLS

    threading.Thread(target=answer_in_plain_text, daemon=True).start()
    try:
        assert seaweedfs_security.refuses_plain_clients(server.getsockname()[1], timeout=5) is False
    finally:
        server.close()


def test_no_secret_of_the_stack_is_on_any_command_line(state):
    secrets = stack_secrets(state)
    assert {"S3 secret key", "MLflow password", "MLflow server key", "SeaweedFS JWT key 0"} <= set(secrets)
    assert on_command_lines(secrets) == []


def test_nothing_phones_home_from_the_stack_the_lab_or_a_driver(state, settings):
    """Ray's usage stats and MLflow's telemetry are off in the stack's services, the lab's kernels and a driver."""
    from helpers import cluster
    from helpers.worker_env import ROOM_ENVIRONMENT
    from workshop import lab

    for service in ("mlflow", "ray"):
        process = processes.remembered_process(state, service)
        assert process is not None, f"the session stack runs {service}"
        environment = process.environ()
        assert {name: environment.get(name) for name in ROOM_ENVIRONMENT} == ROOM_ENVIRONMENT, service
    status, body = http(f"{settings.mlflow_tracking_uri.rstrip('/')}/ajax-api/3.0/mlflow/ui-telemetry",
                        headers=basic(settings.mlflow_username, settings.mlflow_password))
    assert status == 200 and json.loads(body)["disable_ui_telemetry"] is True, body  # the UI's banner
    kernels = lab.kernel_environment()
    assert {name: kernels.get(name) for name in ROOM_ENVIRONMENT} == ROOM_ENVIRONMENT
    cluster.ray_connection(settings)  # a notebook's driver, before ray.init
    assert {name: os.environ.get(name) for name in ROOM_ENVIRONMENT} == ROOM_ENVIRONMENT


def test_a_pickled_model_is_refused_by_the_loaders_and_its_payload_never_runs(settings, tmp_path):
    """A model is code: one logged as a pickle, whose ``__reduce__`` would write a file, is registered; the
    loaders a kernel runs (the lessons' ``mlflow.pytorch.load_model`` and ``mlflow.pyfunc.load_model``) refuse it,
    and the file is never written. The lessons' own pt2 models load without pickle (the notebook tests)."""
    import subprocess
    import sys
    import uuid

    import mlflow
    from torch import nn

    from workshop import lab

    marker = tmp_path / "the-payload-ran"

    class Payload(nn.Module):
        def forward(self, x):
            return x

        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    name = f"t-pickled-{uuid.uuid4().hex[:8]}"
    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
    with mlflow.start_run():
        info = mlflow.pytorch.log_model(Payload(), name="model", serialization_format="pickle",
                                        pip_requirements=["torch"], registered_model_name=name)
    assert not marker.exists()
    for loader in ("mlflow.pytorch.load_model", "mlflow.pyfunc.load_model"):
        ran = subprocess.run([sys.executable, "-c", f"import mlflow; {loader}('models:/{name}/1')"],
                             env={**lab.kernel_environment(), "MLFLOW_TRACKING_URI": settings.mlflow_tracking_uri},
                             capture_output=True, text=True, timeout=120)
        refused = "Deserializing model using pickle is disallowed" in ran.stderr
        assert ran.returncode != 0 and refused, ran.stderr[-2000:]
        assert not marker.exists(), f"{loader} ran the pickle's payload"
    assert info.registered_model_version == "1"


def test_a_remembered_ray_address_counts_only_while_the_stacks_own_process_listens_there(state, tmp_path):
    """The record survives a SIGKILL or a reboot, and anyone may bind the port it names: before a token goes there,
    the port must be held by the recorded process or one it started. Nothing, not even a connection, is sent."""
    import subprocess
    import sys

    from helpers import stack_ray

    real = stack_ray.read_service(state)
    assert real is not None, "the session stack's Ray, proven by its GCS port"
    records = tmp_path / "records"
    records.mkdir()

    def recorded(**changes) -> dict | None:
        (records / stack_ray.SERVICE_FILE).write_text(json.dumps({**real, **changes}))
        return stack_ray.read_service(records)

    with socket.socket() as impostor:  # another program holds a port the record names
        impostor.bind(("127.0.0.1", 0))
        impostor.listen()
        address = f"127.0.0.1:{impostor.getsockname()[1]}"
        assert recorded(address=address) is None, "the stack's Ray does not listen there"
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        assert recorded(pid=gone.pid) is None, "the recorded process is gone"
        impostor.setblocking(False)
        with pytest.raises(BlockingIOError):
            impostor.accept()  # nothing knocked
        assert recorded(address=address, pid=os.getpid()) is not None, "the port held by the recorded process"


def test_the_stack_s_ray_asks_every_client_for_its_token_whatever_the_environment_says(state, tmp_path):
    """``RAY_AUTH_MODE=disabled`` in the learner's environment, and a token file other users can read (as a Ray
    started outside the stack writes it, 0644): the stack's Ray uses tokens all the same, with a new token only
    its owner can read, and it checks at start that a client without the token is refused."""
    import shutil
    import subprocess
    import sys
    import time

    from helpers import stack_ray
    from helpers.settings import project_root
    from workshop import ray_service

    assert stack_ray.refuses_clients_without_token(stack_ray.read_service(state)["address"])  # the session's
    own = tmp_path / "state"  # a Ray of this test's own, with the session stack's services
    own.mkdir(mode=0o700)
    for name in ("stack.env", "mlflow-auth.json"):
        shutil.copy(state / name, own / name)
    token = tmp_path / "home" / ".ray" / "auth_token"
    token.parent.mkdir(parents=True)
    token.write_text("read-by-anyone")
    token.chmod(0o644)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update(HOME=str(tmp_path / "home"), RAY_AUTH_MODE="disabled",
               **{ray_service.PORT_ENV: str(stack_ports.free_ports(["ray"])["ray"])})
    ray = subprocess.Popen([sys.executable, "-m", "workshop.ray_service", "--state", str(own), "--num-cpus", "1"],
                           env=env, cwd=project_root(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines, deadline = [], time.monotonic() + 180
        while not any(line.startswith("Ray is up at") for line in lines) and time.monotonic() < deadline:
            line = ray.stdout.readline()
            assert line, "the Ray service ended:\n" + "".join(lines[-20:])
            lines.append(line)
        info = json.loads((own / stack_ray.SERVICE_FILE).read_text())
        assert info["auth"] == "token" and stack_ray.refuses_clients_without_token(info["address"])
        assert stack_ray.refuses_clients_without_token(info["address"], wrong_token="read-by-anyone"), (
            "the stack's Ray took the token file others could read")
        assert info["token_file"] == str(stack_ray.token_file(own)), "a token of its own, in the state folder"
        assert stack_ray.token_file(own).stat().st_mode & 0o077 == 0
        assert token.read_text() == "read-by-anyone", "the learner's own file, left as it was"
    finally:
        ray.terminate()
        ray.wait(timeout=60)


@pytest.mark.parametrize("service", ["mlflow", "lakefs"])
def test_the_stack_sends_nothing_to_a_program_that_holds_a_service_s_port(state, tmp_path, service):
    """Between choosing a port and the service binding it (about ten seconds for MLflow), or after it died, any user
    may hold the port. The stack asks whether the service is up, and whether it takes the stack's password or keys;
    the impostor must hear neither: before anything is sent, the port's listening socket must be the recorded
    process's own."""
    import shutil
    import subprocess
    import sys

    from tests.platform.room_intruder import waiting_at_a_door
    from workshop import service_health

    own = tmp_path / "state"  # the session stack's records, with the service's process one that never binds its port
    own.mkdir(mode=0o700)
    for name in ("stack.env", "mlflow-auth.json", "ports.json"):
        shutil.copy(state / name, own / name)
    with (own / "stack.env").open("a") as env:  # lakeFS's keys, as a stack with a lakefs binary writes them
        env.write("LAKEFS_ACCESS_KEY_ID=AKIAJDOORTEST\nLAKEFS_SECRET_ACCESS_KEY=not-for-an-impostor\n")
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        processes.remember_process(own, service, process.pid)
        with waiting_at_a_door() as (port, heard):
            assert not service_health.healthy(service, own, f"http://127.0.0.1:{port}")
    finally:
        process.kill()
        process.wait()
    assert heard == [], f"a request went to a port {service} does not listen on"
