"""Ray Data from object pointers: fetch, decode and normalise in parallel workers (notebook 03).

The driver holds only pointers (keys and labels). Ray tasks or actors fetch
their share of the objects and turn them into tensors:

* :func:`preprocess_batch` is the seed's task function, corrected: one client
  per batch, objects fetched one after another.
* :class:`ObjectPreprocessor` is the actor form: one client per actor, kept
  for its lifetime, and each batch's objects fetched concurrently by threads.
* :func:`read_images_dataset` and :func:`read_parquet_dataset` are the faster
  alternatives: Ray's own readers over ``pyarrow.fs.S3FileSystem``, and a few
  packed Parquet shards instead of 70,000 tiny objects.

Every form returns batches ``{"X": float32 [n, 1, 28, 28], "y": int64 [n]}``
normalised like ``ToTensor()`` + ``Normalize((0.5,), (0.5,))`` to [-1, 1].
"""

from __future__ import annotations

import io
import logging
import os
import sys
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from helpers.config import ParameterError, Settings, load_settings
from helpers.storage import StorageError, get_client, read_object

LOG_FILE_NAME = "preprocess.log"
_SETTINGS_ENV = ("S3_ENDPOINT", "S3_ACCESS_KEY", "S3_SECRET_KEY", "S3_SECURE", "S3_REGION", "MLFLOW_TRACKING_URI")


class ObjectDecodeError(StorageError):
    """An object could not be fetched or decoded; the message names its key."""


# --- Ray start-up ----------------------------------------------------------------------

def settings_env(settings: Settings) -> dict[str, str]:
    """The environment variables that let a worker process build the same settings.

    ``AWS_EC2_METADATA_DISABLED`` stops the AWS SDK inside pyarrow from probing
    the EC2 metadata service, which costs seconds per process off AWS.
    """
    values = {
        "AWS_EC2_METADATA_DISABLED": "true",
        "S3_ENDPOINT": settings.s3_url, "S3_ACCESS_KEY": settings.s3_access_key,
        "S3_SECRET_KEY": settings.s3_secret_key, "S3_SECURE": str(settings.s3_secure).lower(),
        "S3_REGION": settings.s3_region, "MLFLOW_TRACKING_URI": settings.mlflow_tracking_uri,
    }
    return {k: v for k, v in values.items() if v}


def quiet_ray_data() -> None:
    """Keep Ray Data's progress bars and execution banners out of notebook outputs."""
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.enable_operator_progress_bars = False
    ctx.print_on_execution_start = False
    ctx.enable_auto_log_stats = False
    for name in ("ray", "ray.data", "ray.train", "ray.tune"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # Ray hands read-only numpy blocks to torch; harmless here, noisy in every notebook.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def init_ray(settings: Settings | None = None, num_cpus: int | None = None, quiet: bool = True,
             dashboard: bool = False, log_to_driver: bool = False) -> dict[str, Any]:
    """Start or join Ray with the object-store settings passed to every worker (notebooks 03-06).

    ``RAY_ADDRESS`` (from the settings) joins a running cluster, shipping the
    ``helpers`` package to its workers; without it a local Ray starts with
    this machine's CPUs. Either way workers get the S3 and MLflow settings as
    environment variables (``runtime_env``), so they can open their own clients.
    Calling it again while Ray runs returns the running cluster's resources.

    Args:
        settings: where the services are; :func:`helpers.config.load_settings` by default.
        num_cpus: CPUs for a local Ray (default: all).
        quiet: hide Ray's log lines and Ray Data progress bars in notebook outputs.
        dashboard: start the Ray dashboard (costs memory and CPU on a laptop).
        log_to_driver: show worker stdout in the driver (off: workers write to a log file instead).

    Returns:
        The cluster's resources (``ray.cluster_resources()``).
    """
    import ray

    settings = settings or load_settings()
    if ray.is_initialized():
        return ray.cluster_resources()
    runtime_env: dict[str, Any] = {"env_vars": settings_env(settings)}
    # "local" always starts a fresh local Ray; None would join any cluster a
    # `ray start` left behind on this machine.
    address = settings.ray_address or "local"
    if address != "local":
        import helpers

        runtime_env["py_modules"] = [str(Path(helpers.__file__).parent)]
    ray.init(
        address=address,
        num_cpus=num_cpus if address == "local" else None,
        include_dashboard=dashboard,
        logging_level=logging.ERROR if quiet else logging.INFO,
        log_to_driver=log_to_driver,
        runtime_env=runtime_env,
        ignore_reinit_error=True,
    )
    if quiet:
        quiet_ray_data()
    return ray.cluster_resources()


def shutdown_ray() -> None:
    """Stop the local Ray (or leave the cluster): call it at the end of a notebook so papermill can exit."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


# --- the pid-stamped logger (as in the seed) ------------------------------------------

def create_logger(log_dir: str | Path | None = None, name: str = "preprocess") -> logging.Logger:
    """A logger that stamps every line with the process id, to stdout and a file (notebook 03).

    Lines from many Ray workers interleave on stdout; the file keeps them
    apart from Ray's own output. Default file: ``$PREPROCESS_LOG_DIR`` or the
    temp folder, ``preprocess.log``.
    """
    log_dir = Path(log_dir or os.environ.get("PREPROCESS_LOG_DIR") or Path(os.environ.get("TMPDIR", "/tmp")))
    logger = logging.getLogger(f"helpers.{name}")
    if getattr(logger, "_log_dir", None) != str(log_dir):
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        log_dir.mkdir(parents=True, exist_ok=True)
        fmt = logging.Formatter("%(process)d %(asctime)s | %(levelname)s | %(message)s")
        for handler in (logging.StreamHandler(sys.stdout), logging.FileHandler(log_dir / LOG_FILE_NAME)):
            handler.setFormatter(fmt)
            logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        logger._log_dir = str(log_dir)  # type: ignore[attr-defined]
    return logger


def _node_id() -> str:
    """Short id of the Ray node this code runs on ('-' outside Ray)."""
    import ray

    return ray.get_runtime_context().get_node_id()[:8] if ray.is_initialized() else "-"


def read_log(log_dir: str | Path) -> list[str]:
    """Lines the pid-stamped logger wrote to ``<log_dir>/preprocess.log``."""
    path = Path(log_dir) / LOG_FILE_NAME
    return path.read_text().splitlines() if path.is_file() else []


# --- pointers -> dataset ------------------------------------------------------------------

def to_ray_dataset(X: Sequence[str], y: Sequence[int], override_num_blocks: int | None = None):
    """Pointers and labels as a Ray Dataset of ``{"X": key, "y": label}`` rows (notebook 03).

    Ray chooses the number of blocks unless ``override_num_blocks`` is given
    (the seed's ``parallelism=5`` is deprecated and rarely better).
    """
    import ray.data

    if len(X) != len(y):
        raise ParameterError(f"X has {len(X)} pointers but y has {len(y)} labels; they must align.")
    if len(X) == 0:
        raise ParameterError("No pointers: list the bucket first (helpers.storage.get_train_test_data).")
    items = [{"X": str(key), "y": int(label)} for key, label in zip(X, y, strict=True)]
    return ray.data.from_items(items, override_num_blocks=override_num_blocks)


def shuffle_pointers(X: Sequence[str], y: Sequence[int], seed: int = 0) -> tuple[list[str], list[int]]:
    """The same pointers in a seeded random order.

    Listings come back sorted by key, which here means sorted by label; a
    model trained on them in that order sees all the zeros, then all the ones,
    and forgets the earlier digits. Shuffle before training.
    """
    order = np.random.default_rng(seed).permutation(len(X))
    return [X[i] for i in order], [int(y[i]) for i in order]


def decode_images(bodies: Sequence[bytes]) -> np.ndarray:
    """Encoded images -> ``float32 [n, 1, 28, 28]`` in [-1, 1] (ToTensor + Normalize((0.5,), (0.5,)))."""
    pixels = np.stack([np.asarray(Image.open(io.BytesIO(body)).convert("L")) for body in bodies])
    return (pixels.astype(np.float32)[:, None, :, :] / 255.0 - 0.5) / 0.5


def _decode_one(key: str, body: bytes) -> np.ndarray:
    try:
        image = np.asarray(Image.open(io.BytesIO(body)).convert("L"))
    except Exception as err:
        raise ObjectDecodeError(f"Object '{key}' is not a readable image ({type(err).__name__}: {err}).") from None
    if image.shape != (28, 28):
        raise ObjectDecodeError(f"Object '{key}' is {image.shape[1]}x{image.shape[0]} pixels, not 28x28.")
    return image


def _to_batch(images: list[np.ndarray], labels: list[int]) -> dict[str, np.ndarray]:
    if not images:
        return {"X": np.zeros((0, 1, 28, 28), np.float32), "y": np.zeros(0, np.int64)}
    pixels = np.stack(images).astype(np.float32)[:, None, :, :]
    return {"X": (pixels / 255.0 - 0.5) / 0.5, "y": np.asarray(labels, dtype=np.int64)}


def _fetch_decode(client, bucket: str, key: str) -> np.ndarray:
    try:
        body = read_object(client, bucket, key)
    except StorageError as err:
        raise ObjectDecodeError(f"Object '{key}' could not be fetched: {err}") from None
    return _decode_one(key, body)


class SkipCounter:
    """Counts objects skipped by the workers (a named Ray actor shared by all of them)."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def add(self, keys: list[str]) -> None:
        """Record skipped keys."""
        self.keys.extend(keys)

    def get(self) -> list[str]:
        """All keys skipped so far."""
        return list(self.keys)


def skip_counter(name: str):
    """The named :class:`SkipCounter` actor ``name`` (created on first use)."""
    import ray

    return ray.remote(num_cpus=0)(SkipCounter).options(name=name, get_if_exists=True, lifetime="detached").remote()


def skipped_keys(name: str) -> list[str]:
    """Keys the workers skipped under counter ``name``; the counter is removed afterwards."""
    import ray

    try:
        counter = ray.get_actor(name)
    except ValueError:
        return []
    keys = ray.get(counter.get.remote())
    ray.kill(counter)
    return keys


def _collect(keys: Sequence[str], labels: Sequence[int], images: list[np.ndarray | Exception],
             skip_counter_name: str | None) -> dict[str, np.ndarray]:
    good_images, good_labels, failed = [], [], []
    for key, label, image in zip(keys, labels, images, strict=True):
        if isinstance(image, Exception):
            if skip_counter_name is None:
                raise image
            failed.append(str(key))
        else:
            good_images.append(image)
            good_labels.append(int(label))
    if failed:
        import ray

        # Wait for the count to land, so the driver reads it complete after the job.
        ray.get(skip_counter(skip_counter_name).add.remote(failed))  # type: ignore[arg-type]
    return _to_batch(good_images, good_labels)


def preprocess_batch(batch: dict[str, np.ndarray], bucket: str, skip_counter_name: str | None = None,
                     log_dir: str | None = None) -> dict[str, np.ndarray]:
    """The seed's task function, corrected: fetch each object of the batch, decode, normalise (notebook 03).

    Opens one client per batch and fetches sequentially, as the seed did.

    Args:
        batch: ``{"X": keys, "y": labels}`` from :func:`to_ray_dataset`.
        bucket: bucket holding the objects.
        skip_counter_name: skip unreadable objects and count them under this
            name (see :func:`skipped_keys`); by default they fail the job.
        log_dir: where the pid-stamped logger writes (one line per batch).

    Raises:
        ObjectDecodeError: an object is missing or not an image; the message names its key.
    """
    started = time.perf_counter()
    client = get_client(load_settings(), max_connections=1)
    images: list[np.ndarray | Exception] = []
    for key in batch["X"]:
        try:
            images.append(_fetch_decode(client, bucket, str(key)))
        except ObjectDecodeError as err:
            images.append(err)
    out = _collect(batch["X"], batch["y"], images, skip_counter_name)
    if log_dir:
        create_logger(log_dir).info(
            f"task on node {_node_id()}: {len(batch['X'])} objects in {time.perf_counter() - started:.2f} s")
    return out


class ObjectPreprocessor:
    """The actor form: one client per actor, a batch's objects fetched concurrently (notebook 03).

    Use with ``ds.map_batches(ObjectPreprocessor, fn_constructor_kwargs={...},
    compute=ray.data.ActorPoolStrategy(size=n))``. The client (and its
    connection pool) is built once in ``__init__`` and reused for every batch.
    """

    def __init__(self, bucket: str, threads: int = 16, skip_counter_name: str | None = None,
                 log_dir: str | None = None) -> None:
        self.bucket = bucket
        self.client = get_client(load_settings(), max_connections=threads)
        self.pool = ThreadPoolExecutor(max_workers=threads)
        self.skip_counter_name = skip_counter_name
        self.log_dir = log_dir

    def _fetch(self, key: str) -> np.ndarray | Exception:
        try:
            return _fetch_decode(self.client, self.bucket, key)
        except ObjectDecodeError as err:
            return err

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Fetch and decode one batch (``{"X": keys, "y": labels}``)."""
        started = time.perf_counter()
        images = list(self.pool.map(self._fetch, [str(k) for k in batch["X"]]))
        out = _collect(batch["X"], batch["y"], images, self.skip_counter_name)
        if self.log_dir:
            create_logger(self.log_dir).info(
                f"actor on node {_node_id()}: {len(batch['X'])} objects in {time.perf_counter() - started:.2f} s")
        return out


def preprocess(ds, bucket: str, method: str = "actors", batch_size: int = 400, num_actors: int = 2,
               threads: int = 16, skip_counter_name: str | None = None, log_dir: str | None = None,
               actor_restarts: int = 0):
    """Lazily map a pointer dataset to image tensors with tasks or actors (notebook 03).

    Nothing is fetched until the dataset is consumed (``materialize()``,
    ``iter_torch_batches``, ``take``): time it there, not here.

    Args:
        ds: pointer dataset from :func:`to_ray_dataset`.
        bucket: bucket holding the objects.
        method: ``"tasks"`` (:func:`preprocess_batch`) or ``"actors"`` (:class:`ObjectPreprocessor`).
        batch_size: pointers per batch.
        num_actors: size of the actor pool.
        threads: concurrent fetches per actor.
        skip_counter_name: skip unreadable objects, counting them (see :func:`skipped_keys`).
        log_dir: folder for the pid-stamped log lines (one per batch).
        actor_restarts: restarts of a crashed actor; 0 by default because a
            rerun of a read-only preprocessing job is cheap and safe.
    """
    import ray.data

    if method == "tasks":
        return ds.map_batches(preprocess_batch, batch_size=batch_size, fn_kwargs={
            "bucket": bucket, "skip_counter_name": skip_counter_name, "log_dir": log_dir})
    if method == "actors":
        with warnings.catch_warnings():
            # max_restarts is a plain remote argument in Ray 2.60 (named ones come in 2.64). With
            # restarts on, Ray's core worker prints an error-level line for every actor pool.
            warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
            return ds.map_batches(
                ObjectPreprocessor, batch_size=batch_size,
                fn_constructor_kwargs={"bucket": bucket, "threads": threads,
                                       "skip_counter_name": skip_counter_name, "log_dir": log_dir},
                compute=ray.data.ActorPoolStrategy(size=num_actors),
                max_restarts=actor_restarts,
            )
    raise ParameterError(f"method must be 'tasks' or 'actors', not {method!r}.")


# --- the faster alternatives: Ray's own readers ------------------------------------------

def s3_filesystem(settings: Settings | None = None):
    """A ``pyarrow.fs.S3FileSystem`` for the configured store (endpoint and scheme set explicitly)."""
    from pyarrow import fs

    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # no EC2 metadata probe off AWS
    settings = settings or load_settings()
    settings.require_object_store()
    return fs.S3FileSystem(
        endpoint_override=settings.s3_host, scheme="https" if settings.s3_secure else "http",
        access_key=settings.s3_access_key, secret_key=settings.s3_secret_key,
        region=settings.s3_region, allow_bucket_creation=False,
    )


def _normalise_images(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    pixels = np.asarray(batch["image"], dtype=np.float32).reshape(-1, 1, 28, 28)
    return {"X": (pixels / 255.0 - 0.5) / 0.5, "y": np.asarray(batch["label"], dtype=np.int64)}


def read_images_dataset(bucket: str, split: str = "train", keys: Sequence[str] | None = None,
                        settings: Settings | None = None):
    """Images via ``ray.data.read_images`` over pyarrow S3, the label from the folder name (notebook 03).

    Without ``keys`` Ray lists ``<bucket>/<split>/`` itself; with them it reads
    exactly those objects (the same pointers the other readers get). The label
    comes from directory partitioning (``<split>/<label>/<id>.png``).
    """
    import ray.data
    from ray.data.datasource import Partitioning

    partitioning = Partitioning("dir", base_dir=f"{bucket}/{split}", field_names=["label"],
                                field_types={"label": int})
    paths = [f"{bucket}/{key}" for key in keys] if keys is not None else f"{bucket}/{split}/"
    ds = ray.data.read_images(paths, filesystem=s3_filesystem(settings), mode="L", partitioning=partitioning)
    return ds.map_batches(_normalise_images, batch_size=1000)


PACKED_PREFIX = "packed"


def pack_parquet_shards(bucket: str, X: Sequence[str], y: Sequence[int], split: str = "train",
                        num_shards: int = 4, threads: int = 16, settings: Settings | None = None) -> list[str]:
    """Write the objects behind ``X`` as a few Parquet shards (``packed/<split>/part-NNN.parquet``).

    Each row holds the key, the label and the encoded image bytes. Reading a
    few large objects costs a few requests instead of one per image.

    Returns:
        The shard keys written.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    settings = settings or load_settings()
    client = get_client(settings, max_connections=threads)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        bodies = list(pool.map(lambda key: read_object(client, bucket, key), X))
    filesystem = s3_filesystem(settings)
    prefix = f"{PACKED_PREFIX}/{split}"
    old = [o.object_name for o in client.list_objects(bucket, prefix=prefix + "/", recursive=True)]
    for key in old:
        client.remove_object(bucket, key)
    keys = []
    for shard, rows in enumerate(np.array_split(np.arange(len(X)), num_shards)):
        table = pa.table({
            "key": pa.array([X[i] for i in rows], pa.string()),
            "label": pa.array([int(y[i]) for i in rows], pa.int64()),
            "image": pa.array([bodies[i] for i in rows], pa.binary()),
        })
        key = f"{prefix}/part-{shard:03d}.parquet"
        pq.write_table(table, f"{bucket}/{key}", filesystem=filesystem)
        keys.append(key)
    return keys


def _decode_packed(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"X": decode_images(list(batch["image"])), "y": np.asarray(batch["label"], dtype=np.int64)}


def read_parquet_dataset(bucket: str, split: str = "train", settings: Settings | None = None):
    """The packed shards via ``ray.data.read_parquet``, decoded to the same batches as the other readers."""
    import ray.data

    ds = ray.data.read_parquet(f"{bucket}/{PACKED_PREFIX}/{split}/", filesystem=s3_filesystem(settings))
    ds = ds.select_columns(["label", "image"])
    return ds.map_batches(_decode_packed, batch_size=1000)
