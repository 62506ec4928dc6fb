"""Generated from notebooks/03_ray_data_preprocessing.ipynb by `python -m workshop.export`: edit the notebook.

Lesson 03 · Preprocess from pointers with Ray Data. Above each definition, the cell that teaches it.
"""
import io
import os
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
import numpy as np
from PIL import Image
from helpers.settings import ParameterError, Settings, check_count, load_settings
from helpers.listing import get_train_test_data, split_validation
from helpers.preprocess_support import create_logger, node_id, remove_superseded, skip_counter, started_last
from helpers.storage import (REPAIR_HINT, ObjectDecodeError, ObjectMissing, StorageError, get_client,
                             mark_complete, read_object, s3_filesystem, smoke_sizes)


# From notebooks/03_ray_data_preprocessing.ipynb, cell 10 (id 6a49e3aa).
def to_ray_dataset(X: Sequence[str], y: Sequence[int], override_num_blocks: int | None = None,
                   numbered: bool = False):
    """Pointers and labels as a Ray Dataset of ``{"X": key, "y": label}`` rows (notebook 03).

    ``numbered`` adds each row's position as ``"row"``, to put rows back in order after a pipeline.
    """
    import ray.data

    if len(X) != len(y):
        raise ParameterError(f"X has {len(X)} pointers but y has {len(y)} labels; they must align.")
    if len(X) == 0:
        raise ParameterError("No pointers: list the bucket first (helpers.listing.get_train_test_data).")
    items = [{"X": str(key), "y": int(label), **({"row": i} if numbered else {})}
             for i, (key, label) in enumerate(zip(X, y, strict=True))]
    return ray.data.from_items(items, override_num_blocks=override_num_blocks)


# From notebooks/03_ray_data_preprocessing.ipynb, cell 13 (id fe5dbbce).
def normalise(pixels) -> np.ndarray:
    """``uint8`` digits -> ``float32 [n, 1, 28, 28]`` in [-1, 1], as ToTensor + Normalize((0.5,), (0.5,))."""
    return (np.asarray(pixels, dtype=np.float32).reshape(-1, 1, 28, 28) / 255.0 - 0.5) / 0.5


# From notebooks/03_ray_data_preprocessing.ipynb, cell 15 (id 1f377da9).
def decode_images(bodies: Sequence[bytes]) -> np.ndarray:
    """Encoded images -> ``float32 [n, 1, 28, 28]`` in [-1, 1]."""
    return normalise(np.stack([np.asarray(Image.open(io.BytesIO(body)).convert("L")) for body in bodies]))


# From notebooks/03_ray_data_preprocessing.ipynb, cell 17 (id 09e1b997).
def fetch_decode(client, bucket: str, key: str) -> np.ndarray:
    """One object fetched and decoded to ``uint8 [28, 28]``.

    Raises:
        ObjectDecodeError: the object is missing or not a 28x28 image; the message names its key.
        StorageError: the store is unreachable or refuses the keys (never skipped: that is an outage).
    """
    try:
        body = read_object(client, bucket, key)
    except ObjectMissing as err:  # one object: skippable; an outage or a wrong key is not, and raises as it is
        raise ObjectDecodeError(f"Object '{key}' could not be fetched: {err}") from None
    try:
        image = np.asarray(Image.open(io.BytesIO(body)).convert("L"))
    except Exception as err:
        raise ObjectDecodeError(f"Object '{key}' in bucket '{bucket}' is not a readable image "
                                f"({type(err).__name__}). {REPAIR_HINT}") from None
    if image.shape != (28, 28):
        raise ObjectDecodeError(f"Object '{key}' in bucket '{bucket}' is {image.shape[1]}x{image.shape[0]} pixels, "
                                f"not 28x28. {REPAIR_HINT}")
    return image


# From notebooks/03_ray_data_preprocessing.ipynb, cell 19 (id 23090795).
def to_batch(keys, labels, images: list, skip_counter_name: str | None,
             extra: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Stack decoded images into ``{"X": float32 [n, 1, 28, 28], "y": int64 [n]}``; errors raise or are counted.

    ``extra`` columns (a row number, say) come along for the rows that are kept.
    """
    kept = {name: np.asarray(values)[[not isinstance(i, Exception) for i in images]]
            for name, values in (extra or {}).items()}
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
        ray.get(skip_counter(skip_counter_name).add.remote(failed))
    if not good_images:
        return {"X": np.zeros((0, 1, 28, 28), np.float32), "y": np.zeros(0, np.int64), **kept}
    return {"X": normalise(np.stack(good_images)), "y": np.asarray(good_labels, dtype=np.int64), **kept}


# From notebooks/03_ray_data_preprocessing.ipynb, cell 21 (id c1fed585).
def preprocess_batch(batch: dict[str, np.ndarray], bucket: str, skip_counter_name: str | None = None,
                     log_dir: str | None = None) -> dict[str, np.ndarray]:
    """The original article's task function, corrected: fetch each object of the batch, decode, normalise.

    Opens one client per batch and fetches one object after another, as the article did.
    """
    started = time.perf_counter()
    client = get_client(load_settings(), max_connections=1)
    images = []
    for key in batch["X"]:
        try:
            images.append(fetch_decode(client, bucket, str(key)))
        except ObjectDecodeError as err:
            images.append(err)
    out = to_batch(batch["X"], batch["y"], images, skip_counter_name)
    if log_dir:
        create_logger(log_dir).info(
            f"task on node {node_id()}: {len(batch['X'])} objects in {time.perf_counter() - started:.2f} s")
    return out


# From notebooks/03_ray_data_preprocessing.ipynb, cell 25 (id 7b52009b).
class ObjectPreprocessor:
    """The actor form: one client per actor, a batch's objects fetched concurrently (notebook 03)."""

    def __init__(self, bucket: str, threads: int = 16, skip_counter_name: str | None = None,
                 log_dir: str | None = None) -> None:
        self.bucket = bucket
        self.client = get_client(load_settings(), max_connections=threads)
        self.pool = ThreadPoolExecutor(max_workers=threads)
        self.skip_counter_name = skip_counter_name
        self.log_dir = log_dir

    def _fetch(self, key: str):
        try:
            return fetch_decode(self.client, self.bucket, key)
        except ObjectDecodeError as err:
            return err

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Fetch and decode one batch (``{"X": keys, "y": labels}``)."""
        started = time.perf_counter()
        images = list(self.pool.map(self._fetch, [str(k) for k in batch["X"]]))
        out = to_batch(batch["X"], batch["y"], images, self.skip_counter_name,
                       {name: column for name, column in batch.items() if name not in ("X", "y")})
        if self.log_dir:
            create_logger(self.log_dir).info(
                f"actor on node {node_id()}: {len(batch['X'])} objects in {time.perf_counter() - started:.2f} s")
        return out


# From notebooks/03_ray_data_preprocessing.ipynb, cell 27 (id e393ed1f).
def preprocess_with_actors(ds, bucket: str, batch_size: int = 400, num_actors: int = 2, threads: int = 16,
                           skip_counter_name: str | None = None, log_dir: str | None = None, num_cpus: float = 1.0):
    """Lazily map a pointer dataset to image tensors with a pool of ``num_actors`` actors (notebooks 03-07).

    Each actor reserves ``num_cpus`` (mostly it waits for the network: notebook 07 asks for half a CPU).
    """
    check_count("batch_size", batch_size, 100_000)
    check_count("num_actors", num_actors, 1024)
    check_count("threads", threads, 256)
    with warnings.catch_warnings():
        # max_restarts is a plain remote argument in this Ray version, which warns about those.
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        return ds.map_batches(
            ObjectPreprocessor,
            batch_size=batch_size,
            concurrency=num_actors,  # the actor pool's size
            num_cpus=num_cpus,
            fn_constructor_kwargs={"bucket": bucket, "threads": threads,
                                   "skip_counter_name": skip_counter_name, "log_dir": log_dir},
            max_restarts=0,
        )


PACKED_PREFIX = "packed"


# From notebooks/03_ray_data_preprocessing.ipynb, cell 37 (id 91032ad7).
def normalise_images(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``read_images`` rows (``image`` uint8, ``label``) -> the same batches as the other readers."""
    return {"X": normalise(batch["image"]), "y": np.asarray(batch["label"], dtype=np.int64)}


# From notebooks/03_ray_data_preprocessing.ipynb, cell 39 (id 0999c23f).
def read_images_dataset(bucket: str, split: str = "train", keys: Sequence[str] | None = None, *,
                        settings: Settings):
    """Images via ``ray.data.read_images`` over pyarrow S3, the label from the folder name (notebook 03).

    Without ``keys`` Ray lists ``<bucket>/<split>/`` itself; with them it reads exactly those objects.
    """
    import ray.data
    from ray.data.datasource import Partitioning

    partitioning = Partitioning("dir", base_dir=f"{bucket}/{split}", field_names=["label"],
                                field_types={"label": int})
    paths = [f"{bucket}/{key}" for key in keys] if keys is not None else f"{bucket}/{split}/"
    ds = ray.data.read_images(paths, filesystem=s3_filesystem(settings), mode="L", partitioning=partitioning)
    return ds.map_batches(normalise_images, batch_size=1000)


# From notebooks/03_ray_data_preprocessing.ipynb, cell 41 (id 8465a912).
def fetch_rows(batch: dict[str, np.ndarray], bucket: str) -> dict[str, np.ndarray]:
    """Pointer rows -> what a Parquet shard stores: key, label and the decoded ``uint8 [28, 28]`` pixels.

    Decoding once here, not on every read, leaves a reader nothing to do but read and scale.
    """
    client = get_client(load_settings(), max_connections=16)
    with ThreadPoolExecutor(16) as pool:
        pixels = list(pool.map(lambda key: fetch_decode(client, bucket, str(key)), batch["X"]))
    return {"key": batch["X"], "label": np.asarray(batch["y"], dtype=np.int64), "pixels": np.stack(pixels)}


CURRENT_FILE = "CURRENT"  # names the folder of the complete set of shards


# From notebooks/03_ray_data_preprocessing.ipynb, cell 43 (id c69fb787).
def pack_parquet_shards(ds, bucket: str, split: str = "train", num_shards: int = 4, *,
                        settings: Settings) -> str:
    """Write the objects behind a pointer dataset as ``num_shards`` Parquet files under ``packed/<split>/<version>/``.

    Each row holds the key, the label and the decoded pixels (``uint8 [28, 28]``). The new
    shards go to a fresh folder; only when all are written does ``packed/<split>/CURRENT`` name it.
    An interrupted packing leaves the previous shards readable.

    Returns:
        The folder (``<bucket>/packed/<split>/<version>``) :func:`read_parquet_dataset` now reads.
    """
    check_count("num_shards", num_shards, 10_000)
    filesystem = s3_filesystem(settings)
    base = f"{bucket}/{PACKED_PREFIX}/{split}"
    version = f"{datetime.now(UTC):%Y%m%d-%H%M%S-%f}-{os.urandom(2).hex()}"  # sorts by start time
    rows = ds.map_batches(fetch_rows, batch_size=1000, fn_kwargs={"bucket": bucket})
    rows.repartition(num_shards).write_parquet(f"{base}/{version}", filesystem=filesystem)
    mark_complete(filesystem, f"{base}/{version}")
    if started_last(filesystem, base, version, CURRENT_FILE):  # of two packings at once, the later one
        with filesystem.open_output_stream(f"{base}/{CURRENT_FILE}") as out:  # the swap: one small PUT
            out.write(version.encode())
    remove_superseded(filesystem, base, CURRENT_FILE)  # keeps CURRENT's folder, the one before, newer ones
    with filesystem.open_input_stream(f"{base}/{CURRENT_FILE}") as current:
        return f"{base}/{current.read().decode()}"


# From notebooks/03_ray_data_preprocessing.ipynb, cell 45 (id 5dcfbbac).
def packed_path(bucket: str, split: str = "train", *, settings: Settings) -> str:
    """The folder of the current packed shards of ``split``.

    Raises:
        StorageError: nothing was packed yet (the message names the call that packs).
    """
    base = f"{bucket}/{PACKED_PREFIX}/{split}"
    try:
        with s3_filesystem(settings).open_input_stream(f"{base}/{CURRENT_FILE}") as current:
            return f"{base}/{current.read().decode().strip()}"
    except FileNotFoundError:
        raise StorageError(f"No packed shards under {base}/: pack them first with "
                           "pack_parquet_shards(ds, bucket, settings=settings) (notebook 03).") from None


# From notebooks/03_ray_data_preprocessing.ipynb, cell 47 (id 4bc26bfb).
def scale_packed(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Packed rows (``pixels`` uint8, ``label``) -> the same normalised batches as the other readers."""
    return {"X": normalise(batch["pixels"]), "y": np.asarray(batch["label"], dtype=np.int64)}


# From notebooks/03_ray_data_preprocessing.ipynb, cell 49 (id 02681b21).
def read_parquet_dataset(bucket: str, split: str = "train", *, settings: Settings):
    """The packed shards via ``ray.data.read_parquet``, scaled to the same batches as the other readers.

    Raises:
        StorageError: the shards hold no ``pixels`` column (packed by an older version: pack them again).
    """
    import pyarrow.parquet as pq
    import ray.data
    from pyarrow import fs

    folder, filesystem = packed_path(bucket, split, settings=settings), s3_filesystem(settings)
    shards = sorted(f.path for f in filesystem.get_file_info(fs.FileSelector(folder)) if f.path.endswith(".parquet"))
    columns = pq.read_schema(shards[0], filesystem=filesystem).names if shards else []
    if "pixels" not in columns:
        raise StorageError(f"The shards under {folder}/ hold {columns}, not decoded 'pixels': they were packed "
                           "by an older version. Pack them again with "
                           "pack_parquet_shards(ds, bucket, settings=settings).")
    # The shard files by name (listed here, in one request) and one read task per shard, so the shards
    # are read in parallel.
    ds = ray.data.read_parquet(shards, filesystem=filesystem, override_num_blocks=len(shards))
    return ds.select_columns(["label", "pixels"]).map_batches(scale_packed, batch_size=4096)


# From notebooks/03_ray_data_preprocessing.ipynb, cell 56 (id 887309d0).
def shuffle_pointers(X: Sequence[str], y: Sequence[int], seed: int = 0) -> tuple[list[str], list[int]]:
    """The same pointers in a seeded random order (listings come back sorted by label)."""
    order = np.random.default_rng(seed).permutation(len(X))
    return [X[i] for i in order], [int(y[i]) for i in order]


# From notebooks/03_ray_data_preprocessing.ipynb, cell 58 (id 47f5ccdf).
def pointers_to_datasets(bucket: str, *splits: tuple[Sequence[str], Sequence[int]], num_actors: int = 2,
                         batch_size: int = 400):
    """``(keys, labels)`` of each split -> preprocessed, materialised Ray Datasets, one per split, rows in order.

    All splits go through one actor pipeline (one pool of actors to start, not one per split) with each
    row's number, and are cut apart by it: Ray Data does not promise that blocks come out in the
    order they went in.
    """
    import pyarrow as pa
    import ray.data

    check_count("num_actors", num_actors, 1024)
    numbered = to_ray_dataset([k for keys, _ in splits for k in keys], [y for _, ys in splits for y in ys],
                              numbered=True)
    rows = preprocess_with_actors(numbered, bucket, batch_size=batch_size, num_actors=num_actors)
    # Back in row order in the driver: the rows fit (220 MB at full size, 70,000 rows of 784 floats), while Ray
    # Data's sort, a distributed shuffle, spent 15 s starting tasks and processes at smoke size on two cores.
    # from_blocks keeps the blocks as they are and needs no task to read their metadata.
    table = pa.concat_tables(rows.iter_batches(batch_size=None, batch_format="pyarrow")).sort_by("row")
    table, parts, start = table.drop_columns(["row"]), [], 0
    for keys, _ in splits:
        part, start = table.slice(start, len(keys)), start + len(keys)
        parts.append(ray.data.from_blocks([part.slice(i, batch_size) for i in range(0, max(len(keys), 1), batch_size)]))
    return tuple(parts)


# From notebooks/03_ray_data_preprocessing.ipynb, cell 60 (id 44cbc843).
def load_datasets(bucket: str, smoke_test_size: int, settings: Settings, num_actors: int = 2,
                  seed: int = 0, batch_size: int = 400):
    """A bucket's pointers -> preprocessed, materialised Ray Datasets ``(train, validation, test)`` (04, 05).

    The validation images are notebook 02's (training images from MNIST index 50,000); the training pointers
    are shuffled (seeded): listings come back sorted by label. Runs on the Ray the caller started
    (``cluster.init_ray``): reading data is no reason to start one.
    """
    check_count("num_actors", num_actors, 1024)  # before any data is read
    smoke_sizes(smoke_test_size)
    x_train, y_train, x_test, y_test, _ = get_train_test_data(bucket, smoke_test_size, "manifest",
                                                              get_client(settings))
    train, validation = split_validation(x_train, y_train)
    return pointers_to_datasets(bucket, shuffle_pointers(*train, seed), validation, (x_test, y_test),
                                num_actors=num_actors, batch_size=batch_size)


# From notebooks/03_ray_data_preprocessing.ipynb, cell 62 (id dd871ece).
def dataset_to_numpy(ds) -> tuple[np.ndarray, np.ndarray]:
    """All ``X`` and ``y`` of a (small, materialised) dataset as numpy arrays."""
    xs, ys = [], []
    for batch in ds.iter_batches(batch_size=None):
        xs.append(batch["X"])
        ys.append(batch["y"])
    return np.concatenate(xs), np.concatenate(ys)
