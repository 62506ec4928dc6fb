"""How each step's cost grows with the data: 70,000, 140,000 and 280,000 objects, measured in one run.

The data grows as the Ray Data article grows it: notebook 01's upload in append mode, each round
another 70,000 objects (60,000 training, 10,000 test) under new keys. At each size it measures:

* the upload of the round that brought the bucket to that size (objects/s);
* listing: recursive, and from the manifest (seconds);
* the driver's peak RSS while it holds the pointer lists, in a fresh process per size and listing,
  beside the size of the pointers themselves (their text, and as Python objects);
* Ray Data over the whole training prefix: notebook 03's actors (images/s), packing it into Parquet
  shards (seconds), and reading the shards back (images/s);
* one Ray Train epoch of notebook 04's loop over every training image (samples/s): the first streams
  from the packed shards, the second trains from the shard each worker cached;
* notebook 07's inference pipeline over every test image (images/s).

Each step's cost is also given per 100,000 objects (or images), and for each step the ratio of that
cost at the largest size to the smallest: 1.0 is linear growth. The data goes to a bucket of its own
(``--bucket``, default ``bench-scale``; ``mnist`` is never touched), emptied first so the sizes are
exact; ``--cleanup`` deletes it afterwards, otherwise it stays for the next run.

    python benchmarks/bench_scale.py [--rounds 1 2 4] [--bucket bench-scale] [--cleanup]

Writes ``benchmarks/results/scale.json`` (each run under ``--label``, default ``after``) and the chart
``docs/scale.png``.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from common import RESULTS, machine, print_table

ROUND = 70_000  # objects one upload round adds
LIMIT = 1.25  # the per-object cost at the largest size, at most this multiple of the smallest's
CHART = Path(__file__).resolve().parents[1] / "docs" / "scale.png"


def timed(fn):
    """``(fn(), seconds)``."""
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started


def grow(client, bucket: str, rounds: int, have: int) -> dict:
    """Upload rounds ``have+1 .. rounds``; the last round's objects/s and every round's seconds."""
    from helpers import upload

    seconds = []
    for number in range(have + 1, rounds + 1):
        report, took = timed(lambda n=number: upload.upload_mnist(bucket, 0, append=n > 1, client=client,
                                                                   progress=False))
        seconds.append(round(took, 2))
        print(f"  round {number}: {report.uploaded:,} objects in {took:.1f} s", flush=True)
    return {"upload_objects_per_s": round(ROUND / seconds[-1]), "upload_round_seconds": seconds}


def _status_bytes(field: str) -> int:
    """``VmRSS`` or ``VmHWM`` (the peak) of this process, from /proc/self/status, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} is not in /proc/self/status")


def probe_rss(bucket: str, method: str) -> dict:
    """In this process: list ``bucket`` as the notebooks do and report peak RSS against the pointers' size.

    The peak is reset after the imports (``/proc/self/clear_refs``), which on their own reach far
    higher than any listing here: what is measured is the listing and the pointer lists it leaves.
    """
    from helpers import listing, storage

    client = storage.get_client()
    list(client.list_objects(bucket, prefix="_manifest/"))  # a connection and a small listing first
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM starts again from the present RSS
    baseline = _status_bytes("VmRSS")
    x_train, y_train, x_test, y_test, _ = listing.get_train_test_data(bucket, 0, method, client)
    keys = [*x_train, *x_test]
    return {"pointers": len(keys), "peak_rss_bytes": _status_bytes("VmHWM"), "baseline_rss_bytes": baseline,
            "held_rss_bytes": _status_bytes("VmRSS"),
            "pointer_text_bytes": sum(len(k.encode()) for k in keys),
            # each key a str object plus its slot in a list; the labels are small ints Python shares
            "pointer_object_bytes": sum(sys.getsizeof(k) + 8 for k in keys) + 8 * len(keys)}


def rss_in_fresh_process(bucket: str, method: str) -> dict:
    """:func:`probe_rss` in a new Python process, so one size's memory does not carry into the next."""
    out = subprocess.run([sys.executable, __file__, "--probe-rss", bucket, method], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    return json.loads(out.stdout.strip().splitlines()[-1])


def count_rows(ds) -> int:
    """Stream ``ds`` through the driver without keeping it; the number of rows."""
    return sum(len(batch["y"]) for batch in ds.iter_batches(batch_size=None))


def ray_data_steps(settings, bucket: str, x_train, y_train) -> dict:
    """Actors over the training pointers, packing them into shards, reading the shards: seconds each."""
    from helpers import preprocess

    pointers = preprocess.to_ray_dataset(x_train, y_train)
    rows, actors = timed(lambda: count_rows(preprocess.preprocess_with_actors(pointers, bucket, num_actors=2)))
    assert rows == len(x_train), (rows, len(x_train))
    _, packing = timed(lambda: preprocess.pack_parquet_shards(pointers, bucket, settings=settings))
    rows, parquet = timed(lambda: count_rows(preprocess.read_parquet_dataset(bucket, settings=settings)))
    assert rows == len(x_train), (rows, len(x_train))
    return {"actors_s": actors, "packing_s": packing, "parquet_read_s": parquet}


def training_epochs(settings, bucket: str, cluster_cpus: float) -> dict:
    """Two epochs of notebook 04's trainer (2 workers) on the packed shards: streamed, then from the cache."""
    from helpers import interrupts, preprocess, training

    params = {**training.DEFAULT_PARAMS, "epochs": 2, "cache_shard": True, "checkpoint_every": 2}
    trainer = training.make_trainer(params, {"train": preprocess.read_parquet_dataset(bucket, settings=settings)},
                                    2, training.unique_run_name("scale"), f"{bucket}/ray-results",
                                    cluster_cpus=cluster_cpus, settings=settings)
    with interrupts.stop_cleanly("Training", trainer=trainer):
        result = trainer.fit()
    history = training.load_checkpoint(result.checkpoint)[1]["history"]
    return {"epoch_streamed_s": history[0]["epoch_seconds"], "epoch_cached_s": history[1]["epoch_seconds"],
            "epoch_samples": history[0]["samples"]}


def inference_step(bucket: str, x_test, y_test, model_uri: str) -> float:
    """Notebook 07's pipeline over every test image, written as Parquet: seconds."""
    from helpers import inference, storage

    _, seconds = timed(lambda: inference.predict_pointers(x_test, y_test, bucket, model_uri).write_parquet(
        f"{bucket}/{inference.PREDICTIONS_PREFIX}/scale-{uuid.uuid4().hex[:8]}", filesystem=storage.s3_filesystem()))
    return seconds


def measure(settings, client, bucket: str, objects: int, model_uri: str | None, cluster_cpus: float) -> dict:
    """Every step at the bucket's present size."""
    from helpers import listing, storage

    row: dict = {"objects": objects}
    keys, row["list_recursive_s"] = timed(lambda: listing.get_object_list(bucket, client))
    _, row["list_manifest_s"] = timed(lambda: listing.list_objects_from_manifest(bucket, client))
    assert len(storage.image_keys(keys)) == objects, (len(keys), objects)  # the manifest is one more object
    for method in ("recursive", "manifest"):
        row[f"rss_{method}"] = rss_in_fresh_process(bucket, method)
    x_train, y_train, x_test, y_test, _ = listing.get_train_test_data(bucket, 0, "manifest", client)
    row["train_images"], row["test_images"] = len(x_train), len(x_test)
    row.update(ray_data_steps(settings, bucket, x_train, y_train))
    row.update(training_epochs(settings, bucket, cluster_cpus))
    if model_uri:
        row["inference_s"] = inference_step(bucket, x_test, y_test, model_uri)
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}


# step -> (the row's seconds or count, what it is counted in: objects, training or test images, samples)
STEPS = {
    "upload": (lambda r: r["upload_round_seconds"][-1], lambda r: ROUND),
    "list, recursive": (lambda r: r["list_recursive_s"], lambda r: r["objects"]),
    "list, manifest": (lambda r: r["list_manifest_s"], lambda r: r["objects"]),
    "Ray Data, actors": (lambda r: r["actors_s"], lambda r: r["train_images"]),
    "packing": (lambda r: r["packing_s"], lambda r: r["train_images"]),
    "Ray Data, packed shards": (lambda r: r["parquet_read_s"], lambda r: r["train_images"]),
    "epoch, streamed": (lambda r: r["epoch_streamed_s"], lambda r: r["epoch_samples"]),
    "epoch, cached shards": (lambda r: r["epoch_cached_s"], lambda r: r["epoch_samples"]),
    "inference": (lambda r: r.get("inference_s"), lambda r: r["test_images"]),
}


def growth(rows: list[dict]) -> list[dict]:
    """Per step: seconds per 100,000 at each size, and the largest size's per-object cost over the smallest's."""
    table = []
    for step, (seconds, count) in STEPS.items():
        per = [None if seconds(r) is None else seconds(r) / count(r) * 100_000 for r in rows]
        ratio = round(per[-1] / per[0], 2) if None not in per and per[0] else None
        per_size = {f"s per 100k at {r['objects'] // 1000}k": None if p is None else float(f"{p:.3g}")
                    for r, p in zip(rows, per, strict=True)}
        table.append({"step": step, **per_size,
                      "largest / smallest": ratio, "linear enough": None if ratio is None else ratio <= LIMIT})
    return table


def memory(rows: list[dict]) -> dict:
    """Peak RSS growth from the smallest size to the largest against the extra pointers' size, per listing."""
    out = {}
    for method in ("recursive", "manifest"):
        small, large = rows[0][f"rss_{method}"], rows[-1][f"rss_{method}"]
        grew = large["peak_rss_bytes"] - small["peak_rss_bytes"]
        extra_objects = large["pointer_object_bytes"] - small["pointer_object_bytes"]
        out[method] = {"peak_rss_growth_mb": round(grew / 2**20, 1),
                       "extra_pointer_text_mb": round((large["pointer_text_bytes"] - small["pointer_text_bytes"])
                                                      / 2**20, 1),
                       "extra_pointer_objects_mb": round(extra_objects / 2**20, 1),
                       "growth_over_pointer_objects": round(grew / extra_objects, 2)}
    return out


def chart(rows: list[dict], path: Path) -> None:
    """Log-log: each step's seconds against the objects, and the line linear growth would follow from the first size.

    The upload is the seconds of every round up to that size (a round alone is always 70,000 objects).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    objects = [r["objects"] for r in rows]
    uploaded = list(itertools.accumulate(sum(r["upload_round_seconds"]) for r in rows))
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for step, (seconds, _) in STEPS.items():
        values = uploaded if step == "upload" else [seconds(r) for r in rows]
        if None in values:
            continue
        (line,) = ax.plot(objects, values, marker="o", label=step)
        ax.plot(objects, [values[0] * n / objects[0] for n in objects], linestyle=":", color=line.get_color(),
                linewidth=1, alpha=0.7)
    ax.set(xscale="log", yscale="log", xlabel="objects in the bucket", ylabel="seconds",
           title="Each step's seconds as the bucket grows (dotted: linear growth from the first size)")
    ax.set_xticks(objects, [f"{n // 1000}k" for n in objects])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    path.parent.mkdir(exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Grow the bucket round by round, measure every step at each size, write the JSON and the chart."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, nargs="+", default=[1, 2, 4],
                        help="sizes to measure at, in upload rounds of 70,000 objects")
    parser.add_argument("--bucket", default="bench-scale", help="a bucket of the benchmark's own, emptied first")
    parser.add_argument("--cleanup", action="store_true", help="delete the bucket afterwards")
    parser.add_argument("--label", default="after", help="key under which scale.json keeps this run")
    parser.add_argument("--probe-rss", nargs=2, metavar=("BUCKET", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe_rss:
        print(json.dumps(probe_rss(*args.probe_rss)))
        return 0
    if args.rounds != sorted(set(args.rounds)) or args.rounds[0] < 1:
        parser.error("--rounds: increasing whole numbers from 1, e.g. 1 2 4")

    from bench_inference import logged_model

    from helpers import cluster, storage
    from workshop import stack

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    settings = stack.ensure_stack()
    client = storage.get_client(settings)
    if client.bucket_exists(args.bucket):
        print(f"emptying '{args.bucket}' ...", flush=True)
        storage.delete_bucket(client, args.bucket, force=True)
    cluster_cpus = cluster.init_ray(settings)["CPU"]
    model_uri = logged_model(settings)
    rows, have = [], 0
    try:
        for rounds in args.rounds:
            print(f"growing to {rounds * ROUND:,} objects ...", flush=True)
            uploads = grow(client, args.bucket, rounds, have)
            have = rounds
            row = {**measure(settings, client, args.bucket, rounds * ROUND, model_uri, cluster_cpus), **uploads}
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        cluster.shutdown_ray()
        if args.cleanup:
            storage.delete_bucket(client, args.bucket, force=True)
    table, mem = growth(rows), memory(rows)
    chart(rows, CHART)
    path = RESULTS / "scale.json"
    stored = json.loads(path.read_text()) if path.is_file() else {}
    stored.update({"benchmark": "scale", "limit_largest_over_smallest": LIMIT})
    stored.setdefault("runs", {})[args.label] = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine(),
        "bucket": args.bucket, "rows": rows, "growth": table, "memory": mem}
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(stored, indent=2) + "\n")
    columns = ["step", *[k for k in table[0] if k.startswith("s per")], "largest / smallest", "linear enough"]
    print_table(f"Cost per 100,000 as the bucket grows ({args.label})", table, columns)
    print_table("Driver memory, smallest to largest size", [{"listing": k, **v} for k, v in mem.items()],
                ["listing", "peak_rss_growth_mb", "extra_pointer_text_mb", "extra_pointer_objects_mb",
                 "growth_over_pointer_objects"])
    print(f"\nwritten: {path}; chart: {CHART}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
