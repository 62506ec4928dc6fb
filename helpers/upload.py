"""Generated from notebooks/01_upload_mnist.ipynb by `python -m workshop.export`: edit the notebook.

Lesson 01 · Upload MNIST to an object store. Above each definition, the cell that teaches it.
"""
import functools
import io
import time
from collections.abc import Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np
from minio import Minio
from PIL import Image

from helpers.settings import ParameterError, check_count
from helpers.mnist import FIRST_VALIDATION_ID, load_mnist
from helpers.notebook import progress_bar
from helpers.storage import (check_bucket_name, ensure_bucket, get_client, image_keys, object_store_errors,
                             smoke_sizes)
from helpers.upload_support import (append_object_id, check_one_format, damaged_keys, finish_append,
                                    manifest_covers, manifest_objects, merge_manifest, raise_interrupted,
                                    start_or_resume_append)


# From notebooks/01_upload_mnist.ipynb, cell 13 (id 7b52009b).
def encode_image(image: np.ndarray, image_format: str = "png") -> bytes:
    """Encode one ``uint8 [28, 28]`` digit as PNG or JPEG (the original article's format)."""
    buffer = io.BytesIO()
    if image_format == "png":
        Image.fromarray(image).save(buffer, format="PNG")
    elif image_format in {"jpeg", "jpg"}:
        Image.fromarray(image).save(buffer, format="JPEG", quality=95)
    else:
        raise ParameterError(f"image_format must be 'png' or 'jpeg', not {image_format!r}.")
    return buffer.getvalue()


# From notebooks/01_upload_mnist.ipynb, cell 15 (id 246b941e).
def object_key(split: str, label: int, object_id: str, image_format: str = "png") -> str:
    """The key of one image: ``train/5/00000.png`` (split, label, id)."""
    return f"{split}/{int(label)}/{object_id}.{image_format}"


# From notebooks/01_upload_mnist.ipynb, cell 19 (id a3b8acfa).
def smoke_indices(smoke_test_size: int) -> dict[str, list[int]]:
    """The MNIST indices to upload, per split: the first training, validation and test images.

    Validation images are the training images from index 50,000 on (notebook 02's split).
    """
    n_train, n_val, n_test = smoke_sizes(smoke_test_size)
    return {"train": [*range(n_train), *range(FIRST_VALIDATION_ID, FIRST_VALIDATION_ID + n_val)],
            "test": list(range(n_test))}


SPLITS = ("train", "test")
MANIFEST_KEY = "_manifest/objects.txt.gz"


# From notebooks/01_upload_mnist.ipynb, cell 20 (id f1abd670).
def plan_keys(smoke_test_size: int = 0, image_format: str = "png",
              append_round: str | None = None) -> list[tuple[str, str, int]]:
    """The objects an upload should create: ``(key, split, index into the MNIST array)``."""
    data = load_mnist()
    out = []
    for split, indices in smoke_indices(smoke_test_size).items():
        labels = data.split(split)[1]
        for index in indices:
            object_id = f"{index:05d}" if append_round is None else append_object_id(append_round, split, index)
            out.append((object_key(split, labels[index], object_id, image_format), split, index))
    return out


# From notebooks/01_upload_mnist.ipynb, cell 23 (id 9e6a55b6).
def image_bytes(split: str, index: int, image_format: str = "png") -> bytes:
    """What the object of MNIST image ``index`` of ``split`` holds: the image, encoded."""
    return encode_image(load_mnist().split(split)[0][index], image_format)


# From notebooks/01_upload_mnist.ipynb, cell 25 (id e35b63ba).
def upload_objects(client: Minio, bucket: str, items: list[tuple[str, str, int]], image_format: str = "png",
                   threads: int = 16, progress: bool = True) -> None:
    """PUT every ``(key, split, index)`` of ``items`` with a thread pool (notebook 01).

    A failure raises ``StorageError`` saying how many finished and to run the call again.
    """
    def put(item: tuple[str, str, int]) -> None:
        key, split, index = item
        body = image_bytes(split, index, image_format)
        client.put_object(bucket, key, io.BytesIO(body), len(body), content_type=f"image/{image_format}")

    check_count("threads", threads, 256)
    done = 0
    bar = progress_bar(total=len(items), desc=f"upload to {bucket}", unit="obj", disable=not progress)
    pool = ThreadPoolExecutor(max_workers=threads)
    try:
        pending = {pool.submit(put, item) for item in items}
        while pending:
            finished, pending = wait(pending, timeout=1.0, return_when=FIRST_EXCEPTION)
            for future in finished:
                future.result()  # the first failure raises here
                done += 1
            bar.update(len(finished))
    except BaseException as err:  # a failure or the kernel's interrupt: drop the queued uploads
        try:
            pool.shutdown(wait=True, cancel_futures=True)
        finally:  # a second press while the running uploads finish still says how far it got
            raise_interrupted(err, done, len(items), client, bucket)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # a press that cut the cancel short: nothing queued runs
        bar.close()


# From notebooks/01_upload_mnist.ipynb, cell 27 (id 40bf7886).
def existing_objects(client: Minio, bucket: str) -> dict[str, tuple[int, str]]:
    """``{key: (size, ETag)}`` of every image in the bucket (the listing carries both: no GET).

    Only image keys count (:func:`helpers.storage.image_keys`): a stray ``train/notes.txt`` is named and left alone.
    """
    with object_store_errors(client, bucket):
        listed = {obj.object_name: (obj.size, (obj.etag or "").strip('"')) for split in SPLITS
                  for obj in client.list_objects(bucket, prefix=f"{split}/", recursive=True)}
    return {key: listed[key] for key in image_keys(listed, bucket)}


# From notebooks/01_upload_mnist.ipynb, cell 29 (id 3feb6879).
def existing_keys(client: Minio, bucket: str) -> set[str]:
    """Every data key already in the bucket (one recursive listing per split)."""
    return set(existing_objects(client, bucket))


# From notebooks/01_upload_mnist.ipynb, cell 32 (id 472b07b9).
@dataclass(frozen=True)
class UploadReport:
    """What :func:`upload_mnist` did: objects planned, uploaded, already present, and how long it took."""

    bucket: str
    planned: int
    uploaded: int
    skipped: int
    seconds: float
    mode: str
    repaired: int = 0  # objects that existed with other bytes than the image (corrupt, truncated) and were replaced

    @property
    def objects_per_second(self) -> float:
        """Upload throughput (uploaded objects / wall seconds)."""
        return self.uploaded / self.seconds if self.seconds else 0.0

    def __str__(self) -> str:
        if self.mode == "manifest":
            return (f"Nothing to upload: the manifest of bucket '{self.bucket}' names all {self.planned:,} objects "
                    "(verify=True checks each one).")
        if self.uploaded == 0:
            return (f"Nothing to upload: all {self.planned:,} objects are already in bucket "
                    f"'{self.bucket}' ({self.mode} mode).")
        repaired = f" ({self.repaired:,} of them replaced a damaged object)" if self.repaired else ""
        return (f"Uploaded {self.uploaded:,} objects{repaired} to '{self.bucket}' in {self.seconds:.1f} s "
                f"({self.objects_per_second:,.0f} objects/s); {self.skipped:,} were already there.")


# From notebooks/01_upload_mnist.ipynb, cell 34 (id eff84a7d).
def write_manifest(client: Minio, bucket: str, keys: Iterable[str]) -> int:
    """Add every data key to the bucket's manifest, one gzipped object; returns how many keys it names."""
    keys = [k for k in keys if k.startswith(("train/", "test/"))]
    with object_store_errors(client, bucket):
        return merge_manifest(client, bucket, MANIFEST_KEY, keys)


# From notebooks/01_upload_mnist.ipynb, cell 36 (id ea6a6880).
def upload_mnist(bucket: str = "mnist", smoke_test_size: int = 0, image_format: str = "png", append: bool = False,
                 threads: int = 16, client: Minio | None = None, progress: bool = True,
                 verify: bool = True) -> UploadReport:
    """Upload MNIST, one image per object, in parallel; idempotent and resumable (notebook 01).

    ``smoke_test_size`` training images and 5/3 and 10/3 as many validation and test images (0: all) go to ``bucket`` as
    ``image_format``. Only what is missing or damaged is sent; ``append=True`` adds a new round instead;
    ``verify=False`` trusts a manifest naming every planned key. Raises ``ParameterError``, ``StorageError``.
    """
    image_format = "jpeg" if image_format == "jpg" else image_format
    encode_image(np.zeros((28, 28), np.uint8), image_format)  # checks the format up front
    smoke_sizes(smoke_test_size)
    check_bucket_name(bucket)
    check_count("threads", threads, 256)
    client = client or get_client(max_connections=threads)
    ensure_bucket(client, bucket)  # also the connection and credentials check
    covered = 0 if verify or append else manifest_covers(client, bucket, MANIFEST_KEY,
                                                          plan_keys(smoke_test_size, image_format))
    if covered:  # the manifest names every planned key: one GET, nothing listed or encoded
        return UploadReport(bucket, covered, 0, covered, 0.0, "manifest")
    append_round, new_round = None, False
    if append:  # a new round, or the one an interrupted call left unfinished
        append_round, smoke_test_size, image_format, new_round = start_or_resume_append(
            client, bucket, smoke_test_size, image_format)
    # A new round's keys are all new: the manifest says in one GET what else is there (a listing grows with it)
    existing = (new_round and manifest_objects(client, bucket, MANIFEST_KEY)) or existing_objects(client, bucket)
    check_one_format(bucket, existing, image_format)
    plan = plan_keys(smoke_test_size, image_format, append_round)
    damaged = damaged_keys(existing, plan, functools.partial(image_bytes, image_format=image_format))
    missing = [item for item in plan if item[0] not in existing or item[0] in damaged]
    started = time.perf_counter()
    if missing:
        upload_objects(client, bucket, missing, image_format, threads, progress)
    seconds = time.perf_counter() - started
    write_manifest(client, bucket, sorted(set(existing) | {key for key, _, _ in plan}))
    if append:
        finish_append(client, bucket)
    return UploadReport(bucket, len(plan), len(missing), len(plan) - len(missing), seconds,
                        "append" if append else "idempotent", repaired=len(damaged))


# From notebooks/01_upload_mnist.ipynb, cell 38 (id b28bebbf).
def verify_upload(bucket: str = "mnist", smoke_test_size: int = 0, image_format: str = "png",
                  repair: bool = False, client: Minio | None = None) -> list[str]:
    """Keys of the canonical upload that are missing or differ from their image; with ``repair``, upload them again.

    Returns:
        The keys that were missing or damaged (before any repair), sorted.
    """
    smoke_sizes(smoke_test_size)
    client = client or get_client()
    plan = plan_keys(smoke_test_size, image_format)
    existing = existing_objects(client, bucket)
    body_of = functools.partial(image_bytes, image_format=image_format)
    bad = sorted(damaged_keys(existing, plan, body_of) | {key for key, _, _ in plan if key not in existing})
    if repair and bad:
        wanted = set(bad)
        upload_objects(client, bucket, [item for item in plan if item[0] in wanted], image_format, progress=False)
    return bad
