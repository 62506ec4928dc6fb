"""One learner trying every door of another learner's room (run as that learner by the shared-server test).

Run with the learner's own checkout as the working folder, so their own keys, login and tokens are at
hand; the other room's addresses (no secret among them) come as JSON on stdin. Prints one JSON object:
``{attempt: "refused: <how>" | "OPEN: <what it got>"}``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path.cwd()
sys.path.insert(0, str(HERE))

from helpers.settings import load_settings  # noqa: E402 - this learner's checkout first


def http(url: str, method: str = "GET", headers: dict[str, str] | None = None,
         body: dict | None = None) -> tuple[int, bytes]:
    """Status and body of one request (an error status too); 0 where nothing answers."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={
        **({"Content-Type": "application/json"} if data else {}), **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


@contextlib.contextmanager
def waiting_at_a_door(port: int = 0) -> Iterator[tuple[int, list[dict]]]:
    """``(port, heard)``: a program that took ``port`` of 127.0.0.1 (0: any free one) and answers every GET with 200,
    keeping the headers of each request in ``heard`` (where a token or a password would show)."""
    heard: list[dict] = []

    class Impostor(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            heard.append(dict(self.headers))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    deadline = time.monotonic() + 10
    while True:  # it takes the port the moment the process that held it is gone
        try:
            server = ThreadingHTTPServer(("127.0.0.1", port), Impostor)
            break
        except OSError:
            if not port or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], heard
    finally:
        server.shutdown()


@contextlib.contextmanager
def waiting_at_a_grpc_door(port: int) -> Iterator[list[tuple[str, dict]]]:
    """``heard``: a gRPC server that took ``port`` of 127.0.0.1 the moment it was free, as one waiting for Ray's
    GCS to die would, keeping every call's method and metadata (where Ray's token travels) and answering none."""
    from concurrent import futures

    import grpc

    heard: list[tuple[str, dict]] = []

    class Everything(grpc.GenericRpcHandler):
        def service(self, call):
            heard.append((call.method, dict(call.invocation_metadata)))
            return None  # UNIMPLEMENTED, after the metadata was read

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((Everything(),))
    deadline = time.monotonic() + 10
    while True:
        try:
            if server.add_insecure_port(f"127.0.0.1:{port}"):
                break
        except RuntimeError:  # grpcio raises where the port is held, or returns 0
            pass
        if time.monotonic() > deadline:
            raise OSError(f"port {port} stayed taken for 10 s")
        time.sleep(0.01)
    server.start()
    try:
        yield heard
    finally:
        server.stop(0)


def door(code: int, body: bytes) -> str:
    """An HTTP answer as a verdict: only a 2xx (or a 3xx that hands something out) opens a door."""
    if 200 <= code < 400:
        return f"OPEN: HTTP {code} {body[:80]!r}"
    return f"refused: HTTP {code}" if code else "refused: nothing answers"


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def own_secret(path: Path) -> str:
    return path.read_text().strip() if path.is_file() else ""


def tls_with_own_certificate(port: int, tls_folder: Path) -> str:
    """A gRPC port of the other store, offered this learner's own store certificate: another CA signed it."""
    context = ssl.create_default_context(cafile=str(tls_folder / "ca.crt"))
    context.check_hostname = False
    context.load_cert_chain(str(tls_folder / "stack.crt"), str(tls_folder / "stack.key"))
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            tls.settimeout(10)
            tls.recv(1)
            return "OPEN: a TLS session with this learner's certificate"
    except (ssl.SSLError, OSError) as err:
        return f"refused: {type(err).__name__}"


def attempts(room: dict) -> dict[str, Callable[[], str]]:
    """Every way in, by name: the other room's bucket, store, MLflow, Ray and JupyterLab."""
    from minio import Minio
    from minio.error import S3Error

    mine = load_settings()
    state = HERE / ".stack"
    ray_token = own_secret(state / "ray_token")
    jupyter_token = own_secret(state / "jupyter-token")
    sign_in_key = (own_secret(state / "dashboard-sign-in-keys").split() or ["none"])[-1]
    login = basic(mine.mlflow_username, mine.mlflow_password)
    s3, mlflow, ray, jupyter = room["s3"], room["mlflow"], room["dashboard"], room["jupyter"]

    def s3_with_own_keys() -> str:
        client = Minio(s3.removeprefix("http://"), mine.s3_access_key, mine.s3_secret_key, secure=False)
        try:
            keys = [o.object_name for o in client.list_objects("mnist", recursive=True)]
        except S3Error as err:
            return f"refused: {err.code}"
        return f"OPEN: listed {len(keys)} objects"

    def state_file() -> str:
        try:
            Path(room["state"], "s3-identities.json").read_text()
        except PermissionError:
            return "refused: PermissionError"
        return "OPEN: read its S3 keys"

    def job_client() -> str:
        from ray.job_submission import JobSubmissionClient

        os.environ["RAY_AUTH_TOKEN"] = ray_token  # this learner's token, as their own Ray takes it
        try:
            job = JobSubmissionClient(ray).submit_job(entrypoint="echo intruder")
        except Exception as err:  # noqa: BLE001 - any refusal will do
            return f"refused: {type(err).__name__}"
        return f"OPEN: submitted {job}"

    ports = room["ports"]
    return {
        "S3: the bucket with own keys": s3_with_own_keys,
        "S3: the bucket without keys": lambda: door(*http(f"{s3}/mnist?list-type=2")),
        "store: filer listing": lambda: door(*http(f"http://127.0.0.1:{ports['filer']}/buckets/mnist/",
                                                   headers={"Accept": "application/json"})),
        "store: filer read": lambda: door(*http(f"http://127.0.0.1:{ports['filer']}/buckets/mnist/_manifest/"
                                                "objects.txt.gz")),
        "store: master deletes the bucket": lambda: door(*http(
            f"http://127.0.0.1:{ports['master']}/col/delete?collection=mnist")),
        "store: master hands out a write token": lambda: door(*http(
            f"http://127.0.0.1:{ports['master']}/dir/assign")),
        "store: volume server": lambda: door(*http(f"http://127.0.0.1:{ports['volume']}/ui/index.html")),
        "store: gRPC with own certificate": lambda: tls_with_own_certificate(ports["filer_grpc"],
                                                                           state / "seaweedfs" / "tls"),
        "store: its state folder": state_file,
        "MLflow: experiments without login": lambda: door(*http(
            f"{mlflow}/api/2.0/mlflow/experiments/search?max_results=5")),
        "MLflow: experiments with own login": lambda: door(*http(
            f"{mlflow}/api/2.0/mlflow/experiments/search?max_results=5", headers=login)),
        "MLflow: set an alias with own login": lambda: door(*http(
            f"{mlflow}/api/2.0/mlflow/registered-models/alias", "POST", login,
            {"name": "mnist-classifier", "alias": "champion", "version": "1"})),
        "Ray: submit a job with own token": lambda: door(*http(
            f"{ray}/api/jobs/", "POST", {"Authorization": f"Bearer {ray_token}"}, {"entrypoint": "echo intruder"})),
        "Ray: submit a job without token": lambda: door(*http(f"{ray}/api/jobs/", "POST", None,
                                                             {"entrypoint": "echo intruder"})),
        "Ray: JobSubmissionClient with own token": job_client,
        "Ray: sign-in link with own key": lambda: door(*http(f"{room['sign_in']}/?key={sign_in_key}")),
        "JupyterLab: API without token": lambda: door(*http(f"{jupyter}/api/contents")),
        "JupyterLab: API with own token": lambda: door(*http(f"{jupyter}/api/contents",
                                                             headers={"Authorization": f"token {jupyter_token}"})),
        "JupyterLab: start a kernel with own token": lambda: door(*http(
            f"{jupyter}/api/kernels", "POST", {"Authorization": f"token {jupyter_token}"}, {"name": "python3"})),
    }


def main() -> int:
    """Try every door of the room described on stdin; print the verdicts as JSON."""
    room = json.load(sys.stdin)
    verdicts = {}
    for name, attempt in attempts(room).items():
        try:
            verdicts[name] = attempt()
        except Exception as err:  # noqa: BLE001 - the attempt itself broke: say so, never count it as refused
            verdicts[name] = f"ERROR: {type(err).__name__}: {err}"
    print(json.dumps(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
