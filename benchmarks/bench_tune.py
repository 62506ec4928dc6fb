"""Sweep wall time and trials/minute, with ASHA and without, side by side at equal num_samples and seed.

    python benchmarks/bench_tune.py [--smoke-test-size 600] [--num-samples 8] [--epochs 6]
"""

from __future__ import annotations

import argparse

from common import print_table, write_results

from helpers import data, stack, storage, tune


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke-test-size", type=int, default=600)
    parser.add_argument("--num-samples", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--max-concurrent-trials", type=int, default=2)
    parser.add_argument("--bucket", default="bench-listing")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    settings = stack.ensure_stack()
    storage.upload_mnist(args.bucket, 0, client=storage.get_client(settings), progress=False)
    data.init_ray(settings)
    arrays = tune.load_arrays(args.bucket, args.smoke_test_size, settings, seed=args.seed)
    rows, sweeps = [], {}
    for scheduler in ("asha", None):
        sweep = tune.run_sweep(args.num_samples, args.max_concurrent_trials, "hyperopt", scheduler, args.epochs,
                               args.bucket, args.smoke_test_size, seed=args.seed, experiment="bench-tune",
                               settings=settings, arrays=arrays, verbose=False)
        sweeps[scheduler or "none"] = sweep
        epochs_run = int(sweep.table["training_iteration"].sum())
        rows.append({"scheduler": scheduler or "none", "trials": len(sweep.table), "epochs run": epochs_run,
                     "seconds": round(sweep.seconds, 1),
                     "trials/min": round(len(sweep.table) / sweep.seconds * 60, 1),
                     "best val acc": round(sweep.best_validation_accuracy, 4),
                     "best test acc": round(sweep.test_accuracy, 4)})
    data.shutdown_ray()
    speedup = sweeps["none"].seconds / sweeps["asha"].seconds
    print_table(f"Sweep: {args.num_samples} trials x up to {args.epochs} epochs, {args.smoke_test_size} images, "
                f"{args.max_concurrent_trials} at once", rows,
                ["scheduler", "trials", "epochs run", "seconds", "trials/min", "best val acc", "best test acc"])
    print(f"\nASHA speed-up at equal num_samples: {speedup:.2f}x")
    path = write_results(f"tune_{args.smoke_test_size}", {"args": vars(args), "rows": rows, "asha_speedup": speedup})
    print(f"written to {path.relative_to(path.parents[2])}")


if __name__ == "__main__":
    main()
