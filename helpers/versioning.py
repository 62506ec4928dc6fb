"""lakeFS plumbing: a checked client and one clear line for every refusal (notebook 06).

Notebook 06 teaches the lakeFS calls themselves (repository, import,
branches, commits with metadata, diff, merge, tags); this module only
connects, with the endpoint and keys from the ``LAKEFS_*`` settings, and
turns the SDK's exceptions into one line that says what to do.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator

from helpers.errors import TutorialError
from helpers.settings import ParameterError, Settings, SettingsError, load_settings

LAKEFS_BUCKET = "lakefs"  # the bucket holding every repository's storage namespace
HOW_TO_GET_LAKEFS = (
    "Run `make run` (or `python -m workshop.stack up --download-lakefs`) where there is internet: it fetches "
    "lakeFS; or start the full stack with `docker compose up -d` (see README); or point LAKEFS_ENDPOINT, "
    "LAKEFS_ACCESS_KEY_ID and LAKEFS_SECRET_ACCESS_KEY at a lakeFS server whose blockstore is S3_ENDPOINT."
)
NAMESPACE_MARKER = "_lakefs/dummy"  # lakeFS writes it into a repository's storage namespace on creation
NAMESPACE_IN_USE = (
    " (deleting a repository keeps its data, so its namespace can't be reused): choose another repository "
    "name, or delete that prefix from the bucket first"
)


class LakeFSError(TutorialError, RuntimeError):
    """lakeFS refused or failed an operation; the message says what to do."""


class LakeFSUnavailable(LakeFSError):
    """No lakeFS is configured, or the configured one does not answer."""


class LakeFSAuthError(LakeFSError):
    """lakeFS answered but rejected the access key or secret."""


_REPOSITORY_NAME = re.compile(r"[a-z0-9][a-z0-9-]{2,62}")


def check_repository_name(name: object) -> str:
    """``name`` when lakeFS accepts it as a repository name, else one :class:`ParameterError` quoting the rule."""
    if not isinstance(name, str) or not _REPOSITORY_NAME.fullmatch(name):
        raise ParameterError(f"{name!r} is not a valid lakeFS repository name: use 3-63 lowercase letters, digits "
                             "and hyphens, starting with a letter or digit.")
    return name


def bound_requests(client, connect_timeout: float = 5.0, read_timeout: float = 120.0) -> None:
    """Give every request of a ``lakefs.Client`` a connect and read timeout.

    The SDK passes no timeout unless a call asks for one, and then a lakeFS that stops answering
    holds the notebook for ever; the wrapper adds one to every request that has none.
    """
    rest = client.sdk_client._api.rest_client
    unbounded = rest.request

    def request(*args, _request_timeout=None, **kwargs):
        return unbounded(*args, _request_timeout=_request_timeout or (connect_timeout, read_timeout), **kwargs)

    rest.request = request


def require_lakefs(settings: Settings) -> None:
    """Raise :class:`LakeFSUnavailable` (with how to get one) unless a lakeFS endpoint and its keys are configured.

    The endpoint and keys come from ``LAKEFS_*`` settings only (passed to ``lakefs.Client`` explicitly, so a
    stray ``~/.lakectl.yaml`` or ``LAKECTL_*`` variable can't redirect the tutorial).
    """
    if not settings.lakefs_endpoint:
        raise LakeFSUnavailable(f"No lakeFS server is configured. {HOW_TO_GET_LAKEFS}")
    if not settings.lakefs_access_key or not settings.lakefs_secret_key:
        raise SettingsError("LAKEFS_ENDPOINT is set but LAKEFS_ACCESS_KEY_ID / LAKEFS_SECRET_ACCESS_KEY are not.")


def check_client(client, settings: Settings, timeout: float = 5.0):
    """``client`` (a ``lakefs.Client``) with bounded requests, once one request showed the server answers.

    Raises:
        LakeFSUnavailable: the server does not answer (in ``timeout`` seconds).
        LakeFSAuthError: the server rejected the keys.
    """
    import urllib3

    bound_requests(client)
    try:
        client.sdk_client.config_api.get_config(_request_timeout=timeout)
    except urllib3.exceptions.HTTPError as err:  # refused / timed out: urllib3's MaxRetryError and friends
        raise LakeFSUnavailable(
            f"lakeFS at {settings.lakefs_endpoint} is not reachable ({type(err).__name__}). {HOW_TO_GET_LAKEFS}"
        ) from None
    except Exception as err:
        status = getattr(err, "status", None)
        if status in (401, 403):
            raise LakeFSAuthError(
                f"lakeFS at {settings.lakefs_endpoint} rejected the access key (HTTP {status}): check "
                "LAKEFS_ACCESS_KEY_ID and LAKEFS_SECRET_ACCESS_KEY (.env or environment)."
            ) from None
        raise LakeFSUnavailable(f"lakeFS at {settings.lakefs_endpoint} answered with an error: {err}") from None
    return client


def connect(settings: Settings | None = None, timeout: float = 5.0):
    """A checked ``lakefs.Client`` for the configured server (notebook 06 shows the same steps one by one).

    Raises:
        LakeFSUnavailable: nothing is configured, or the server does not answer.
        LakeFSAuthError: the server rejected the keys.
    """
    import lakefs

    settings = settings or load_settings()
    require_lakefs(settings)
    client = lakefs.Client(host=settings.lakefs_endpoint, username=settings.lakefs_access_key,
                           password=settings.lakefs_secret_key)
    return check_client(client, settings, timeout)


@contextlib.contextmanager
def lakefs_errors(action: str) -> Iterator[None]:
    """Turn the SDK's exceptions into one :class:`LakeFSError` line that names ``action``."""
    import lakefs.exceptions as lx

    try:
        yield
    except lx.NotAuthorizedException as err:
        raise LakeFSAuthError(f"{action}: lakeFS rejected the keys ({_reason(err)}).") from None
    except lx.LakeFSException as err:
        reason = _reason(err)
        hint = NAMESPACE_IN_USE if "storage namespace already in use" in reason else ""
        raise LakeFSError(f"{action}: {reason}{hint}") from None


def _reason(err: Exception) -> str:
    body = getattr(err, "body", None)  # the SDK parses lakeFS's {"message": ...} when it can
    if isinstance(body, (str, bytes)):
        try:
            body = json.loads(body)
        except ValueError:
            pass
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return str(getattr(err, "reason", None) or err)


def storage_namespace(repo_name: str, bucket: str = LAKEFS_BUCKET) -> str:
    """Where lakeFS keeps a repository's own data: ``s3://lakefs/<repo>``."""
    return f"s3://{bucket}/{repo_name}"


def check_same_object_store(repo, s3_client, s3_endpoint: str) -> None:
    """Raise :class:`LakeFSError` unless lakeFS keeps ``repo``'s data in the object store at ``s3_endpoint``.

    Notebook 06 imports the bucket's objects into lakeFS and reads lakeFS's files
    back by physical address, so lakeFS's blockstore must be this same object
    store. The marker lakeFS writes into every new namespace shows whether it is.
    """
    from minio.error import S3Error

    namespace = repo.properties.storage_namespace.rstrip("/")
    bucket, _, prefix = namespace.removeprefix("s3://").partition("/")
    key = f"{prefix}/{NAMESPACE_MARKER}".lstrip("/")
    try:
        s3_client.stat_object(bucket, key)
    except S3Error as err:
        if err.code not in ("NoSuchKey", "NoSuchBucket"):
            raise
        raise LakeFSError(
            f"lakeFS keeps repository {repo.id!r} in {namespace}, but {s3_endpoint} has no {namespace}/"
            f"{NAMESPACE_MARKER}: that lakeFS stores its data in another object store. Notebook 06 imports from "
            "and reads this bucket directly, so point LAKEFS_ENDPOINT at a lakeFS whose blockstore is S3_ENDPOINT "
            "(docker compose and `python -m workshop.stack up` set theirs up that way)."
        ) from None


def current_import(repo, head, bucket: str, prefixes: tuple[str, ...] | list[str], s3_client) -> int | None:
    """How many objects ``head`` imported, when it holds exactly the bucket's objects under ``prefixes``; else None.

    Exactly: the same keys with the same ETags. An object overwritten in the bucket since is imported
    again, so a commit id always names the bytes it was made from.
    """
    from helpers.storage import object_store_errors

    sources = ",".join(f"s3://{bucket}/{p}" for p in prefixes)
    if head.metadata.get("import_source") != sources:
        return None
    with lakefs_errors(f"listing {head.id[:12]}"):
        held = {o.path: o.checksum for prefix in prefixes for o in repo.ref(head.id).objects(prefix=prefix)}
    with object_store_errors(s3_client, bucket):
        stored = {o.object_name: (o.etag or "").strip('"') for prefix in prefixes
                  for o in s3_client.list_objects(bucket, prefix=prefix, recursive=True)}
    return len(held) if held == stored else None


def wait_for_import(manager, sources: str, timeout: float, poll_seconds: float = 0.5):
    """The finished import's status, polled here.

    Not ``manager.wait()``: that runs ``asyncio.run()``, which fails inside Jupyter's event loop.

    Raises:
        LakeFSError: the import failed (lakeFS's message) or took longer than ``timeout`` seconds (it is
            cancelled then, and nothing was committed).
    """
    import time

    from lakefs.exceptions import ConflictException

    deadline = time.monotonic() + timeout
    while True:
        status = manager.status()
        if status.error is not None:
            raise LakeFSError(f"importing {sources}: {status.error.message}")
        if status.completed:
            return status
        if time.monotonic() > deadline:
            try:
                manager.cancel()
            except ConflictException:  # lakeFS cancels no finished import: it completed since the poll above
                if (status := manager.status()).completed and status.error is None:
                    return status
                raise LakeFSError(f"importing {sources} did not finish within {timeout:.0f} s, and lakeFS refused to "
                                  "cancel it: see the branch in lakeFS, then run it again.") from None
            raise LakeFSError(f"importing {sources} did not finish within {timeout:.0f} s and was cancelled "
                              "(nothing was committed): run it again, with a larger timeout= for a large bucket.")
        time.sleep(poll_seconds)
