"""Generated from notebooks/02_list_and_split.ipynb by `python -m workshop.export`: edit the notebook.

Lesson 02 · List the bucket and split it into pointer lists. Above each definition, the cell that teaches it.
"""
import gzip
import io
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Literal
import numpy as np
from minio import Minio
from minio.error import S3Error
from PIL import Image
from helpers.settings import ParameterError, check_count
from helpers.mnist import FIRST_VALIDATION_ID
from helpers.storage import (StorageError, bucket_not_found, endpoint_of, get_client, image_keys,
                             object_store_errors, read_object, smoke_sizes)
from helpers.upload import MANIFEST_KEY, SPLITS


# From notebooks/02_list_and_split.ipynb, cell 8 (id fba25c0c).
def get_object_list(bucket: str = "mnist", client: Minio | None = None) -> list[str]:
    """Every key in the bucket from one recursive listing, as in the original article (notebook 02)."""
    client = client or get_client()
    with object_store_errors(client, bucket):
        return [obj.object_name for obj in client.list_objects(bucket, recursive=True)]


# From notebooks/02_list_and_split.ipynb, cell 11 (id fe5dbbce).
def split_train_test(objects, bucket: str = "") -> tuple[list[str], list[int], list[str], list[int]]:
    """Split image keys into ``X_train, y_train, X_test, y_test`` by each key's path (notebook 02).

    ``train/5/00000.png`` is a training image of a 5. Keys that are not images of the data set (a stray
    ``train/notes.txt``, a folder marker ``train/x/``) are left out, and named once (``image_keys``).
    """
    out: dict[str, tuple[list[str], list[int]]] = {"train": ([], []), "test": ([], [])}
    for key in image_keys(objects, bucket):
        split, label, _ = key.split("/")  # the label is a path segment: never read it by character position
        out[split][0].append(key)
        out[split][1].append(int(label))
    (x_train, y_train), (x_test, y_test) = out["train"], out["test"]
    return x_train, y_train, x_test, y_test


# From notebooks/02_list_and_split.ipynb, cell 14 (id 17ba0791).
def fetch_image(bucket: str, key: str, client: Minio | None = None) -> np.ndarray:
    """Download one image object and decode it to a ``uint8 [28, 28]`` array (notebook 02)."""
    body = read_object(client or get_client(), bucket, key)
    return np.asarray(Image.open(io.BytesIO(body)).convert("L"))


# From notebooks/02_list_and_split.ipynb, cell 17 (id fa35e192).
def list_objects_parallel(bucket: str = "mnist", client: Minio | None = None, threads: int = 20) -> list[str]:
    """Data keys listed by label prefix (``train/0/`` ... ``test/9/``), 20 listings at once (notebook 02).

    Two more listings, one level deep under ``train/`` and ``test/``, find what the label
    prefixes cannot see (an object or folder that is not a label 0-9), which is named once and left out.
    """
    check_count("threads", threads, 256)
    client = client or get_client(max_connections=threads)
    prefixes = [f"{split}/{label}/" for split in SPLITS for label in range(10)]

    def list_prefix(prefix: str) -> list[str]:
        with object_store_errors(client, bucket):
            return [o.object_name for o in client.list_objects(bucket, prefix=prefix, recursive=True)]

    with object_store_errors(client, bucket):
        strays = [o.object_name for split in SPLITS for o in client.list_objects(bucket, prefix=f"{split}/")
                  if o.object_name not in prefixes]
    image_keys([key for stray in strays for key in (list_prefix(stray) if stray.endswith("/") else [stray])],
               bucket)  # says what is left out
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return [key for keys in pool.map(list_prefix, prefixes) for key in keys]


# From notebooks/02_list_and_split.ipynb, cell 19 (id 480dfdbf).
def list_objects_from_manifest(bucket: str = "mnist", client: Minio | None = None) -> list[str]:
    """Data keys read from the manifest object written at upload time: one GET (notebook 02).

    Raises:
        StorageError: the bucket has no manifest (it is written by ``helpers.upload.upload_mnist``).
    """
    client = client or get_client()
    with object_store_errors(client, bucket):
        try:
            response = client.get_object(bucket, MANIFEST_KEY)
        except S3Error as err:
            if err.code == "NoSuchKey":
                raise StorageError(f"Bucket '{bucket}' has no manifest ({MANIFEST_KEY}). It is written by "
                                   "helpers.upload.upload_mnist(); or list with listing='parallel'.") from None
            raise
        try:
            text = gzip.decompress(response.read()).decode()
        except (OSError, EOFError, UnicodeDecodeError):
            raise StorageError(f"The manifest {MANIFEST_KEY} in bucket '{bucket}' is damaged. Run "
                               "helpers.upload.upload_mnist(bucket, ...) again to rewrite it, or list with "
                               "listing='parallel'.") from None
        finally:
            response.close()
            response.release_conn()
    return text.split("\n") if text else []


LISTINGS = {"recursive": get_object_list, "parallel": list_objects_parallel, "manifest": list_objects_from_manifest}


ListingMethod = Literal["recursive", "parallel", "manifest"]


# From notebooks/02_list_and_split.ipynb, cell 21 (id 1574bddb).
def is_canonical(key: str) -> bool:
    """Whether a key's id is an MNIST index (``00042``), not an appended round's UUID."""
    object_id = key.rsplit("/", 1)[-1].split(".", 1)[0]
    return len(object_id) == 5 and object_id.isdigit()


# From notebooks/02_list_and_split.ipynb, cell 23 (id f1809f84).
def smoke_subset(keys: list[str], labels: list[int], count: int) -> tuple[list[str], list[int]]:
    """The first ``count`` images in MNIST order: canonical ids only, each id once.

    Appended rounds' copies (UUID ids) never enter a smoke subset; a bucket that holds
    nothing but appended rounds gives its first keys by id instead.
    """
    canonical = [i for i in range(len(keys)) if is_canonical(keys[i])]
    candidates = canonical or list(range(len(keys)))
    order, seen = [], set()
    for i in sorted(candidates, key=lambda i: (keys[i].rsplit("/", 1)[-1], keys[i])):
        object_id = keys[i].rsplit("/", 1)[-1].split(".", 1)[0]
        if object_id not in seen:
            seen.add(object_id)
            order.append(i)
        if len(order) == count:
            break
    return [keys[i] for i in order], [labels[i] for i in order]


# From notebooks/02_list_and_split.ipynb, cell 25 (id 85623d4b).
def is_validation(key: str) -> bool:
    """Whether a training key is a validation image: MNIST index 50,000 or above (an appended copy: 1 in 6 by id)."""
    object_id = key.rsplit("/", 1)[-1].split(".", 1)[0]
    if is_canonical(key):
        return int(object_id) >= FIRST_VALIDATION_ID
    return zlib.crc32(object_id.encode()) % 6 == 0


# From notebooks/02_list_and_split.ipynb, cell 27 (id 9b969694).
def split_validation(keys: list[str], labels: list[int]):
    """Training pointers -> ``((train keys, labels), (validation keys, labels))``, split by :func:`is_validation`."""
    train, validation = ([], []), ([], [])
    for key, label in zip(keys, labels, strict=True):
        split = validation if is_validation(key) else train
        split[0].append(key)
        split[1].append(label)
    return train, validation


# From notebooks/02_list_and_split.ipynb, cell 29 (id 859da8ff).
def smoke_split(x_train: list[str], y_train: list[int], x_test: list[str], y_test: list[int],
                smoke_test_size: int) -> tuple[list[str], list[int], list[str], list[int]]:
    """The pointers a smoke size names: its training and validation images (both in ``x_train``) and test images.

    0 keeps all; the smoke size gives 5/3 as many validation and 10/3 as many test images (notebook 02).
    """
    if not smoke_test_size:
        return x_train, y_train, x_test, y_test
    n_train, n_val, n_test = smoke_sizes(smoke_test_size)
    (fit, y_fit), (val, y_val) = split_validation(x_train, y_train)
    (fit, y_fit), (val, y_val) = smoke_subset(fit, y_fit, n_train), smoke_subset(val, y_val, n_val)
    return fit + val, y_fit + y_val, *smoke_subset(x_test, y_test, n_test)


# From notebooks/02_list_and_split.ipynb, cell 31 (id aea0160b).
def get_train_test_data(bucket: str = "mnist", smoke_test_size: int = 0, listing: ListingMethod = "recursive",
                        client: Minio | None = None) -> tuple[list[str], list[int], list[str], list[int], float]:
    """List the bucket and split it into pointer lists, timed, like the original article (notebook 02).

    Args:
        bucket: bucket holding the uploaded MNIST objects.
        smoke_test_size: keep this many training pointers, and 5/3 and 10/3 as many validation (among the
            training pointers) and test pointers; 0 keeps all.
        listing: ``"recursive"``, ``"parallel"`` (by label prefix) or ``"manifest"`` (one GET).
        client: a MinIO client; one is made by default.

    Returns:
        ``X_train, y_train, X_test, y_test, load_time_sec``.

    Raises:
        ParameterError: bad smoke size or listing name.
        StorageError: store unreachable, bad credentials, missing bucket or manifest.
    """
    if listing not in LISTINGS:
        raise ParameterError(f"listing must be one of {sorted(LISTINGS)}, not {listing!r}.")
    smoke_sizes(smoke_test_size)  # a bad smoke size fails here, before any listing
    client = client or get_client()
    started = time.perf_counter()
    with object_store_errors(client, bucket):
        if not client.bucket_exists(bucket):
            raise bucket_not_found(endpoint_of(client), bucket)
    pointers = split_train_test(LISTINGS[listing](bucket, client=client), bucket)
    return *smoke_split(*pointers, smoke_test_size), time.perf_counter() - started
