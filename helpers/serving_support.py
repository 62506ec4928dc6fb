"""Plumbing for notebook 08 (lesson module helpers.serving): serving the champion with Ray Serve.

The endpoint's key, checking a request's body, lineage as headers, the HTTP port, the versions a roll may
try, a roll that an interrupt undoes, the canary's check, and a load generator with its one-line summary.

The notebook shows the deployment, ``serve.run`` and the requests; this module holds what every answer
needs and no learner has to read.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import io
import json
import os
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from helpers import interrupts, stack_ray
from helpers.errors import TutorialError
from helpers.ports import free_port_candidates, port_is_free
from helpers.private_files import write_private
from helpers.settings import state_dir

KEY_ENV = "SERVE_API_KEY"  # a cluster's key for the endpoint; else one generated into the stack's state
KEY_FILE = "serve-key"  # in the stack's state folder, 0600
CURL_HEADER_FILE = "serve-auth-header"  # `curl -H @<file>`: the key never goes on a command line
REQUEST_FILE = "request.json"  # the body notebook 08's curl sends, beside the header file
# Where each lineage fact goes in an answer's headers (the body carries the same keys).
LINEAGE_HEADERS = {"model_version": "X-Model-Version", "mlflow_run_id": "X-MLflow-Run-Id",
                   "data_commit": "X-Data-Commit", "git_commit": "X-Git-Commit"}
IMAGE_SIDE = 28


class ServePortTaken(TutorialError, RuntimeError):
    """Another program holds the port Serve's proxy was to listen on: nothing is sent to it."""


class BadRequest(TutorialError, ValueError):
    """A request the endpoint cannot answer: the message is the one line the client gets with a 400."""


class CanaryFailed(TutorialError, RuntimeError):
    """The canary's share of the requests saw a failure, or no answer from the challenger: the roll stops there."""


def api_key() -> str:
    """The endpoint's key: ``SERVE_API_KEY``, else this stack's own (generated once, kept 0600 in its state)."""
    if os.environ.get(KEY_ENV):
        return os.environ[KEY_ENV]
    path = state_dir() / KEY_FILE
    if not path.exists():
        write_private(path, secrets.token_urlsafe(32))
        write_private(path.with_name(CURL_HEADER_FILE), f"Authorization: Bearer {path.read_text().strip()}\n")
    return path.read_text().strip()


def curl_header_file() -> Path:
    """A 0600 file holding the ``Authorization`` header, for ``curl -H @<file>`` (no key on a command line)."""
    path = state_dir() / CURL_HEADER_FILE
    wanted = f"Authorization: Bearer {api_key()}\n"
    if not path.exists() or path.read_text() != wanted:
        write_private(path, wanted)
    return path


def key_digest(key: str) -> str:
    """What a replica compares a request's key with: its SHA-256 (the key itself never goes in a config)."""
    return hashlib.sha256(key.encode()).hexdigest()


def authorized(authorization: str, digest: str) -> bool:
    """True when a request's ``Authorization`` header, ``Bearer <key>``, matches ``digest`` (in constant time)."""
    scheme, _, presented = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(key_digest(presented.strip()), digest)


def auth_headers() -> dict[str, str]:
    """The header a client sends with every request."""
    return {"Authorization": f"Bearer {api_key()}"}


def parse_image(body: bytes) -> np.ndarray:
    """A request's body -> ``uint8 [28, 28]``: JSON with ``"image"`` (a PNG, base64) or ``"pixels"`` (784 numbers).

    Raises:
        BadRequest: empty, not JSON (or nested too deeply), neither field, not a PNG or JPEG, not 28x28 (an
            image's declared size is checked before it is decoded), or pixels that are not 784 numbers from 0
            to 255; one line that says what to send.
    """
    send = 'Send JSON {"image": "<a 28x28 PNG, base64>"} or {"pixels": [784 numbers from 0 to 255]}.'
    if not body.strip():
        raise BadRequest(f"The request has no body. {send}")
    try:
        message = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise BadRequest(f"The body is not JSON. {send}") from None
    except RecursionError:  # [[[[...]]]] deeper than Python's parser recurses
        raise BadRequest(f"The JSON is nested too deeply. {send}") from None
    if isinstance(message, dict) and "image" in message:
        return _decode_png(message["image"], send)
    if isinstance(message, dict) and "pixels" in message:
        return _pixels(message["pixels"], send)
    raise BadRequest(f"The JSON has neither \"image\" nor \"pixels\". {send}")


def _decode_png(text: object, send: str) -> np.ndarray:
    from PIL import Image

    not_an_image = BadRequest(f"\"image\" is not a base64 PNG or JPEG. {send}")
    try:
        raw = base64.b64decode(str(text), validate=True)
        image = Image.open(io.BytesIO(raw), formats=("PNG", "JPEG"))  # reads the header, decodes nothing yet
    except Image.DecompressionBombError:
        raise BadRequest(f"The image is far larger than 28x28 pixels. {send}") from None
    except (ValueError, OSError):  # binascii.Error is a ValueError, UnidentifiedImageError an OSError
        raise not_an_image from None
    if image.size != (IMAGE_SIDE, IMAGE_SIDE):  # the declared size, checked before a pixel is decoded
        raise BadRequest(f"The image is {image.size[0]}x{image.size[1]} pixels, not 28x28. {send}")
    try:
        return np.asarray(image.convert("L"))
    except (ValueError, OSError):  # a header that promised more than the data holds
        raise not_an_image from None


def _pixels(values: object, send: str) -> np.ndarray:
    try:
        pixels = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer no float holds
        raise BadRequest(f"\"pixels\" must be numbers. {send}") from None
    if pixels.size != IMAGE_SIDE * IMAGE_SIDE:
        raise BadRequest(f"\"pixels\" holds {pixels.size} values, not 784 (28x28). {send}")
    if pixels.ndim not in (1, 2):
        raise BadRequest(f"\"pixels\" is nested {pixels.ndim} deep: one list of 784, or 28 lists of 28. {send}")
    if not np.isfinite(pixels).all() or pixels.min() < 0 or pixels.max() > 255:
        raise BadRequest(f"\"pixels\" must be from 0 to 255. {send}")
    return pixels.reshape(IMAGE_SIDE, IMAGE_SIDE).astype(np.uint8)


def to_base64(body: bytes) -> str:
    """An encoded image (a PNG object's bytes) as the base64 text a request's ``"image"`` carries."""
    return base64.b64encode(body).decode()


def blank_png(side: int) -> str:
    """A black ``side`` x ``side`` PNG, base64: an image of the wrong size when ``side`` is not 28."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.zeros((side, side), dtype=np.uint8)).save(out, format="PNG")
    return to_base64(out.getvalue())


def curl_folder(body: dict[str, Any]) -> Path:
    """The stack's private state folder, holding the key's header file and ``body`` as ``request.json``.

    ``curl -H @serve-auth-header --data @request.json`` run there sends the request without the key ever
    appearing on a command line.
    """
    curl_header_file()
    write_private(state_dir() / REQUEST_FILE, json.dumps(body))
    return state_dir()


def require_resources(use_gpu: bool, num_replicas: int) -> None:
    """With ``use_gpu``, one GPU per replica must exist in Ray: else one line now, not replicas waiting for ever."""
    if use_gpu:
        from helpers.training_support import require_gpus

        require_gpus(num_replicas)


def lineage_headers(lineage: dict[str, str]) -> dict[str, str]:
    """The lineage of an answer as its ``X-...`` headers."""
    return {header: str(lineage[name]) for name, header in LINEAGE_HEADERS.items() if name in lineage}


def http_port() -> int:
    """The port Serve's HTTP proxy uses on this Ray: where Serve already runs, its port; else a free one.

    A second ``serve.start`` with another port would be ignored (Serve keeps its first), so a rerun asks first.
    """
    from ray.serve.context import _get_global_client  # no public call says the running proxy's port

    client = _get_global_client(raise_if_no_controller_running=False)
    if client is not None and client.http_config.port:
        return int(client.http_config.port)
    return next(port for port in free_port_candidates(200) if port_is_free(port))


def check_serve_port(port: int) -> None:
    """Stop in one line where Serve's proxy does not hold ``port``: the endpoint's key goes to no other program.

    Any user of the machine may bind a port the moment it is free, here between choosing it and Serve's proxy
    binding it. On this machine's Ray (the stack's, or one this process started) the proxy is one of that
    Ray's processes. A cluster's head is not shared with other users, and is not checked.
    """
    import ray

    gcs_port = int(ray.get_runtime_context().gcs_address.rpartition(":")[2])
    heads = [(stack_ray.read_service(state_dir()) or {}).get("pid"), os.getpid()]
    head = next((pid for pid in heads if pid and stack_ray.listens_under(pid, gcs_port)), None)
    if head is not None and not stack_ray.listens_under(head, port):
        raise ServePortTaken(f"Port {port} is held by another program, not by this Ray's Serve: nothing was sent to "
                             "it. Run `serve.shutdown()`, then this cell again: Serve takes another free port.")


def register_as(mlflow_client, name: str, choice, alias: str | None = None, tags: dict[str, str] | None = None):
    """A new version of ``name`` from ``choice`` (a logged model), with ``tags``, optionally named ``alias``."""
    from mlflow.exceptions import MlflowException

    model = mlflow_client.get_logged_model(choice.uri.rsplit("/", 1)[-1])
    try:
        mlflow_client.create_registered_model(name)
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    version = mlflow_client.create_model_version(name, source=choice.uri, run_id=model.source_run_id, tags=tags,
                                                 model_id=model.model_id, await_creation_for=0)
    if alias:
        mlflow_client.set_registered_model_alias(name, alias, version.version)
    print(f"Registered {choice.source} as {name} version {version.version}" + (f" (@{alias})" if alias else ""))
    return version


def roll_candidates(mlflow_client, name: str, champion_version: str, training_experiment: str,
                    sweep_experiment: str) -> Iterator[Any]:
    """The versions of ``name`` a roll may try, in turn, each registered only when its turn comes.

    The registry's other versions, newest first; then the day's models (04's latest, the one 05 chose) that no
    version holds yet; last, the champion's own model as a new version (the same weights: the rule before a
    roll cannot refuse it).
    """
    from helpers.champion_candidates import ModelChoice, day_models

    versions = mlflow_client.search_model_versions(f"name = '{name}'")
    others = sorted((v for v in versions if v.version != champion_version), key=lambda v: -int(v.version))
    yield from others
    held = {v.source for v in versions}
    for choice in day_models(mlflow_client, training_experiment, sweep_experiment).values():
        if choice.uri not in held:
            yield register_as(mlflow_client, name, choice)
    champion = mlflow_client.get_model_version(name, champion_version)
    yield register_as(mlflow_client, name, ModelChoice(champion.source, f"@champion's own model (version "
                                                                         f"{champion_version})"))


@contextlib.contextmanager
def rolled_back_if_stopped(what: str, roll_back: Callable[[], str]) -> Iterator[None]:
    """A roll that an interrupt or an error undoes: ``roll_back()`` puts the champion back and says what it did.

    An interrupt ends the cell in one :class:`~helpers.interrupts.Interrupted` line, ``"<what> stopped: you
    interrupted it. <what roll_back returned>"``; an error is raised as it was, after the roll back.
    """
    try:
        with interrupts.stop_cleanly(what, roll_back):
            yield
    except interrupts.Interrupted:
        raise
    except BaseException:
        roll_back()
        raise


@dataclass
class LoadResult:
    """What a load of concurrent requests saw: each answer's latency, the versions that answered, the errors."""

    latencies: list[float] = field(default_factory=list)
    versions: list[tuple[float, str]] = field(default_factory=list)  # (seconds since start, X-Model-Version)
    errors: list[str] = field(default_factory=list)
    answers: list[tuple[bytes, dict[str, Any]]] = field(default_factory=list)  # (body sent, JSON answer)
    seconds: float = 0.0
    during_ended: float | None = None  # seconds since start when ``during`` returned (the roll was done)

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile of the latencies, in milliseconds."""
        return float(np.percentile(self.latencies, q) * 1000) if self.latencies else float("nan")

    @property
    def throughput(self) -> float:
        """Answers per second."""
        return len(self.latencies) / self.seconds if self.seconds else 0.0


def send_load(url: str, bodies: Sequence[bytes], clients: int, seconds: float | None = None,
              requests_per_client: int | None = None, during: Callable[[], Any] | None = None,
              headers: dict[str, str] | None = None, settle: float = 0.0) -> LoadResult:
    """``clients`` threads POST ``bodies`` in turn to ``url`` until ``seconds`` pass (or each sent its count).

    ``during``, if given, runs in this thread while the load goes on (a roll to a new model); the load stops
    ``settle`` seconds after it returned, once ``seconds`` passed. A non-200 answer or a failed connection is an error.
    """
    import requests

    headers = {**(headers or auth_headers()), "Content-Type": "application/json"}
    result, lock, start = LoadResult(), threading.Lock(), time.perf_counter()
    done = threading.Event()

    def client(offset: int) -> None:
        session, sent = requests.Session(), 0
        while not done.is_set() and (requests_per_client is None or sent < requests_per_client):
            body, began = bodies[(offset + sent * clients) % len(bodies)], time.perf_counter()
            sent += 1
            try:
                answer = session.post(url, data=body, headers=headers, timeout=30)
                failed = None if answer.status_code == 200 else f"{answer.status_code}: {answer.text[:200]}"
            except requests.RequestException as err:
                answer, failed = None, f"{type(err).__name__}: {err}"
            with lock:
                if failed:
                    result.errors.append(failed)
                else:
                    result.latencies.append(time.perf_counter() - began)
                    result.versions.append((began - start, answer.headers.get("X-Model-Version", "")))
                    result.answers.append((body, answer.json()))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    try:
        if during is not None:
            during()
            result.during_ended = time.perf_counter() - start
            time.sleep(settle)
        if seconds is not None:
            time.sleep(max(0.0, seconds - (time.perf_counter() - start)))
            done.set()
        for thread in threads:
            thread.join()
    finally:
        done.set()
    result.seconds = time.perf_counter() - start
    return result


def check_canary(canary: LoadResult, challenger: str) -> None:
    """Go on to the whole roll only if the canary answered without a failure and the challenger gave answers.

    Raises:
        CanaryFailed: one line saying what went wrong (the roll is then put back by its guard).
    """
    answered = count_by_version(canary).get(str(challenger), 0)
    if canary.errors or not answered:
        why = f"{len(canary.errors)} failed requests" if canary.errors else "no answer came from it"
        raise CanaryFailed(f"The canary of version {challenger} failed ({why}): the roll stops before the whole.")


def load_line(phase: str, result: LoadResult) -> str:
    """One line for a load: answers, errors, latency (p50, p99) and answers per second, and who answered."""
    return (f"{phase}: {len(result.latencies)} answers in {result.seconds:.1f} s, {len(result.errors)} errors, "
            f"p50 {result.percentile(50):.0f} ms, p99 {result.percentile(99):.0f} ms, "
            f"{result.throughput:.0f} answers/s; answers by version: {count_by_version(result)}")


def only_after(result: LoadResult, version: str) -> float:
    """Seconds into a load after which every request sent got its answer from ``version`` (0.0: all of them)."""
    others = [began for began, answered in result.versions if answered != str(version)]
    return max(others, default=0.0)


def count_by_version(result: LoadResult) -> dict[str, int]:
    """How many answers each model version gave."""
    return dict(sorted(Counter(version for _, version in result.versions).items()))


def answers_by_body(result: LoadResult) -> dict[bytes, dict[str, Any]]:
    """Each body sent and the answer it got (the last one, where a body was sent twice)."""
    return dict(result.answers)
