"""Lifecycle of the embedded stack, on private ports and a private state folder."""

import hashlib
import http.server
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from helpers import listing, storage, upload
from helpers.ports import port_is_free
from helpers.private_files import write_private
from helpers.settings import load_settings
from tests.fakes.release_archive import release_archive
from workshop import (
    lakefs_binary,
    lakefs_service,
    mlflow_service,
    processes,
    seaweedfs_service,
    service_health,
    stack,
    stack_ports,
)


@pytest.fixture
def state(tmp_path):
    """A private state folder; whatever the test started is stopped afterwards."""
    yield tmp_path
    stack.down(tmp_path)


def private_ports():
    return stack_ports.free_ports(list(stack_ports.DEFAULT_PORTS))


def cli(*args, state):
    return subprocess.run([sys.executable, "-m", "workshop.stack", *args, "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=180)


@pytest.mark.slow
def test_up_twice_status_and_down(state):
    rows = {r.name: r for r in stack.up(state, ports=private_ports())}
    assert rows["seaweedfs"].healthy and rows["mlflow"].healthy and rows["ray"].healthy
    assert rows["seaweedfs"].detail == rows["ray"].detail == "started"
    pids = {name: rows[name].pid for name in ("seaweedfs", "mlflow", "ray")}
    # MLflow and Ray start side by side, not Ray after MLflow answered (MLflow alone takes 8 s or more)
    started = {name: psutil.Process(pid).create_time() for name, pid in pids.items()}
    assert abs(started["ray"] - started["mlflow"]) < 3
    mlflow_commands = [" ".join(p.cmdline()) for p in processes.process_group(psutil.Process(pids["mlflow"]))]
    assert not [c for c in mlflow_commands if "huey" in c or "_job_runner" in c], "MLflow's job runner is off"
    ray_processes = psutil.Process(pids["ray"]).children(recursive=True)  # GCS, raylet, agents, workers
    assert len(ray_processes) >= 3

    again = {r.name: r for r in stack.up(state)}  # ports remembered from the first call
    assert {name: again[name].pid for name in pids} == pids
    assert again["mlflow"].detail == "already running"

    result = cli("status", state=state)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("healthy") == 3

    settings = load_settings(environ={}, stack_state=state)
    assert settings.s3_endpoint.startswith("http://127.0.0.1:") and settings.mlflow_tracking_uri
    line = stack.services_line(settings, state=state)
    assert line.count("(embedded stack)") == 2 and "not used" not in line
    # the .env trap: a compose-era .env hides the running embedded stack, and the line says so
    (state / "root").mkdir()
    (state / "root" / ".env").write_text("S3_ENDPOINT=http://127.0.0.1:9000\n")
    env_wins = load_settings(environ={}, root=state / "root", stack_state=state)
    line = stack.services_line(env_wins, state=state)
    assert "object store http://127.0.0.1:9000 (S3_ENDPOINT from .env)" in line
    assert "embedded stack is running too but is not used: S3_ENDPOINT in .env; it wins. Remove it" in line
    client = storage.get_client(settings)
    storage.ensure_bucket(client, "persisted")

    services = [*(psutil.Process(pid) for pid in pids.values()), *ray_processes]
    assert sorted(stack.down(state)) == ["mlflow", "ray", "seaweedfs"]
    assert not [p for p in services if p.is_running() and not processes.is_zombie(p)]
    assert not (state / "ray.json").exists()
    assert not any(r.running for r in stack.status(state))
    assert stack.down(state) == []

    # Data persists across a restart.
    stack.up(state, with_mlflow=False, with_ray=False)
    assert client.bucket_exists("persisted")


def _mlflow_answers(url: str, path: str, auth: tuple[str, str] | None = None, body: dict | None = None) -> int:
    """The HTTP status MLflow gives ``path``, signed in with ``auth`` or not."""
    import base64
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url + path, data=json.dumps(body).encode() if body else None,
                                     headers={"Content-Type": "application/json"})
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_up_over_an_older_stack_starts_it_secured_and_keeps_its_data(state):
    """An older stack's SeaweedFS (no JWT, no TLS) and MLflow (no login), left running, are started again."""
    from workshop import seaweedfs_security

    stack.up(state, ports=private_ports(), with_ray=False, with_lakefs=False)  # keys, folders, settings
    stack.down(state)
    ports, settings = stack_ports.saved_ports(state), load_settings(environ={}, stack_state=state)
    old_weed = [arg for arg in seaweedfs_service.command(state, ports)
                if not arg.startswith(("-config_dir", "-disableHttp"))]
    old_mlflow = [arg for arg in mlflow_service.command(state, ports) if arg not in ("--app-name", "basic-auth")]
    auth = {"secret_key": "old", **json.loads((state / "mlflow-auth.json").read_text())}
    old_env = {k: v for k, v in mlflow_service.environment(state, settings, auth).items()
               if not k.startswith("MLFLOW_")}
    for name, command, env in (("seaweedfs", old_weed, None), ("mlflow", old_mlflow, old_env)):
        stack._start(name, command, state, env)
        record = json.loads((state / f"{name}.pid").read_text())
        (state / f"{name}.pid").write_text(json.dumps({k: v for k, v in record.items() if k != "fingerprint"}))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (service_health.http_ok(settings.mlflow_tracking_uri + "/health") and
                                                service_health.http_ok(settings.s3_url + "/healthz")):
        time.sleep(0.5)
    assert not seaweedfs_security.refuses_plain_clients(ports["master_grpc"]), "the old way: gRPC without TLS"
    created = {"name": "kept"}
    assert _mlflow_answers(settings.mlflow_tracking_uri, "/api/2.0/mlflow/experiments/create", body=created) == 200
    client = storage.get_client(settings)
    storage.ensure_bucket(client, "kept")
    client.put_object("kept", "object", io.BytesIO(b"data"), 4)

    began = time.monotonic()
    rows = {r.name: r for r in stack.up(state, with_ray=False, with_lakefs=False, timeout=60)}
    print(f"up over the older stack: {time.monotonic() - began:.1f} s")  # it polled the old MLflow 90 s, then failed
    for name in ("seaweedfs", "mlflow"):
        assert rows[name].healthy and rows[name].detail.startswith("started again: an older version"), rows[name]
    assert seaweedfs_security.refuses_plain_clients(ports["master_grpc"])
    uri, login = settings.mlflow_tracking_uri, (settings.mlflow_username, settings.mlflow_password)
    assert _mlflow_answers(uri, "/api/2.0/mlflow/experiments/get-by-name?experiment_name=kept") == 401
    assert _mlflow_answers(uri, "/api/2.0/mlflow/experiments/get-by-name?experiment_name=kept", login) == 200
    assert storage.read_object(storage.get_client(settings), "kept", "object") == b"data"
    again = {r.name: r for r in stack.up(state, with_ray=False, with_lakefs=False)}
    assert again["mlflow"].detail == again["seaweedfs"].detail == "already running"


def test_a_disk_too_full_for_the_object_store_is_one_line_before_anything_starts(state, monkeypatch):
    """Below 1% free SeaweedFS writes nothing and every upload fails with HTTP 500: up says so first."""
    import shutil

    monkeypatch.setattr(seaweedfs_service, "SPARE_BYTES", shutil.disk_usage(state).free)  # the real disk, 1% short
    with pytest.raises(stack.StackError, match=r"GB free of .* free .* GB or more, or set STACK_STATE_DIR"):
        stack.up(state, ports=private_ports())
    assert all(processes.remembered_process(state, name) is None for name in stack.SERVICES)
    monkeypatch.setattr(seaweedfs_service, "SPARE_BYTES", 0)
    seaweedfs_service.check_free_space(state)  # a disk with room passes


def test_port_in_use_is_named(state):
    ports = private_ports()
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", ports["s3"]))
        blocker.listen()
        with pytest.raises(stack_ports.PortInUseError) as err:
            stack.up(state, ports=ports, with_mlflow=False, with_ray=False)
        result = cli("up", "--no-mlflow", "--no-ray", state=state)  # the CLI says it in one line, exit 1
    assert str(ports["s3"]) in str(err.value) and "--s3-port" in str(err.value)
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0 and "already in use" in result.stderr
    assert not any(r.running for r in stack.status(state))


def test_up_waits_a_moment_for_a_port_released_just_now():
    # A service stopped just now can hold its port a moment longer (up right after down): not "in use".
    port = private_ports()["s3"]
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))
    holder.listen()
    releaser = threading.Timer(0.5, holder.close)
    releaser.start()
    try:
        stack_ports.check_ports_free("seaweedfs", {"s3": port}, ["s3"])
    finally:
        releaser.join()
    assert port_is_free(port)


def test_a_service_stays_ours_when_the_clock_is_set():
    # The wall clock moved by 6 s (NTP, a VM's clock, a laptop's resume) while the stack ran: the recorded
    # start on the wall clock no longer matches, the start since boot does. Both moved: another process.
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record = processes.identity(psutil.Process(sleeper.pid))
        moved = {**record, "create_time": record["create_time"] + 6}
        assert processes.our_process(moved).pid == sleeper.pid
        assert processes.our_process({**moved, "since_boot": record["since_boot"] + 6}) is None
        assert processes.our_process({**record, "uid": os.getuid() + 1}) is None  # another user's
        assert processes.our_process({k: v for k, v in record.items() if k != "since_boot"}).pid == sleeper.pid
    finally:
        sleeper.kill()
        sleeper.wait()


def test_down_stops_only_what_up_started(state):
    # A stranger whose command line even names the state folder (as a `.stack-dev` would contain `.stack`).
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(state)])
    try:
        (state / "seaweedfs.pid").write_text(str(stranger.pid))  # a bare pid: not a record of ours
        (state / "mlflow.pid").write_text(json.dumps(  # the right pid and executable, another start time
            {"pid": stranger.pid, "exe": psutil.Process(stranger.pid).exe(), "create_time": 1.0}))
        assert stack.down(state) == []
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


# A service that forks a worker into its own process group and then a grandchild that outlives its parent,
# as MLflow's server does with its workers: `down` must stop them all, or the orphan keeps the port.
FORKING_SERVICE = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                  "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(0.5)"])
time.sleep(120)
"""


def test_down_stops_the_service_s_whole_process_group_orphans_included(state):
    (state / "logs").mkdir()
    proc = stack._start("mlflow", [sys.executable, "-c", FORKING_SERVICE], state)
    deadline = time.monotonic() + 20
    group = []
    while time.monotonic() < deadline:
        group = [p for p in psutil.process_iter() if _pgid(p) == proc.pid and not processes.is_zombie(p)]
        if len(group) == 2 and all(p.ppid() != proc.pid for p in group if p.pid != proc.pid):
            break  # the service and an orphan that is no longer its child
        time.sleep(0.2)
    assert len(group) == 2, "the forking service did not leave an orphan"
    orphan = next(p for p in group if p.pid != proc.pid)
    assert stack.down(state) == ["mlflow"]
    assert not orphan.is_running() or processes.is_zombie(orphan)
    proc.wait(timeout=10)


def _listening_pids(ports: list[int]) -> dict[int, int]:
    """Which process listens on each of ``ports`` on 127.0.0.1 (those nothing listens on are left out)."""
    found = {}
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port in ports and conn.pid:
            found[conn.laddr.port] = conn.pid
    return found


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_service_whose_main_process_was_killed_comes_back_with_the_next_up(state):
    """SIGKILL to each service's main process alone, as a crash does: its children (MLflow's uvicorn worker, Ray's
    processes) live on and hold its ports. The next ``up`` recognises them as the stack's own, stops them, and
    brings everything back within seconds; ``down`` afterwards leaves no process and no port."""
    ports = private_ports()
    rows = {r.name: r for r in stack.up(state, ports=ports)}
    services = [name for name in ("seaweedfs", "mlflow", "lakefs", "ray") if rows[name].running]
    assert {"seaweedfs", "mlflow", "ray"} <= set(services)
    service_port = {"seaweedfs": ports["s3"], "mlflow": ports["mlflow"], "lakefs": ports["lakefs"],
                    "ray": ports["ray"]}
    for name in services:
        main = psutil.Process(stack.status(state)[stack.SERVICES.index(name)].pid)
        left = [p for p in processes.process_group(main) if p.pid != main.pid]
        main.kill()
        main.wait(10)
        if name == "mlflow":
            assert left and processes.orphans(state, "mlflow"), "MLflow's worker outlives its server"
            assert ports["mlflow"] in _listening_pids([ports["mlflow"]]), "and holds the port"
        started = time.monotonic()
        again = {r.name: r for r in stack.up(state)}
        took = time.monotonic() - started
        assert all(again[other].healthy for other in services), (name, again)
        assert again[name].detail.startswith("started") and again[name].pid != main.pid
        assert not [p for p in left if p.is_running() and not processes.is_zombie(p)], name
        assert took < 60, f"{name}: up took {took:.0f} s"
        listener = _listening_pids([service_port[name]]).get(service_port[name])
        assert listener is not None and listener in {again[name].pid} | {
            p.pid for p in psutil.Process(again[name].pid).children(recursive=True)}, name
    everything = [p for name in services
                  for p in processes.process_group(psutil.Process(stack.status(state)[stack.SERVICES.index(name)].pid))]
    assert sorted(stack.down(state)) == sorted(services)
    assert not [p for p in everything if p.is_running() and not processes.is_zombie(p)]
    assert not _listening_pids(list(ports.values()))


def test_orphans_are_only_the_service_s_own_session(state):
    """A process of another session, or one started before the service (a reused number), is never an orphan."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        processes.remember_process(state, "mlflow", sleeper.pid)
        record = json.loads((state / "mlflow.pid").read_text())
        assert record["session"] == sleeper.pid
        assert processes.orphans(state, "mlflow") == [], "the main process runs: nothing is orphaned"
        sleeper.kill()
        sleeper.wait()
        assert processes.orphans(state, "mlflow") == [] and stranger.poll() is None
        (state / "mlflow.pid").write_text(json.dumps({**record, "session": stranger.pid,
                                                      "create_time": record["create_time"] + 3600}))
        assert processes.orphans(state, "mlflow") == [], "it started before the service: not the service's"
        (state / "mlflow.pid").write_text(json.dumps({**record, "session": stranger.pid, "create_time": 1.0}))
        assert [p.pid for p in processes.orphans(state, "mlflow")] == [stranger.pid]
        assert processes.stop_orphans(state, "mlflow") == 1 and stranger.wait(10) is not None
    finally:
        for proc in (sleeper, stranger):
            if proc.poll() is None:
                proc.kill()


def _pgid(p: psutil.Process) -> int | None:
    try:
        return os.getpgid(p.pid)
    except (ProcessLookupError, psutil.Error):
        return None


@pytest.mark.parametrize("args, message", [
    (["--s3-port", "0"], "s3=0 is not a port number"),
    (["--mlflow-port", "70000"], "mlflow=70000 is not a port number"),
    (["--port-base", "65530"], "is not a port number"),
])
def test_a_bad_port_is_refused_in_one_line_and_never_saved(state, args, message):
    result = cli("up", "--no-mlflow", "--no-lakefs", *args, state=state)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr and "1 to 65535" in result.stderr
    assert not (state / "ports.json").exists()


def test_two_services_on_one_port_are_refused(state):
    port = private_ports()["s3"]
    result = cli("up", "--s3-port", str(port), "--mlflow-port", str(port), state=state)
    assert result.returncode == 1 and "both" in result.stderr and "its own" in result.stderr
    assert not (state / "ports.json").exists()


@pytest.mark.parametrize("name, text", [
    ("ports.json", "{not json"),
    ("ports.json", '{"s3": "eighty"}'),
    ("s3-identities.json", '{"identities": []}'),
    ("lakefs-keys.json", "[1, 2]"),
    ("mlflow-auth.json", '{"username": "admin"}'),
])
def test_damaged_state_files_name_the_file_and_the_reset(state, name, text, monkeypatch):
    monkeypatch.setattr(lakefs_binary, "find", lambda: Path("/bin/true"))  # so the lakeFS keys are read too
    (state / name).write_text(text)
    with pytest.raises(stack.StackError) as err:
        stack.up(state, ports=private_ports(), with_mlflow=False, with_ray=False)
    assert name in str(err.value) and "make reset" in str(err.value)
    assert (state / name).read_text() == text  # reported, not overwritten
    assert not (state / "seaweedfs.pid").exists()  # nothing was started


def _modes(root):
    return {str(p.relative_to(root)): p.stat().st_mode & 0o777 for p in [root, *root.rglob("*")] if not p.is_symlink()}


@pytest.mark.slow
def test_two_ups_at_once_start_one_stack_and_every_state_file_is_private(state):
    write_private(state / "ports.json", json.dumps(private_ports()))
    command = [sys.executable, "-m", "workshop.stack", "up", "--no-lakefs", "--no-ray", "--state-dir", str(state)]
    runs = [subprocess.Popen(command,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [run.communicate(timeout=180) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    started = [out for out, _ in outputs if "started" in out]
    assert len(started) == 1, outputs  # the second waited for the lock, then found the services running
    weeds = [p for p in psutil.process_iter(["cmdline"]) if any(str(state) in a for a in p.info["cmdline"] or [])]
    assert len([p for p in weeds if "mini" in p.info["cmdline"]]) == 1
    env = load_settings(environ={}, stack_state=state)
    assert storage.get_client(env).bucket_exists("mlflow")  # both services work

    modes = _modes(state)
    loose = {path: oct(mode) for path, mode in modes.items() if mode & 0o077}
    assert not loose, f"readable by others: {loose}"
    for name in ("stack.env", "ports.json", "s3-identities.json", "seaweedfs.pid", "logs/mlflow.log",
                 "mlflow/mlflow.db"):
        assert modes[name] == 0o600, name
    assert modes["."] == modes["logs"] == 0o700
    assert sorted(stack.down(state)) == ["mlflow", "seaweedfs"]
    assert not [p for p in weeds if p.is_running() and not processes.is_zombie(p)]


def test_state_files_are_replaced_whole_and_private(tmp_path):
    target = tmp_path / "stack.env"
    target.write_text("old")
    target.chmod(0o644)
    write_private(target, "new")
    assert target.read_text() == "new" and target.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["stack.env"]  # no temporary file left behind


@pytest.mark.slow
def test_interrupted_upload_resumes_without_duplicates(state):
    stack.up(state, ports=private_ports(), with_mlflow=False, with_ray=False)
    client = storage.get_client(load_settings(environ={}, stack_state=state), retries=0)
    bucket, smoke = "resume", 1200  # 1,200 + 2,000 validation + 4,000 test objects: several seconds of uploading

    errors = []

    def run_upload():
        try:
            upload.upload_mnist(bucket, smoke, client=client, progress=False)
        except storage.StorageError as err:
            errors.append(err)

    worker = threading.Thread(target=run_upload)
    worker.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and worker.is_alive():
        time.sleep(0.2)
        try:
            if len(listing.list_objects_parallel(bucket, client=client)) > 200:
                break
        except storage.StorageError:
            pass
    stack.kill_service("seaweedfs", state)  # SIGKILL, mid-upload
    worker.join(timeout=120)
    assert errors and "run the same call again" in str(errors[0])

    stack.up(state, with_mlflow=False, with_ray=False)
    partial = len(listing.list_objects_parallel(bucket, client=client))
    assert 0 < partial < 7200
    report = upload.upload_mnist(bucket, smoke, client=client, progress=False)
    assert report.skipped == partial and report.uploaded == 7200 - partial
    keys = listing.list_objects_parallel(bucket, client=client)
    assert len(keys) == len(set(keys)) == 7200
    assert sorted(listing.list_objects_from_manifest(bucket, client=client)) == sorted(keys)


@pytest.mark.slow
def test_up_after_a_kill_returns_once_stored_objects_can_be_read(state):
    """``up`` waits for the volume server, not only the S3 port: reads at once after it are never a 500."""
    stack.up(state, ports=private_ports(), with_mlflow=False, with_ray=False)
    client = storage.get_client(load_settings(environ={}, stack_state=state), retries=0)
    storage.ensure_bucket(client, "kept")
    for i in range(10):
        client.put_object("kept", f"object-{i}", io.BytesIO(b"x" * (100 + i)), 100 + i)
    for _ in range(3):  # the window after a restart is seconds long on a busy machine, absent on an idle one
        stack.kill_service("seaweedfs", state)
        stack.up(state, with_mlflow=False, with_ray=False)
        for i in range(10):
            response = client.get_object("kept", f"object-{i}")
            try:
                assert response.read() == b"x" * (100 + i)
            finally:
                response.close()
                response.release_conn()


@pytest.mark.parametrize("volume_servers, ready", [
    ("", False),  # what the master's status page lists before the first heartbeat
    ('<a href="http://127.0.0.1:1/ui/index.html">127.0.0.1:1</a>', False),  # a volume server, not this stack's
    ('<a href="http://127.0.0.1:{volume}/ui/index.html">127.0.0.1:{volume}</a>', True),
])
def test_the_object_store_is_healthy_only_once_its_master_knows_a_volume_server(tmp_path, volume_servers, ready,
                                                                                 monkeypatch):
    """Health needs both the S3 port's ``/healthz`` and this stack's volume server on the master's status page."""
    volume = 65000
    monkeypatch.setattr(service_health, "knows_our_keys", lambda *args: True)  # tested with real stacks below

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            page = f"<html><h2>Topology</h2>{volume_servers.format(volume=volume)}</html>"
            body = {"/healthz": b"OK", "/": page.encode()}.get(self.path, b"404 page not found")
            self.send_response(200 if self.path in ("/healthz", "/") else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        (tmp_path / "ports.json").write_text(json.dumps({"s3": port, "master": port, "volume": volume}))
        processes.remember_process(tmp_path, "seaweedfs", os.getpid())  # the port's listener: this process, as recorded
        assert service_health.healthy("seaweedfs", tmp_path, f"http://127.0.0.1:{port}") is ready
    finally:
        server.shutdown()
        server.server_close()


# A stand-in for the lakeFS binary: it reads the config file the stack wrote, checks what the stack promises
# (loopback only, local KV under the state folder, S3 blockstore on the embedded store, no calls home) and
# serves the lakeFS API test double with the installation keys and blockstore credentials from that file.
FAKE_LAKEFS = '''#!{python}
import sys, time, yaml
if sys.argv[1:] == ["--version"]:
    sys.exit(print("lakefs version {version}"))
sys.path.insert(0, {root!r})
assert sys.argv[1:3] == ["run", "--config"], sys.argv
cfg = yaml.safe_load(open(sys.argv[3]))
host, port = cfg["listen_address"].split(":")
assert host == "127.0.0.1" and cfg["database"]["type"] == "local" and cfg["stats"]["enabled"] is False
assert cfg["security"] == {{"audit_check_url": "", "check_latest_version": False}}
s3 = cfg["blockstore"]["s3"]
assert cfg["blockstore"]["type"] == "s3" and s3["force_path_style"] is True
from helpers.settings import Settings
from tests.fakes.lakefs_double import LakeFSServer
settings = Settings(s3_endpoint=s3["endpoint"], s3_access_key=s3["credentials"]["access_key_id"],
                    s3_secret_key=s3["credentials"]["secret_access_key"])
install = cfg["installation"]
server = LakeFSServer(settings, install["access_key_id"], install["secret_access_key"], port=int(port))
server.serve_forever()
'''


def fake_lakefs(version: str = lakefs_binary.LAKEFS_VERSION) -> str:
    """A stand-in ``lakefs`` binary: answers ``--version``, and ``run --config`` starts the API double."""
    from helpers.settings import project_root

    return FAKE_LAKEFS.format(python=sys.executable, root=str(project_root()), version=version)


@pytest.mark.slow
@pytest.mark.lakefs
def test_up_starts_lakefs_where_a_binary_is_on_path_and_writes_its_settings(state, tmp_path, monkeypatch):
    from helpers import versioning

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "lakefs"
    fake.write_text(fake_lakefs())
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    assert lakefs_binary.find() == fake

    rows = {r.name: r for r in stack.up(state, ports=private_ports(), with_mlflow=False, with_ray=False)}
    assert rows["lakefs"].healthy and rows["lakefs"].detail == "started"
    settings = load_settings(environ={}, stack_state=state)
    assert settings.lakefs_endpoint == rows["lakefs"].url and settings.lakefs_access_key.startswith("AKIAJ")
    assert "test-double" in versioning.connect(settings).version  # the keys in stack.env are the server's keys
    assert storage.get_client(settings).bucket_exists(lakefs_service.LAKEFS_BUCKET)  # namespace bucket made up front
    config = (state / "lakefs" / "config.yaml")
    assert oct(config.stat().st_mode & 0o777) == "0o600" and str(state) in config.read_text()

    assert "lakefs" in stack.down(state)
    assert not {r.name: r for r in stack.status(state)}["lakefs"].running


@pytest.mark.slow
@pytest.mark.lakefs
def test_a_program_at_lakefs_s_port_after_lakefs_died_hears_nothing_and_lakefs_moves(state, tmp_path, monkeypatch,
                                                                                        capsys):
    """lakeFS died and another program bound its port: ``up`` sends it no key, not even a health request, starts
    lakeFS on a free port and says in one line which port it left; the notebooks' settings name the new one."""
    from helpers import versioning
    from tests.platform.room_intruder import waiting_at_a_door

    fake = tmp_path / "bin" / "lakefs"
    fake.parent.mkdir()
    fake.write_text(fake_lakefs())
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    (state / "ports.json").write_text(json.dumps(private_ports()))  # chosen by the stack, not by the learner
    assert stack.up(state, with_mlflow=False, with_ray=False)[2].healthy
    old = json.loads((state / "ports.json").read_text())["lakefs"]
    stack.kill_service("lakefs", state)
    with waiting_at_a_door(old) as (_, heard):
        rows = {r.name: r for r in stack.up(state, with_mlflow=False, with_ray=False)}
    new = json.loads((state / "ports.json").read_text())["lakefs"]
    assert heard == [], "a request went to the program at lakeFS's old port"
    assert rows["lakefs"].healthy and new != old
    assert f"Ports another program holds, moved: lakefs {old} -> {new}" in capsys.readouterr().out
    settings = load_settings(environ={}, stack_state=state)
    assert settings.lakefs_endpoint == f"http://127.0.0.1:{new}"
    assert "test-double" in versioning.connect(settings).version


@pytest.mark.slow
def test_a_program_at_ray_s_port_after_its_gcs_died_hears_nothing_and_ray_moves_with_a_new_token(state, capsys):
    """Ray's GCS was killed alone, as the out-of-memory killer does, and another program bound its port at once:
    every other process of that Ray stops with it, so nothing calls the port (the token travels with every call),
    and ``up`` starts Ray on a free port with a token of its own, which the old one does not open."""
    from helpers import stack_ray
    from tests.platform.room_intruder import waiting_at_a_grpc_door

    (state / "ports.json").write_text(json.dumps(private_ports()))  # chosen by the stack, not by the learner
    assert stack.up(state, with_mlflow=False, with_lakefs=False)[3].healthy
    old = stack_ray.read_service(state)
    old_token, old_port = stack_ray.read_token(state), int(old["address"].rpartition(":")[2])
    family = psutil.Process(old["pid"]).children(recursive=True)
    [gcs] = [p for p in family if p.name() == "gcs_server"]
    gcs.kill()
    with waiting_at_a_grpc_door(old_port) as heard:
        time.sleep(5)  # Ray's other processes, left running, called it within a second, thousands of times
        rows = {r.name: r for r in stack.up(state, with_mlflow=False, with_lakefs=False)}
        time.sleep(2)
    assert heard == [], f"{len(heard)} calls reached the program at Ray's old port, the first: {heard[:1]}"
    assert not [p for p in family if p.is_running() and not processes.is_zombie(p)], "left running"
    new = stack_ray.read_service(state)
    assert rows["ray"].healthy and new["address"] != old["address"]
    assert f"Ports another program holds, moved: ray {old_port} -> " in capsys.readouterr().out
    assert stack_ray.read_token(state) != old_token
    assert oct(stack_ray.token_file(state).stat().st_mode)[-3:] == "600"
    assert stack_ray.refuses_clients_without_token(new["address"], wrong_token=old_token), "the old token opens it"
    assert "died: every process of this Ray stopped" in (state / "logs" / "ray.log").read_text()


def test_status_says_when_no_lakefs_binary_is_available(state, monkeypatch):
    monkeypatch.setattr(stack.lakefs_binary, "find", lambda: None)
    row = {r.name: r for r in stack.status(state)}["lakefs"]
    assert not row.running and "no lakefs binary" in row.detail and "docker compose" in row.detail


# --- fetching lakeFS where it is missing -------------------------------------------

class ReleaseServer(http.server.ThreadingHTTPServer):
    """lakeFS's releases page on 127.0.0.1: serves whatever archives a test puts in ``files``."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.requests: list[str] = []
        files, requests = self.files, self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802 - stdlib name
                requests.append(self.path)
                body = files.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/releases/"

    def publish(self, version: str, members: dict[str, str]) -> str:
        """A release archive holding ``members`` (name -> script), at the path the downloader asks for."""
        path = "/" + lakefs_binary.release_url(version, self.url).split("/", 3)[3]
        self.files[path] = release_archive(members)
        return path

    def sha256(self, path: str) -> str:
        """The digest of the archive published at ``path`` (what a test pins in place of the real release's)."""
        return hashlib.sha256(self.files[path]).hexdigest()


@pytest.fixture
def releases():
    server = ReleaseServer()
    yield server
    server.shutdown()
    server.server_close()


def lakectl() -> str:
    return "#!/bin/sh\necho lakectl\n"


def test_download_fetches_unpacks_and_checks_the_pinned_release(releases, tmp_path):
    path = releases.publish(lakefs_binary.LAKEFS_VERSION, {"lakefs": fake_lakefs(), "lakectl": lakectl()})
    binary = lakefs_binary.download(target=tmp_path / "bin", base_url=releases.url, timeout=10,
                                    sha256=releases.sha256(path))
    assert releases.requests == [path] and path.endswith(f"v{lakefs_binary.LAKEFS_VERSION}/lakeFS_"
                                                         f"{lakefs_binary.LAKEFS_VERSION}_Linux_x86_64.tar.gz")
    assert binary == tmp_path / "bin" / "lakefs" and (tmp_path / "bin" / "lakectl").is_file()
    assert lakefs_binary.verify(binary) == f"lakefs version {lakefs_binary.LAKEFS_VERSION}"
    assert sorted(p.name for p in (tmp_path / "bin").iterdir()) == ["lakectl", "lakefs"], "no leftovers"


@pytest.mark.parametrize("case", ["not the pinned archive", "wrong version", "not an archive", "no lakefs inside",
                                  "no such release", "nothing listening", "no pin for that version"])
def test_a_bad_download_says_why_and_installs_nothing(releases, tmp_path, case):
    version = lakefs_binary.LAKEFS_VERSION
    base, path = releases.url, None
    if case in ("not the pinned archive", "no pin for that version"):  # a mirror serving other bytes
        releases.publish(version, {"lakefs": fake_lakefs(), "lakectl": lakectl()})
    elif case == "wrong version":
        path = releases.publish(version, {"lakefs": fake_lakefs("1.2.3"), "lakectl": lakectl()})
    elif case == "not an archive":
        path = releases.publish(version, {})
        releases.files[path] = b"<html>rate limited</html>"
    elif case == "no lakefs inside":
        path = releases.publish(version, {"lakectl": lakectl()})
    elif case == "nothing listening":
        base = f"http://127.0.0.1:{stack_ports.free_ports(['x'])['x']}/"
    with pytest.raises(lakefs_binary.DownloadError) as err:
        lakefs_binary.download("1.2.3" if case == "no pin for that version" else version, target=tmp_path / "bin",
                               base_url=base, timeout=10, sha256=path and releases.sha256(path))
    expected = {"not the pinned archive": f"not the pinned {lakefs_binary.pinned_sha256()}",
                "wrong version": "not lakeFS " + version, "not an archive": "not a lakeFS release archive",
                "no lakefs inside": "not a lakeFS release archive", "no such release": "404",
                "nothing listening": "could not fetch",
                "no pin for that version": "no SHA-256 is pinned for lakeFS 1.2.3"}[case]
    assert expected in str(err.value)
    assert not (tmp_path / "bin" / "lakefs").exists() and not list((tmp_path / "bin").glob(".download-*"))


def up_download_lakefs(state, home, releases_url: str, sha256: str = "") -> subprocess.CompletedProcess:
    """``python -m workshop.stack up --download-lakefs`` with no lakefs anywhere, on private ports.

    ``sha256`` takes the place of the real release's pinned digest, for a test archive.
    """
    stack_ports.load_or_choose_ports(state, private_ports())  # noqa: SLF001 - remembered by the CLI's up
    env = {**os.environ, "HOME": str(home), "PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin",
           lakefs_binary.RELEASES_URL_ENV: releases_url}
    pin = f"lakefs_binary.RELEASE_SHA256 = dict.fromkeys(lakefs_binary.RELEASE_SHA256, {sha256!r}); " if sha256 else ""
    code = f"import sys; from workshop import lakefs_binary, stack; {pin}sys.exit(stack.main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, "up", "--download-lakefs", "--no-mlflow", "--no-ray",
                           "--state-dir", str(state)], capture_output=True, text=True, timeout=180, env=env)


@pytest.mark.slow
@pytest.mark.lakefs
def test_up_download_lakefs_fetches_it_when_missing_and_starts_it(releases, state, tmp_path):
    path = releases.publish(lakefs_binary.LAKEFS_VERSION, {"lakefs": fake_lakefs(), "lakectl": lakectl()})
    result = up_download_lakefs(state, tmp_path / "home", releases.url, releases.sha256(path))
    assert result.returncode == 0, result.stdout + result.stderr
    installed = tmp_path / "home" / ".lakefs" / "bin" / "lakefs"
    assert f"lakeFS {lakefs_binary.LAKEFS_VERSION} is not installed: fetching it ... installed: {installed}\n" \
        in result.stdout
    row = {r.name: r for r in stack.status(state)}["lakefs"]
    assert row.healthy and installed.is_file()


@pytest.mark.slow
def test_up_download_lakefs_offline_starts_without_it_in_one_line(state, tmp_path):
    result = up_download_lakefs(state, tmp_path / "home", f"http://127.0.0.1:{stack_ports.free_ports(['x'])['x']}/")
    assert result.returncode == 0, result.stdout + result.stderr
    skipped = [line for line in result.stdout.splitlines() if "lakeFS" in line]
    assert len(skipped) == 1 and "could not fetch" in skipped[0] and "notebook 06 will be skipped" in skipped[0]
    assert "Traceback" not in result.stdout + result.stderr
    assert not (tmp_path / "home" / ".lakefs" / "bin" / "lakefs").exists()
    assert not {r.name: r for r in stack.status(state)}["lakefs"].running


def test_importing_ray_builds_no_iri_grammar():
    # `make install` removes rfc3987-syntax: Ray imports jsonschema, whose optional IRI checker built
    # a grammar for about 2 s in every kernel and every Ray worker process.
    code = "import sys, ray; print(sorted(m for m in sys.modules if m.startswith(('rfc3987', 'lark'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", f"`import ray` loaded {out.stdout.strip()}: run `make install` to remove it"


def test_an_exited_process_its_parent_has_not_reaped_counts_as_stopped():
    # A stack started by another process (the test session, `make lab`): its services' parent is not the
    # process stopping them, so an exited service stays a zombie until that parent reaps it.
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "print(subprocess.Popen(['sleep', '60']).pid, flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        child.kill()
        while child.status() != psutil.STATUS_ZOMBIE:  # exited, and its parent never reaps it
            time.sleep(0.05)
        assert processes.wait_stopped([child], timeout=0) == []
        assert processes.wait_stopped([psutil.Process(parent.pid)], timeout=0) == [psutil.Process(parent.pid)]
    finally:
        parent.kill()
        parent.wait()


def hold(port: int) -> socket.socket | None:
    """A listening socket on ``port``, as another learner's stack would hold it (None where one holds it already)."""
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", port))
    except OSError:
        holder.close()
        return None
    holder.listen()
    return holder


def test_a_new_stack_takes_the_default_ports_that_are_free_and_moves_the_others(state):
    holder = hold(stack_ports.DEFAULT_PORTS["s3"])
    try:
        ports, given = stack_ports.load_or_choose_ports(state, None)  # noqa: SLF001
    finally:
        if holder:
            holder.close()
    assert given == set() and ports["s3"] != stack_ports.DEFAULT_PORTS["s3"] and port_is_free(ports["s3"])
    assert all(port == stack_ports.DEFAULT_PORTS[name] for name, port in ports.items() if name != "s3"
               and port_is_free(stack_ports.DEFAULT_PORTS[name]) and name not in ("admin", "admin_grpc"))
    assert ports["admin_grpc"] == ports["admin"] + 10_000 and len(set(ports.values())) == len(ports)
    saved = json.loads((state / "ports.json").read_text())
    assert {k: saved[k] for k in ports} == ports and saved[stack_ports.GIVEN_KEY] == []
    assert stack_ports.load_or_choose_ports(state, None) == (ports, set())  # noqa: SLF001 - kept for the next start


@pytest.mark.slow
def test_up_moves_a_remembered_port_another_program_took_meanwhile(state, capsys):
    ports = private_ports()
    (state / "ports.json").write_text(json.dumps(ports))  # chosen by the stack, not by the user
    holder = hold(ports["s3"])
    try:
        rows = {r.name: r for r in stack.up(state, with_mlflow=False, with_ray=False)}
    finally:
        holder.close()
    moved = json.loads((state / "ports.json").read_text())["s3"]
    assert rows["seaweedfs"].healthy and moved != ports["s3"]
    assert f"Ports another program holds, moved: s3 {ports['s3']} -> {moved}" in capsys.readouterr().out
    settings = load_settings(environ={}, stack_state=state)
    assert settings.s3_endpoint == f"http://127.0.0.1:{moved}"
    storage.ensure_bucket(storage.get_client(settings), "reachable")


@pytest.mark.slow
def test_two_stacks_started_at_the_same_moment_on_the_same_ports_each_end_with_their_own(tmp_path):
    """Two learners' first ``up`` at the same moment both find the same ports free: one wins them, the other moves."""
    from concurrent.futures import ThreadPoolExecutor

    ports = private_ports()
    states = [tmp_path / "first", tmp_path / "second"]
    for state in states:
        state.mkdir()
        (state / "ports.json").write_text(json.dumps(ports))  # chosen by the stacks, so either may move them
    try:
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda state: cli("up", "--no-ray", "--no-lakefs", state=state), states))
        assert [r.returncode for r in results] == [0, 0], [r.stdout + r.stderr for r in results]
        assert sum("while this stack started: starting again on free ones" in r.stdout for r in results) == 1
        chosen = [json.loads((state / "ports.json").read_text()) for state in states]
        for name in ("s3", "mlflow"):
            assert chosen[0][name] != chosen[1][name], name
        for state in states:  # each one's keys and login open its own servers
            settings = load_settings(environ={}, stack_state=state)
            storage.get_client(settings).list_buckets()
            assert service_health.knows_our_keys("mlflow", state, settings.mlflow_tracking_uri)
            assert all(r.healthy for r in stack.status(state) if r.name in ("seaweedfs", "mlflow"))
    finally:
        for state in states:
            stack.down(state)
