"""Sweep wall time and trials/minute, with ASHA and without, side by side at equal num_samples and seed.

    python benchmarks/bench_tune.py [--smoke-test-size 600] [--num-samples 8] [--epochs 10]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import time

from common import print_table, write_results

from helpers import cluster, sweeps, training, upload
from workshop import stack


def sweep(settings, bucket: str, arrays, args, scheduler: str | None) -> dict:
    """Notebook 05's sweep without MLflow (only time is measured), its best trial restored and tested."""
    resources = cluster.init_ray(settings)
    name = training.unique_run_name("bench-sweep")
    trainable, extra = sweeps.make_trainable(arrays, 0, args.max_concurrent, resources["CPU"], "")
    space = {**sweeps.search_space(), "epochs": args.epochs, "seed": args.seed, **extra}
    tuner = sweeps.make_tuner(trainable, space, sweeps.make_searcher("hyperopt", [sweeps.KNOWN_GOOD], args.seed),
                              sweeps.make_scheduler(scheduler, args.epochs), args.num_samples,
                              args.max_concurrent, name, f"{bucket}/tune-results", settings)
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        results = tuner.fit()
    seconds = time.perf_counter() - started
    best = results.get_best_result(metric=sweeps.METRIC, mode=sweeps.MODE, scope="last")  # as notebook 05
    net, _ = training.load_checkpoint(sweeps.last_checkpoint(best, settings))
    return {"table": results.get_dataframe(), "seconds": seconds,
            "best_validation_accuracy": float(best.metrics[sweeps.METRIC]),
            "test_accuracy": training.accuracy(training.predict(net, arrays["x_test"]), arrays["y_test"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke-test-size", type=int, default=600)
    parser.add_argument("--num-samples", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--max-concurrent", type=int, default=1)
    parser.add_argument("--bucket", default="bench-listing")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    settings = stack.ensure_stack()
    upload.upload_mnist(args.bucket, 0, progress=False)
    cluster.init_ray(settings)
    arrays = sweeps.load_arrays(args.bucket, args.smoke_test_size, settings, seed=args.seed)
    rows, runs = [], {}
    for scheduler in ("asha", None):
        run = runs[scheduler or "none"] = sweep(settings, args.bucket, arrays, args, scheduler)
        epochs_run = int(run["table"]["training_iteration"].sum())
        rows.append({"scheduler": scheduler or "none", "trials": len(run["table"]), "epochs run": epochs_run,
                     "seconds": round(run["seconds"], 1),
                     "trials/min": round(len(run["table"]) / run["seconds"] * 60, 1),
                     "best val_accuracy": round(run["best_validation_accuracy"], 4),
                     "best test_accuracy": round(run["test_accuracy"], 4)})
    cluster.shutdown_ray()
    speedup = runs["none"]["seconds"] / runs["asha"]["seconds"]
    print_table(f"Sweep: {args.num_samples} trials x up to {args.epochs} epochs, {args.smoke_test_size} images, "
                f"{args.max_concurrent} at once", rows,
                ["scheduler", "trials", "epochs run", "seconds", "trials/min", "best val_accuracy",
                 "best test_accuracy"])
    print(f"\nASHA speed-up at equal num_samples: {speedup:.2f}x")
    path = write_results(f"tune_{args.smoke_test_size}", {"args": vars(args), "rows": rows, "asha_speedup": speedup})
    print(f"written to {path.relative_to(path.parents[2])}")


if __name__ == "__main__":
    main()
