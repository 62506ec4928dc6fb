import _thread
import dataclasses
import gzip
import io
import signal
import threading
import time

import numpy as np
import pytest

from helpers import listing, storage, upload, upload_support
from helpers.mnist import load_mnist
from helpers.settings import ParameterError, Settings, SettingsError

SMOKE = 30  # 30 training + 50 validation (both under train/) + 100 test objects


@pytest.fixture
def uploaded(client, bucket):
    report = upload.upload_mnist(bucket, SMOKE, client=client, progress=False)
    return bucket, report


def test_upload_creates_the_expected_objects_with_correct_labels(client, uploaded):
    bucket, report = uploaded
    assert (report.planned, report.uploaded, report.skipped) == (180, 180, 0)
    keys = listing.list_objects_parallel(bucket, client=client)
    assert len(keys) == len(set(keys)) == 180
    data = load_mnist()
    for key in keys:
        split, label, name = key.split("/")
        index = int(name.split(".")[0])
        assert int(data.split(split)[1][index]) == int(label), key
    assert sum(k.startswith("train/") for k in keys) == 80 and sum(k.startswith("test/") for k in keys) == 100


def test_png_objects_decode_to_the_exact_mnist_pixels(client, uploaded):
    bucket, _ = uploaded
    data = load_mnist()
    for index, label in [(0, 5), (1, 0), (7, 3)]:
        image = listing.fetch_image(bucket, f"train/{label}/{index:05d}.png", client=client)
        np.testing.assert_array_equal(image, data.train_images[index])


def test_second_upload_adds_nothing(client, uploaded):
    bucket, _ = uploaded
    again = upload.upload_mnist(bucket, SMOKE, client=client, progress=False)
    assert (again.uploaded, again.skipped) == (0, 180)
    assert "Nothing to upload" in str(again)
    assert len(listing.list_objects_parallel(bucket, client=client)) == 180


def test_jpeg_format_like_the_seed(client, bucket):
    upload.upload_mnist(bucket, 12, image_format="jpeg", client=client, progress=False)
    keys = listing.list_objects_parallel(bucket, client=client)
    assert len(keys) == 12 + 20 + 40 and all(k.endswith(".jpeg") for k in keys)
    image = listing.fetch_image(bucket, "train/5/00000.jpeg", client=client)
    assert np.abs(image.astype(int) - load_mnist().train_images[0]).mean() < 3  # lossy but close


def test_append_grows_the_data_set_and_resumes_an_interrupted_round(client, uploaded, capsys):
    bucket, _ = uploaded
    first = upload.upload_mnist(bucket, SMOKE, append=True, client=client, progress=False)
    assert first.uploaded == 180
    assert len(listing.list_objects_parallel(bucket, client=client)) == 360
    # A round that started but never finished (the marker is left behind) is resumed, with its own size.
    round_id, *_ = upload.start_or_resume_append(client, bucket, 30, "png")
    resumed = upload.upload_mnist(bucket, 999, append=True, client=client, progress=False)
    assert "Resuming" in capsys.readouterr().out
    assert resumed.planned == 180
    keys = listing.list_objects_parallel(bucket, client=client)
    assert len(keys) == len(set(keys)) == 540
    assert upload_support.APPEND_MARKER_KEY not in listing.get_object_list(bucket, client=client)
    assert len(listing.list_objects_from_manifest(bucket, client=client)) == 540


def test_a_new_append_round_reads_the_manifest_instead_of_listing_the_bucket(client, uploaded):
    bucket, _ = uploaded
    outside = "train/3/zz-put-by-hand.png"  # an image no upload wrote: only a listing sees it
    body = storage.read_object(client, bucket, "train/5/00000.png")
    client.put_object(bucket, outside, io.BytesIO(body), len(body))
    upload.upload_mnist(bucket, SMOKE, append=True, client=client, progress=False)
    manifest = listing.list_objects_from_manifest(bucket, client=client)
    assert len(manifest) == 360 and outside not in manifest  # one GET of the manifest, no listing
    client.remove_object(bucket, upload.MANIFEST_KEY)  # no manifest: the round lists the bucket instead
    upload.upload_mnist(bucket, SMOKE, append=True, client=client, progress=False)
    manifest = listing.list_objects_from_manifest(bucket, client=client)
    assert len(manifest) == 541 and outside in manifest
    assert len(listing.get_train_test_data(bucket, 0, "manifest", client)[0]) == 3 * 80 + 1
    client.put_object(bucket, upload.MANIFEST_KEY, io.BytesIO(b"not gzip"), 8)  # damaged: listed instead, no error
    assert upload_support.manifest_objects(client, bucket, upload.MANIFEST_KEY) == {}
    upload.upload_mnist(bucket, SMOKE, append=True, client=client, progress=False)
    assert len(listing.list_objects_from_manifest(bucket, client=client)) == 721


def test_three_listings_agree_and_split_correctly(client, uploaded):
    bucket, _ = uploaded
    results = {}
    for method in listing.LISTINGS:
        x_train, y_train, x_test, y_test, seconds = listing.get_train_test_data(bucket, listing=method, client=client)
        assert seconds > 0
        results[method] = sorted(zip(x_train, y_train, strict=True)), sorted(zip(x_test, y_test, strict=True))
    assert results["recursive"] == results["parallel"] == results["manifest"]
    train, test = results["manifest"]
    assert len(train) == 80 and len(test) == 100
    assert all(key.split("/")[1] == str(label) for key, label in train + test)


def test_recursive_listing_includes_the_manifest_which_split_ignores(client, uploaded):
    bucket, _ = uploaded
    objects = listing.get_object_list(bucket, client=client)
    assert upload.MANIFEST_KEY in objects and len(objects) == 181
    x_train, _, x_test, _ = listing.split_train_test(objects)
    assert len(x_train) + len(x_test) == 180


def test_manifest_is_one_gzipped_object_listing_every_key(client, uploaded):
    bucket, _ = uploaded
    body = storage.read_object(client, bucket, upload.MANIFEST_KEY)
    keys = gzip.decompress(body).decode().split("\n")
    assert sorted(keys) == sorted(listing.list_objects_parallel(bucket, client=client))


def test_smoke_subset_is_the_first_images_in_mnist_order(client, uploaded):
    bucket, _ = uploaded
    x_train, y_train, x_test, y_test, _ = listing.get_train_test_data(bucket, smoke_test_size=6, client=client)
    assert x_train[:3] == ["train/5/00000.png", "train/0/00001.png", "train/4/00002.png"]
    assert y_train[:6] == [5, 0, 4, 1, 9, 2] and len(x_train) == 6 + 10  # the first training images, then
    assert [int(key[-9:-4]) for key in x_train[6:]] == list(range(50_000, 50_010))  # the first validation ones
    assert x_test[0] == "test/7/00000.png" and y_test[0] == 7 and len(x_test) == 20


def test_split_parses_labels_by_path_segment_not_position():
    objects = ["train/7/a.png", "test/3/b.jpeg", "_manifest/objects.txt.gz", "datasets/readme.txt"]
    assert listing.split_train_test(objects) == (["train/7/a.png"], [7], ["test/3/b.jpeg"], [3])


@pytest.mark.parametrize("key", ["train/abc.png", "train/x/1.png", "test/12/1.png", "train/1/noext", "test/1/2/3.png",
                                 "train/notes.txt", "train/5/readme.md"])
def test_a_key_that_is_not_an_image_is_left_out_and_named_once(key, capsys):
    assert listing.split_train_test(["train/1/ok.png", key], "b") == (["train/1/ok.png"], [1], [], [])
    said = capsys.readouterr().out
    assert said.count(repr(key)) == 1 and "Data keys are <train|test>/<label 0-9>/<id>.<png|jpeg>" in said
    listing.split_train_test(["train/1/ok.png", key], "b")
    assert capsys.readouterr().out == "", "said once"


def test_a_folder_marker_is_a_folder_not_an_object(capsys):
    assert listing.split_train_test(["train/x/", "train/1/ok.png", "test/"]) == (["train/1/ok.png"], [1], [], [])
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("size", [-1, 50_001, 1.5, True, "10"])
def test_bad_smoke_sizes_are_rejected(size):
    with pytest.raises(ParameterError, match="smoke_test_size"):
        storage.smoke_sizes(size)


def test_smoke_sizes_measure_on_many_more_images_than_they_train_on():
    assert storage.smoke_sizes(0) == (50_000, 10_000, 10_000)  # MNIST's usual training / validation split
    assert storage.smoke_sizes(600) == (600, 1_000, 2_000)  # the notebooks' defaults
    assert storage.smoke_sizes(1) == (1, 2, 4) and storage.smoke_sizes(6_000) == (6_000, 10_000, 10_000)
    indices = upload.smoke_indices(30)
    assert indices["train"] == [*range(30), *range(50_000, 50_050)] and indices["test"] == list(range(100))
    assert [len(v) for v in upload.smoke_indices(0).values()] == [60_000, 10_000]


def test_bad_parameters_fail_before_any_upload(client, bucket):
    with pytest.raises(ParameterError, match="image_format"):
        upload.upload_mnist(bucket, 10, image_format="gif", client=client)
    with pytest.raises(ParameterError, match="listing"):
        listing.get_train_test_data(bucket, listing="fast", client=client)
    assert not client.bucket_exists(bucket)


def test_wrong_credentials_are_one_clear_error(settings, bucket):
    bad = storage.get_client(dataclasses.replace(settings, s3_secret_key="wrong-secret"))
    with pytest.raises(storage.BadCredentials, match="S3_SECRET_KEY"):
        upload.upload_mnist(bucket, 10, client=bad, progress=False)
    with pytest.raises(storage.BadCredentials):
        listing.get_train_test_data("mnist", client=bad)


def test_unreachable_store_names_the_endpoint_and_the_fix(settings):
    down = storage.get_client(dataclasses.replace(settings, s3_endpoint="http://127.0.0.1:9"), retries=0)
    with pytest.raises(storage.ObjectStoreUnreachable) as err:
        listing.get_train_test_data("mnist", client=down)
    assert "http://127.0.0.1:9" in str(err.value) and "python -m workshop.stack up" in str(err.value)


def test_a_store_that_fails_every_write_is_one_line_about_its_disk_within_seconds(settings, bucket):
    """A store whose disk is full answers HTTP 500 (SeaweedFS below 1% free): not "cannot reach", and no long wait."""
    import http.server

    class Failing(http.server.BaseHTTPRequestHandler):
        def do_PUT(self):  # noqa: N802 - http.server's name
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD = do_PUT  # noqa: N815

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        failing = storage.get_client(dataclasses.replace(settings, s3_endpoint=f"http://127.0.0.1:{server.server_port}"))
        started = time.monotonic()
        with pytest.raises(storage.ObjectStoreFailing) as err:
            upload.upload_mnist(bucket, 10, client=failing, progress=False)
        assert time.monotonic() - started < 30
    finally:
        server.shutdown()
    assert "server error" in str(err.value) and "disk" in str(err.value) and "Cannot reach" not in str(err.value)


def test_missing_bucket_and_missing_manifest(client, bucket):
    with pytest.raises(storage.BucketNotFound, match=bucket):
        listing.get_train_test_data(bucket, client=client)
    with pytest.raises(storage.BucketNotFound, match="upload_mnist"):
        listing.list_objects_parallel(bucket, client=client)
    storage.ensure_bucket(client, bucket)
    with pytest.raises(storage.StorageError, match="no manifest"):
        listing.list_objects_from_manifest(bucket, client=client)
    with pytest.raises(storage.StorageError, match="missing"):
        storage.read_object(client, bucket, "train/1/none.png")


def test_no_object_store_configured():
    with pytest.raises(SettingsError, match="S3_ENDPOINT"):
        storage.get_client(Settings())


# --- hardening: bad input is one clear line before any I/O; nothing is lost or silently wrong ---------------


@pytest.mark.parametrize("workers", [0, -1, "16", 2.5, 10**6])
@pytest.mark.timeout(30)
def test_bad_thread_counts_fail_before_any_io(client, bucket, workers):
    with pytest.raises(ParameterError, match="threads"):
        upload.upload_mnist(bucket, 10, threads=workers, client=client, progress=False)
    with pytest.raises(ParameterError, match="threads"):
        listing.list_objects_parallel(bucket, client=client, threads=workers)
    assert not client.bucket_exists(bucket)  # failed before ensure_bucket, which hung with a pool of size 0


def test_a_bad_connection_pool_size_is_refused():
    with pytest.raises(ParameterError, match="max_connections"):
        storage.get_client(Settings(s3_endpoint="127.0.0.1:9", s3_access_key="a", s3_secret_key="b"),
                           max_connections=0)


@pytest.mark.parametrize("name", ["Not_A_Valid_Bucket", "ab", "x" * 64, "-start", "a..b", "192.168.0.1", 42])
def test_invalid_bucket_names_quote_the_s3_rules(client, name):
    for call in (lambda: upload.upload_mnist(name, 10, client=client, progress=False),
                 lambda: listing.get_train_test_data(name, client=client),
                 lambda: storage.ensure_bucket(client, name)):
        with pytest.raises(ParameterError) as err:
            call()
        assert "is not a valid bucket name" in str(err.value) and "3-63 characters" in str(err.value)


def test_the_data_mlflow_and_lakefs_buckets_need_force_to_delete(client):
    for name in sorted(storage.PROTECTED_BUCKETS):
        existed = client.bucket_exists(name)
        with pytest.raises(ParameterError, match="force=True"):
            storage.delete_bucket(client, name)
        assert client.bucket_exists(name) == existed


def test_one_image_format_per_bucket(client, bucket):
    upload.upload_mnist(bucket, 12, client=client, progress=False)
    with pytest.raises(ParameterError) as err:
        upload.upload_mnist(bucket, 12, image_format="jpeg", client=client, progress=False)
    assert "already holds png images" in str(err.value) and "image_format='png'" in str(err.value)
    assert all(k.endswith(".png") for k in listing.list_objects_parallel(bucket, client=client))


def test_the_smoke_subset_takes_canonical_images_only_after_an_append(client, uploaded):
    bucket, _ = uploaded
    upload.upload_mnist(bucket, SMOKE, append=True, client=client, progress=False)
    x_train, y_train, x_test, _, _ = listing.get_train_test_data(bucket, SMOKE, "manifest", client=client)
    assert len(x_train) == len(set(x_train)) == SMOKE + 50 and len(x_test) == 100  # training, then validation
    assert all(listing.is_canonical(key) for key in x_train + x_test)
    assert x_train == sorted(x_train, key=lambda k: k.rsplit("/", 1)[1])
    labels = load_mnist().train_labels
    assert y_train == labels[:SMOKE].tolist() + labels[50_000:50_050].tolist()


def test_a_corrupt_object_is_found_and_repaired_by_the_next_upload(client, uploaded):
    bucket, _ = uploaded
    key = "train/5/00000.png"
    client.put_object(bucket, key, io.BytesIO(b"not an image"), 12)
    truncated = upload.encode_image(load_mnist().train_images[1])[:-5]  # same key, same kind of bytes, cut short
    client.put_object(bucket, "train/0/00001.png", io.BytesIO(truncated), len(truncated))
    assert upload.verify_upload(bucket, SMOKE, client=client) == ["train/0/00001.png", key]
    report = upload.upload_mnist(bucket, SMOKE, client=client, progress=False)
    assert (report.uploaded, report.repaired, report.skipped) == (2, 2, 178)
    assert "replaced a damaged object" in str(report)
    np.testing.assert_array_equal(listing.fetch_image(bucket, key, client=client), load_mnist().train_images[0])
    assert upload.verify_upload(bucket, SMOKE, client=client) == []


def test_verify_repairs_a_missing_object_too(client, uploaded):
    bucket, _ = uploaded
    client.remove_object(bucket, "test/7/00000.png")
    assert upload.verify_upload(bucket, SMOKE, repair=True, client=client) == ["test/7/00000.png"]
    assert upload.verify_upload(bucket, SMOKE, client=client) == []


@pytest.mark.timeout(60)
def test_an_interrupt_cancels_the_queued_uploads(client, bucket, capsys):
    storage.ensure_bucket(client, bucket)
    plan = upload.plan_keys(6000)  # 26,000 objects (with 20,000 validation and test images): many seconds
    stop = threading.Event()

    def press_stop() -> None:  # Ctrl-C / the kernel's interrupt button
        # Python can deliver an interrupt inside a garbage-collector callback, which swallows it:
        # like a user, press again a second later if the first one was lost.
        while not stop.wait(0.5 if not press_stop.pressed else 1.0):
            press_stop.pressed = True
            _thread.interrupt_main()

    press_stop.pressed = False
    presser = threading.Thread(target=press_stop, daemon=True)
    presser.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            upload.upload_objects(client, bucket, plan, threads=2, progress=False)
    finally:
        # A press made while the first was being handled would land here: Python drops a pending one ignored.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        stop.set()
        presser.join()
        signal.signal(signal.SIGINT, previous)
    assert "run the same call again" in capsys.readouterr().out
    time.sleep(1)  # nothing may still be sending after the call returned
    uploaded = len(listing.list_objects_parallel(bucket, client=client))
    assert 0 < uploaded < len(plan) // 2
    assert len(listing.list_objects_parallel(bucket, client=client)) == uploaded


def test_a_press_that_cuts_the_cancel_of_the_queued_uploads_short_still_runs_nothing_queued(client, bucket,
                                                                                          monkeypatch):
    """A second press can land inside the pool's cancel of the queued uploads, before it dropped them: the
    clean-up after it must drop them still, not wait (uninterruptibly) while all of them run."""
    from concurrent.futures import ThreadPoolExecutor

    class CutShort(ThreadPoolExecutor):
        cut = False

        def shutdown(self, wait=True, *, cancel_futures=False):
            if cancel_futures and not CutShort.cut:
                CutShort.cut = True
                raise KeyboardInterrupt  # the second press, before anything queued was cancelled
            super().shutdown(wait=wait, cancel_futures=cancel_futures)

    monkeypatch.setattr(upload, "ThreadPoolExecutor", CutShort)
    storage.ensure_bucket(client, bucket)
    plan = upload.plan_keys(6000)  # 26,000 objects: minutes for two threads
    with pytest.raises(storage.StorageError, match="Upload interrupted after"):
        upload.upload_objects(client, bucket, [("train/0/broken.png", "train", 10**9), *plan], threads=2,
                              progress=False)  # the first item fails (no such image): the upload stops
    assert CutShort.cut
    time.sleep(1)  # nothing may still be sending after the call returned
    uploaded = len(listing.list_objects_parallel(bucket, client=client))
    assert uploaded < len(plan) // 2
    assert len(listing.list_objects_parallel(bucket, client=client)) == uploaded


def test_an_interrupt_that_lands_in_a_lock_s_release_is_still_an_interrupt(capsys):
    """Ctrl-C inside ``with lock:`` (submitting 26,000 uploads takes a while) can make the lock's release fail,
    and the failure then hides the interrupt: it is still the learner's Interrupt, not a storage error."""
    from helpers import upload_support

    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("release unlocked lock")  # noqa: B904 (as the lock's __exit__ raises it)
    except RuntimeError as err:
        failure = err
    with pytest.raises(KeyboardInterrupt):
        upload_support.raise_interrupted(failure, 0, 26_000, client=None, bucket="b")
    assert "Upload interrupted after 0 of 26,000 objects" in capsys.readouterr().out


@pytest.mark.parametrize("key", ["train/stray.png", "test/x/00001.png"])
def test_the_parallel_listing_names_keys_outside_the_label_folders(client, uploaded, key, capsys):
    bucket, _ = uploaded
    client.put_object(bucket, key, io.BytesIO(b"x"), 1)
    assert len(listing.list_objects_parallel(bucket, client=client)) == 180
    assert repr(key) in capsys.readouterr().out


def test_a_stray_object_never_poisons_the_bucket(client, uploaded, capsys):
    """A README someone dropped into train/: every listing and the next upload leave it out and name it."""
    bucket, _ = uploaded
    client.put_object(bucket, "train/notes.txt", io.BytesIO(b"read me"), 7)
    again = upload.upload_mnist(bucket, SMOKE, client=client, progress=False)  # no "txt images" refusal
    assert (again.uploaded, again.skipped) == (0, 180)
    for method in ("recursive", "parallel", "manifest"):
        x_train, _, x_test, _, _ = listing.get_train_test_data(bucket, listing=method, client=client)
        assert (len(x_train), len(x_test)) == (80, 100), method
    said = capsys.readouterr().out
    assert said.count("'train/notes.txt'") == 1 and "txt" not in said.replace("notes.txt", "")
    with pytest.raises(ParameterError, match="already holds png images"):  # the real mix is still refused
        upload.upload_mnist(bucket, SMOKE, image_format="jpeg", client=client, progress=False)


def test_a_folder_marker_left_by_a_deleted_object_is_not_an_object(client, uploaded, capsys):
    bucket, _ = uploaded
    client.put_object(bucket, "train/x/notes.txt", io.BytesIO(b"x"), 1)
    client.remove_object(bucket, "train/x/notes.txt")
    client.put_object(bucket, "train/y/", io.BytesIO(b""), 0)  # a marker, as some stores and tools leave them
    assert "train/y/" in listing.get_object_list(bucket, client=client)
    for method in ("recursive", "parallel"):
        x_train, _, _, _, _ = listing.get_train_test_data(bucket, listing=method, client=client)
        assert len(x_train) == 80, method
    assert "train/y/" not in capsys.readouterr().out


def test_a_damaged_manifest_or_append_marker_is_named_with_the_fix(client, uploaded):
    bucket, _ = uploaded
    client.put_object(bucket, upload.MANIFEST_KEY, io.BytesIO(b"garbage"), 7)
    with pytest.raises(storage.StorageError, match="manifest .* is damaged. Run helpers.upload.upload_mnist"):
        listing.list_objects_from_manifest(bucket, client=client)
    upload.upload_mnist(bucket, SMOKE, client=client, progress=False)  # rewrites it
    assert len(listing.list_objects_from_manifest(bucket, client=client)) == 180
    client.put_object(bucket, upload_support.APPEND_MARKER_KEY, io.BytesIO(b"{}"), 2)
    with pytest.raises(storage.StorageError, match="append marker .* is damaged. Delete it"):
        upload.upload_mnist(bucket, SMOKE, append=True, client=client, progress=False)


@pytest.mark.timeout(120)
def test_two_uploads_at_once_end_with_one_complete_copy(client, bucket):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:  # two notebooks running notebook 01's upload together
        reports = list(pool.map(lambda _: upload.upload_mnist(bucket, 120, client=client, progress=False), range(2)))
    assert all(r.planned == 720 for r in reports)
    keys = listing.list_objects_parallel(bucket, client=client)
    assert len(keys) == len(set(keys)) == 720
    assert sorted(listing.list_objects_from_manifest(bucket, client=client)) == sorted(keys)
    assert upload.verify_upload(bucket, 120, client=client) == []  # every object is its image


def test_a_manifest_written_meanwhile_is_merged_not_overwritten(client, uploaded, monkeypatch):
    bucket, _ = uploaded
    put = client._put_object

    def another_upload_writes_first(*args, **kwargs):
        monkeypatch.setattr(client, "_put_object", put)  # only this first write loses the race
        upload_support.merge_manifest(client, bucket, upload.MANIFEST_KEY, ["train/0/other-upload.png"])
        return put(*args, **kwargs)

    monkeypatch.setattr(client, "_put_object", another_upload_writes_first)
    assert upload.write_manifest(client, bucket, ["train/0/this-upload.png"]) == 182
    names = set(listing.list_objects_from_manifest(bucket, client=client))
    assert {"train/0/this-upload.png", "train/0/other-upload.png"} <= names and len(names) == 182


@pytest.mark.timeout(120)
def test_an_append_round_and_an_upload_at_once_both_land_in_the_manifest(client, uploaded):
    from concurrent.futures import ThreadPoolExecutor

    bucket, _ = uploaded
    calls = [dict(smoke_test_size=120), dict(smoke_test_size=SMOKE, append=True)]
    with ThreadPoolExecutor(2) as pool:  # each read the manifest (or listing) before the other wrote it
        reports = list(pool.map(lambda kw: upload.upload_mnist(bucket, client=client, progress=False, **kw), calls))
    assert [r.uploaded for r in reports] == [720 - 180, 180]
    keys = listing.list_objects_parallel(bucket, client=client)
    assert len(keys) == len(set(keys)) == 720 + 180
    assert sorted(listing.list_objects_from_manifest(bucket, client=client)) == sorted(keys)


def test_a_folder_whose_writer_stopped_half_way_is_refused_by_its_readers(bucket, client, settings):
    filesystem = storage.s3_filesystem(settings)
    storage.ensure_bucket(client, bucket)
    folder = f"{bucket}/predictions/cut-off"
    with filesystem.open_output_stream(f"{folder}/part-0.parquet") as out:  # a write that stopped after one file
        out.write(b"some rows")
    with pytest.raises(storage.StorageError, match=r"cut-off/ is incomplete: .* \(no _SUCCESS\). Run it again\."):
        storage.require_complete(filesystem, folder, "Run it again.")
    storage.mark_complete(filesystem, folder)
    assert storage.require_complete(filesystem, folder, "Run it again.") == folder
