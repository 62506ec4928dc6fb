"""The GPU path without a GPU: what crosses torch.distributed lives on the device Ray Train gives the worker.

With ``use_gpu=True`` Ray Train's process group is NCCL, which reduces CUDA tensors only. These tests run
the collectives on a real gloo group and replace device selection only at its one boundary,
``ray.train.torch.get_device()``: the ``meta`` device stands in for a GPU.
"""

import socket

import pytest
import ray.train.torch
import torch
import torch.distributed as dist

from helpers import training
from helpers.training_support import ShardCache


@pytest.fixture
def gloo_group():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_the_epoch_sums_are_reduced_on_the_device_get_device_names(gloo_group, monkeypatch):
    monkeypatch.setattr(ray.train.torch, "get_device", lambda: torch.device("meta"))
    reduced = training.all_reduce_sum([3.0, 4.0])
    assert reduced.device.type == "meta"  # a CPU tensor here is what NCCL rejects on a GPU
    monkeypatch.setattr(ray.train.torch, "get_device", lambda: torch.device("cpu"))
    assert training.all_reduce_sum([3.0, 4.0]).tolist() == [3.0, 4.0]


def test_outside_ray_train_the_sums_stay_as_they_are_without_asking_for_a_device(monkeypatch):
    assert not dist.is_initialized()
    monkeypatch.setattr(ray.train.torch, "get_device", lambda: pytest.fail("no device outside Ray Train"))
    assert training.all_reduce_sum([1.0, 2.0]).tolist() == [1.0, 2.0]


def test_the_cached_shard_is_shuffled_on_the_device_of_its_rows():
    cache = ShardCache({"cache_shard": True, "batch_size_per_worker": 4})
    rows = [{"X": torch.zeros(4, 1, 28, 28, device="meta"), "y": torch.zeros(4, dtype=torch.int64, device="meta")}]
    assert len(list(cache.epoch(iter(rows), seed=1))) == 1  # the first epoch streams and keeps the rows
    (batch,) = list(cache.epoch(iter(()), seed=2))  # later epochs index the kept rows on their own device
    assert batch["X"].device.type == batch["y"].device.type == "meta"


def test_a_checkpoint_saved_from_a_device_loads_on_a_cpu_only_machine(tmp_path, monkeypatch):
    net = training.build_model("mlp", [16])
    state = training.checkpoint_state(net, None, 1, [], {"model": "mlp", "hidden_sizes": [16]})
    path = tmp_path / training.CHECKPOINT_FILE
    torch.save(state, path)
    seen = {}
    real_load = torch.load

    def load(*args, **kwargs):
        seen.update(kwargs)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", load)
    loaded, _ = training.load_checkpoint(path)
    assert seen["map_location"] == "cpu" and seen["weights_only"] is True  # CUDA tensors come back on the CPU
    assert all(p.device.type == "cpu" for p in loaded.parameters())
