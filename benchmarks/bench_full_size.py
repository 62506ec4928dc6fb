"""Every notebook at full size, one after the other in one run, and notebook 04 against the code it replaced.

``smoke_test_size=0``: all 60,000 training images (50,000 to train on, 10,000 held out for validation)
and 10,000 test images, every notebook at its other defaults, in order 01-07 on the same stack and bucket,
as a learner would run them at full size. Notebook 04's model is then tested again outside the notebook:
its checkpoint, read from the bucket, on all 10,000 test images, so the accuracy the notebook reports is
checked, not trusted. Notebook 06 runs against lakeFS where one answers, else against the tests' API
double (the JSON says which). Where 04 and 07 run, 07 runs once more as a learner without lakeFS runs it:
``@champion`` a smoke model, and notebook 04's full-size model the day's (``"07 without lakeFS"``).

``--baseline REF`` also runs notebook 04 of git revision REF at full size in the same run, in a worktree
of its own with a stack of its own (its code runs in its Ray's workers), so notebook 04's time is
compared with the code it replaced on the same machine at the same time.

    python benchmarks/bench_full_size.py [--bucket bench-full] [--only 04 06] [--baseline aabc910]

Writes ``benchmarks/results/full_size.json``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from common import lakefs_or_double, print_table, summary_facts, write_results

from helpers import upload
from helpers.settings import project_root
from workshop import stack, stack_ports
from workshop.runner import execute, notebook_paths

# What each notebook's row keeps of its summary, beside its status and seconds.
KEPT = {"01": ("objects",), "02": ("train pointers", "test pointers"),
        "03": ("pointers",),
        "04": ("validation accuracy", "test accuracy", "load seconds", "training seconds", "epochs",
               "training images", "validation images"),
        "05": ("trials", "chosen val_accuracy", "test_accuracy", "sweep seconds"),
        "06": ("objects imported", "experiments", "chosen", "chosen val_accuracy", "chosen is the winner",
               "chosen test_accuracy (measured once)", "champion val_accuracy", "reproduced"),
        "07": ("model source", "images predicted", "test_accuracy from the Parquet",
               "Ray Data seconds", "driver seconds")}


def recomputed_accuracy(checkpoint_uri: str) -> float:
    """Notebook 04's model from its checkpoint in the bucket, tested on all 10,000 MNIST test images without Ray."""
    from helpers import mnist, preprocess, storage, training

    bucket, key = checkpoint_uri.removeprefix("s3://").split("/", 1)
    body = storage.read_object(storage.get_client(), bucket, f"{key}/{training.CHECKPOINT_FILE}")
    net, _ = training.load_checkpoint(body)
    data = mnist.load_mnist()
    predicted = training.predict(net, preprocess.normalise(data.test_images))
    return training.accuracy(predicted, data.test_labels.astype("int64"))


def without_lakefs_07(bucket: str, suffix: str, out: Path) -> dict:
    """Notebook 07 at full size where notebook 06 never ran, as a learner without lakeFS runs it.

    The registry's ``@champion`` is first a smoke model (notebook 04 at its smoke defaults, registered as a
    learner's earlier smoke run leaves it); notebook 04's full-size model is the day's. Notebook 07 must move
    ``@champion`` to the better one by notebook 06's rule and say which notebook registered what it serves.
    """
    from helpers import champion_candidates, serving_support, tracking
    from helpers.settings import load_settings

    smoke_experiment, name = f"full-smoke-{suffix}", f"full-no-lakefs-{suffix}"
    (notebook,) = notebook_paths(pattern="04_*.ipynb")
    execute(notebook, out / "04-smoke.ipynb", {"bucket": bucket, "experiment": smoke_experiment}, cell_timeout=3600)
    client = tracking.connect(load_settings().mlflow_tracking_uri)
    smoke = champion_candidates.latest_training_model(client, smoke_experiment)
    serving_support.register_as(client, name, smoke, "champion", tags={"registered_by": "a smoke run of notebook 04"})
    row = run_notebook("07", {"bucket": bucket, "registered_model": name, "training_experiment": f"full-train-{suffix}",
                              "sweep_experiment": f"full-none-{suffix}", "experiment": f"full-inference-{suffix}"}, out)
    return {**row, "champion before": f"a smoke run of notebook 04, test accuracy {smoke.recorded_accuracy:.2%}"}


def run_notebook(number: str, parameters: dict, out: Path) -> dict:
    """One notebook at full size: its status, seconds and the summary facts :data:`KEPT` names."""
    (notebook,) = notebook_paths(pattern=f"{number}_*.ipynb")
    run = execute(notebook, out / notebook.name, {"smoke_test_size": 0, **parameters}, cell_timeout=3600)
    facts = summary_facts(run.output) if run.output.is_file() else {}
    print(f"  {notebook.name}: {run.status} in {run.seconds:.0f} s {run.message}", flush=True)
    row = {"notebook": number, "status": run.status, "seconds": round(run.seconds, 1),
           **{key: facts.get(key) for key in KEPT[number]}}
    if number == "04" and facts.get("checkpoint"):
        row["test accuracy recomputed from the checkpoint"] = round(recomputed_accuracy(facts["checkpoint"]), 4)
    return row


def baseline_04(ref: str, bucket: str) -> dict:
    """Notebook 04 of revision ``ref`` at full size: a worktree, a stack started from it, its bucket filled."""
    root = Path(tempfile.mkdtemp(prefix="baseline-"))
    tree, state = root / "tree", root / "stack"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), ref], cwd=project_root(), check=True,
                   capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(tree), "STACK_STATE_DIR": str(state)}
    env = {k: v for k, v in env.items() if not k.startswith(("S3_", "MLFLOW_", "LAKEFS_", "RAY_ADDRESS"))}
    python = [sys.executable, "-c"]
    platform = "workshop" if (tree / "workshop").is_dir() else "helpers"  # the baseline's own stack and runner
    try:
        ports = stack_ports.free_ports(["s3", "mlflow", "base", "ray"])
        subprocess.run([sys.executable, "-m", f"{platform}.stack", "up", "--no-lakefs", "--state-dir", str(state),
                        "--s3-port", str(ports["s3"]), "--mlflow-port", str(ports["mlflow"]), "--port-base",
                        str(ports["base"]), "--ray-port", str(ports["ray"])], cwd=tree, env=env, check=True)
        subprocess.run([*python, f"from helpers import upload; upload.upload_mnist({bucket!r}, 0, progress=False)"],
                       cwd=tree, env=env, check=True)
        out, notebook = root / "out.ipynb", tree / "notebooks" / "04_distributed_training.ipynb"
        script = (f"from pathlib import Path; from {platform}.runner import execute; "
                  f"r = execute(Path({str(notebook)!r}), Path({str(out)!r}), "
                  f"{{'bucket': {bucket!r}, 'smoke_test_size': 0}}, cell_timeout=3600); "
                  f"print('RESULT', r.status, round(r.seconds, 1))")
        done = subprocess.run([*python, script], cwd=tree, env=env, capture_output=True, text=True)
        status, seconds = done.stdout.split("RESULT", 1)[1].split()
        facts = summary_facts(out) if out.is_file() else {}
        print(f"  baseline {ref} 04: {status} in {float(seconds):.0f} s", flush=True)
        return {"ref": ref, "notebook": "04", "status": status, "seconds": float(seconds),
                **{key: facts.get(key) for key in KEPT["04"]}}
    finally:
        subprocess.run([sys.executable, "-m", f"{platform}.stack", "down", "--state-dir", str(state)], cwd=tree,
                       env=env, capture_output=True)
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=project_root(), capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Run every notebook (or ``--only`` some) at full size and write the JSON; exit 1 when one fails."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bucket", default="bench-full", help="a bucket of its own: every image goes in")
    parser.add_argument("--only", nargs="*", help="notebook numbers (default: all seven)")
    parser.add_argument("--baseline", metavar="REF", help="also run notebook 04 of this git revision")
    args = parser.parse_args(argv)

    baseline = baseline_04(args.baseline, args.bucket) if args.baseline else None
    settings = stack.ensure_stack()
    upload.upload_mnist(args.bucket, 0, progress=False)  # the notebooks find it complete
    out = Path(tempfile.mkdtemp(prefix="full-size-"))
    suffix = uuid.uuid4().hex[:8]  # the runs of this benchmark, apart from a learner's
    per_notebook = {"05": {"experiment": f"full-tune-{suffix}"},
                    "04": {"experiment": f"full-train-{suffix}"},
                    "06": {"repo_name": f"full-{suffix}", "experiment": f"full-lakefs-{suffix}",
                           "registered_model": f"full-{suffix}", "training_experiment": f"full-train-{suffix}",
                           "sweep_experiment": f"full-tune-{suffix}"},
                    "07": {"registered_model": f"full-{suffix}", "training_experiment": f"full-train-{suffix}",
                           "sweep_experiment": f"full-tune-{suffix}", "experiment": f"full-inference-{suffix}"}}
    rows, by_number = [], {}
    with lakefs_or_double(settings) as lakefs:
        for notebook in notebook_paths():
            number = notebook.name[:2]
            if args.only and number not in args.only:
                continue
            rows.append(run_notebook(number, {"bucket": args.bucket, **per_notebook.get(number, {})}, out))
            by_number[number] = rows[-1]
        if "04" in by_number and "07" in by_number:
            by_number["07 without lakeFS"] = without_lakefs_07(args.bucket, suffix, out)
    shutil.rmtree(out, ignore_errors=True)
    ok = all(row["status"] == "ok" for row in by_number.values())
    payload = {"bucket": args.bucket, "lakefs": lakefs, "rows": rows}
    if "07 without lakeFS" in by_number:
        payload["07 without lakeFS"] = by_number["07 without lakeFS"]
    if "04" in by_number and "06" in by_number and ok:
        payload["ratio_06_to_04"] = round(by_number["06"]["seconds"] / by_number["04"]["seconds"], 2)
    if baseline and "04" in by_number:
        payload["baseline_04"] = baseline
        payload["ratio_04_to_baseline"] = round(by_number["04"]["seconds"] / baseline["seconds"], 2)
    path = write_results("full_size", payload)
    print_table("Full size (every image), one run", rows, ["notebook", "status", "seconds"])
    if baseline:
        print(f"\nnotebook 04: {by_number['04']['seconds']} s now, {baseline['seconds']} s at {baseline['ref']} "
              f"({payload['ratio_04_to_baseline']}x)")
    print(f"written: {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
