"""Batch inference: notebook 07's Ray Data pipeline against the same job in the driver, at three sizes.

Both predict the same images with the same MLflow model (an untrained MLP, logged here: the time does not
depend on the weights). The pipeline fetches and decodes with notebook 03's actors, predicts in a pool of
model actors and writes Parquet to the bucket; the driver fetches with a thread pool, decodes and predicts
in one process and writes nothing (which favours it). Each row is the median of ``--repeats`` runs, all on
the same warm Ray.

    python benchmarks/bench_inference.py [--sizes 100 10000 70000] [--repeats 3]

Writes ``benchmarks/results/inference.json``; notebook 07 shows it under "At full size".
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid

import numpy as np
from common import print_table, write_results

from helpers import cluster, inference, listing, storage, training, upload
from workshop import stack


def logged_model(settings) -> str:
    """The URI of an untrained notebook-04 MLP, logged to MLflow as notebook 04 logs its models."""
    import mlflow

    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
    mlflow.set_experiment("bench-inference")
    with mlflow.start_run(run_name=f"bench-{uuid.uuid4().hex[:6]}"):
        net = training.build_model("mlp").eval()
        return training.log_torch_model(net, np.zeros((5, 1, 28, 28), np.float32)).model_uri


def main(argv: list[str] | None = None) -> int:
    """Time both ways at each size and write the JSON."""
    import mlflow

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 10_000, 70_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bucket", default="bench-listing")
    parser.add_argument("--num-actors", type=int, default=2)
    args = parser.parse_args(argv)

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    settings = stack.ensure_stack()
    upload.upload_mnist(args.bucket, 0, progress=False)
    cluster.init_ray(settings)
    x_train, y_train, x_test, y_test, _ = listing.get_train_test_data(args.bucket, 0, "manifest")
    keys, labels = [*x_test, *x_train], [*y_test, *y_train]  # the test images first, as notebook 07 reads them
    uri = logged_model(settings)
    filesystem = storage.s3_filesystem(settings)
    rows = []
    for size in args.sizes:
        some_keys, some_labels = keys[:size], labels[:size]
        ray_times, driver_times = [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            inference.predict_pointers(some_keys, some_labels, args.bucket, uri, args.num_actors).write_parquet(
                f"{args.bucket}/{inference.PREDICTIONS_PREFIX}/bench-{uuid.uuid4().hex[:8]}", filesystem=filesystem)
            ray_times.append(time.perf_counter() - started)
            started = time.perf_counter()
            inference.predict_in_driver(some_keys, some_labels, args.bucket, mlflow.pytorch.load_model(uri), settings)
            driver_times.append(time.perf_counter() - started)
        ray_s, driver_s = statistics.median(ray_times), statistics.median(driver_times)
        faster = "Ray Data" if ray_s < driver_s else "driver"
        rows.append({"images": len(some_keys), "ray_data_s": round(ray_s, 2), "driver_s": round(driver_s, 2),
                     "ray_data_images_per_s": round(len(some_keys) / ray_s), "faster": faster,
                     "ratio": round(max(ray_s, driver_s) / min(ray_s, driver_s), 2)})
        print(rows[-1], flush=True)
    cluster.shutdown_ray()
    path = write_results("inference", {"bucket": args.bucket, "num_actors": args.num_actors,
                                       "repeats": args.repeats, "rows": rows})
    print_table("Batch inference: Ray Data pipeline vs the driver", rows,
                ["images", "ray_data_s", "driver_s", "faster", "ratio"])
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
