"""What notebook 01's upload calls in one line, kept out of the lesson.

The lesson is the upload itself: a client, a plan of keys, a thread pool, and
skipping what exists. Around it:

* append rounds (``append=True``): a marker object in the bucket remembers the
  round in progress, so an interrupted round is finished by the next call, and
  each round's ids are UUIDs derived from the round id;
* repair: objects whose size or ETag says they hold other bytes than their
  image are found from the listing alone and uploaded again;
* one image format per bucket, and one clear line when an upload is cut off;
* the manifest merged with a conditional write, so two uploads finishing at once both land in it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import random
import time
import uuid
from collections.abc import Callable, Iterable, Mapping

from minio import Minio
from minio.error import S3Error

from helpers.settings import ParameterError
from helpers.storage import ObjectMissing, StorageError, object_store_errors, read_object, translate_error

APPEND_MARKER_KEY = "_manifest/append-in-progress.json"
_APPEND_NAMESPACE = uuid.UUID("6f1d1c1e-2b7a-4f0e-9d1e-3c5a7b9e0f42")


def append_object_id(append_round: str, split: str, index: int) -> str:
    """The id of image ``index`` of ``split`` in an append round: new for each round, the same on a resume."""
    return str(uuid.uuid5(_APPEND_NAMESPACE, f"{append_round}/{split}/{index}"))


def _read_marker(client: Minio, bucket: str) -> dict | None:
    try:
        marker = json.loads(read_object(client, bucket, APPEND_MARKER_KEY))
        return {k: marker[k] for k in ("round", "smoke_test_size", "image_format")}
    except ObjectMissing:
        return None
    except (ValueError, TypeError, KeyError):
        raise StorageError(
            f"The append marker {APPEND_MARKER_KEY} in bucket '{bucket}' is damaged. Delete it "
            f"(client.remove_object({bucket!r}, {APPEND_MARKER_KEY!r})) and run again: the unfinished "
            "round's objects stay, and a new round starts.") from None


def start_or_resume_append(client: Minio, bucket: str, smoke_test_size: int,
                           image_format: str) -> tuple[str, int, str, bool]:
    """Begin a new append round, or pick up the one an interrupted call left behind.

    Returns the round's id, size and format, and whether it is new (nothing of it can be in the bucket yet).
    """
    with object_store_errors(client, bucket):
        marker = _read_marker(client, bucket)
        new = marker is None
        if not new:
            print(f"Resuming the unfinished append round {marker['round'][:8]} "
                  f"(smoke_test_size={marker['smoke_test_size']}, {marker['image_format']}): an interrupted "
                  "call left it, or another upload runs it now and the two share its objects.")
        else:
            marker = {"round": uuid.uuid4().hex, "smoke_test_size": int(smoke_test_size),
                      "image_format": image_format}
            body = json.dumps(marker).encode()
            client.put_object(bucket, APPEND_MARKER_KEY, io.BytesIO(body), len(body),
                              content_type="application/json")
    return marker["round"], marker["smoke_test_size"], marker["image_format"], new


def _read_manifest(client: Minio, bucket: str, manifest_key: str) -> tuple[set[str], str | None]:
    """The keys the manifest names and its ETag; (set(), None) where there is none, (set(), etag) where damaged."""
    try:
        response = client.get_object(bucket, manifest_key)
    except S3Error as err:
        if err.code == "NoSuchKey":
            return set(), None
        raise
    try:
        etag = response.headers.get("ETag")
        try:
            return {key for key in gzip.decompress(response.read()).decode().split("\n") if key}, etag
        except (OSError, EOFError, UnicodeDecodeError):
            return set(), etag
    finally:
        response.close()
        response.release_conn()


# AWS answers a conditional write that lost a race with either of these; SeaweedFS and MinIO with the first.
_LOST_THE_RACE = ("PreconditionFailed", "ConditionalRequestConflict")


def merge_manifest(client: Minio, bucket: str, manifest_key: str, keys: Iterable[str], attempts: int = 40) -> int:
    """Write the manifest as ``keys`` plus what it names now, unless somebody wrote it meanwhile: then merge again.

    Two uploads that finish at once both read the old manifest, and a plain PUT keeps only the last
    one's keys. This PUT is conditional on the manifest read (``If-Match`` on its ETag, or
    ``If-None-Match: *`` where there was none), so the slower writer is refused, reads the new manifest
    and merges. Returns how many keys the written manifest names.
    """
    keys = set(keys)
    for attempt in range(attempts):
        listed, etag = _read_manifest(client, bucket, manifest_key)
        merged = sorted(keys | listed)
        body = gzip.compress("\n".join(merged).encode(), compresslevel=6)
        condition = {"If-Match": etag} if etag else {"If-None-Match": "*"}
        try:  # minio's put_object takes no request headers: the plain PutObject call takes them
            client._put_object(bucket, manifest_key, body, {"Content-Type": "application/gzip", **condition})
            return len(merged)
        except S3Error as err:
            if err.code not in _LOST_THE_RACE:
                raise
        time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
    raise StorageError(f"The manifest {manifest_key} of bucket '{bucket}' changed under each of {attempts} writes; "
                       "another upload keeps rewriting it. Run the call again once that upload is done.")


def manifest_objects(client: Minio, bucket: str, manifest_key: str) -> dict[str, tuple[int, str]]:
    """The image keys the bucket's manifest names (one GET), without size or ETag; {} where none is readable.

    What a new append round needs to know of the bucket: its keys are new, so nothing of it can be
    damaged or present; the others only go into the new manifest and the one-format check. Every
    upload that finished wrote the manifest, so it names them in one request, where a listing of the
    whole bucket grows with every round (10 s at 210,000 objects, a seventh of a round's upload).
    """
    try:  # none, damaged or not reachable: {}, and the caller lists the bucket (and says why)
        with object_store_errors(client, bucket):
            listed, _ = _read_manifest(client, bucket, manifest_key)
    except (S3Error, StorageError):
        return {}
    return {key: (-1, "") for key in listed}


def finish_append(client: Minio, bucket: str) -> None:
    """Mark the append round done (its marker object goes)."""
    with object_store_errors(client, bucket):
        client.remove_object(bucket, APPEND_MARKER_KEY)


def check_one_format(bucket: str, existing: Iterable[str], image_format: str) -> None:
    """Refuse to mix PNG and JPEG in one bucket: the same image twice would make every listing count it twice."""
    others = sorted({key.rsplit(".", 1)[-1] for key in existing} - {image_format})
    if others:
        raise ParameterError(
            f"Bucket '{bucket}' already holds {others[0]} images; one image format per bucket. Use "
            f"image_format={others[0]!r}, or another bucket for {image_format}.")


def damaged_keys(existing: Mapping[str, tuple[int, str]], plan: Iterable[tuple[str, str, int]],
                 body_of: Callable[[str, int], bytes]) -> set[str]:
    """Planned keys that exist with other bytes than ``body_of(split, index)``, told by size and ETag (no GET).

    Encoding an image always gives the same bytes, and a single-part upload's ETag is the MD5 of its
    bytes; a multipart ETag (``"<md5>-<parts>"``) is not, and there the size has to do.
    """
    damaged = set()
    for key, split, index in plan:
        if key not in existing:
            continue
        size, etag = existing[key]
        body = body_of(split, index)
        if size != len(body) or ("-" not in etag and etag != hashlib.md5(body).hexdigest()):
            damaged.add(key)
    return damaged


def raise_interrupted(err: BaseException, done: int, total: int, client: Minio, bucket: str) -> None:
    """Re-raise an upload's failure (or the kernel's interrupt) with how far it got and how to resume."""
    again = "Nothing is lost: run the same call again to upload only the missing objects."
    if isinstance(err.__context__, KeyboardInterrupt):  # the press landed in a lock's release, which then failed
        err = err.__context__
    if not isinstance(err, Exception):  # KeyboardInterrupt: stop, as asked
        print(f"Upload interrupted after {done:,} of {total:,} objects. {again}")
        raise err
    raise StorageError(f"Upload interrupted after {done:,} of {total:,} objects: "
                       f"{translate_error(err, client, bucket)} {again}") from None


def manifest_covers(client: Minio, bucket: str, manifest_key: str, plan: Iterable[tuple[str, str, int]]) -> int:
    """How many planned objects there are when the bucket's manifest names every planned key (one GET); else 0.

    ``upload_mnist(..., verify=False)`` trusts that answer: it lists and compares nothing. A planned key the
    manifest does not name, or no readable manifest, means 0: the call then lists and compares as usual.
    """
    listed = manifest_objects(client, bucket, manifest_key)
    keys = [key for key, _, _ in plan]
    return len(keys) if listed and all(key in listed for key in keys) else 0
