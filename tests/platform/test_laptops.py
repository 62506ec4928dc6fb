"""The laptops learners bring (macOS on Apple silicon, Linux, WSL2), simulated here where they differ from this one.

Unix socket paths: 103 bytes on macOS, 107 on Linux, wherever ``$TMPDIR`` points (macOS gives every user one of
about 49 bytes under ``/var/folders``); a service whose Python executes itself again under the same pid (macOS's
framework Python); a lab whose parent dies where there is no ``PR_SET_PDEATHSIG``; a Python without certificate
authorities (python.org's on macOS); Ray Train's gloo on the loopback interface; x86-only numerics settings.
The whole Mac-shaped learner (a deep checkout, ``HOME`` elsewhere, the stack, the notebooks and the lab) runs
in tests/platform/test_kit.py, from a workshop kit with the network cut.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from helpers import private_files, worker_env
from helpers.private_files import SocketPathError, short_temp_root, unix_socket_limit
from workshop import lab, processes, seaweedfs_security

MAC_TMPDIR = "/var/folders/zz/zyxvpxvq6csfxvn_n0000000000000/T/"  # as macOS sets it: 49 bytes


@pytest.fixture
def mac_tmpdir(monkeypatch, tmp_path_factory):
    """``$TMPDIR`` as macOS sets it, made here (as root; a user may not create /var/folders).

    pytest's own temporary folder is fixed first (``tmp_path_factory``), outside it.
    """
    tmp_path_factory.getbasetemp()
    folder = Path(MAC_TMPDIR)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except PermissionError:
        pytest.skip("making /var/folders/... needs root")
    folder.chmod(0o1777)
    monkeypatch.setenv("TMPDIR", MAC_TMPDIR)
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    return folder


def test_the_socket_limit_is_the_platforms():
    assert unix_socket_limit("linux") == 107
    assert unix_socket_limit("darwin") == 103  # sun_path holds 104 bytes there, its NUL included
    assert unix_socket_limit() == (107 if sys.platform.startswith("linux") else 103)


def test_a_short_tmpdir_is_kept_and_a_mac_one_gives_way_to_tmp_when_the_sockets_would_not_fit(mac_tmpdir):
    assert len(MAC_TMPDIR) == 49
    assert short_temp_root(20, platform="darwin") == mac_tmpdir  # 48 + 20 bytes fit in 103
    ray_room = len(worker_env.RAY_SOCKETS) + len("/ray-0123456789")
    assert short_temp_root(ray_room, platform="darwin") == Path("/tmp")  # 48 + 98 do not: /tmp, as Ray does
    assert len("/tmp") + ray_room <= unix_socket_limit("darwin")
    with pytest.raises(SocketPathError) as refused:
        short_temp_root(unix_socket_limit("darwin"), platform="darwin")
    assert "export TMPDIR=/tmp" in str(refused.value) and "\n" not in str(refused.value)


def test_ray_s_folder_leaves_its_sockets_room_under_a_mac_tmpdir_and_a_long_ray_tmpdir_is_one_line(mac_tmpdir,
                                                                                                   monkeypatch):
    worker_env.private_ray_tmpdir()
    folder = os.environ["RAY_TMPDIR"]
    assert folder.startswith("/tmp/ray-") and Path(folder).stat().st_mode & 0o777 == 0o700
    assert len(folder) + len(worker_env.RAY_SOCKETS) <= unix_socket_limit("darwin")
    # The path Ray refused on a Mac (136 bytes), and one it would refuse: said before Ray starts, in one line.
    monkeypatch.setenv("RAY_TMPDIR", str(mac_tmpdir / "ray-501"))
    with pytest.raises(SocketPathError) as refused:
        worker_env.private_ray_tmpdir()
    assert str(refused.value).startswith(f"RAY_TMPDIR={mac_tmpdir}/ray-501 would give Ray's sockets paths of")
    assert "unset RAY_TMPDIR" in str(refused.value)
    # The stack's Ray's folder, which its jobs' drivers inherit: room for a session of their own, at the longest.
    stack_folder = "/tmp/ray-4294967294/stack-0123abcd"
    monkeypatch.setenv("RAY_TMPDIR", stack_folder)
    assert worker_env.ray_tmpdir() == stack_folder
    assert len(stack_folder) + len(worker_env.RAY_SESSION_SOCKETS) <= unix_socket_limit("darwin")
    with pytest.raises(SocketPathError):  # but no room for another stack's Ray folder inside it
        worker_env.ray_tmpdir(worker_env.RAY_SOCKETS)


def test_stack_up_says_a_ray_tmpdir_too_long_for_sockets_in_one_line_and_starts_nothing(tmp_path, mac_tmpdir,
                                                                                         monkeypatch):
    from workshop import stack
    from workshop.state_files import StackError

    monkeypatch.setenv("RAY_TMPDIR", str(mac_tmpdir / ("r" * 60)))
    with pytest.raises(StackError) as refused:
        stack.up(tmp_path / "state")
    assert str(refused.value).startswith("RAY_TMPDIR=") and "\n" not in str(refused.value)
    assert not list((tmp_path / "state").glob("*.pid")), "no service started"


def test_the_object_store_s_sockets_move_out_of_a_state_folder_at_macos_s_limit(monkeypatch, tmp_path):
    # A state folder whose socket paths have 104-107 bytes: fine on Linux, too long on macOS.
    state = tmp_path / ("s" * (104 - len(str(tmp_path)) - len("/filer.sock") - 1))
    assert len(str(state / "filer.sock")) == 104
    if sys.platform.startswith("linux"):
        assert seaweedfs_security.socket_paths(state)["filer"] == state / "filer.sock"
    monkeypatch.setattr(sys, "platform", "darwin")
    moved = seaweedfs_security.socket_paths(state)
    assert all(len(str(path)) <= 103 and path.parent.stat().st_mode & 0o777 == 0o700 for path in moved.values())


def test_the_lab_s_kernel_sockets_fit_under_a_mac_tmpdir_and_move_to_tmp_under_a_longer_one(mac_tmpdir,
                                                                                              monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    for expected in (mac_tmpdir, Path("/tmp")):  # 48 bytes leave room for <folder>/kernel-<n>; 80 do not
        folder = lab.kernel_sockets_folder()
        try:
            assert folder.parent == expected and folder.stat().st_mode & 0o777 == 0o700
            assert len(str(folder / "kernel-65535")) <= 103
        finally:
            folder.rmdir()
        longer = mac_tmpdir / ("x" * (80 - len(str(mac_tmpdir)) - 1))
        longer.mkdir(exist_ok=True)
        monkeypatch.setenv("TMPDIR", str(longer))
        monkeypatch.setattr(tempfile, "tempdir", None)


def test_a_service_that_executes_itself_again_under_its_pid_stays_ours(tmp_path):
    """macOS's framework Python starts as bin/python3.11 and executes Python.app under the same pid."""
    stub = subprocess.Popen(["/bin/sh", "-c", f"sleep 0.5; exec {sys.executable} -c 'import time; time.sleep(60)'"])
    try:
        processes.remember_process(tmp_path, "service", stub.pid)  # written while it is still /bin/sh
        deadline = time.monotonic() + 10
        while psutil.Process(stub.pid).exe() != os.path.realpath(sys.executable) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert psutil.Process(stub.pid).exe() == os.path.realpath(sys.executable), "the stub executed Python"
        assert processes.read_pid_record(tmp_path, "service")["exe"] != psutil.Process(stub.pid).exe()
        assert processes.remembered_process(tmp_path, "service").pid == stub.pid
    finally:
        stub.kill()
        stub.wait()
    assert processes.remembered_process(tmp_path, "service") is None


def test_a_process_watching_its_parent_gets_sigterm_when_the_parent_dies(tmp_path):
    """Where the kernel cannot be asked (macOS has no PR_SET_PDEATHSIG), the lab watches its parent itself."""
    told = tmp_path / "told"
    child = textwrap.dedent(f"""
        import os, signal, sys, time
        from workshop import lab
        signal.signal(signal.SIGTERM, lambda *_: (open({str(told)!r}, "w").write("SIGTERM"), sys.exit(0)))
        parent = os.getppid()  # before the test kills it, as exit_with_parent does
        print(os.getpid(), flush=True)
        lab.watch_parent(parent, interval=0.1)
        time.sleep(60)
    """)
    parent = subprocess.Popen(["/bin/sh", "-c", f"{sys.executable} -c \"$CHILD\"; sleep 60"], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "CHILD": child}, cwd=Path(lab.__file__).parent.parent)
    try:
        watcher = psutil.Process(int(parent.stdout.readline()))
        parent.kill()  # as `kill -9 <make>` would
        parent.wait()
        watcher.wait(timeout=10)
        assert told.read_text() == "SIGTERM"
    finally:
        parent.kill()


def test_a_python_without_certificate_authorities_checks_downloads_against_certifi_s():
    """python.org's Python on macOS has none until its Install Certificates.command runs."""
    probe = "from workshop import lakefs_binary; print(lakefs_binary.https_context().cert_store_stats()['x509_ca'])"
    root = Path(lab.__file__).parent.parent
    bare = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=root, check=True,
                          env={**os.environ, "SSL_CERT_FILE": "/nonexistent.pem", "SSL_CERT_DIR": "/nonexistent"})
    assert int(bare.stdout) > 100, bare.stderr  # certifi's authorities, where the system's are missing
    assert ssl.get_default_verify_paths().cafile, "this machine has its own, which are kept"


def test_an_untrusted_certificate_ends_the_lakefs_download_in_one_line(tmp_path, monkeypatch):
    import datetime
    import http.server
    import threading

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from workshop import lakefs_binary

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                         serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(lakefs_binary.DownloadError) as refused:
            lakefs_binary.download(base_url=f"https://127.0.0.1:{server.server_address[1]}/", target=tmp_path / "bin",
                                   timeout=10)
    finally:
        server.shutdown()
    said = str(refused.value)
    assert "its certificate is not trusted here" in said and "SSL_CERT_FILE" in said and "\n" not in said
    assert not (tmp_path / "bin" / "lakefs").exists()


def test_ray_train_s_gloo_keeps_to_the_loopback_interface_of_a_local_ray():
    defaults = worker_env.local_ray_defaults()
    interface = defaults["GLOO_SOCKET_IFNAME"]
    assert any(a.address == "127.0.0.1" for a in psutil.net_if_addrs()[interface])
    assert "GLOO_SOCKET_IFNAME" not in worker_env.LOCAL_RAY_DEFAULTS, "computed on the machine, not fixed"


def test_numerics_pinned_to_avx2_only_where_there_is_avx2():
    from workshop import runner

    assert runner.reproducible_numerics("x86_64") == {"MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    assert runner.reproducible_numerics("arm64") == {} == runner.reproducible_numerics("aarch64")


def test_private_temp_folder_refuses_another_user_s_folder_of_its_name(tmp_path, monkeypatch):
    """Another user made ``<tmp>/<name>-<uid>`` first, to get in: a folder of a unique name instead."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    taken = tmp_path / f"probe-{os.getuid()}"
    taken.mkdir()
    if os.getuid() == 0:
        os.chown(taken, 1, 1)
    else:
        pytest.skip("needs root to make a folder of another user's")
    folder = private_files.private_temp_folder("probe")
    assert folder != taken and folder.parent == tmp_path and folder.name.startswith(f"probe-{os.getuid()}-")
