"""read_once: the same pointers give back the same datasets within one Ray job, anything else reads again."""

import pytest

from helpers import dataset_cache

TRAIN = (["train/1/a.png", "train/2/b.png"], [1, 2])
TEST = (["test/3/c.png"], [3])


@pytest.fixture
def job(monkeypatch):
    """The Ray job the cache sees (the one boundary replaced: no Ray needed to test the bookkeeping)."""
    current = {"id": "01000000"}
    monkeypatch.setattr(dataset_cache, "_ray_job", lambda: current["id"])
    dataset_cache.forget()
    yield current
    dataset_cache.forget()


def counting_reader():
    calls = []

    def read(bucket, *splits, **options):
        calls.append((bucket, splits, options))
        return object()

    return read, calls


def test_the_same_pointers_are_read_once(job):
    read, calls = counting_reader()
    first = dataset_cache.read_once(read, "mnist", TRAIN, TEST, num_actors=2)
    again = dataset_cache.read_once(read, "mnist", (list(TRAIN[0]), list(TRAIN[1])), TEST, num_actors=2)
    assert again is first and len(calls) == 1


@pytest.mark.parametrize("change", [
    lambda: ("other", TRAIN, TEST, {"num_actors": 2}),                               # another bucket
    lambda: ("mnist", (TRAIN[0][::-1], TRAIN[1][::-1]), TEST, {"num_actors": 2}),    # another order
    lambda: ("mnist", (TRAIN[0], [1, 7]), TEST, {"num_actors": 2}),                  # another label
    lambda: ("mnist", TRAIN, TEST, {"num_actors": 3}),                               # another option
    lambda: ("mnist", (TRAIN[0] + TEST[0], TRAIN[1] + TEST[1]), ([], []), {"num_actors": 2}),  # another split
])
def test_anything_else_is_read_again(job, change):
    read, calls = counting_reader()
    dataset_cache.read_once(read, "mnist", TRAIN, TEST, num_actors=2)
    bucket, train, test, options = change()
    dataset_cache.read_once(read, bucket, train, test, **options)
    assert len(calls) == 2


def test_a_new_ray_job_reads_again_and_only_the_last_few_are_kept(job):
    read, calls = counting_reader()
    dataset_cache.read_once(read, "mnist", TRAIN, TEST)
    job["id"] = "02000000"  # Ray restarted, or the kernel connected again: the old blocks are gone
    dataset_cache.read_once(read, "mnist", TRAIN, TEST)
    assert len(calls) == 2
    for bucket in ("b1", "b2", "b3")[:dataset_cache.KEEP]:
        dataset_cache.read_once(read, bucket, TRAIN, TEST)
    dataset_cache.read_once(read, "mnist", TRAIN, TEST)  # let go of by now
    assert len(calls) == 3 + dataset_cache.KEEP


def test_without_ray_nothing_is_kept(monkeypatch):
    monkeypatch.setattr(dataset_cache, "_ray_job", lambda: None)
    dataset_cache.forget()
    read, calls = counting_reader()
    dataset_cache.read_once(read, "mnist", TRAIN, TEST)
    dataset_cache.read_once(read, "mnist", TRAIN, TEST)
    assert len(calls) == 2
