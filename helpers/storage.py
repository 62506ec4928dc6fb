"""The object store's plumbing: a client, one clear error per user mistake, and small shared pieces (all notebooks).

Notebook 01 teaches the MinIO calls themselves (``bucket_exists``,
``put_object``, listings); this module holds what every notebook needs and
no learner has to read: a client with a sized connection pool and timeouts,
translation of SDK and network errors into one line naming the fix,
parameter checks, and a ``pyarrow`` S3 filesystem for Ray's readers.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import time
from collections.abc import Iterable, Iterator

import numpy as np
import urllib3
from minio import Minio
from minio.deleteobjects import DeleteObject
from minio.error import S3Error

from helpers.errors import TutorialError
from helpers.mnist import FIRST_VALIDATION_ID, TEST_SIZE, TRAIN_SIZE
from helpers.settings import ParameterError, Settings, check_count, load_settings


class StorageError(TutorialError, RuntimeError):
    """An object-store problem a user can fix; the message says how."""


class ObjectStoreUnreachable(StorageError):
    """Nothing answers at the configured endpoint."""


class ObjectStoreFailing(StorageError):
    """The object store answers, but with server errors (HTTP 5xx) to every try."""


class BadCredentials(StorageError):
    """The object store rejected the access key or secret."""


class BucketNotFound(StorageError):
    """The bucket does not exist."""


class ObjectDecodeError(StorageError):
    """An object could not be fetched or decoded; the message names its key."""


class ObjectMissing(StorageError):
    """One object is not in the bucket (the store itself answered)."""


# What to do about an object that is not the image it should be.
REPAIR_HINT = ("Repair it: run helpers.upload.upload_mnist(bucket, smoke_test_size) again (notebook 01), which "
               "re-uploads every object that differs from MNIST, or delete the object.")

# The data keys: train/5/00000.png. Anything else under train/ or test/ is not an image of the data set.
IMAGE_KEY = re.compile(r"(train|test)/[0-9]/[^/]+\.(png|jpeg)")
IMAGE_KEY_SHAPE = "<train|test>/<label 0-9>/<id>.<png|jpeg>"
_reported_strays: set[tuple[str, str]] = set()


def image_keys(keys: Iterable[str], bucket: str = "") -> list[str]:
    """The keys of ``keys`` that are data set images (``train/5/00000.png``), in their order (notebooks 01-06).

    A key ending in ``/`` is a folder marker that some stores leave behind (an empty object), not an
    object: it is dropped. Any other key under ``train/`` or ``test/`` that is not an image key (a
    ``train/notes.txt`` someone dropped in) is left out too, and named once, with the fix, the first
    time this process sees it. Keys outside ``train/`` and ``test/`` (the manifest, packed shards,
    checkpoints) are not data and pass unnoticed.
    """
    images, strays = [], []
    for key in keys:
        if IMAGE_KEY.fullmatch(key):
            images.append(key)
        elif not key.endswith("/") and key.split("/", 1)[0] in ("train", "test"):
            strays.append(key)
    new = [key for key in strays if (bucket, key) not in _reported_strays]
    if new:
        _reported_strays.update((bucket, key) for key in new)
        many = len(new) > 1
        names = ", ".join(repr(key) for key in new[:3]) + (f" and {len(new) - 3} more" if len(new) > 3 else "")
        where = f" in bucket '{bucket}'" if bucket else ""
        print(f"Skipped {len(new)} object{'s' * many}{where} that {'are' if many else 'is'} not "
              f"{'images' if many else 'an image'} of the data set: {names}. Data keys are {IMAGE_KEY_SHAPE}; "
              f"move or delete {'them' if many else 'it'} to silence this.")
    return images


# What pyarrow's S3 client (Ray Train's checkpoints, Ray Data's readers) says when nothing answers.
_NO_CONNECTION = re.compile(r"AWS Error NETWORK_CONNECTION|curlCode: 7|Could not connect to server")
_WHERE = re.compile(r"Failed to connect to (\S+) port (\d+)")


def outage_during(error: BaseException, doing: str = "training") -> ObjectStoreUnreachable | None:
    """The one-line error for a Ray run that failed because the object store stopped answering, else None.

    Ray Train reports a worker's failed checkpoint upload as a ``WorkerGroupError`` holding the worker's
    whole traceback, which ends in pyarrow's ``AWS Error NETWORK_CONNECTION``; Ray Tune reports a trial's
    failed checkpoint sync in its result grid's errors, with the same words.
    """
    text = str(error)
    if not _NO_CONNECTION.search(text):
        return None
    where = _WHERE.search(text)
    endpoint = f"http://{where.group(1)}:{where.group(2)}" if where else "the configured endpoint"
    return ObjectStoreUnreachable(
        f"The object store at {endpoint} stopped answering during {doing}. Start it again (`python -m "
        "workshop.stack up`), then run the cells again: a training run resumes from its last checkpoint in the "
        "bucket, a sweep starts over.")


# Buckets the tutorial's own state lives in: deleting one needs force=True.
PROTECTED_BUCKETS = frozenset({"mnist", "mlflow", "lakefs"})
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
BUCKET_RULES = ("3-63 characters of lowercase letters, digits, dots and hyphens, starting and ending with a "
                "letter or digit, no '..', not an IP address")


def check_bucket_name(bucket: object) -> str:
    """``bucket`` when it follows the S3 naming rules, else one :class:`ParameterError` quoting them."""
    if not isinstance(bucket, str) or not _BUCKET_NAME.fullmatch(bucket) or ".." in bucket or _is_ip(bucket):
        raise ParameterError(f"{bucket!r} is not a valid bucket name: S3 bucket names are {BUCKET_RULES}.")
    return bucket


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def get_client(settings: Settings | None = None, max_connections: int = 32, retries: int = 2) -> Minio:
    """A MinIO SDK client for the configured object store (notebooks 01-03).

    Args:
        settings: where the store is; :func:`helpers.settings.load_settings` by default.
        max_connections: HTTP connection pool size; match it to the number of
            threads that share the client, or requests queue for a connection.
        retries: retries of a failed request before giving up.

    Raises:
        SettingsError: no object store is configured (the message names the fix).
    """
    check_count("max_connections", max_connections, 1024)
    check_count("retries", retries, 20, minimum=0)
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


def endpoint_of(client: Minio) -> str:
    """The endpoint a client talks to, for error messages."""
    return getattr(client, "tutorial_endpoint", str(client._base_url.host))


def translate_error(err: Exception, client: Minio, bucket: str | None = None) -> Exception:
    """Turn a low-level SDK/network error into one clear :class:`StorageError` (or return it unchanged)."""
    endpoint = endpoint_of(client)
    if isinstance(err, S3Error):
        if err.code in {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken"}:
            return BadCredentials(
                f"The object store at {endpoint} rejected the credentials ({err.code}). Check S3_ACCESS_KEY "
                "and S3_SECRET_KEY; the embedded stack's keys are in .stack/stack.env."
            )
        if err.code == "NoSuchBucket":
            return bucket_not_found(endpoint, bucket or err.bucket_name)
        return err
    if isinstance(err, urllib3.exceptions.MaxRetryError) and isinstance(err.reason, urllib3.exceptions.ResponseError):
        return ObjectStoreFailing(
            f"The object store at {endpoint} answered every try with a server error ({err.reason}). A full disk "
            "is the usual cause: the embedded stack's store stops writing when less than 1% of its disk is free "
            "(its log: .stack/logs/seaweedfs.log). Free some space, then run the cell again."
        )
    if isinstance(err, (urllib3.exceptions.MaxRetryError, urllib3.exceptions.ProtocolError,
                        urllib3.exceptions.NewConnectionError, ConnectionError)):
        return ObjectStoreUnreachable(
            f"Cannot reach the object store at {endpoint}. Start the embedded stack with "
            "`python -m workshop.stack up` (or `make stack-up`), or point S3_ENDPOINT at a running server."
        )
    return err


def bucket_not_found(endpoint: str, bucket: str | None) -> BucketNotFound:
    """The error for a missing bucket, naming the notebook that creates it."""
    return BucketNotFound(
        f"Bucket '{bucket}' does not exist at {endpoint}. Upload the data first: "
        "helpers.upload.upload_mnist(bucket=...) (notebook 01)."
    )


@contextlib.contextmanager
def object_store_errors(client: Minio, bucket: str | None = None) -> Iterator[None]:
    """Re-raise SDK/network errors inside the block as one clear :class:`StorageError`.

    Raises:
        ParameterError: ``bucket`` breaks the S3 naming rules (checked before any request).
    """
    if bucket is not None:
        check_bucket_name(bucket)
    try:
        yield
    except (S3Error, urllib3.exceptions.HTTPError, ConnectionError) as err:
        clear = translate_error(err, client, bucket)
        if clear is err:
            raise
        raise clear from None


def ensure_bucket(client: Minio, bucket: str) -> bool:
    """Create ``bucket`` if it is missing. Returns True when it was created (safe when two callers race)."""
    with object_store_errors(client, bucket):
        if client.bucket_exists(bucket):
            return False
        try:
            client.make_bucket(bucket)
        except S3Error as err:
            if err.code in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                return False  # another notebook created it between the two calls
            for _ in range(30):  # SeaweedFS answers a create that races another's with other codes: it comes
                if client.bucket_exists(bucket):
                    return False
                time.sleep(0.1)
            raise
        return True


def delete_bucket(client: Minio, bucket: str, force: bool = False) -> int:
    """Delete every object of ``bucket`` and then the bucket. Returns the number of objects deleted.

    Raises:
        ParameterError: ``bucket`` holds the tutorial's data, MLflow's artifacts or lakeFS's repositories
            (:data:`PROTECTED_BUCKETS`) and ``force`` is not True.
    """
    if bucket in PROTECTED_BUCKETS and force is not True:
        raise ParameterError(f"Bucket '{bucket}' holds the tutorial's data, MLflow artifacts or lakeFS "
                             "repositories: pass force=True to delete it anyway.")
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


def smoke_sizes(smoke_test_size: int) -> tuple[int, int, int]:
    """Training, validation and test image counts for a smoke size: 600 gives 600, 1,000 and 2,000 (0: all of MNIST).

    Measuring is cheap and few images make every comparison noise: 5/3 and 10/3 as many, up to 10,000 each.
    Raises ParameterError for a size that is negative, above 50,000, or not an integer.
    """
    if isinstance(smoke_test_size, bool) or not isinstance(smoke_test_size, (int, np.integer)):
        raise ParameterError(f"smoke_test_size must be an integer, not {smoke_test_size!r}.")
    if not 0 <= smoke_test_size <= FIRST_VALIDATION_ID:
        raise ParameterError(
            f"smoke_test_size={smoke_test_size} is out of range: use 0 for the full data set "
            f"or a number of training images between 1 and {FIRST_VALIDATION_ID:,}."
        )
    n = int(smoke_test_size) or FIRST_VALIDATION_ID  # 0: every training image, and so the most of the others
    return n, min(TRAIN_SIZE - FIRST_VALIDATION_ID, -(-n * 5 // 3)), min(TEST_SIZE, -(-n * 10 // 3))


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
                raise ObjectMissing(f"Object '{key}' is missing from bucket '{bucket}'.") from None
            raise
        try:
            return response.read()
        finally:
            response.close()
            response.release_conn()


def s3_filesystem(settings: Settings | None = None):
    """A ``pyarrow.fs.S3FileSystem`` for the configured store (notebooks 03-05: Ray's readers and storage_path).

    The endpoint and scheme are set explicitly: pyarrow does not read a
    custom endpoint from the environment everywhere.
    """
    from pyarrow import fs

    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # no EC2 metadata probe off AWS
    settings = settings or load_settings()
    settings.require_object_store()
    return fs.S3FileSystem(
        endpoint_override=settings.s3_host, scheme="https" if settings.s3_secure else "http",
        access_key=settings.s3_access_key, secret_key=settings.s3_secret_key,
        region=settings.s3_region, allow_bucket_creation=False,
    )


COMPLETE_MARKER = "_SUCCESS"  # Hadoop's and Spark's name for "every file of this folder is written"


def mark_complete(filesystem, folder: str) -> None:
    """Write the marker that says every file under ``folder`` is written; the last step of a folder's writer."""
    with filesystem.open_output_stream(f"{folder}/{COMPLETE_MARKER}") as out:
        out.write(b"")


def is_complete(filesystem, folder: str) -> bool:
    """Whether ``folder`` holds the marker its writer leaves once every file is written."""
    from pyarrow import fs

    return filesystem.get_file_info(f"{folder}/{COMPLETE_MARKER}").type == fs.FileType.File


def require_complete(filesystem, folder: str, rerun: str) -> str:
    """``folder`` when its writer finished; otherwise one error naming ``rerun``, the call that writes it whole.

    A write cut off half-way (an error, a stopped kernel) leaves some files and no marker; reading
    them as the whole would count a part as the result.
    """
    if not is_complete(filesystem, folder):
        raise StorageError(f"s3://{folder}/ is incomplete: its writer stopped before the end (no {COMPLETE_MARKER}). "
                           f"{rerun}")
    return folder
