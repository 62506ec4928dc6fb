"""The Ray dashboard's sign-in for ``make lab``: one-time links that hand a browser Ray's own token cookie.

Ray's dashboard asks every browser for Ray's token. ``make lab`` prints a link to a small server of its own
instead, on 127.0.0.1: an unused key in the link sets the cookie the dashboard's token prompt would set, and
forwards the browser to the dashboard, so no one pastes a token. Each key works once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hmac
import os
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from helpers.private_files import write_private

# The cookie Ray's dashboard reads its token from (ray._private.authentication.authentication_constants).
RAY_TOKEN_COOKIE = "ray-authentication-token"
KEYS_FILE = "dashboard-sign-in-keys"  # in the state folder, 0600: the keys not used yet


@contextlib.contextmanager
def _keys_locked(state: Path):
    """Hold the lock of the sign-in keys: the lab uses them up while ``--sign-in-link`` adds one."""
    fd = os.open(state / ".sign-in.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def new_key(state: Path) -> str:
    """A key for one use of the dashboard's sign-in link, added to the lab's private list of unused keys."""
    key = secrets.token_urlsafe(16)
    path = state / KEYS_FILE
    with _keys_locked(state):
        kept = path.read_text().split() if path.is_file() else []
        write_private(path, "\n".join([*kept[-9:], key]) + "\n")  # a few unused links stay valid, not many
    return key


def use_key(state: Path, given: str) -> bool:
    """Whether ``given`` is an unused key; it is used up (removed) in the same step."""
    path = state / KEYS_FILE
    with _keys_locked(state):
        keys = path.read_text().split() if path.is_file() else []
        if not given or not any(hmac.compare_digest(given.encode(), key.encode()) for key in keys):
            return False
        write_private(path, "".join(f"{key}\n" for key in keys if key != given))
    return True


def start(port: int, state: Path, token: str, dashboard_url: str) -> ThreadingHTTPServer:
    """Serve the dashboard's sign-in links on 127.0.0.1:``port`` (``port`` 0: any free one).

    ``GET /?key=<key>`` with an unused key sets Ray's own token cookie, as the dashboard's token prompt would,
    and forwards the browser to the dashboard; the key is then used up, so a link that leaked (a shared
    screen, a browser history) signs nobody in. Cookies belong to a host, not a port, so the dashboard on
    127.0.0.1 receives it. Another key: ``python -m workshop.lab --sign-in-link``.
    """

    class SignIn(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            given = parse_qs(urlsplit(self.path).query).get("key", [""])[0]
            if not use_key(state, given):
                self.send_error(403, "This sign-in link was used already, or is not one make lab printed: "
                                     "`python -m workshop.lab --sign-in-link` prints a new one.")
                return
            self.send_response(303)
            self.send_header("Set-Cookie", f"{RAY_TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict")
            self.send_header("Location", f"{dashboard_url}/#/actors")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - quiet: the terminal shows the URLs
            pass

    try:
        server = ThreadingHTTPServer(("127.0.0.1", port), SignIn)
    except OSError:  # the port is taken: any free one, the printed link says which
        server = ThreadingHTTPServer(("127.0.0.1", 0), SignIn)
    threading.Thread(target=server.serve_forever, name="dashboard-sign-in", daemon=True).start()
    return server
