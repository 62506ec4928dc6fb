"""The workshop kit's parts on a small scale: ``make kit-serve`` serves only the kit's checked files, under its key,
read-only and bounded; lakeFS installs from a kit's copy of its releases, over ``file://`` and over HTTP, checked
against its pin.

The room-sized tests (whole installs from a real kit, with the network cut) are in tests/platform/test_kit.py.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import socket
import threading
from pathlib import Path

import pytest

from workshop import kit_serve
from workshop.kit import SUMS


@pytest.fixture
def small_kit(tmp_path):
    """A kit of three files and its SHA256SUMS, and a file beside it that is not the kit's."""
    kit = tmp_path / "kit"
    (kit / "wheels").mkdir(parents=True)
    (kit / "simple" / "six").mkdir(parents=True)
    files = {"manifest.json": b'{"lock_sha256": "x"}', "wheels/six-1.17.0-py2.py3-none-any.whl": b"PK" + b"x" * 5000,
             "simple/six/index.html": b"<a href='../../wheels/six-1.17.0-py2.py3-none-any.whl'>six</a>"}
    for relative, data in files.items():
        (kit / relative).write_bytes(data)
    (kit / SUMS).write_text("".join(f"{hashlib.sha256(d).hexdigest()}  {r}\n" for r, d in files.items()))
    (tmp_path / "secret.txt").write_text("not the kit's")
    (kit / "wheels" / "unlisted.whl").write_bytes(b"not in SHA256SUMS")
    return kit


@pytest.fixture
def served(small_kit):
    """The kit served on a free port of 127.0.0.1; yields ``(port, key)``."""
    server = kit_serve.KitServer(("127.0.0.1", 0), kit_serve.checked_files(small_kit.resolve()), "k3y")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], "k3y", server
    server.shutdown()
    server.server_close()


def request(port: int, method: str, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_it_serves_the_kit_s_files_under_its_key_and_nothing_else(served, small_kit):
    port, key, _ = served
    status, body = request(port, "GET", f"/{key}/wheels/six-1.17.0-py2.py3-none-any.whl")
    assert status == 200 and body == (small_kit / "wheels" / "six-1.17.0-py2.py3-none-any.whl").read_bytes()
    assert request(port, "GET", f"/{key}/simple/six/")[0] == 200  # a package index's page, as installers ask
    assert request(port, "GET", f"/{key}/manifest.json?x=1")[0] == 200
    assert request(port, "HEAD", f"/{key}/manifest.json") == (200, b"")
    for path in ("/manifest.json", "/wrong/manifest.json", f"/{key}/", f"/{key}/wheels/unlisted.whl",
                 f"/{key}/../secret.txt", f"/{key}/wheels/../../secret.txt", f"/{key}//etc/passwd",
                 f"/{key}/%2e%2e/secret.txt"):
        assert request(port, "GET", path)[0] == 404, path
    assert request(port, "POST", f"/{key}/manifest.json")[0] == 501  # read-only
    assert request(port, "PUT", f"/{key}/manifest.json")[0] == 501


def test_a_request_line_too_long_is_refused_and_the_server_goes_on(served):
    port, key, _ = served
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b" 414 " in raw.recv(200).split(b"\r\n")[0]
    assert request(port, "GET", f"/{key}/manifest.json")[0] == 200


def test_a_slot_is_given_back_however_its_connection_ends(served):
    port, key, server = served
    for _ in range(kit_serve.MAX_CONNECTIONS + 5):  # more connections than slots, each cut off mid-request
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            raw.sendall(b"GET /" + key.encode())
    assert request(port, "GET", f"/{key}/manifest.json")[0] == 200


def test_a_changed_missing_or_outside_file_is_refused_before_serving_in_one_line(small_kit, tmp_path):
    (small_kit / "manifest.json").write_bytes(b'{"lock_sha256": "y"}')
    with pytest.raises(kit_serve.KitServeError) as changed:
        kit_serve.checked_files(small_kit)
    assert "manifest.json" in str(changed.value) and "\n" not in str(changed.value)
    os.remove(small_kit / "manifest.json")
    with pytest.raises(kit_serve.KitServeError) as missing:
        kit_serve.checked_files(small_kit)
    assert "is missing manifest.json" in str(missing.value)
    outside = small_kit.parent / "secret.txt"
    (small_kit / SUMS).write_text(f"{hashlib.sha256(outside.read_bytes()).hexdigest()}  ../secret.txt\n")
    with pytest.raises(kit_serve.KitServeError) as escaped:
        kit_serve.checked_files(small_kit)
    assert "outside the kit" in str(escaped.value)
    link = small_kit / "wheels" / "link.whl"
    link.symlink_to(outside)
    (small_kit / SUMS).write_text(f"{hashlib.sha256(outside.read_bytes()).hexdigest()}  wheels/link.whl\n")
    with pytest.raises(kit_serve.KitServeError) as linked:
        kit_serve.checked_files(small_kit)
    assert "outside the kit" in str(linked.value)


def test_no_sums_means_no_kit(tmp_path):
    with pytest.raises(kit_serve.KitServeError) as refused:
        kit_serve.checked_files(Path(tmp_path))
    assert "has no SHA256SUMS" in str(refused.value) and "make kit" in str(refused.value)


def fake_release(folder: Path) -> str:
    """A lakeFS release archive of two scripts, laid out as the kit keeps it; its SHA-256."""
    from tests.fakes.release_archive import release_archive
    from workshop import lakefs_binary

    version = lakefs_binary.LAKEFS_VERSION
    archive = release_archive({"lakefs": f"#!/bin/sh\necho lakefs version {version}\n",
                               "lakectl": "#!/bin/sh\necho lakectl\n"})
    path = folder / lakefs_binary.release_url(version, "x/").split("/", 1)[1]
    path.parent.mkdir(parents=True)
    path.write_bytes(archive)
    return hashlib.sha256(archive).hexdigest()


def test_lakefs_installs_from_a_kit_s_releases_over_file_and_http_checked_against_its_pin(tmp_path):
    """What make install KIT=... and INDEX=... do for lakeFS, with a stand-in release: it installs only under the
    stand-in's own digest; under the real pin (the kit's path in make install) it is refused in one line."""
    import http.server
    import subprocess
    import sys

    from workshop import lakefs_binary

    releases = tmp_path / "kit" / "lakefs"
    digest = fake_release(releases)
    for base in [releases.as_uri() + "/", None]:
        if base is None:  # the same folder over HTTP, as kit-serve serves the kit's lakefs/
            handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(releases))  # noqa: E731
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            base = f"http://127.0.0.1:{server.server_address[1]}/"
        target = tmp_path / f"bin-{len(base)}"
        binary = lakefs_binary.download(base_url=base, target=target, sha256=digest, timeout=10)
        assert lakefs_binary.verify(binary).endswith(lakefs_binary.LAKEFS_VERSION)
        refused = subprocess.run([sys.executable, "-m", "workshop.lakefs_binary", "--from", base, "--to",
                                  str(tmp_path / "pinned")], capture_output=True, text=True, timeout=60,
                                 cwd=Path(lakefs_binary.__file__).parent.parent)
        [line] = refused.stderr.strip().splitlines()
        assert refused.returncode == 1 and "not the pinned" in line and "Nothing was installed" in line
        assert not (tmp_path / "pinned" / "lakefs").exists()
    server.shutdown()
