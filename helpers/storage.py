"""MNIST in an S3 bucket: upload, list and split into pointer lists (notebooks 01 and 02).

Objects are laid out as in the seed article: ``train/<label>/<id>.<ext>`` and
``test/<label>/<id>.<ext>``, one image per object. The driver only ever
handles *pointers* (object keys); workers fetch the bytes later.

Three ways to list them are offered, from the seed's one recursive listing to
a manifest object that turns a listing into one GET.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Literal

import numpy as np
import urllib3
from minio import Minio
from minio.deleteobjects import DeleteObject
from minio.error import S3Error
from PIL import Image
from tqdm.auto import tqdm

from helpers.config import ParameterError, Settings, load_settings
from helpers.mnist import TEST_SIZE, TRAIN_SIZE, load_mnist

SPLITS = ("train", "test")
MANIFEST_KEY = "_manifest/objects.txt.gz"
APPEND_MARKER_KEY = "_manifest/append-in-progress.json"
_APPEND_NAMESPACE = uuid.UUID("6f1d1c1e-2b7a-4f0e-9d1e-3c5a7b9e0f42")
ListingMethod = Literal["recursive", "parallel", "manifest"]


class StorageError(RuntimeError):
    """An object-store problem a user can fix; the message says how."""


class ObjectStoreUnreachable(StorageError):
    """Nothing answers at the configured endpoint."""


class BadCredentials(StorageError):
    """The object store rejected the access key or secret."""


class BucketNotFound(StorageError):
    """The bucket does not exist."""


class MalformedKeyError(StorageError, ValueError):
    """An object under ``train/`` or ``test/`` does not follow ``<split>/<label>/<id>.<ext>``."""


@dataclass(frozen=True)
class UploadReport:
    """What :func:`upload_mnist` did: objects planned, uploaded, already present, and how long it took."""

    bucket: str
    planned: int
    uploaded: int
    skipped: int
    seconds: float
    mode: str

    @property
    def objects_per_second(self) -> float:
        """Upload throughput (uploaded objects / wall seconds)."""
        return self.uploaded / self.seconds if self.seconds else 0.0

    def __str__(self) -> str:
        if self.uploaded == 0:
            return (f"Nothing to upload: all {self.planned:,} objects are already in bucket "
                    f"'{self.bucket}' ({self.mode} mode).")
        return (f"Uploaded {self.uploaded:,} objects to '{self.bucket}' in {self.seconds:.1f} s "
                f"({self.objects_per_second:,.0f} objects/s); {self.skipped:,} were already there.")


# --- client and errors -------------------------------------------------------------

def get_client(settings: Settings | None = None, max_connections: int = 32, retries: int = 2) -> Minio:
    """A MinIO SDK client for the configured object store (notebooks 01-03).

    Args:
        settings: where the store is; :func:`helpers.config.load_settings` by default.
        max_connections: HTTP connection pool size; match it to the number of
            threads that share the client, or requests queue for a connection.
        retries: retries of a failed request before giving up.

    Raises:
        ConfigError: no object store is configured (the message names the fix).
    """
    settings = settings or load_settings()
    settings.require_object_store()
    http = urllib3.PoolManager(
        maxsize=max_connections,
        block=True,
        timeout=urllib3.Timeout(connect=3, read=60),
        retries=urllib3.Retry(total=retries, backoff_factor=0.2, status_forcelist=(500, 502, 503, 504)),
    )
    client = Minio(
        settings.s3_host,
        access_key=settings.s3_access_key,
        secret_key=settings.s3_secret_key,
        secure=settings.s3_secure,
        region=settings.s3_region,
        http_client=http,
    )
    client.tutorial_endpoint = settings.s3_url  # kept for error messages
    return client


def _endpoint(client: Minio) -> str:
    return getattr(client, "tutorial_endpoint", str(client._base_url.host))


def translate_error(err: Exception, client: Minio, bucket: str | None = None) -> Exception:
    """Turn a low-level SDK/network error into one clear :class:`StorageError` (or return it unchanged)."""
    endpoint = _endpoint(client)
    if isinstance(err, S3Error):
        if err.code in {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken"}:
            return BadCredentials(
                f"The object store at {endpoint} rejected the credentials ({err.code}). Check S3_ACCESS_KEY "
                "and S3_SECRET_KEY; the embedded stack's keys are in .stack/stack.env."
            )
        if err.code == "NoSuchBucket":
            return _bucket_not_found(endpoint, bucket or err.bucket_name)
        return err
    if isinstance(err, (urllib3.exceptions.MaxRetryError, urllib3.exceptions.ProtocolError,
                        urllib3.exceptions.NewConnectionError, ConnectionError)):
        return ObjectStoreUnreachable(
            f"Cannot reach the object store at {endpoint}. Start the embedded stack with "
            "`python -m helpers.stack up` (or `make stack-up`), or point S3_ENDPOINT at a running server."
        )
    return err


def _bucket_not_found(endpoint: str, bucket: str | None) -> BucketNotFound:
    return BucketNotFound(
        f"Bucket '{bucket}' does not exist at {endpoint}. Upload the data first: "
        "helpers.storage.upload_mnist(bucket=...) (notebook 01)."
    )


@contextlib.contextmanager
def object_store_errors(client: Minio, bucket: str | None = None) -> Iterator[None]:
    """Re-raise SDK/network errors inside the block as one clear :class:`StorageError`."""
    try:
        yield
    except (S3Error, urllib3.exceptions.HTTPError, ConnectionError) as err:
        clear = translate_error(err, client, bucket)
        if clear is err:
            raise
        raise clear from None


def ensure_bucket(client: Minio, bucket: str) -> bool:
    """Create ``bucket`` if it is missing. Returns True when it was created."""
    with object_store_errors(client, bucket):
        if client.bucket_exists(bucket):
            return False
        client.make_bucket(bucket)
        return True


def delete_bucket(client: Minio, bucket: str) -> int:
    """Delete every object of ``bucket`` and then the bucket. Returns the number of objects deleted."""
    with object_store_errors(client, bucket):
        if not client.bucket_exists(bucket):
            return 0
        names = [o.object_name for o in client.list_objects(bucket, recursive=True)]
        for start in range(0, len(names), 1000):
            errors = list(client.remove_objects(bucket, (DeleteObject(n) for n in names[start:start + 1000])))
            if errors:
                raise StorageError(f"Could not delete {len(errors)} objects from '{bucket}': {errors[0]}")
        client.remove_bucket(bucket)
    return len(names)


# --- planning the upload -------------------------------------------------------------

def smoke_sizes(smoke_test_size: int) -> tuple[int, int]:
    """Train and test image counts for a smoke size (0 = the full 60,000 + 10,000).

    The test split keeps MNIST's 6:1 ratio, so ``smoke_test_size=600`` gives 600 + 100.

    Raises:
        ValueError: the size is negative, above 60,000, or not an integer.
    """
    if isinstance(smoke_test_size, bool) or not isinstance(smoke_test_size, (int, np.integer)):
        raise ParameterError(f"smoke_test_size must be an integer, not {smoke_test_size!r}.")
    if not 0 <= smoke_test_size <= TRAIN_SIZE:
        raise ParameterError(
            f"smoke_test_size={smoke_test_size} is out of range: use 0 for the full data set "
            f"or a number of training images between 1 and {TRAIN_SIZE:,}."
        )
    if smoke_test_size == 0:
        return TRAIN_SIZE, TEST_SIZE
    return int(smoke_test_size), max(1, min(TEST_SIZE, round(smoke_test_size / 6)))


def plan_keys(smoke_test_size: int = 0, image_format: str = "png",
              append_round: str | None = None) -> list[tuple[str, str, int]]:
    """The objects an upload should create: ``(key, split, index into the MNIST array)``.

    Without ``append_round`` ids are the MNIST index (``train/5/00000.png``),
    so a repeated upload names the same objects and adds nothing. With one,
    ids are UUIDs derived from the round, new for each round yet stable when
    an interrupted round is resumed.
    """
    data = load_mnist()
    out = []
    for split, count in zip(SPLITS, smoke_sizes(smoke_test_size), strict=True):
        labels = data.split(split)[1]
        for index in range(count):
            if append_round is None:
                object_id = f"{index:05d}"
            else:
                object_id = str(uuid.uuid5(_APPEND_NAMESPACE, f"{append_round}/{split}/{index}"))
            out.append((f"{split}/{int(labels[index])}/{object_id}.{image_format}", split, index))
    return out


def encode_image(image: np.ndarray, image_format: str = "png") -> bytes:
    """Encode one ``uint8 [28, 28]`` digit as PNG (lossless) or JPEG (like the seed)."""
    buffer = io.BytesIO()
    if image_format == "png":
        Image.fromarray(image).save(buffer, format="PNG")
    elif image_format in {"jpeg", "jpg"}:
        Image.fromarray(image).save(buffer, format="JPEG", quality=95)
    else:
        raise ParameterError(f"image_format must be 'png' or 'jpeg', not {image_format!r}.")
    return buffer.getvalue()


# --- upload --------------------------------------------------------------------------

def upload_mnist(
    bucket: str = "mnist",
    smoke_test_size: int = 0,
    image_format: str = "png",
    append: bool = False,
    max_workers: int = 16,
    client: Minio | None = None,
    progress: bool = True,
) -> UploadReport:
    """Upload MNIST, one image per object, in parallel (notebook 01).

    Idempotent by default: object ids are the MNIST index, objects already in
    the bucket are skipped, so a second call uploads nothing and an
    interrupted call resumes where it stopped. ``append=True`` behaves like
    the seed's script instead: each call adds another set of objects with
    fresh UUIDs (70,000 at full size), which grows a benchmark data set; an
    interrupted append round is finished by the next append call.

    Args:
        bucket: target bucket (created if missing).
        smoke_test_size: number of training images (0 = all 60,000); the test
            split gets one sixth of it.
        image_format: ``"png"`` (lossless, default) or ``"jpeg"`` (the seed's choice).
        append: add a new set of objects instead of completing the canonical one.
        max_workers: parallel uploads (threads sharing one connection pool).
        client: a client from :func:`get_client`; one is made by default.
        progress: show a tqdm progress bar.

    Returns:
        An :class:`UploadReport` (printable).

    Raises:
        ValueError: bad smoke size or image format.
        StorageError: store unreachable, wrong credentials, or the upload was
            interrupted (the message says to run the same call again).
    """
    image_format = "jpeg" if image_format == "jpg" else image_format
    encode_image(np.zeros((28, 28), np.uint8), image_format)  # validates the format up front
    smoke_sizes(smoke_test_size)
    client = client or get_client(max_connections=max_workers)
    ensure_bucket(client, bucket)  # also the connection and credentials check (no ListAllMyBuckets needed)

    append_round = None
    if append:
        append_round, smoke_test_size, image_format = _start_or_resume_append(
            client, bucket, smoke_test_size, image_format)
    plan = plan_keys(smoke_test_size, image_format, append_round)
    existing = set(list_objects_parallel(bucket, client=client))
    missing = [item for item in plan if item[0] not in existing]

    started = time.perf_counter()
    if missing:
        _put_all(client, bucket, missing, image_format, max_workers, progress)
    seconds = time.perf_counter() - started

    write_manifest(client, bucket, sorted(existing | {key for key, _, _ in plan}))
    if append:
        with object_store_errors(client, bucket):
            client.remove_object(bucket, APPEND_MARKER_KEY)
    return UploadReport(bucket, len(plan), len(missing), len(plan) - len(missing), seconds,
                        "append" if append else "idempotent")


def _start_or_resume_append(client: Minio, bucket: str, smoke_test_size: int,
                            image_format: str) -> tuple[str, int, str]:
    """Begin a new append round, or pick up the one an interrupted call left behind."""
    with object_store_errors(client, bucket):
        try:
            response = client.get_object(bucket, APPEND_MARKER_KEY)
            try:
                marker = json.loads(response.read())
            finally:
                response.close()
                response.release_conn()
            print(f"Resuming the unfinished append round {marker['round'][:8]} "
                  f"(smoke_test_size={marker['smoke_test_size']}, {marker['image_format']}).")
            return marker["round"], marker["smoke_test_size"], marker["image_format"]
        except S3Error as err:
            if err.code != "NoSuchKey":
                raise
        marker = {"round": uuid.uuid4().hex, "smoke_test_size": int(smoke_test_size),
                  "image_format": image_format}
        body = json.dumps(marker).encode()
        client.put_object(bucket, APPEND_MARKER_KEY, io.BytesIO(body), len(body),
                          content_type="application/json")
    return marker["round"], marker["smoke_test_size"], marker["image_format"]


def _put_all(client: Minio, bucket: str, items: list[tuple[str, str, int]], image_format: str,
             max_workers: int, progress: bool) -> None:
    data = load_mnist()
    content_type = f"image/{image_format}"

    def put(item: tuple[str, str, int]) -> None:
        key, split, index = item
        body = encode_image(data.split(split)[0][index], image_format)
        client.put_object(bucket, key, io.BytesIO(body), len(body), content_type=content_type)

    done = 0
    bar = tqdm(total=len(items), desc=f"upload to {bucket}", unit="obj", disable=not progress)
    with ThreadPoolExecutor(max_workers=max_workers) as pool:
        pending = {pool.submit(put, item) for item in items}
        try:
            while pending:
                finished, pending = wait(pending, timeout=1.0, return_when=FIRST_EXCEPTION)
                for future in finished:
                    future.result()
                    done += 1
                bar.update(len(finished))
        except Exception as err:
            for future in pending:
                future.cancel()
            clear = translate_error(err, client, bucket)
            raise StorageError(
                f"Upload interrupted after {done:,} of {len(items):,} objects: {clear} "
                "Nothing is lost: run the same call again to upload only the missing objects."
            ) from None
        finally:
            bar.close()


# --- manifest ---------------------------------------------------------------------------

def write_manifest(client: Minio, bucket: str, keys: Iterable[str]) -> int:
    """Write the manifest object: every data key of the bucket, one per line, gzipped.

    Listing through it is one GET instead of many LIST pages. Returns the number of keys.
    """
    keys = [k for k in keys if k.startswith(("train/", "test/"))]
    body = gzip.compress("\n".join(keys).encode(), compresslevel=6)
    with object_store_errors(client, bucket):
        client.put_object(bucket, MANIFEST_KEY, io.BytesIO(body), len(body), content_type="application/gzip")
    return len(keys)


# --- listing --------------------------------------------------------------------------

def get_object_list(bucket: str = "mnist", client: Minio | None = None) -> list[str]:
    """Every key in the bucket from one recursive listing, as in the seed (notebook 02).

    The server returns 1,000 keys per page, so 70,000 objects take 70
    sequential round trips: simple, and the slowest of the three listings.
    """
    client = client or get_client()
    with object_store_errors(client, bucket):
        return [obj.object_name for obj in client.list_objects(bucket, recursive=True)]


def list_objects_parallel(bucket: str = "mnist", client: Minio | None = None,
                          max_workers: int = 20) -> list[str]:
    """Data keys listed by label prefix (``train/0/`` ... ``test/9/``), 20 listings at once (notebook 02)."""
    client = client or get_client(max_connections=max_workers)
    prefixes = [f"{split}/{label}/" for split in SPLITS for label in range(10)]

    def list_prefix(prefix: str) -> list[str]:
        with object_store_errors(client, bucket):
            return [o.object_name for o in client.list_objects(bucket, prefix=prefix, recursive=True)]

    with ThreadPoolExecutor(max_workers=max_workers) as pool:
        return [key for keys in pool.map(list_prefix, prefixes) for key in keys]


def list_objects_from_manifest(bucket: str = "mnist", client: Minio | None = None) -> list[str]:
    """Data keys read from the manifest object written at upload time: one GET (notebook 02).

    Raises:
        StorageError: the bucket has no manifest (upload with :func:`upload_mnist`).
    """
    client = client or get_client()
    with object_store_errors(client, bucket):
        try:
            response = client.get_object(bucket, MANIFEST_KEY)
        except S3Error as err:
            if err.code == "NoSuchKey":
                raise StorageError(
                    f"Bucket '{bucket}' has no manifest ({MANIFEST_KEY}). It is written by "
                    "helpers.storage.upload_mnist(); or list with listing='parallel'."
                ) from None
            raise
        try:
            text = gzip.decompress(response.read()).decode()
        finally:
            response.close()
            response.release_conn()
    return text.split("\n") if text else []


LISTINGS = {
    "recursive": get_object_list,
    "parallel": list_objects_parallel,
    "manifest": list_objects_from_manifest,
}


# --- split into pointer lists ----------------------------------------------------------

def split_train_test(objects: Iterable[str]) -> tuple[list[str], list[int], list[str], list[int]]:
    """Split keys into ``X_train, y_train, X_test, y_test`` from the key's path (notebook 02).

    The label is the second path segment (``train/7/x.png`` -> 7), read with
    ``split('/')``; the seed read one character at a fixed position, which
    breaks for any other layout. Keys outside ``train/`` and ``test/``
    (such as the manifest) are not images and are ignored.

    Raises:
        MalformedKeyError: a ``train/``/``test/`` key is malformed; the message names it.
    """
    out: dict[str, tuple[list[str], list[int]]] = {"train": ([], []), "test": ([], [])}
    for key in objects:
        parts = key.split("/")
        if parts[0] not in out:
            continue
        if len(parts) != 3 or not parts[1].isdigit() or int(parts[1]) > 9 or "." not in parts[2]:
            raise MalformedKeyError(
                f"Malformed object key {key!r}: expected '<train|test>/<label 0-9>/<id>.<ext>'. "
                "Remove or rename that object."
            )
        out[parts[0]][0].append(key)
        out[parts[0]][1].append(int(parts[1]))
    (x_train, y_train), (x_test, y_test) = out["train"], out["test"]
    return x_train, y_train, x_test, y_test


def _smoke_subset(keys: list[str], labels: list[int], count: int) -> tuple[list[str], list[int]]:
    """The first ``count`` pointers ordered by object id (for canonical ids: the MNIST order)."""
    order = sorted(range(len(keys)), key=lambda i: (keys[i].rsplit("/", 1)[-1], keys[i]))[:count]
    return [keys[i] for i in order], [labels[i] for i in order]


def get_train_test_data(
    bucket: str = "mnist",
    smoke_test_size: int = 0,
    listing: ListingMethod = "recursive",
    client: Minio | None = None,
) -> tuple[list[str], list[int], list[str], list[int], float]:
    """List the bucket and split it into pointer lists, timed, like the seed (notebook 02).

    Args:
        bucket: bucket holding the uploaded MNIST objects.
        smoke_test_size: keep only this many training pointers (and a sixth as
            many test pointers), in MNIST order; 0 keeps everything.
        listing: ``"recursive"`` (the seed's), ``"parallel"`` (by label prefix)
            or ``"manifest"`` (one GET).
        client: a client from :func:`get_client`; one is made by default.

    Returns:
        ``X_train, y_train, X_test, y_test, load_time_sec``.

    Raises:
        ValueError: bad smoke size or listing name.
        StorageError: store unreachable, bad credentials, missing bucket or manifest.
    """
    if listing not in LISTINGS:
        raise ParameterError(f"listing must be one of {sorted(LISTINGS)}, not {listing!r}.")
    n_train, n_test = smoke_sizes(smoke_test_size)
    client = client or get_client()
    started = time.perf_counter()
    with object_store_errors(client, bucket):
        if not client.bucket_exists(bucket):
            raise _bucket_not_found(_endpoint(client), bucket)
    x_train, y_train, x_test, y_test = split_train_test(LISTINGS[listing](bucket, client=client))
    if smoke_test_size:
        x_train, y_train = _smoke_subset(x_train, y_train, n_train)
        x_test, y_test = _smoke_subset(x_test, y_test, n_test)
    return x_train, y_train, x_test, y_test, time.perf_counter() - started


def count_objects(bucket: str = "mnist", client: Minio | None = None) -> dict[str, int]:
    """Number of objects per ``<split>/<label>`` prefix, e.g. ``{"train/0": 5923, ...}`` (notebook 01)."""
    keys = list_objects_parallel(bucket, client=client)
    return dict(sorted(Counter(key.rsplit("/", 1)[0] for key in keys).items()))


def bucket_usage(bucket: str, prefix: str = "", client: Minio | None = None) -> dict[str, int]:
    """Objects and bytes stored under ``prefix`` of ``bucket`` (notebook 06: an import copies nothing)."""
    client = client or get_client()
    objects = size = 0
    with object_store_errors(client, bucket):
        for obj in client.list_objects(bucket, prefix=prefix or None, recursive=True):
            objects += 1
            size += int(obj.size or 0)
    return {"objects": objects, "bytes": size}


# --- single objects ------------------------------------------------------------------------

def read_object(client: Minio, bucket: str, key: str) -> bytes:
    """The bytes of one object; the connection goes back to the pool either way.

    Raises:
        StorageError: the object is missing (the message names its key), or the store is unreachable.
    """
    with object_store_errors(client, bucket):
        try:
            response = client.get_object(bucket, key)
        except S3Error as err:
            if err.code == "NoSuchKey":
                raise StorageError(f"Object '{key}' is missing from bucket '{bucket}'.") from None
            raise
        try:
            return response.read()
        finally:
            response.close()
            response.release_conn()


def fetch_image(bucket: str, key: str, client: Minio | None = None) -> np.ndarray:
    """Download one image object and decode it to a ``uint8 [28, 28]`` array (notebook 02)."""
    body = read_object(client or get_client(), bucket, key)
    return np.asarray(Image.open(io.BytesIO(body)).convert("L"))
