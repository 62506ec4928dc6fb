"""Training throughput: Ray Train (2 workers, 1 worker) vs a plain one-process PyTorch loop.

All train the same MLP on the same preprocessed 60,000 images with the same
global batch size and the same per-batch bookkeeping. ``same_threads_ratio``
compares one Ray Train worker with the plain loop at the same PyTorch thread
count, so it measures Ray's own overhead, not a difference in threads; both
train from memory (the worker caches its shard after the first epoch, as
notebook 04 does). A second one-worker row streams every epoch through Ray
Data, to show what that costs. Ray Train's two-worker run is the full-size
training run of notebook 04, so it also gives the full-size test accuracy and
training time.

    python benchmarks/bench_training.py [--epochs 10] [--plain-epochs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch
from common import print_table, write_results
from torch import nn

from helpers import cluster, preprocess, training, upload
from workshop import stack


def plain_loop(images: np.ndarray, labels: np.ndarray, params: dict, batch_size: int, epochs: int,
               threads: int) -> list[dict]:
    """The same model, optimizer and per-batch bookkeeping (loss and accuracy sums) as the Ray Train loop,
    in one process with ``threads`` PyTorch threads, batches sliced from in-memory tensors."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    net = training.model_from_params(params)
    optimizer = training.make_optimizer(params["optimizer"], net.parameters(), params["lr"], params["momentum"])
    loss_fn = nn.NLLLoss(reduction="sum")
    x, y = torch.as_tensor(images), torch.as_tensor(labels, dtype=torch.int64)
    rows = []
    for epoch in range(epochs):
        order = torch.randperm(len(x))
        data_s = compute_s = loss_sum = correct = 0.0
        started = time.perf_counter()
        for i in range(0, len(x), batch_size):
            t0 = time.perf_counter()
            idx = order[i:i + batch_size]
            xb, yb = x[idx], y[idx]
            t1 = time.perf_counter()
            optimizer.zero_grad()
            output = net(xb)
            loss = loss_fn(output, yb)
            (loss / len(yb)).backward()
            optimizer.step()
            loss_sum += float(loss.detach())
            correct += float((output.argmax(dim=1) == yb).sum())
            data_s += t1 - t0
            compute_s += time.perf_counter() - t1
        seconds = time.perf_counter() - started
        rows.append({"epoch": epoch, "seconds": seconds, "samples/s": len(x) / seconds,
                     "data_seconds": data_s, "compute_seconds": compute_s, "train_loss": loss_sum / len(x)})
    torch.set_num_threads(previous)
    return rows


def ray_train(settings, bucket: str, params: dict, num_workers: int, train_ds, test_ds) -> dict:
    """Notebook 04's trainer (no MLflow run: only throughput is measured), fitted and tested."""
    resources = cluster.init_ray(settings)
    trainer = training.make_trainer(params, {"train": train_ds}, num_workers, training.unique_run_name("bench"),
                                    f"{bucket}/ray-results", cluster_cpus=resources["CPU"], settings=settings)
    started = time.perf_counter()
    result = trainer.fit()
    seconds = time.perf_counter() - started
    net, state = training.load_checkpoint(result.checkpoint)
    images, labels = preprocess.dataset_to_numpy(test_ds)
    return {"history": state["history"], "training_seconds": seconds,
            "test_accuracy": training.accuracy(training.predict(net, images), labels)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--plain-epochs", type=int, default=3)
    parser.add_argument("--bucket", default="bench-listing")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--batch-size-per-worker", type=int, default=64)
    args = parser.parse_args()

    settings = stack.ensure_stack()
    upload.upload_mnist(args.bucket, 0, progress=False)
    params = {**training.DEFAULT_PARAMS, "epochs": args.epochs, "batch_size_per_worker": args.batch_size_per_worker,
              "cache_shard": True}  # notebook 04's default
    resources = cluster.init_ray(settings)
    started = time.perf_counter()
    train_ds, _, test_ds = preprocess.load_datasets(args.bucket, 0, settings)
    load_seconds = time.perf_counter() - started

    # Ray Train, full size: also notebook 04's accuracy target.
    result = ray_train(settings, args.bucket, params, args.num_workers, train_ds, test_ds)
    # One worker with the same global batch: no gradient all-reduce, so the gap to the
    # two-worker row is the cost of synchronising gradients every step.
    global_batch = args.batch_size_per_worker * args.num_workers
    threads = max(1, int(training.worker_resources(1, False, resources["CPU"])["CPU"]))
    one_worker = {**params, "epochs": args.plain_epochs, "torch_threads": threads,
                  "batch_size_per_worker": global_batch}
    single = ray_train(settings, args.bucket, one_worker, 1, train_ds, test_ds)
    streamed = ray_train(settings, args.bucket, {**one_worker, "cache_shard": False}, 1, train_ds, test_ds)

    # Plain loop over the same preprocessed tensors: with the one worker's thread count (the ratio that
    # measures Ray, not threads), and with every CPU.
    images, labels = preprocess.dataset_to_numpy(train_ds)
    cluster.shutdown_ray()
    plain_same = plain_loop(images, labels, params, global_batch, args.plain_epochs, threads)
    all_cpus = os.cpu_count() or 1
    plain = plain_loop(images, labels, params, global_batch, args.plain_epochs, all_cpus)

    def ray_row(name: str, history: list[dict]) -> dict:
        epochs = history[1:] or history  # epoch 0 includes the dataset's start-up
        return {"loop": name, "samples/s": round(statistics.median(r["samples"] / r["epoch_seconds"] for r in epochs)),
                "epoch s": round(statistics.median(r["epoch_seconds"] for r in epochs), 2),
                # the taught loop holds no timer inside the epoch: its data and compute shares are not split
                "data s (rank 0)": None, "compute s (rank 0)": None}

    def plain_row(name: str, history: list[dict]) -> dict:
        return {"loop": name, "samples/s": round(statistics.median(r["samples/s"] for r in history)),
                "epoch s": round(statistics.median(r["seconds"] for r in history), 2),
                "data s (rank 0)": round(statistics.median(r["data_seconds"] for r in history), 2),
                "compute s (rank 0)": round(statistics.median(r["compute_seconds"] for r in history), 2)}

    rows = [
        ray_row(f"Ray Train, {args.num_workers} workers x {args.batch_size_per_worker}", result["history"]),
        ray_row(f"Ray Train, 1 worker x {global_batch}, {threads} thread(s)", single["history"]),
        ray_row(f"Ray Train, 1 worker x {global_batch}, {threads} thread(s), Ray Data every epoch",
                streamed["history"]),
        plain_row(f"plain PyTorch, 1 process x {global_batch}, {threads} thread(s)", plain_same),
        plain_row(f"plain PyTorch, 1 process x {global_batch}, {all_cpus} threads", plain),
    ]
    ray_rate, plain_rate = rows[0]["samples/s"], rows[-1]["samples/s"]
    same_threads_ratio = rows[1]["samples/s"] / rows[3]["samples/s"]
    streamed_ratio = rows[2]["samples/s"] / rows[3]["samples/s"]
    print_table(f"Training throughput (60,000 images, median epoch, global batch {global_batch})", rows,
                ["loop", "samples/s", "epoch s", "data s (rank 0)", "compute s (rank 0)"])
    print(f"\nsame threads, Ray Train (1 worker) / plain: {same_threads_ratio:.2f} (target at least 0.8); "
          f"streaming every epoch through Ray Data: {streamed_ratio:.2f}")
    print(f"ratio Ray Train ({args.num_workers} workers) / plain ({all_cpus} threads): {ray_rate / plain_rate:.2f}")
    print(f"full-size test accuracy: {result['test_accuracy']:.4f} after {args.epochs} epochs; "
          f"load {load_seconds:.0f} s, training {result['training_seconds']:.0f} s")
    path = write_results("training", {
        "params": params, "num_workers": args.num_workers, "rows": rows,
        "same_threads_ratio": same_threads_ratio, "same_threads_ratio_streaming": streamed_ratio,
        "threads_per_worker": threads,
        "ray_vs_plain": ray_rate / plain_rate, "one_worker_vs_plain": rows[1]["samples/s"] / plain_rate,
        "ray_history": result["history"], "one_worker_history": single["history"],
        "one_worker_streaming_history": streamed["history"],
        "plain_same_threads_history": plain_same, "plain_history": plain,
        "full_size": {"test_accuracy": result["test_accuracy"], "epochs": args.epochs,
                      "load_seconds": load_seconds, "training_seconds": result["training_seconds"]},
    })
    print(f"written to {path.relative_to(path.parents[2])}")


if __name__ == "__main__":
    main()
