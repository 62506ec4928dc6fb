"""Online predictions: notebook 08's Ray Serve deployment against a plain HTTP server, side by side in one run.

Three servers answer the same JSON requests (a test image as a base64 PNG) with the same model:

1. plain HTTP: one process, Python's ``ThreadingHTTPServer``, the model loaded once, one forward pass per
   request (the baseline);
2. Ray Serve without batching: notebook 08's ``DigitClassifier``, one replica, ``max_batch_size`` 1;
3. Ray Serve with batching: the same replica with notebook 08's ``max_batch_size`` (read from its parameters).

Each is loaded by 1, 8 and 32 concurrent clients for ``--seconds`` each (after a warm-up), and p50, p95
and p99 latency and the throughput are recorded. The clients run in one process of their own, so they
never share an interpreter with a server. JSON in ``benchmarks/results/serve.json``, a chart in
``docs/serve.png``.

    python benchmarks/bench_serve.py [--seconds 5] [--clients 1 8 32]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from common import print_table, write_results

from helpers import cluster, serving_support
from workshop import stack, stack_ports


def notebook_batch_size() -> int:
    """Notebook 08's ``max_batch_size``, from its parameters cell: the benchmark batches as the notebook does."""
    import papermill

    from workshop.runner import notebook_paths

    (notebook,) = notebook_paths(pattern="08_*.ipynb")
    return int(papermill.inspect_notebook(str(notebook))["max_batch_size"]["default"])


BATCH = notebook_batch_size()
SERVERS = ("plain HTTP (1 process)", "Ray Serve, no batching", f"Ray Serve, batching ({BATCH})")
CHART = Path(__file__).resolve().parents[1] / "docs" / "serve.png"


def request_bodies(count: int = 200) -> list[bytes]:
    """``count`` test images as the JSON bodies a client sends."""
    import io

    from PIL import Image

    from helpers.mnist import load_mnist

    images, _ = load_mnist().split("test")
    bodies = []
    for image in images[:count]:
        out = io.BytesIO()
        Image.fromarray(image).save(out, format="PNG")
        bodies.append(json.dumps({"image": serving_support.to_base64(out.getvalue())}).encode())
    return bodies


def plain_server(model_uri: str, port: int, ready) -> None:
    """The baseline: the model in one process behind ``ThreadingHTTPServer``, one forward pass per request."""
    import mlflow
    import numpy as np
    import torch

    from helpers.preprocess import normalise
    from helpers.settings import load_settings

    load_settings().use_mlflow_credentials()
    mlflow.set_tracking_uri(load_settings().mlflow_tracking_uri)
    torch.set_num_threads(1)  # as a Serve replica with less than one CPU gets
    net = mlflow.pytorch.load_model(model_uri)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            try:
                image = serving_support.parse_image(body)
                with torch.no_grad():
                    probabilities = net(torch.as_tensor(normalise(np.stack([image])))).exp()[0]
                status, answer = 200, {"digit": int(probabilities.argmax()), "confidence": float(probabilities.max())}
            except serving_support.BadRequest as err:
                status, answer = 400, {"error": str(err)}
            payload = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    ready.set()
    server.serve_forever()


def load_in_own_process(url: str, bodies: list[bytes], clients: int, seconds: float, out) -> None:
    """Run one load (``serving_support.send_load``) and put its numbers on ``out``."""
    result = serving_support.send_load(url, bodies, clients, seconds=seconds, headers=HEADERS)
    out.put({"p50_ms": round(result.percentile(50), 1), "p95_ms": round(result.percentile(95), 1),
             "p99_ms": round(result.percentile(99), 1), "throughput": round(result.throughput, 1),
             "requests": len(result.latencies), "errors": len(result.errors)})


HEADERS: dict[str, str] = {}


def measure(url: str, bodies: list[bytes], clients: int, seconds: float) -> dict:
    """One load of ``clients`` clients for ``seconds``, in a fresh client process."""
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    process = context.Process(target=load_in_own_process, args=(url, bodies, clients, seconds, out))
    process.start()
    numbers = out.get(timeout=seconds + 120)
    process.join()
    return numbers


def deploy(config: dict, batch: int) -> None:
    """Notebook 08's deployment with ``max_batch_size`` ``batch``."""
    from ray import serve

    from helpers.serving import DigitClassifier

    serve.run(DigitClassifier.options(num_replicas=1, user_config={**config, "max_batch_size": batch}).bind(),
              name="mnist-bench", route_prefix="/predict")


def chart(rows: list[dict], path: Path) -> None:
    """p99 latency and throughput by clients, one line per server."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (latency, throughput) = plt.subplots(1, 2, figsize=(10, 3.8))
    for server in SERVERS:
        mine = [r for r in rows if r["server"] == server]
        clients = [r["clients"] for r in mine]
        latency.plot(clients, [r["p99_ms"] for r in mine], marker="o", label=server)
        throughput.plot(clients, [r["throughput"] for r in mine], marker="o", label=server)
    latency.set(xscale="log", xlabel="concurrent clients", ylabel="p99 latency (ms)", title="Tail latency")
    throughput.set(xscale="log", xlabel="concurrent clients", ylabel="answers per second", title="Throughput")
    for axis in (latency, throughput):
        axis.set_xticks([r["clients"] for r in rows if r["server"] == SERVERS[0]])
        axis.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        axis.grid(alpha=0.3)
    latency.legend(fontsize=8)
    figure.suptitle(f"One model, three servers, on {os.cpu_count()} CPUs")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="each load's length")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--registered-model", default="mnist-classifier")
    parser.add_argument("--training-experiment", default="mnist-ray-train")
    args = parser.parse_args()

    import mlflow
    from mlflow.tracking import MlflowClient
    from ray import serve

    from helpers.inference import champion_model, hold_champion_rule
    from helpers.serving import model_lineage, resolve_alias

    settings = stack.ensure_stack()
    cluster.init_ray(settings)
    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)  # the rule loads the day's models by URI
    client = MlflowClient(settings.mlflow_tracking_uri)
    if champion_model(client, args.registered_model) is None:
        print(hold_champion_rule(client, args.registered_model, "mnist", 600, "bench_serve.py",
                                 args.training_experiment, settings=settings))
    version, model_uri = resolve_alias(client, args.registered_model)
    HEADERS.update(serving_support.auth_headers())
    bodies = request_bodies()
    config = {"model_uri": model_uri, "lineage": model_lineage(client, args.registered_model, version),
              "batch_wait_timeout_s": 0.01, "key_digest": serving_support.key_digest(serving_support.api_key())}

    rows: list[dict] = []
    port = stack_ports.free_ports(["plain"])["plain"]
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    baseline = context.Process(target=plain_server, args=(model_uri, port, ready), daemon=True)
    baseline.start()
    try:
        ready.wait(120)
        urls = {SERVERS[0]: f"http://127.0.0.1:{port}/predict"}
        http_port = serving_support.http_port()
        serve.start(http_options={"host": "127.0.0.1", "port": http_port})
        for server, batch in ((SERVERS[0], None), (SERVERS[1], 1), (SERVERS[2], BATCH)):
            if batch is not None:
                deploy(config, batch)
                serving_support.check_serve_port(http_port)  # the endpoint's key goes to Serve's own port only
                urls[server] = f"http://127.0.0.1:{http_port}/predict"
            measure(urls[server], bodies, 4, 1.0)  # warm-up: connections, first batches
            for clients in args.clients:
                rows.append({"server": server, "clients": clients,
                             **measure(urls[server], bodies, clients, args.seconds)})
                print(rows[-1], flush=True)
    finally:
        baseline.terminate()
        serve.delete("mnist-bench")
    floor = {r["clients"]: r for r in rows if r["server"] == SERVERS[0]}
    for row in rows:  # side by side with the baseline measured in the same run
        row["p99_vs_plain"] = round(row["p99_ms"] / floor[row["clients"]]["p99_ms"], 2)
        row["throughput_vs_plain"] = round(row["throughput"] / floor[row["clients"]]["throughput"], 2)
    path = write_results("serve", {"model": model_uri, "seconds_per_load": args.seconds, "max_batch_size": BATCH,
                                   "rows": rows})
    chart(rows, CHART)
    print_table("Online predictions (one model, three servers)", rows,
                ["server", "clients", "p50_ms", "p95_ms", "p99_ms", "throughput", "p99_vs_plain",
                 "throughput_vs_plain", "errors"])
    print(f"\n{path}\n{CHART}")


if __name__ == "__main__":
    main()
