"""Ray Data preprocessing from pointers, on a real local Ray and the real object store."""

import contextlib
import dataclasses
import io
import ipaddress
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections import Counter

import numpy as np
import psutil
import pytest
import torch

from helpers import cluster, listing, notebook, preprocess, preprocess_support, storage, upload, worker_env
from helpers.mnist import load_mnist
from helpers.ports import port_is_free
from helpers.settings import ParameterError
from workshop import processes, stack_ports

SMOKE = 450  # 450 training pointers: batches of 400 + 50 (and 750 validation images under train/)
VALIDATION = 750


@pytest.fixture(scope="module")
def ray_local(settings):
    cluster.init_ray(settings, num_cpus=2)
    yield
    cluster.shutdown_ray()


@pytest.fixture(scope="module")
def dataset_bucket(client, settings):
    name = f"t-data-{uuid.uuid4().hex[:8]}"
    upload.upload_mnist(name, SMOKE, client=client, progress=False)
    yield name
    storage.delete_bucket(client, name)


@pytest.fixture(scope="module")
def pointers(dataset_bucket, client):
    """The training pointers (notebook 02's validation images set aside), as notebook 03 preprocesses them."""
    x_train, y_train, _, _, _ = listing.get_train_test_data(dataset_bucket, listing="manifest", client=client)
    return listing.split_validation(x_train, y_train)[0]


def run_preprocessing(ds, bucket, method, batch_size=400, num_actors=2, **kwargs):
    """The two preprocessing forms notebook 03 shows: map_batches with the task function or the actor class."""
    if method == "tasks":
        return ds.map_batches(preprocess.preprocess_batch, batch_size=batch_size,
                              fn_kwargs={"bucket": bucket, **kwargs})
    return preprocess.preprocess_with_actors(ds, bucket, batch_size=batch_size, num_actors=num_actors, **kwargs)


def mnist_lookup():
    """Map the bytes of every MNIST training image to its index."""
    images = load_mnist().train_images[:SMOKE]
    return {images[i].tobytes(): i for i in range(len(images))}


def to_uint8(x: np.ndarray) -> np.ndarray:
    return np.rint((x * 0.5 + 0.5) * 255).astype(np.uint8).reshape(-1, 28, 28)


@pytest.mark.parametrize("method", ["tasks", "actors"])
def test_batches_have_the_right_shape_dtype_range_and_count(ray_local, dataset_bucket, pointers, method):
    ds = run_preprocessing(preprocess.to_ray_dataset(*pointers), dataset_bucket, method, batch_size=400, num_actors=2)
    batches = list(ds.iter_torch_batches(batch_size=400, dtypes=torch.float32))
    assert [len(b["y"]) for b in batches] == [400, 50]
    first = batches[0]
    assert first["X"].shape == (400, 1, 28, 28) and first["X"].dtype == torch.float32
    assert first["X"].min() == -1.0 and first["X"].max() == 1.0  # black background and full-ink pixels
    assert first["y"].dtype == torch.float32 and set(first["y"].int().tolist()) <= set(range(10))


@pytest.mark.parametrize("method", ["tasks", "actors"])
def test_labels_stay_aligned_with_their_images(ray_local, dataset_bucket, pointers, method):
    lookup, labels = mnist_lookup(), load_mnist().train_labels
    out = run_preprocessing(preprocess.to_ray_dataset(*pointers), dataset_bucket, method, batch_size=128).materialize()
    seen = []
    for batch in out.iter_batches(batch_size=None):
        for image, label in zip(to_uint8(batch["X"]), batch["y"], strict=True):
            index = lookup[image.tobytes()]  # KeyError: an image that is not in MNIST
            assert int(labels[index]) == int(label)
            seen.append(index)
    assert sorted(seen) == list(range(SMOKE))


def test_normalisation_matches_torchvision(dataset_bucket, client):
    from PIL import Image
    from torchvision import transforms

    body = storage.read_object(client, dataset_bucket, "train/5/00000.png")
    ours = preprocess.decode_images([body])[0]
    theirs = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.5,), (0.5,))])(
        Image.open(io.BytesIO(body)))
    np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-6)


@pytest.fixture
def broken_bucket(client):
    name = f"t-broken-{uuid.uuid4().hex[:8]}"
    upload.upload_mnist(name, 30, client=client, progress=False)
    body = b"this is not a png"
    client.put_object(name, "train/3/corrupt.png", io.BytesIO(body), len(body))
    yield name
    storage.delete_bucket(client, name)


@pytest.mark.parametrize("method", ["tasks", "actors"])
def test_a_corrupt_object_fails_in_one_line_naming_its_key_and_the_repair(ray_local, broken_bucket, client, method):
    x, y, *_ = listing.get_train_test_data(broken_bucket, listing="parallel", client=client)
    with pytest.raises(storage.ObjectDecodeError) as err:  # the worker's own error, not Ray's UserCodeException
        run_preprocessing(preprocess.to_ray_dataset(x, y), broken_bucket, method, batch_size=16).materialize()
    line = notebook.user_error_line(err.value)  # what a notebook shows
    assert "\n" not in line and line.startswith("ObjectDecodeError: Object 'train/3/corrupt.png'")
    assert "is not a readable image" in line and "upload_mnist" in line


@pytest.mark.parametrize("fault", ["wrong secret", "stopped server"])
def test_skip_mode_never_skips_an_outage(ray_local, broken_bucket, monkeypatch, fault):
    # Skipping is for one bad object; a store that is down or refuses the keys must stop the run.
    counter = f"skips-{uuid.uuid4().hex[:8]}"
    if fault == "wrong secret":
        monkeypatch.setenv("S3_SECRET_KEY", "not-the-secret")
        expected = storage.BadCredentials
    else:
        monkeypatch.setenv("S3_ENDPOINT", f"http://127.0.0.1:{stack_ports.free_ports(['s3'])['s3']}")
        expected = storage.ObjectStoreUnreachable
    worker = preprocess.ObjectPreprocessor(broken_bucket, threads=2, skip_counter_name=counter)
    batch = {"X": np.array(["train/5/00000.png", "train/3/corrupt.png"]), "y": np.array([5, 3])}
    with pytest.raises(expected):
        worker(batch)
    with pytest.raises(expected):
        preprocess.preprocess_batch(batch, broken_bucket, skip_counter_name=counter)
    assert preprocess_support.skipped_keys(counter) == []


def test_repacking_swaps_in_the_new_shards_only_when_all_are_written(ray_local, dataset_bucket, pointers, client,
                                                                     settings):
    x, y = pointers
    first = preprocess.pack_parquet_shards(preprocess.to_ray_dataset(x[:100], y[:100]), dataset_bucket,
                                           num_shards=2, settings=settings)
    assert preprocess.packed_path(dataset_bucket, settings=settings) == first
    with pytest.raises(storage.StorageError, match="train/7/gone.png"):  # a packing that fails half-way
        preprocess.pack_parquet_shards(preprocess.to_ray_dataset(x[:100] + ["train/7/gone.png"], y[:100] + [7]),
                                       dataset_bucket, num_shards=2, settings=settings)
    # the old shards are still whole
    assert preprocess.read_parquet_dataset(dataset_bucket, settings=settings).count() == 100
    second = preprocess.pack_parquet_shards(preprocess.to_ray_dataset(x[:50], y[:50]), dataset_bucket,
                                            num_shards=2, settings=settings)
    assert second != first and preprocess.read_parquet_dataset(dataset_bucket, settings=settings).count() == 50
    # The replaced folder stays for a reader that started before the swap; the failed one goes.
    assert packed_folders(client, dataset_bucket) == {"CURRENT", first.rsplit("/", 1)[1], second.rsplit("/", 1)[1]}
    third = preprocess.pack_parquet_shards(preprocess.to_ray_dataset(x[:30], y[:30]), dataset_bucket,
                                           num_shards=2, settings=settings)
    assert packed_folders(client, dataset_bucket) == {"CURRENT", second.rsplit("/", 1)[1], third.rsplit("/", 1)[1]}


def packed_folders(client, bucket: str) -> set[str]:
    """The names under packed/train/: CURRENT and the version folders."""
    return {o.object_name.split("/")[2] for o in client.list_objects(bucket, prefix="packed/train/",
                                                                     recursive=True)} - {""}  # folder markers


def test_a_reader_of_the_replaced_shards_and_a_packing_still_running_keep_their_folders(
        ray_local, dataset_bucket, pointers, client, settings):
    import ray.data

    x, y = pointers
    first = preprocess.pack_parquet_shards(preprocess.to_ray_dataset(x[:40], y[:40]), dataset_bucket,
                                           num_shards=2, settings=settings)
    # a reader picks the folder, and reads it while ...
    reading = preprocess.packed_path(dataset_bucket, settings=settings)
    filesystem = storage.s3_filesystem(settings)
    running = f"{dataset_bucket}/packed/train/99991231-235959-000000"  # ... a packing started later still writes
    with filesystem.open_output_stream(f"{running}/part-0.parquet") as out:
        out.write(b"half of a shard")
    second = preprocess.pack_parquet_shards(preprocess.to_ray_dataset(x[:20], y[:20]), dataset_bucket,
                                            num_shards=2, settings=settings)
    assert reading == first != second == preprocess.packed_path(dataset_bucket, settings=settings)
    assert ray.data.read_parquet(reading, filesystem=filesystem, file_extensions=["parquet"]).count() == 40
    assert filesystem.get_file_info(f"{running}/part-0.parquet").size == len(b"half of a shard")


@pytest.mark.timeout(300)
def test_two_packings_at_once_leave_current_naming_a_whole_folder(ray_local, dataset_bucket, pointers, settings):
    from concurrent.futures import ThreadPoolExecutor

    x, y = pointers
    sizes = [60, 30]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda n: preprocess.pack_parquet_shards(preprocess.to_ray_dataset(x[:n], y[:n]),
                                                               dataset_bucket, num_shards=2, settings=settings), sizes))
    assert preprocess.read_parquet_dataset(dataset_bucket, settings=settings).count() in sizes


class RacedFilesystem:
    """The object store's filesystem, where another packing's cleanup removes each folder just before this one does."""

    def __init__(self, filesystem):
        self.filesystem = filesystem
        self.raced = []

    def __getattr__(self, name):
        return getattr(self.filesystem, name)

    def delete_dir(self, path):
        self.filesystem.delete_dir(path)  # the other packing, first
        self.raced.append(path)
        return self.filesystem.delete_dir(path)


def test_a_cleanup_that_finds_its_superseded_folders_already_gone_finishes(bucket, client, settings):
    client.make_bucket(bucket)
    filesystem = storage.s3_filesystem(settings)
    base = f"{bucket}/packed/train"
    versions = ["20261201-000000-000000", "20261202-000000-000000", "20261203-000000-000000",
                "20261204-000000-000000"]
    for version in versions:
        with filesystem.open_output_stream(f"{base}/{version}/part-0.parquet") as out:
            out.write(b"shard")
        storage.mark_complete(filesystem, f"{base}/{version}")
    with filesystem.open_output_stream(f"{base}/CURRENT") as out:
        out.write(versions[-1].encode())
    raced = RacedFilesystem(filesystem)
    assert preprocess_support.remove_superseded(raced, base, "CURRENT") == versions[:2]
    assert raced.raced == [f"{base}/{v}" for v in versions[:2]]
    assert packed_folders(client, bucket) == {"CURRENT", *versions[2:]}


@pytest.mark.parametrize("call", [
    lambda: preprocess.preprocess_with_actors(None, "b", num_actors=0),
    lambda: preprocess.preprocess_with_actors(None, "b", threads=-1),
    lambda: preprocess.preprocess_with_actors(None, "b", batch_size=0),
    lambda: preprocess.pack_parquet_shards(None, "b", num_shards=0, settings=None),
    lambda: preprocess.load_datasets("b", 10, None, num_actors="2"),
])
def test_counts_below_one_are_refused_before_any_work(call):
    with pytest.raises(ParameterError, match="whole number from 1"):
        call()


def test_a_missing_object_fails_naming_its_key(ray_local, dataset_bucket):
    with pytest.raises(Exception, match="train/7/gone.png"):
        run_preprocessing(preprocess.to_ray_dataset(["train/5/00000.png", "train/7/gone.png"], [5, 7]),
                        dataset_bucket, "tasks").materialize()


@pytest.mark.parametrize("method", ["tasks", "actors"])
def test_skip_mode_drops_and_counts_bad_objects(ray_local, broken_bucket, client, method):
    x, y, *_ = listing.get_train_test_data(broken_bucket, listing="parallel", client=client)
    x, y = x + ["train/2/missing.png"], y + [2]
    counter = f"skips-{uuid.uuid4().hex[:8]}"
    out = run_preprocessing(preprocess.to_ray_dataset(x, y), broken_bucket, method, batch_size=8,
                          skip_counter_name=counter).materialize()
    assert out.count() == len(x) - 2
    assert sorted(preprocess_support.skipped_keys(counter)) == ["train/2/missing.png", "train/3/corrupt.png"]


def test_shards_packed_by_an_older_version_ask_to_be_packed_again(ray_local, dataset_bucket, settings):
    import pyarrow as pa
    import pyarrow.parquet as pq

    filesystem, base = storage.s3_filesystem(settings), f"{dataset_bucket}/packed/old-split"
    table = pa.table({"key": ["train/1/00001.png"], "label": [1], "image": [b"\x89PNG..."]})  # encoded bytes
    pq.write_table(table, f"{base}/v1/part-0.parquet", filesystem=filesystem)
    with filesystem.open_output_stream(f"{base}/CURRENT") as out:
        out.write(b"v1")
    with pytest.raises(storage.StorageError, match=r"hold \['key', 'label', 'image'\].*Pack them again"):
        preprocess.read_parquet_dataset(dataset_bucket, "old-split", settings=settings)


def test_all_readers_give_the_same_images_and_labels(ray_local, dataset_bucket, client, settings):
    def multiset(ds):
        out = Counter()
        for batch in ds.iter_batches(batch_size=None):
            for image, label in zip(to_uint8(batch["X"]), batch["y"], strict=True):
                out[(image.tobytes(), int(label))] += 1
        return out

    x, y, *_ = listing.get_train_test_data(dataset_bucket, listing="manifest", client=client)  # all of train/
    actors = multiset(run_preprocessing(preprocess.to_ray_dataset(x, y), dataset_bucket, "actors"))
    # Ray lists the prefix itself
    images = multiset(preprocess.read_images_dataset(dataset_bucket, "train", settings=settings))
    path = preprocess.pack_parquet_shards(preprocess.to_ray_dataset(x, y), dataset_bucket,
                                          num_shards=3, settings=settings)
    shards = [o.object_name for o in client.list_objects(dataset_bucket, prefix=path.split("/", 1)[1] + "/")
              if o.object_name.endswith(".parquet")]
    assert len(shards) == 3
    parquet = multiset(preprocess.read_parquet_dataset(dataset_bucket, settings=settings))
    assert sum(actors.values()) == SMOKE + VALIDATION
    assert actors == images == parquet


def test_pointer_lists_must_align():
    with pytest.raises(ParameterError, match="align"):
        preprocess.to_ray_dataset(["a", "b"], [1])
    with pytest.raises(ParameterError, match="No pointers"):
        preprocess.to_ray_dataset([], [])
    with pytest.raises(ParameterError, match="No pointers"):  # load_datasets numbers its pointers through it
        preprocess.to_ray_dataset([], [], numbered=True)


def test_numbered_pointers_carry_their_position(ray_local):
    rows = preprocess.to_ray_dataset(["a", "b", "c"], [1, 2, 3], numbered=True).take_all()
    assert [(r["X"], r["y"], r["row"]) for r in rows] == [("a", 1, 0), ("b", 2, 1), ("c", 3, 2)]
    assert "row" not in preprocess.to_ray_dataset(["a"], [1]).take_all()[0]


def test_logger_stamps_pid_and_node(ray_local, dataset_bucket, pointers, tmp_path):
    run_preprocessing(preprocess.to_ray_dataset(*pointers, override_num_blocks=4), dataset_bucket, "tasks",
                    batch_size=100, log_dir=str(tmp_path)).materialize()
    lines = preprocess_support.read_log(tmp_path)
    assert len(lines) >= 4
    assert all(line.split()[0].isdigit() and " on node " in line for line in lines)
    assert {int(line.split()[0]) for line in lines}.isdisjoint({os.getpid()}), "written by Ray workers"


DRIVER = textwrap.dedent("""
    import json, sys, time
    from helpers import cluster, listing, preprocess
    bucket, log_dir = sys.argv[1], sys.argv[2]
    x, y, *_ = listing.get_train_test_data(bucket, listing="manifest")
    cluster.init_ray()  # RAY_ADDRESS comes from the environment: no code change
    import ray
    deadline = time.monotonic() + 90
    while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.monotonic() < deadline:
        time.sleep(1)
    nodes = [n["NodeID"][:8] for n in ray.nodes() if n["Alive"]]
    ds = preprocess.to_ray_dataset(x, y, override_num_blocks=8).map_batches(
        preprocess.preprocess_batch, batch_size=50, fn_kwargs={"bucket": bucket, "log_dir": log_dir})
    print(json.dumps({"rows": ds.materialize().count(), "nodes": nodes}))
""")


def wait_for_port(port: int, timeout: float = 60) -> None:
    """Until something listens on ``127.0.0.1:port`` (the head's GCS) or ``timeout`` s passed."""
    deadline = time.monotonic() + timeout
    while port_is_free(port) and time.monotonic() < deadline:
        time.sleep(0.2)


@pytest.mark.slow
def test_two_node_cluster_runs_the_same_code_through_ray_address(dataset_bucket, tmp_path):
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    port = stack_ports.free_ports(["ray"])["ray"]
    # A temporary folder of its own: `ray start` records "the current cluster" in it, which another test's
    # `ray start` in this user's folder (test_submit's, at the same moment) must not find overwritten.
    ray_tmpdir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's sockets are in it
    # and a token of its own, which its nodes and the driver share: whatever Ray this process joined before, if any
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_AUTH_TOKEN_PATH"}, "RAY_ADDRESS": f"127.0.0.1:{port}",
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16), "RAY_TMPDIR": ray_tmpdir}
    common = ["--num-cpus=1", "--node-ip-address=127.0.0.1", "--disable-usage-stats", "--block"]
    nodes = []
    try:
        # Each node in a process group of its own: stopping it stops what it spawned, never this process.
        nodes.append(subprocess.Popen([ray_bin, "start", "--head", f"--port={port}", "--include-dashboard=false",
                                       *common], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True))
        wait_for_port(port)  # the head must accept connections before the second node joins
        nodes.append(subprocess.Popen([ray_bin, "start", f"--address=127.0.0.1:{port}", *common],
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True))
        result = subprocess.run([sys.executable, "-c", DRIVER, dataset_bucket, str(tmp_path)],
                                capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        facts = json.loads(result.stdout.strip().splitlines()[-1])
        assert facts["rows"] == SMOKE + VALIDATION and len(facts["nodes"]) == 2
        used = {line.split(" on node ")[1].split(":")[0] for line in preprocess_support.read_log(tmp_path)}
        assert used == set(facts["nodes"]), "tasks ran on both nodes"
    finally:
        for proc in reversed(nodes):  # a throwaway cluster: `ray start --block` takes 20 s and more on SIGTERM
            with contextlib.suppress(psutil.NoSuchProcess):
                processes.stop_group(psutil.Process(proc.pid), timeout=3)
        shutil.rmtree(ray_tmpdir, ignore_errors=True)


def test_load_datasets_cuts_one_pipeline_into_shuffled_train_validation_and_test(ray_local, dataset_bucket, client,
                                                                                  settings):
    import ray.data

    x_train, y_train, x_test, y_test, _ = listing.get_train_test_data(dataset_bucket, SMOKE, "manifest", client)
    (x_fit, y_fit), (x_val, y_val) = listing.split_validation(x_train, y_train)
    x_fit, y_fit = preprocess.shuffle_pointers(x_fit, y_fit, seed=5)
    assert (len(x_fit), len(x_val), len(x_test)) == (SMOKE, VALIDATION, 1500)
    # Batches of 16 over two actors: every row, in order, on its side of the cuts.
    splits = preprocess.load_datasets(dataset_bucket, SMOKE, settings, seed=5, batch_size=16)
    assert ray.data.DataContext.get_current().execution_options.preserve_order is False  # not relied on, not set
    for ds, keys, labels in zip(splits, (x_fit, x_val, x_test), (y_fit, y_val, y_test), strict=True):
        images, got_labels = preprocess.dataset_to_numpy(ds)
        expected = [np.asarray(preprocess.fetch_decode(client, dataset_bucket, key)) for key in keys]
        assert got_labels.tolist() == labels
        assert np.array_equal(to_uint8(images), np.stack(expected))


def test_extra_columns_keep_only_the_rows_whose_image_is_kept(ray_local):
    counter = f"skips-{uuid.uuid4().hex[:8]}"
    image = np.full((28, 28), 255, np.uint8)
    batch = preprocess.to_batch(["a", "b", "c"], [1, 2, 3], [image, ValueError("not an image"), image], counter,
                                {"row": np.array([10, 11, 12])})
    assert batch["y"].tolist() == [1, 3] and batch["row"].tolist() == [10, 12] and batch["X"].shape == (2, 1, 28, 28)
    assert preprocess_support.skipped_keys(counter) == ["b"]


def test_shuffle_pointers_is_a_seeded_permutation_that_keeps_pairs():
    x = [f"train/{i % 10}/{i:05d}.png" for i in range(100)]
    y = [i % 10 for i in range(100)]
    xs, ys = preprocess.shuffle_pointers(x, y, seed=3)
    assert xs != x and sorted(xs) == sorted(x)
    assert all(key.split("/")[1] == str(label) for key, label in zip(xs, ys, strict=True))
    assert preprocess.shuffle_pointers(x, y, seed=3) == (xs, ys)


def test_read_images_names_an_object_that_is_not_an_image(ray_local, broken_bucket, settings):
    with pytest.raises(ValueError) as err:  # Ray's own reader: RayTaskError(ValueError)
        preprocess.read_images_dataset(broken_bucket, "train", settings=settings).materialize()
    line = notebook.user_error_line(err.value)
    assert line == (f"ObjectDecodeError: Object 'train/3/corrupt.png' in bucket '{broken_bucket}' is not a readable "
                    f"image. {storage.REPAIR_HINT}")


def test_a_notebook_shows_user_errors_in_one_line_and_other_errors_whole(capsys):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        notebook.setup()
        shell.run_cell("from helpers.settings import ParameterError\n"
                       "raise ParameterError('threads=0 is out of range')")
        short = capsys.readouterr()
        shell.run_cell("int('not a number')")  # a ValueError of another kind keeps its traceback
        whole = capsys.readouterr()
    finally:
        shell.set_custom_exc((), None)
        InteractiveShell.clear_instance()
    import re

    short_text, whole_text = (re.sub(r"\x1b\[[0-9;]*m", "", c.out + c.err) for c in (short, whole))  # no colours
    assert "ParameterError: threads=0 is out of range" in short_text
    assert "Traceback" not in short_text and "Cell In[" not in short_text
    assert "invalid literal for int()" in whole_text and "Cell In[" in whole_text


def test_the_s3_keys_can_stay_out_of_ray_s_runtime_env(settings, monkeypatch):
    monkeypatch.setenv(worker_env.KEYS_FROM_CLUSTER_ENV, "true")  # the nodes have the keys themselves
    shipped = cluster.cluster_runtime_env(settings)["env_vars"]
    assert "S3_SECRET_KEY" not in shipped and "S3_ACCESS_KEY" not in shipped
    assert shipped["S3_ENDPOINT"] == settings.s3_url and shipped["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"
    monkeypatch.delenv(worker_env.KEYS_FROM_CLUSTER_ENV)
    assert cluster.cluster_runtime_env(settings)["env_vars"]["S3_SECRET_KEY"] == settings.s3_secret_key


def worker_view() -> tuple[dict, dict]:
    """(the job's runtime_env variables, the service settings and local Ray defaults a worker process sees)."""
    import ray

    names = [*cluster.WORKER_SETTINGS, *cluster.local_ray_defaults()]
    return ray.get(ray.remote(lambda: (ray.get_runtime_context().runtime_env.get("env_vars", {}),
                                       {k: os.environ.get(k) for k in names})).remote())


def assert_loopback_only(root: psutil.Process) -> None:
    """Every socket ``root`` and the processes under it listen on is a loopback address."""
    ours = {p.pid for p in root.children(recursive=True)} | {root.pid}
    listening = [c for c in psutil.net_connections("inet") if c.status == psutil.CONN_LISTEN and c.pid in ours]
    assert listening, "Ray's processes listen somewhere"
    exposed = [f"{c.laddr.ip}:{c.laddr.port}" for c in listening
               if not ipaddress.ip_address(c.laddr.ip.removeprefix("::ffff:")).is_loopback]
    assert not exposed, f"reachable from the network: {exposed}"


def test_the_stacks_ray_is_joined_and_its_workers_have_the_drivers_settings(settings, monkeypatch):
    import ray

    from helpers import stack_ray
    from helpers.settings import state_dir

    service = stack_ray.read_service(state_dir())
    if service is None:
        pytest.skip("no stack's Ray: the services come from S3_ENDPOINT, not a stack started here")
    cluster.shutdown_ray()
    for name in cluster.local_ray_defaults():
        monkeypatch.delenv(name, raising=False)
    elsewhere = dataclasses.replace(settings, mlflow_tracking_uri="http://127.0.0.1:9")
    try:
        cluster.init_ray(settings, num_cpus=1)  # a running Ray keeps its own CPUs
        assert ray.get_runtime_context().gcs_address == service["address"]
        assert ray.cluster_resources()["CPU"] == service["cpus"]
        job_env, worker_env = worker_view()
        assert job_env == {}  # the stack's settings are the driver's: nothing to send
        assert worker_env["S3_ENDPOINT"] == settings.s3_url and worker_env["S3_SECRET_KEY"] == settings.s3_secret_key
        defaults = cluster.local_ray_defaults()
        assert {name: worker_env[name] for name in defaults} == defaults
        assert not [name for name in defaults if name in os.environ]  # nothing for Ray Train to send
        cluster.shutdown_ray()

        cluster.init_ray(elsewhere)  # a driver pointed at other services sends its own settings
        job_env, worker_env = worker_view()
        assert job_env["MLFLOW_TRACKING_URI"] == worker_env["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:9"
    finally:
        cluster.shutdown_ray()
    assert_loopback_only(psutil.Process(service["pid"]))


def test_a_local_ray_s_workers_inherit_the_settings_without_a_runtime_env(settings, monkeypatch):
    import os

    import ray

    cluster.shutdown_ray()
    for name in cluster.local_ray_defaults():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("S3_ENDPOINT", "http://127.0.0.1:1")  # another stack's, left in the driver's environment
    monkeypatch.delenv("S3_SECRET_KEY", raising=False)
    try:
        cluster.init_ray(settings, num_cpus=1, address="local")
        assert {node["NodeManagerAddress"] for node in ray.nodes()} == {"127.0.0.1"}
        assert_loopback_only(psutil.Process())
        job_env, worker_env = worker_view()
        assert job_env == {}  # nothing in the job's runtime_env: Ray can use the workers it started ahead of time
        assert worker_env["S3_ENDPOINT"] == settings.s3_url and worker_env["S3_SECRET_KEY"] == settings.s3_secret_key
        assert worker_env["MLFLOW_TRACKING_URI"] == settings.mlflow_tracking_uri
        # Ray Train's controller polls every 0.2 s and starts no preemption watcher on a local Ray.
        assert {name: worker_env[name] for name in cluster.local_ray_defaults()} == cluster.local_ray_defaults()
        # The driver's own environment is as it was: no RAY_TRAIN_* variable for Ray Train to send its actors.
        assert os.environ["S3_ENDPOINT"] == "http://127.0.0.1:1" and "S3_SECRET_KEY" not in os.environ
        assert not [name for name in cluster.local_ray_defaults() if name in os.environ]
    finally:
        cluster.shutdown_ray()


def test_validation_images_are_mnist_s_training_images_from_50000_on_whatever_the_order():
    ids = [*range(300), *range(49_990, 50_300)]
    keys = [f"train/{i % 10}/{i:05d}.png" for i in ids] + [f"train/3/{uuid.UUID(int=n)}.png" for n in range(60)]
    labels = [i % 10 for i in ids] + [3] * 60
    (fit_keys, fit_labels), (val_keys, val_labels) = listing.split_validation(keys, labels)
    canonical = [k for k in val_keys if listing.is_canonical(k)]
    assert [int(k[-9:-4]) for k in canonical] == list(range(50_000, 50_300))  # in the list's order
    assert 0 < len(val_keys) - len(canonical) < 60  # appended copies: about one in six, by their id
    assert sorted(fit_keys + val_keys) == sorted(keys) and not set(fit_keys) & set(val_keys)
    assert all(int(k.split("/")[1]) == y for k, y in zip(fit_keys + val_keys, fit_labels + val_labels, strict=True))
    (_, _), (again, _) = listing.split_validation(keys[::-1], labels[::-1])
    assert sorted(again) == sorted(val_keys)  # the id decides, not the position
