"""``make lab`` from the terminal: its Ray's dashboard behind Ray's token and the lab's sign-in link, one clear
line when JupyterLab cannot start, and the same clean-up for Ctrl-C, SIGTERM, SIGHUP and a parent that died.

The browser test (tests/platform/test_browser.py) runs notebooks in the lab; these tests run it without a browser.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from helpers import stack_ray
from helpers.settings import project_root
from workshop import dashboard_sign_in, processes, stack_ports
from workshop import lab as lab_module

pytestmark = pytest.mark.slow


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def state() -> Path:
    return Path(os.environ["STACK_STATE_DIR"])


def lab_command(ports: dict[str, int], *extra: str) -> list[str]:
    return [sys.executable, "-m", "workshop.lab", "--jupyter-port", str(ports["jupyter"]), "--dashboard-port",
            str(ports["dashboard"]), "--sign-in-port", str(ports["sign_in"]), *extra]


def start(ports: dict[str, int], *extra: str, shell_parent: bool = False) -> tuple[subprocess.Popen, list[str]]:
    """Start the lab (under ``sh -c`` when ``shell_parent``) and read its output until it printed the URLs."""
    command = lab_command(ports, *extra)
    if shell_parent:  # as make runs it: the lab is the child of another process
        command = ["sh", "-c", " ".join(command) + "; echo lab-exited-$?"]
    proc = subprocess.Popen(command, cwd=project_root(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    lines = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if line.startswith("Ctrl-C stops"):
            return proc, lines
    proc.kill()
    pytest.fail("the lab did not print its URLs:\n" + "\n".join(lines[-15:]))


def finish(proc: subprocess.Popen, lines: list[str], timeout: float = 90) -> int:
    proc.wait(timeout=timeout)
    lines += proc.stdout.read().splitlines()
    return proc.returncode


def printed_url(lines: list[str], name: str) -> str:
    return next(re.match(rf"\s+{name}\s+(\S+)", line).group(1) for line in lines if re.match(rf"\s+{name}\s", line))


def assert_cleaned_up(ports: dict[str, int], jupyter: bool = True) -> None:
    """JupyterLab and the dashboard gone, the stack's Ray running again without its dashboard."""
    service = stack_ray.read_service(state())
    assert service is not None and service["dashboard"] is None
    assert not port_open(ports["dashboard"]) and not port_open(ports["sign_in"])
    if jupyter:
        assert not port_open(ports["jupyter"])
        assert processes.remembered_process(state(), lab_module.JUPYTER_RECORD) is None
    assert processes.remembered_process(state(), lab_module.LAB_RECORD) is None


def test_no_jupyter_prints_the_urls_and_puts_the_stack_s_ray_back(settings):
    ports = stack_ports.free_ports(["jupyter", "dashboard", "sign_in"])
    result = subprocess.run(lab_command(ports, "--no-jupyter"), cwd=project_root(), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "Services: object store" in result.stdout  # which endpoints won, and why
    assert printed_url(lines, "JupyterLab").startswith(f"http://127.0.0.1:{ports['jupyter']}/lab?token=")
    assert printed_url(lines, "MLflow") == settings.mlflow_tracking_uri
    assert_cleaned_up(ports, jupyter=False)  # --no-jupyter: printed, then stopped again


def test_a_running_lab_s_sign_in_link_sets_ray_s_token_cookie_and_nothing_without_its_key(settings):
    ports = stack_ports.free_ports(["jupyter", "dashboard", "sign_in"])
    proc, lines = start(ports)
    try:
        link = printed_url(lines, "Ray dashboard")
        dashboard = f"http://127.0.0.1:{ports['dashboard']}"
        assert link.startswith(f"http://127.0.0.1:{ports['sign_in']}/?key=")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{dashboard}/api/jobs/", timeout=10)
        assert refused.value.code == 401, "Ray's own token authentication stays on"
        with pytest.raises(urllib.error.HTTPError) as no_key:
            urllib.request.urlopen(link.split("?")[0] + "?key=wrong", timeout=10)
        assert no_key.value.code == 403 and "Set-Cookie" not in no_key.value.headers

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args, **kwargs):
                return None

        with pytest.raises(urllib.error.HTTPError) as signed_in:
            urllib.request.build_opener(NoRedirect).open(link, timeout=10)
        assert signed_in.value.code == 303 and signed_in.value.headers["Location"] == f"{dashboard}/#/actors"
        cookie = signed_in.value.headers["Set-Cookie"].split(";")[0]
        token = lab_module.ray_token(Path(os.environ["STACK_STATE_DIR"]))
        assert cookie == f"{dashboard_sign_in.RAY_TOKEN_COOKIE}={token}"
        request = urllib.request.Request(f"{dashboard}/api/jobs/", headers={"Cookie": cookie})
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200
        # the link works once: a second use (a leaked link, a browser's history) signs nobody in
        with pytest.raises(urllib.error.HTTPError) as again:
            urllib.request.build_opener(NoRedirect).open(link, timeout=10)
        assert again.value.code == 403 and "Set-Cookie" not in again.value.headers
        assert "--sign-in-link" in again.value.read().decode()
        fresh = subprocess.run([sys.executable, "-m", "workshop.lab", "--sign-in-link"], cwd=project_root(),
                               capture_output=True, text=True, timeout=60)
        assert fresh.returncode == 0 and fresh.stdout.strip().startswith(f"http://127.0.0.1:{ports['sign_in']}/?key=")
        assert fresh.stdout.strip() != link
        with pytest.raises(urllib.error.HTTPError) as signed_in_again:
            urllib.request.build_opener(NoRedirect).open(fresh.stdout.strip(), timeout=10)
        assert signed_in_again.value.code == 303
        # one lab per stack: a second one says so in one line and touches nothing
        second = subprocess.run(lab_command(stack_ports.free_ports(["jupyter", "dashboard", "sign_in"])),
                                cwd=project_root(), capture_output=True, text=True, timeout=60)
        assert second.returncode == 1 and f"make lab is already running (pid {proc.pid})" in second.stderr
        assert stack_ray.read_service(state())["dashboard"] == dashboard
    finally:
        proc.send_signal(signal.SIGINT)
        assert finish(proc, lines) == 0
    assert "Stopping (Ctrl-C) ..." in lines and "The stack's Ray is running again, without its dashboard." in lines
    assert_cleaned_up(ports)


def test_a_lab_kernel_talks_over_unix_sockets_only_its_learner_can_open_and_no_port_gives_its_output(settings):
    """Over Jupyter's default TCP, any user could subscribe to a kernel's output (IOPub needs no key to listen).
    Under make lab the kernel's channels are Unix sockets in a folder only the learner can open; a SUB socket
    on every TCP port the kernel listens on reads nothing while the kernel prints."""
    import json

    import zmq
    from jupyter_client import BlockingKernelClient

    ports = stack_ports.free_ports(["jupyter", "dashboard", "sign_in"])
    proc, lines = start(ports)
    try:
        url = printed_url(lines, "JupyterLab")
        token = re.search(r"token=(\w+)", url)[1]
        request = urllib.request.Request(f"http://127.0.0.1:{ports['jupyter']}/api/kernels", data=b"{}",
                                         headers={"Authorization": f"token {token}"}, method="POST")
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 201
        jupyter = processes.remembered_process(state(), lab_module.JUPYTER_RECORD)
        deadline, kernel = time.monotonic() + 60, None
        while kernel is None and time.monotonic() < deadline:
            kernel = next((p for p in jupyter.children(recursive=True) if "ipykernel" in " ".join(p.cmdline())), None)
            time.sleep(0.2)
        assert kernel is not None, "the kernel started"
        connection_file = kernel.cmdline()[kernel.cmdline().index("-f") + 1]
        info = json.loads(Path(connection_file).read_text())
        assert info["transport"] == "ipc"
        sockets = Path(info["ip"]).parent
        assert sockets.stat().st_uid == os.getuid() and sockets.stat().st_mode & 0o077 == 0

        client = BlockingKernelClient(connection_file=connection_file)
        client.load_connection_file()
        client.start_channels()
        client.wait_for_ready(timeout=60)
        context = zmq.Context()
        listeners = []
        for connection in kernel.net_connections("tcp"):  # ipykernel's inbox for its subprocesses' output, if any
            if connection.status == psutil.CONN_LISTEN:
                sub = context.socket(zmq.SUB)
                sub.setsockopt(zmq.SUBSCRIBE, b"")
                sub.connect(f"tcp://127.0.0.1:{connection.laddr.port}")
                listeners.append(sub)
        time.sleep(1)  # connected before the kernel prints
        client.execute("print('what the learner printed')")
        printed = ""
        while "what the learner printed" not in printed:  # the learner's own client, over the Unix sockets, hears it
            message = client.get_iopub_msg(timeout=30)
            printed += message["content"].get("text", "")
        heard = [sub.recv(zmq.NOBLOCK) for sub in listeners if sub.poll(2000)]
        assert heard == [], "a TCP port of the kernel gave its output"
        client.stop_channels()
        for sub in listeners:
            sub.close(linger=0)
        context.term()
    finally:
        proc.send_signal(signal.SIGINT)
        assert finish(proc, lines) == 0
    assert not sockets.exists(), "the sockets' folder goes with the lab"


def test_jupyterlab_s_token_goes_only_to_a_port_jupyterlab_itself_listens_on(tmp_path):
    """While JupyterLab starts, any program may hold its port. The lab waits for JupyterLab to answer: it must not
    send the token to whatever answers there first."""
    from tests.platform.room_intruder import waiting_at_a_door

    starting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # a JupyterLab yet to bind
    try:
        with waiting_at_a_door() as (port, heard), pytest.raises(lab_module.LabError, match="did not answer"):
            lab_module.wait_until_answers(starting, port, "the-token", tmp_path / "log", timeout=3)
    finally:
        starting.kill()
        starting.wait()
    assert heard == [], "the token went to a port JupyterLab does not listen on"


def test_a_jupyterlab_that_cannot_start_ends_the_lab_with_its_last_log_line(settings):
    ports = stack_ports.free_ports(["jupyter", "dashboard", "sign_in"])
    ray_before = stack_ray.read_service(state())
    with socket.socket() as taken:  # another program holds JupyterLab's port
        taken.bind(("127.0.0.1", ports["jupyter"]))
        taken.listen()
        started = time.monotonic()
        result = subprocess.run(lab_command(ports), cwd=project_root(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: JupyterLab exited at start: ")
    assert f"port {ports['jupyter']} is not available" in errors[0]
    assert "Open:" not in result.stdout, "no URLs for a lab that is not there"
    assert time.monotonic() - started < 60
    assert stack_ray.read_service(state())["pid"] == ray_before["pid"], "the stack's Ray was not touched"


def test_a_jupyter_config_that_turns_the_token_off_stops_the_lab_in_one_line(settings, tmp_path):
    """A learner's own Jupyter config with an empty token wins over the lab's token file, and JupyterLab would then
    answer anyone: the lab checks that a request without the token is refused, and stops in one line if not."""
    ports = stack_ports.free_ports(["jupyter", "dashboard", "sign_in"])
    (tmp_path / "jupyter_server_config.py").write_text('c.IdentityProvider.token = ""\n')
    result = subprocess.run(lab_command(ports), cwd=project_root(), capture_output=True, text=True, timeout=180,
                            env={**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path)})
    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: JupyterLab answered without its token on port {ports['jupyter']}"), result.stderr
    assert "Open:" not in result.stdout and not port_open(ports["jupyter"])


def test_sigterm_sighup_and_a_parent_that_died_clean_up_like_ctrl_c_and_leftovers_are_stopped(settings):
    ports = stack_ports.free_ports(["jupyter", "dashboard", "sign_in"])
    # A lab killed outright (SIGKILL) leaves its JupyterLab and the dashboard's Ray behind ...
    proc, lines = start(ports)
    leftover = processes.remembered_process(state(), lab_module.JUPYTER_RECORD)
    proc.kill()
    proc.wait(timeout=10)
    assert leftover.is_running() and port_open(ports["dashboard"])
    # ... and the next lab stops that JupyterLab and keeps the Ray, which has the dashboard already.
    ray_pid = stack_ray.read_service(state())["pid"]
    proc, lines = start(ports)
    assert f"Stopped the JupyterLab an earlier make lab left running (pid {leftover.pid})." in lines
    assert not leftover.is_running() or processes.is_zombie(leftover)
    assert stack_ray.read_service(state())["pid"] == ray_pid
    proc.send_signal(signal.SIGHUP)  # the terminal closed
    assert finish(proc, lines) == 0 and "Stopping (SIGHUP) ..." in lines
    assert_cleaned_up(ports)
    # make runs the lab as its child: when make is killed, the lab is told to stop (SIGTERM).
    proc, lines = start(ports, shell_parent=True)
    lab = next(p for p in psutil.Process(proc.pid).children() if "workshop.lab" in " ".join(p.cmdline()))
    proc.kill()  # the shell, as `kill -9 <make>` would
    proc.wait(timeout=10)
    lab.wait(timeout=90)
    assert_cleaned_up(ports)


def test_ctrl_c_while_jupyterlab_starts_stops_it(settings):
    """Ctrl-C before the URLs are printed, while JupyterLab starts: it is stopped too, not left running."""
    ports = stack_ports.free_ports(["jupyter", "dashboard", "sign_in"])
    proc = subprocess.Popen(lab_command(ports), cwd=project_root(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline, jupyter = time.monotonic() + 60, None
    while jupyter is None and time.monotonic() < deadline:
        jupyter = next((p for p in psutil.Process(proc.pid).children(recursive=True)
                        if "jupyterlab" in " ".join(p.cmdline())), None)
        time.sleep(0.1)
    assert jupyter is not None, "JupyterLab started"
    proc.send_signal(signal.SIGINT)  # before it answers: JupyterLab takes seconds to start
    assert proc.wait(timeout=90) == 0
    assert not jupyter.is_running() or processes.is_zombie(jupyter)
    assert not port_open(ports["jupyter"])
    assert processes.remembered_process(state(), lab_module.LAB_RECORD) is None


def test_a_stop_that_comes_before_jupyterlab_was_noted_still_stops_it(tmp_path):
    """Ctrl-C can land between JupyterLab's start and the lab noting it: the clean-up finds it as the lab's child."""
    port = stack_ports.free_ports(["jupyter"])["jupyter"]
    (tmp_path / "token").write_text(os.urandom(16).hex())
    jupyter = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--ip=127.0.0.1", f"--port={port}", "--no-browser",
                                f"--ServerApp.root_dir={tmp_path}", *(["--allow-root"] if os.geteuid() == 0 else [])],
                               env={**os.environ, "JUPYTER_TOKEN_FILE": str(tmp_path / "token")},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    handlers = {sig: signal.getsignal(sig) for sig in lab_module.STOP_SIGNALS}
    try:
        deadline = time.monotonic() + 60
        while not port_open(port):
            assert jupyter.poll() is None and time.monotonic() < deadline, "JupyterLab answers"
            time.sleep(0.2)
        lab_module.clean_up(tmp_path, None, None, restore=False)  # as a lab stopped before it noted JupyterLab
        assert jupyter.wait(timeout=30) is not None and not port_open(port)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if jupyter.poll() is None:
            jupyter.kill()


def test_the_lab_does_not_restart_a_stack_s_ray_that_runs_a_job(settings, tmp_path):
    """A notebook (a `make run`, a `make catch-up`) runs on the stack's Ray: the lab would restart that Ray to add
    its dashboard and stop the notebook mid-run. It refuses, in one line naming the job, and touches nothing."""
    service = stack_ray.read_service(state())
    script = tmp_path / "driver.py"
    script.write_text("import time\nfrom helpers import cluster\ncluster.init_ray()\nprint('joined', flush=True)\n"
                      "time.sleep(120)\n")
    driver = subprocess.Popen([sys.executable, str(script)], cwd=project_root(), stdout=subprocess.PIPE, text=True)
    try:
        assert driver.stdout.readline().strip() == "joined"
        result = subprocess.run(lab_command(stack_ports.free_ports(["jupyter", "dashboard", "sign_in"])),
                                cwd=project_root(), capture_output=True, text=True, timeout=120)
        assert result.returncode == 1, result.stdout + result.stderr
        errors = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(errors) == 1 and "The stack's Ray runs 1 job(s)" in errors[0] and f"pid {driver.pid}" in errors[0]
        assert stack_ray.read_service(state())["pid"] == service["pid"], "the stack's Ray was not restarted"
        assert driver.poll() is None, "the job goes on"
    finally:
        driver.kill()
        driver.wait()


@pytest.mark.parametrize("arguments, message", [
    (["--jupyter-port", "99999"], "Port --jupyter-port=99999 is not a port number"),
    (["--dashboard-port", "8888"], "Ports --jupyter-port and --dashboard-port are both 8888"),
])
def test_bad_lab_ports_are_one_line_before_anything_starts(arguments, message):
    result = subprocess.run([sys.executable, "-m", "workshop.lab", *arguments], cwd=project_root(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stderr.startswith(f"error: {message}")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Open:" not in result.stdout
