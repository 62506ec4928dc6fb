"""Data-loading throughput: five ways to turn the same pointers into images, side by side in one run.

1. tasks: the original article's function, a new client per batch, sequential GETs;
2. actors: an actor pool, one client per actor, concurrent GETs;
3. read_images: Ray's reader through pyarrow S3 (label from the folder name);
4. parquet: the same images packed into a few Parquet shards;
5. ceiling: a plain threaded GET loop in one process, no decoding.

Each is timed to a full ``materialize()`` after a warm-up that starts Ray's
worker processes, at a smoke size and on all 60,000 training images.

    python benchmarks/bench_data_loading.py [--sizes 2000 60000]
"""

from __future__ import annotations

import argparse
import re
import time
from concurrent.futures import ThreadPoolExecutor

from common import print_table, write_results

from helpers import cluster, listing, preprocess, storage, upload
from workshop import stack


def ceiling(client, bucket: str, keys: list[str], threads: int = 16) -> None:
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for _ in pool.map(lambda key: storage.read_object(client, bucket, key), keys):
            pass


def tasks(ds, bucket: str):
    """Notebook 03's task form: map_batches with the preprocessing function."""
    return ds.map_batches(preprocess.preprocess_batch, batch_size=400, fn_kwargs={"bucket": bucket})


def time_it(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def remote_times(ds) -> dict[str, float]:
    """Sum of remote wall and CPU seconds over the dataset's operators (from Ray Data's stats)."""
    stats = ds.stats()
    wall = re.findall(r"Remote wall time: .*?([\d.]+)(ms|s|us) total", stats)
    cpu = re.findall(r"Remote cpu time: .*?([\d.]+)(ms|s|us) total", stats)
    scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
    return {"remote_wall_s": round(sum(float(v) * scale[u] for v, u in wall), 2),
            "remote_cpu_s": round(sum(float(v) * scale[u] for v, u in cpu), 2)}


def bench(settings, bucket: str, x: list[str], y: list[int], num_actors: int, threads: int) -> list[dict]:
    client = storage.get_client(settings, max_connections=threads)
    ds = preprocess.to_ray_dataset(x, y)
    results: dict[str, dict] = {}

    def run(name: str, make) -> None:
        holder = {}
        seconds = time_it(lambda: holder.setdefault("ds", make().materialize()))
        assert holder["ds"].count() == len(x), name
        results[name] = {"seconds": seconds, **remote_times(holder["ds"])}

    run("tasks", lambda: tasks(ds, bucket))
    run("actors", lambda: preprocess.preprocess_with_actors(ds, bucket, num_actors=num_actors, threads=threads))
    run("read_images", lambda: preprocess.read_images_dataset(bucket, keys=x, settings=settings))
    pack_seconds = time_it(lambda: preprocess.pack_parquet_shards(ds, bucket, num_shards=4, settings=settings))
    run("parquet", lambda: preprocess.read_parquet_dataset(bucket, settings=settings))
    results["ceiling"] = {"seconds": time_it(lambda: ceiling(client, bucket, x, threads))}

    rows = []
    for name, r in results.items():
        rows.append({"size": len(x), "method": name, "seconds": round(r["seconds"], 2),
                     "images/s": round(len(x) / r["seconds"]),
                     "vs tasks": f"{results['tasks']['seconds'] / r['seconds']:.1f}x",
                     "vs ceiling": f"{results['ceiling']['seconds'] / r['seconds']:.0%}",
                     **{k: v for k, v in r.items() if k != "seconds"}})
    rows.append({"size": len(x), "method": "(packing the shards, once)", "seconds": round(pack_seconds, 2)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 60000])
    parser.add_argument("--bucket", default="bench-listing")
    parser.add_argument("--num-actors", type=int, default=2)
    parser.add_argument("--threads", type=int, default=16)
    args = parser.parse_args()

    settings = stack.ensure_stack(with_mlflow=False)
    client = storage.get_client(settings)
    print(f"ensuring the 70,000 objects are in '{args.bucket}' (uploads only on the first run) ...", flush=True)
    upload.upload_mnist(args.bucket, 0, client=client, progress=False)
    x_all, y_all, *_ = listing.get_train_test_data(args.bucket, listing="manifest", client=client)
    cluster.init_ray(settings)
    warm = preprocess.to_ray_dataset(x_all[:64], y_all[:64])  # start the worker processes before timing
    tasks(warm, args.bucket).materialize()
    preprocess.preprocess_with_actors(warm, args.bucket, num_actors=args.num_actors).materialize()

    rows = []
    for size in args.sizes:
        x, y, *_ = listing.get_train_test_data(args.bucket, smoke_test_size=min(size, 60000), listing="manifest",
                                               client=client)
        rows += bench(settings, args.bucket, x, y, args.num_actors, args.threads)
        print_table(f"Data loading, {len(x):,} images", [r for r in rows if r["size"] == len(x)],
                    ["method", "seconds", "images/s", "vs tasks", "vs ceiling", "remote_wall_s", "remote_cpu_s"])
    cluster.shutdown_ray()
    full = [r for r in rows if r["size"] == max(r["size"] for r in rows)]
    by = {r["method"]: r for r in full}
    path = write_results("data_loading", {
        "object_store": settings.s3_url, "num_actors": args.num_actors, "threads": args.threads, "rows": rows,
        "ratios_at_largest_size": {
            "actors_vs_tasks": by["actors"]["images/s"] / by["tasks"]["images/s"],
            "actors_vs_ceiling": by["actors"]["images/s"] / by["ceiling"]["images/s"],
            "parquet_vs_tasks": by["parquet"]["images/s"] / by["tasks"]["images/s"],
        },
    })
    print(f"\nwritten to {path.relative_to(path.parents[2])}")


if __name__ == "__main__":
    main()
