"""``make kit-serve``: a workshop kit served to the room from the instructor's laptop, read-only.

It serves exactly the files the kit's ``SHA256SUMS`` lists, after checking every one of them against it (a kit
that fails is refused in one line), under a key that goes with the address learners type: without it a
request gets 404, as does anything outside the kit. GET and HEAD only, no listing, nothing written. Every
request is bounded: a connection that sends nothing for :data:`IDLE_TIMEOUT` seconds is closed, a request
line over 8 KiB is refused (headers: 100 lines of 64 KiB at most, as http.server has it), and at most
:data:`MAX_CONNECTIONS` are served at once (the others wait their turn in the listening queue). It prints
the two commands learners type.
"""

from __future__ import annotations

import argparse
import hmac
import secrets
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from helpers.errors import TutorialError
from workshop.install import sha256_of
from workshop.kit import REPOSITORY, SUMS

IDLE_TIMEOUT = 20.0  # seconds a connection may stay silent (an idle kept-alive one gives its slot up)
MAX_CONNECTIONS = 64  # served at once; the others wait to be accepted (make install opens 8 at most)
MAX_LINE = 8192  # bytes of a request line or a header line
KEY_LETTERS = "abcdefghjkmnpqrstuvwxyz23456789"  # no 0/o, 1/l/i: typed from a slide


class KitServeError(TutorialError, RuntimeError):
    """The kit cannot be served (the message says which file and what to do)."""


def checked_files(kit: Path) -> dict[str, Path]:
    """The kit's files by their path in it, each checked against ``SHA256SUMS``.

    Raises:
        KitServeError: no SHA256SUMS (not a kit, or one half built), or a file missing or changed.
    """
    try:
        lines = (kit / SUMS).read_text().splitlines()
    except OSError:
        raise KitServeError(f"{kit} has no {SUMS}: it is not a finished kit; run `make kit KIT={kit}`") from None
    files, root = {}, kit.resolve()
    for line in lines:
        digest, _, relative = line.partition("  ")
        path = kit / relative
        if path.is_symlink() or not path.resolve().is_relative_to(root):
            raise KitServeError(f"{relative} in the kit's {SUMS} is outside the kit (a link, or a path out of it): "
                                f"make the kit again with `make kit KIT={kit}`")
        if not path.is_file():
            raise KitServeError(f"the kit at {kit} is missing {relative}: copy it again, or run `make kit KIT={kit}`")
        if sha256_of(path) != digest:
            raise KitServeError(f"{relative} in the kit at {kit} differs from its SHA256SUMS: copy it again, or run "
                                f"`make kit KIT={kit}`")
        files[relative] = path
    return files


class KitServer(ThreadingHTTPServer):
    """An HTTP server for one kit's checked files, under one key, a bounded number of connections at once."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], files: dict[str, Path], key: str) -> None:
        self.files, self.key, self.slots = files, key, threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.stopping = threading.Event()
        super().__init__(address, KitRequestHandler)

    def process_request(self, request, client_address) -> None:
        """Serve it in a thread of its own once a slot is free (the connections behind it wait to be accepted)."""
        while not self.slots.acquire(timeout=0.5):
            if self.stopping.is_set():  # shutdown() must not wait for a slot
                self.shutdown_request(request)
                return
        super().process_request(request, client_address)

    def shutdown(self) -> None:
        """Stop serving, also while every slot is taken."""
        self.stopping.set()
        super().shutdown()

    def handle_error(self, request, client_address) -> None:
        """One line for a connection that broke (a learner's laptop went to sleep), not a traceback."""
        error = sys.exc_info()[1]
        print(f"{client_address[0]}: connection ended: {type(error).__name__}: {error}", file=sys.stderr, flush=True)

    def process_request_thread(self, request, client_address) -> None:
        """Serve, then free the slot, however the connection ended."""
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class KitRequestHandler(BaseHTTPRequestHandler):
    """GET and HEAD of a kit's file under the server's key (404 for any other path); other methods get 501."""

    server: KitServer
    timeout = IDLE_TIMEOUT
    protocol_version = "HTTP/1.1"  # installers keep the connection for many files

    def parse_request(self) -> bool:
        """Refuse a request line longer than :data:`MAX_LINE` (http.server allows 64 KiB)."""
        if len(self.raw_requestline) > MAX_LINE:
            self.requestline, self.request_version, self.command = "", "HTTP/1.0", ""  # as http.server does
            self.send_error(414)
            return False
        return super().parse_request()

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        """Send the file."""
        self._answer(body=True)

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's name)
        """Send the file's headers."""
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        path = self._file()
        if path is None:
            self.send_error(404)
            return
        size = path.stat().st_size
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8" if path.suffix == ".html"
                         else "application/octet-stream")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        if body:
            with open(path, "rb") as stream:
                self.wfile.flush()
                self.connection.sendfile(stream)

    def _file(self) -> Path | None:
        """The kit's file the request names under the key, or None."""
        parts = self.path.split("?", 1)[0].split("/", 2)  # "", key, path in the kit
        if len(parts) < 3 or not hmac.compare_digest(parts[1].encode(), self.server.key.encode()):
            return None
        relative = urllib.parse.unquote(parts[2])
        relative += "index.html" if relative.endswith("/") else ""  # a package index's page, as installers ask
        return self.server.files.get(relative)  # a name SHA256SUMS lists, or nothing: no path is ever joined

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's signature)
        """Quiet: a room's installs make thousands of requests."""


def addresses() -> list[str]:
    """This machine's IPv4 addresses on its networks (learners type one of them); 127.0.0.1 where it has none."""
    import psutil

    found = [a.address for nic in psutil.net_if_addrs().values() for a in nic
             if a.family.name == "AF_INET" and not a.address.startswith("127.")]
    return found or ["127.0.0.1"]


def serve(kit: Path, port: int, bind: str, key: str | None = None, ready: threading.Event | None = None) -> None:
    """Check the kit, print what learners type, and serve it until Ctrl-C."""
    kit = kit.resolve()
    print(f"Checking {kit} against its {SUMS} ...", flush=True)
    files = checked_files(kit)
    key = key or "".join(secrets.choice(KEY_LETTERS) for _ in range(8))
    server = KitServer((bind, port), files, key)
    port = server.server_address[1]
    hosts = ["127.0.0.1"] if bind.startswith("127.") else addresses()
    print(f"Serving the workshop kit ({len(files)} files, read-only) on port {port}. Learners type:", flush=True)
    for host in hosts:
        base = f"http://{host}:{port}/{key}/"
        print(f"  git clone {base}{REPOSITORY} mnist-on-object-storage\n"
              f"  cd mnist-on-object-storage && make install INDEX={base}", flush=True)
    print("Ctrl-C stops it.", flush=True)
    if ready is not None:
        ready.set()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("\nStopped.")
    finally:
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    """``python -m workshop.kit_serve --kit FOLDER [--port N] [--bind ADDRESS]`` (``make kit-serve``)."""
    parser = argparse.ArgumentParser(prog="python -m workshop.kit_serve", description=__doc__.split("\n")[0])
    parser.add_argument("--kit", type=Path, default=Path("kit"), help="the kit's folder (./kit)")
    parser.add_argument("--port", type=int, default=8765, help="the port to listen on (8765; 0: any free one)")
    parser.add_argument("--bind", default="0.0.0.0", help="the address to listen on (all of this machine's)")
    args = parser.parse_args(argv)
    try:
        serve(args.kit, args.port, args.bind)
    except (KitServeError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
