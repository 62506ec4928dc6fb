"""The smoke path a learner waits for: every notebook at its default parameters, with where each second goes.

Runs the notebooks (``workshop.runner``) on the warm stack ``--repeats`` times
and records, per notebook, the total and a breakdown: the spans the code
records (``helpers.timings``: imports, Ray start, each Ray Data pipeline,
training, each epoch's compute and checkpoint + report, each Tune trial) and
every cell's duration (MLflow and object-store cells show up there). The same
run times a yardstick, one epoch of a plain PyTorch loop, and reports every
figure also in yardsticks, so runs on machines of different speed compare.
It also times a Ray Train fit whose loop only reports once: the part of
notebook 04's training that is Ray Train starting and stopping, with the
actors that fit started and when each was up (from Ray's actor table); and
one new Ray worker process importing PyTorch, the unit that start is made of.

The target is a multiple of a floor measured in the same run, on the same Ray (``floors``): each Ray
notebook's kernel start, imports and Ray start, plus every start it pays, each at what that start costs
with no work in it: each Ray Train fit it started (Ray's actor table: one ``TrainController`` each) at
an empty fit's seconds, each Ray Data pipeline it ran (Ray Data's own record of every execution)
at an empty pipeline's seconds, one of two actors where the pipeline started actors (Ray's actor
table: ``_MapWorker``s), else one of tasks, each Tune sweep at the seconds of a sweep with
notebook 05's trials and concurrency whose trials only report once, each Tune trial at a new worker
process importing PyTorch, each Serve start at ``serve.start`` and ``serve.run`` of an empty deployment,
and each model actor (07's, 08's replicas) at a new worker process loading the champion. Notebooks
03-08 at most 2x that floor. The older floors (one fit for 04 and 05, 03's timed pipelines only; no
trial, Serve or model actor counted) and the yardsticks stay in the JSON for the runs before.

    python benchmarks/bench_smoke.py                  # 01-05 (06 too where lakeFS runs), 3 repeats
    python benchmarks/bench_smoke.py --lakefs-double  # 06 against the tests' lakeFS API double where none runs
    python benchmarks/bench_smoke.py --label before   # stored under "before" in smoke.json
    python benchmarks/bench_smoke.py --ray lab        # on make lab's Ray (its dashboard on)

Writes ``benchmarks/results/smoke.json``, keeping the other labels already there.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, lakefs_or_double, machine, print_table, summary_facts  # noqa: E402

from helpers import timings  # noqa: E402

# Targets in yardsticks (a plain PyTorch epoch of the same run).
REGISTERED_MODEL = "mnist-classifier"  # notebooks 06-08's registry name, at their defaults
TARGETS = {"notebooks 01-05": 130, "any notebook": 45, "04": 33, "ray start": 9, "06": 65}
# Targets as multiples of each notebook's floor, every start counted, measured in the same run (see floors()).
FLOOR_TARGETS = {"03": 2.0, "04": 2.0, "05": 2.0, "06": 2.0, "07": 2.0, "08": 2.0}
# Where a notebook's model actors are started, the parameter that says how many (each loads the model).
MODEL_ACTORS = {"07": "num_actors", "08": "num_replicas"}


def yardstick(repeats: int = 3) -> float:
    """Median seconds of one epoch of a plain PyTorch loop: 60,000 random 784-float inputs, batch 128,
    the 784-128-64-10 MLP with SGD, 2 threads, after a warm-up epoch."""
    import torch
    from torch import nn

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        generator = torch.Generator().manual_seed(0)
        x, y = torch.randn(60_000, 784, generator=generator), torch.randint(0, 10, (60_000,), generator=generator)
        net = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10),
                            nn.LogSoftmax(dim=1))
        optimizer, loss_fn = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9), nn.NLLLoss()

        def epoch() -> float:
            started = time.perf_counter()
            for i in range(0, len(x), 128):
                optimizer.zero_grad()
                loss_fn(net(x[i:i + 128]), y[i:i + 128]).backward()
                optimizer.step()
            return time.perf_counter() - started

        epoch()
        return statistics.median(epoch() for _ in range(repeats))
    finally:
        torch.set_num_threads(threads)


def _report_once(config: dict) -> None:
    import ray.train

    ray.train.report({"reported": 1})


def actors_started(actors: list[dict], job_id: str, since: float) -> dict:
    """The actors of job ``job_id`` that came up after ``since`` (epoch seconds), from the GCS actor table.

    Returns how many there were (each one a new worker process) and, by class, how many seconds after
    ``since`` the first of that class was up: for a Ray Train fit, the chain of process starts it waits for.
    """
    mine = [a for a in actors if a["JobID"] == job_id and a["StartTime"] / 1000 >= since]
    up: dict[str, float] = {}
    for actor in sorted(mine, key=lambda a: a["StartTime"]):
        up.setdefault(actor["ActorClassName"], round(actor["StartTime"] / 1000 - since, 2))
    return {"actors": len(mine), "up_after_seconds": up}


def actors_of_this_job_since(since: float) -> dict:
    """:func:`actors_started` for this driver's Ray job, read from the GCS actor table.

    Ray's state API would need the dashboard, which the stack's Ray runs without; its private
    ``state.actors()`` reads the same table from the GCS.
    """
    import ray
    from ray._private import state

    return actors_started(list(state.actors().values()), ray.get_runtime_context().get_job_id(), since)


def empty_fit(repeats: int = 3) -> dict:
    """A Ray Train fit on the stack's Ray whose loop only reports once: median seconds, and what it started.

    Two workers with notebook 04's resources: what starting and stopping Ray Train (controller,
    worker actors, torch.distributed) costs a notebook before any data, epoch or checkpoint.
    ``actors`` and ``up_after_seconds`` (medians over the repeats) say which actors each fit
    started and when each was up, counted from ``fit()``.
    """
    import ray.train
    from ray.train.torch import TorchTrainer

    from helpers import cluster, training

    resources = cluster.init_ray()
    seconds, started = [], []
    try:
        with tempfile.TemporaryDirectory() as folder:
            for number in range(repeats):
                trainer = TorchTrainer(_report_once, scaling_config=ray.train.ScalingConfig(
                    num_workers=2, resources_per_worker=training.worker_resources(2, False, resources["CPU"])),
                    run_config=ray.train.RunConfig(name=f"empty-{number}", storage_path=folder))
                began, clock = time.time(), time.perf_counter()
                trainer.fit()
                seconds.append(time.perf_counter() - clock)
                started.append(actors_of_this_job_since(began))
    finally:
        cluster.shutdown_ray()
    classes = {name for run in started for name in run["up_after_seconds"]}
    return {"seconds": statistics.median(seconds),
            "actors": int(statistics.median(run["actors"] for run in started)),
            "up_after_seconds": dict(sorted(
                ((name, round(statistics.median(run["up_after_seconds"][name] for run in started
                                                if name in run["up_after_seconds"]), 2)) for name in classes),
                key=lambda kv: kv[1]))}


class _Identity:
    def __call__(self, batch):
        return batch


def _identity(batch):
    return batch


def empty_pipeline(repeats: int = 3, actors: bool = True) -> float:
    """Median seconds of a Ray Data pipeline of one row: through a pool of two actors, as notebooks 03 and 07 build
    them, or (``actors=False``) through a task.

    What each pipeline pays before its first image: the streaming executor, and for actors two new processes.
    """
    import ray.data

    from helpers import cluster

    cluster.init_ray()
    seconds = []
    try:
        for _ in range(repeats):
            clock = time.perf_counter()
            rows = ray.data.from_items([{"x": 1}])
            step = rows.map_batches(_Identity, concurrency=2, num_cpus=0.5) if actors else rows.map_batches(_identity)
            step.materialize()
            seconds.append(time.perf_counter() - clock)
    finally:
        cluster.shutdown_ray()
    return statistics.median(seconds)


def _trial_reports_once(config: dict) -> None:
    from ray import tune

    tune.report({"reported": 1})


def sweep_defaults() -> tuple[int, int]:
    """Notebook 05's default ``num_samples`` and ``max_concurrent``, read from its parameters cell."""
    import papermill

    from workshop.runner import notebook_paths

    (notebook,) = notebook_paths(pattern="05_*.ipynb")
    found = papermill.inspect_notebook(str(notebook))
    return int(found["num_samples"]["default"]), int(found["max_concurrent"]["default"])


def empty_sweep(repeats: int = 3) -> dict:
    """Median seconds of a Ray Tune sweep whose trials only report once, with notebook 05's trials and concurrency.

    What a sweep pays before any epoch: Tune's controller, the trial actors (a new process, reused by the
    next trial as in notebook 05), a result and a trial end per trial; one CPU per trial, as 05 asks.
    """
    from ray import tune

    from helpers import cluster

    trials, concurrent = sweep_defaults()
    resources = cluster.init_ray()
    cpus = max(0.5, min(1.0, resources["CPU"] / concurrent))
    seconds = []
    try:
        with tempfile.TemporaryDirectory() as folder:
            for number in range(repeats):
                tuner = tune.Tuner(
                    tune.with_resources(_trial_reports_once, {"cpu": cpus}),
                    tune_config=tune.TuneConfig(num_samples=trials, max_concurrent_trials=concurrent,
                                                reuse_actors=True),
                    run_config=tune.RunConfig(name=f"empty-sweep-{number}", storage_path=folder, verbose=0))
                clock = time.perf_counter()
                with contextlib.redirect_stdout(io.StringIO()):
                    tuner.fit()
                seconds.append(time.perf_counter() - clock)
    finally:
        cluster.shutdown_ray()
    return {"seconds": statistics.median(seconds), "trials": trials, "max_concurrent": concurrent}


def _imports_torch() -> bool:
    import ray.train.torch  # noqa: F401 - what a Ray Train worker process imports
    import torch  # noqa: F401

    return True


def in_a_new_worker_process(function, *args, repeats: int = 3) -> float:
    """Median seconds for Ray to start a new worker process and run ``function(*args)`` in it.

    The probe is a task with a ``runtime_env`` of its own (a new one each time), so Ray starts a process for
    it, as it does for every actor of a fit (Ray Train gives its controller a ``runtime_env``, and Ray's
    prestarted idle workers have none) and for Ray Data's and Serve's model actors.
    """
    import ray

    from helpers import cluster

    cluster.init_ray()
    probe = ray.remote(num_cpus=0)(function)
    seconds = []
    try:
        for number in range(repeats):
            clock = time.perf_counter()
            fresh = {"env_vars": {"SMOKE_PROBE": f"{uuid.uuid4().hex}-{number}"}}
            ray.get(probe.options(runtime_env=fresh).remote(*args))
            seconds.append(time.perf_counter() - clock)
    finally:
        cluster.shutdown_ray()
    return statistics.median(seconds)


def new_worker_process(repeats: int = 3) -> float:
    """Median seconds for a new worker process that imports PyTorch and Ray Train: the unit Ray Train's start is
    made of."""
    return in_a_new_worker_process(_imports_torch, repeats=repeats)


def _loads_model(model_uri: str) -> bool:
    import mlflow.pytorch

    mlflow.pytorch.load_model(model_uri)
    return True


def model_load(model_uri: str, repeats: int = 3) -> float:
    """Median seconds for a new worker process that imports MLflow and PyTorch and loads ``model_uri``: what each
    model actor of notebook 07's pipeline and each replica of notebook 08's deployment pays before its first batch.
    """
    return in_a_new_worker_process(_loads_model, model_uri, repeats=repeats)


def empty_serve(repeats: int = 3) -> float:
    """Median seconds of Serve's start and ``serve.run`` of a deployment that does nothing, up to its first answer.

    What notebook 08's ``serve.start`` and ``serve.run`` pay before any model is loaded: Serve's controller,
    its HTTP proxy, one replica (a new process).
    """
    import ray
    from ray import serve

    from helpers import cluster
    from helpers.serving_support import http_port

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Nothing:
        def __call__(self, request) -> str:
            return "ok"

    cluster.init_ray()
    seconds = []
    try:
        for number in range(repeats):
            clock = time.perf_counter()
            serve.start(http_options={"host": "127.0.0.1", "port": http_port()})
            handle = serve.run(Nothing.bind(), name=f"empty-{number}", route_prefix=f"/empty-{number}")
            handle.remote(None).result(timeout_s=60)
            seconds.append(time.perf_counter() - clock)
            serve.shutdown()
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()
    return statistics.median(seconds)


def model_actors(notebooks: list[Path]) -> dict[str, int]:
    """How many model actors each notebook of :data:`MODEL_ACTORS` starts at its defaults (read from its parameters)."""
    import papermill

    counts = {}
    for notebook in notebooks:
        name = MODEL_ACTORS.get(notebook.name[:2])
        if name:
            counts[notebook.name[:2]] = int(papermill.inspect_notebook(str(notebook))[name]["default"])
    return counts


def cell_durations(notebook: Path, minimum: float = 0.5) -> list[dict]:
    """Cells that took at least ``minimum`` seconds: index, first code line, seconds (papermill's metadata)."""
    cells = []
    for index, cell in enumerate(json.loads(notebook.read_text())["cells"]):
        seconds = cell.get("metadata", {}).get("papermill", {}).get("duration")
        if seconds is None or seconds < minimum:
            continue
        lines = [line for line in "".join(cell["source"]).splitlines()
                 if line.strip() and not line.startswith(("#@save", "# Solution", "# CHECK_OUTPUT"))]
        cells.append({"cell": index, "first_line": (lines[0] if lines else "")[:80], "seconds": round(seconds, 2)})
    return cells


def ray_init_seconds(notebook: Path) -> float | None:
    """Seconds of the cells that call ``ray.init(`` themselves (papermill's metadata), or None if none does.

    Notebook 03 shows the call instead of ``cluster.init_ray``, so no "ray start" span is recorded there.
    """
    durations = [cell.get("metadata", {}).get("papermill", {}).get("duration") or 0.0
                 for cell in json.loads(notebook.read_text())["cells"]
                 if cell["cell_type"] == "code" and "ray.init(" in "".join(cell["source"])]
    return sum(durations) if durations else None


def fits_started(actors: list[dict], began: float, ended: float) -> int:
    """How many Ray Train fits started between ``began`` and ``ended`` (epoch seconds): one controller each."""
    return sum(1 for actor in actors if actor["ActorClassName"] == "TrainController"
               and began <= actor["StartTime"] / 1000 <= ended)


def pipelines_run(executions: list[dict], actors: list[dict], began: float, ended: float) -> dict[str, int]:
    """The Ray Data pipelines that started between ``began`` and ``ended``: with actors, and of tasks only.

    ``executions`` are Ray Data's own records (its stats actor keeps one per execution of a dataset:
    ``materialize``, ``write_parquet``, ``to_pandas``, a Ray Train worker's shard ...); a pipeline that
    started a pool of actors shows map actors starting in its time (Ray names their class ``_MapWorker``, or
    ``MapWorker(MapBatches(<the class>))`` since Ray 2.5x).
    """
    counts = {"actors": 0, "tasks": 0}
    for run in executions:
        start, end = run.get("start_time") or 0.0, run.get("end_time") or ended
        if not began <= start <= ended:
            continue
        pooled = any("MapWorker" in actor["ActorClassName"] and start - 0.5 <= actor["StartTime"] / 1000 <= end
                     for actor in actors)
        counts["actors" if pooled else "tasks"] += 1
    return counts


def data_executions() -> list[dict]:
    """Every Ray Data execution the stats actor of the stack's Ray remembers (all jobs)."""
    import ray
    from ray.data._internal.stats import STATS_ACTOR_NAME, STATS_ACTOR_NAMESPACE

    try:
        actor = ray.get_actor(STATS_ACTOR_NAME, namespace=STATS_ACTOR_NAMESPACE)
    except ValueError:  # no pipeline ran on this Ray yet
        return []
    return list(ray.get(actor.get_datasets.remote(), timeout=30).values())


def count_fits(rows: list[dict]) -> None:
    """Add to each row of :func:`run_once` the Ray Train fits and Ray Data pipelines its notebook started."""
    from ray._private import state

    from helpers import cluster

    cluster.init_ray()
    try:
        actors = list(state.actors().values())
        executions = data_executions()
    finally:
        cluster.shutdown_ray()
    for row in rows:
        began, ended = row.pop("began"), row.pop("ended")
        row["fits"] = fits_started(actors, began, ended)
        row["pipelines"] = pipelines_run(executions, actors, began, ended)


def mlflow_spans(facts: dict, tracking_uri: str) -> list[dict]:
    """Spans measured from outside the lesson code, with MLflow's own timestamps.

    Notebook 04's rank 0 logs each epoch as it ends: the metric's timestamps mark the epochs
    ("train: epoch logged", zero-length). Notebook 05's trials are child runs: their start and
    end times are the trials ("tune: trial").
    """
    from mlflow.tracking import MlflowClient

    client, spans = MlflowClient(tracking_uri), []
    if facts.get("MLflow run id"):
        for metric in client.get_metric_history(facts["MLflow run id"], "train_loss"):
            spans.append({"label": "train: epoch logged", "start": metric.timestamp / 1000,
                          "end": metric.timestamp / 1000})
    if facts.get("MLflow parent run id"):
        parent = client.get_run(facts["MLflow parent run id"])
        for run in client.search_runs([parent.info.experiment_id],
                                      filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"):
            if run.info.end_time:
                spans.append({"label": "tune: trial", "start": run.info.start_time / 1000,
                              "end": run.info.end_time / 1000})
    return spans


def breakdown(spans: list[dict]) -> dict[str, dict]:
    """Spans summed by label, plus Ray Train's start, epochs and teardown (from the epochs MLflow logged)."""
    table: dict[str, dict] = {}
    marks = sorted(s["end"] for s in spans if s["label"] == "train: epoch logged")
    for span in spans:
        if span["label"] == "train: epoch logged":
            continue
        row = table.setdefault(span["label"], {"seconds": 0.0, "count": 0})
        row["seconds"] += span["end"] - span["start"]
        row["count"] += 1
    training = [s for s in spans if s["label"] == "training"]
    if training and marks:
        fit = training[-1]
        table["train: start (fit to the first epoch's end)"] = {"seconds": marks[0] - fit["start"], "count": 1}
        if len(marks) > 1:
            table["train: epochs after the first"] = {"seconds": marks[-1] - marks[0], "count": len(marks) - 1}
        table["train: teardown (last epoch's end to fit's return)"] = {"seconds": fit["end"] - marks[-1], "count": 1}
    return {label: {"seconds": round(row["seconds"], 2), "count": row["count"]} for label, row in table.items()}


def run_once(notebooks: list[Path], out_dir: Path, parameters: dict[str, dict], spans_file: Path) -> list[dict]:
    """Execute ``notebooks`` once each (``parameters`` by notebook number); their totals, spans and cells.

    Every process writes its spans to ``spans_file`` (``SMOKE_TIMINGS``); a notebook's
    are the ones that ended while it ran (they run one after another).
    """
    from helpers.settings import load_settings
    from workshop.runner import execute

    rows = []
    for notebook in notebooks:
        began = time.time()
        run = execute(notebook, out_dir / notebook.name, parameters.get(notebook.name[:2]))
        ended = time.time()
        print(f"  {notebook.name}: {run.status} in {run.seconds:.1f} s {run.message}", flush=True)
        spans = [s for s in (timings.read(spans_file) if spans_file.is_file() else []) if began <= s["end"] <= ended]
        if run.output.is_file():
            spans += mlflow_spans(summary_facts(run.output), load_settings().mlflow_tracking_uri)
        parts = breakdown(spans)
        ray_init = ray_init_seconds(run.output) if run.output.is_file() else None
        if ray_init is not None and "ray start" not in parts:
            parts["ray start"] = {"seconds": round(ray_init, 2), "count": 1}
        rows.append({"notebook": notebook.name[:2], "status": run.status, "seconds": round(run.seconds, 2),
                     "breakdown": parts, "began": began, "ended": ended,
                     "cells": cell_durations(run.output) if run.output.is_file() else []})
    count_fits(rows)
    return rows


def summarise(repeats: list[list[dict]], stick: float) -> list[dict]:
    """Per notebook: the median total and median breakdown over the repeats, in seconds and yardsticks."""
    summary = []
    for index, first in enumerate(repeats[0]):
        runs = [repeat[index] for repeat in repeats]
        seconds = statistics.median(run["seconds"] for run in runs)
        labels = {label for run in runs for label in run["breakdown"]}
        parts = {label: round(statistics.median(run["breakdown"].get(label, {}).get("seconds", 0.0)
                                                for run in runs), 2) for label in sorted(labels)}
        counts = {label: int(statistics.median(run["breakdown"].get(label, {}).get("count", 0) for run in runs))
                  for label in sorted(labels)}
        summary.append({"notebook": first["notebook"], "status": sorted({run["status"] for run in runs}),
                        "seconds": round(seconds, 1), "yardsticks": round(seconds / stick, 1),
                        "fits": int(statistics.median(run.get("fits", 0) for run in runs)),
                        "pipelines": {kind: int(statistics.median(run.get("pipelines", {}).get(kind, 0)
                                                                  for run in runs)) for kind in ("actors", "tasks")},
                        "breakdown_seconds": parts, "breakdown_counts": counts,
                        "breakdown_yardsticks": {k: round(v / stick, 1) for k, v in parts.items()}})
    return summary


def verdict(summary: list[dict], stick: float) -> dict[str, dict]:
    """Each target of the smoke path against what this run measured (in yardsticks)."""
    by_name = {row["notebook"]: row for row in summary}
    first_five = [by_name[n]["yardsticks"] for n in ("01", "02", "03", "04", "05") if n in by_name]
    checks = {"notebooks 01-05": round(sum(first_five), 1) if len(first_five) == 5 else None,
              "any notebook": max((row["yardsticks"] for n, row in by_name.items() if n != "06"), default=None),
              "04": by_name["04"]["yardsticks"] if "04" in by_name else None,
              "ray start": max((row["breakdown_yardsticks"]["ray start"] for row in summary
                                if "ray start" in row["breakdown_yardsticks"]), default=None),
              "06": by_name["06"]["yardsticks"] if "06" in by_name and by_name["06"]["status"] == ["ok"] else None}
    return {name: {"measured": value, "target": TARGETS[name],
                   "met": None if value is None else value <= TARGETS[name]} for name, value in checks.items()}


def floors(summary: list[dict], empty_fit_seconds: float, empty_pipeline_seconds: float,
           empty_task_pipeline_seconds: float, empty_sweep_seconds: float = 0.0, starts: dict | None = None
           ) -> dict[str, dict]:
    """Each Ray notebook's time as a multiple of its floor: what it cannot avoid paying, every start counted.

    The floor: the notebook's own kernel start, imports and Ray start (spans of the same run), plus each
    Ray Train fit it started at the seconds of a fit whose loop only reports once, plus each Ray Data
    pipeline it ran at the seconds of a one-row pipeline, through two actors where it started actors, else
    through a task, plus each Tune sweep it ran (its "sweep" spans) at the seconds of a sweep of notebook
    05's trials that only report once (all timed in the same run on the same Ray). ``starts`` adds the
    starts measured since: ``"new process"`` seconds for each Tune trial (its own worker process importing
    PyTorch), ``"serve"`` for each Serve start (its "serve.run" spans), ``"model load"`` for each model
    actor (``"model actors"``: their number by notebook).
    """
    starts = starts or {}
    out = {}
    for row in summary:
        parts = row["breakdown_seconds"]
        if "ray start" not in parts or row["status"] != ["ok"]:
            continue
        number = row["notebook"]
        start = parts.get("kernel start + imports", 0.0) + parts["ray start"]
        fits, pipelines = row.get("fits", 0), row.get("pipelines", {})
        counts = row.get("breakdown_counts", {})
        sweeps = counts.get("sweep", 0)
        trials = counts.get("tune: trial", 0) if "new process" in starts else 0
        serves = sum(n for label, n in counts.items() if label.startswith("serve.run")) if "serve" in starts else 0
        models = starts.get("model actors", {}).get(number, 0) if "model load" in starts else 0
        each_start = (start + fits * empty_fit_seconds + pipelines.get("actors", 0) * empty_pipeline_seconds
                      + pipelines.get("tasks", 0) * empty_task_pipeline_seconds + sweeps * empty_sweep_seconds
                      + trials * starts.get("new process", 0.0) + serves * starts.get("serve", 0.0)
                      + models * starts.get("model load", 0.0))
        target = FLOOR_TARGETS.get(number)
        multiple = row["seconds"] / each_start
        out[number] = {"seconds": row["seconds"], "kernel and ray start": round(start, 2), "fits": fits,
                       "actor pipelines": pipelines.get("actors", 0), "task pipelines": pipelines.get("tasks", 0),
                       "sweeps": sweeps, **({"trials": trials, "serve starts": serves, "model loads": models}
                                            if starts else {}),
                       "floor_each_start": round(each_start, 2),
                       "multiple_each_start": round(multiple, 2), "target": target,
                       "met": None if target is None else multiple <= target}
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the smoke benchmark and write ``benchmarks/results/smoke.json``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--label", default="after", help="key under which smoke.json keeps this run")
    parser.add_argument("--only", nargs="*", help="notebook numbers (default: all)")
    parser.add_argument("--ray", choices=("stack", "lab"), default="stack",
                        help="the stack's Ray (`make run`), or make lab's: the same Ray with its dashboard on")
    parser.add_argument("--lakefs-double", action="store_true",
                        help="where no lakeFS answers, run notebook 06 against the API double "
                             "(tests/fakes/lakefs_double.py)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    from helpers.settings import load_settings, state_dir
    from workshop import stack
    from workshop.runner import notebook_paths

    settings = stack.ensure_stack()
    folder = Path(tempfile.mkdtemp(prefix="smoke-"))
    spans_file = folder / "spans.jsonl"
    # The stack's Ray starts again with the span file in its environment, so its workers
    # (Ray Train's, Tune's) record theirs without a job runtime_env, as in a learner's run.
    os.environ[timings.TIMINGS_ENV] = str(spans_file)
    stack.down(only=("ray",))
    if args.ray == "lab":
        from workshop import lab

        lab.ray_with_dashboard(state_dir(), 8265, None)
    else:
        stack.up()
    lakefs, double = "", contextlib.ExitStack()
    if args.lakefs_double:
        lakefs = double.enter_context(lakefs_or_double(settings))
    notebooks = [p for p in notebook_paths() if not args.only or p.name[:2] in args.only]

    # The yardstick is timed before the notebooks and after each repeat: the median of those stands
    # for the machine's speed during the whole run, not at one moment.
    sticks = [yardstick()]
    print(f"yardstick: {sticks[0]:.3f} s", flush=True)
    floor = empty_fit()
    process = new_worker_process()
    pipeline = empty_pipeline()
    task_pipeline = empty_pipeline(actors=False)
    sweep = empty_sweep()
    serve_start = empty_serve()
    print(f"Ray Train fit with an empty loop: {floor['seconds']:.1f} s; a new worker process importing "
          f"PyTorch: {process:.1f} s; Serve's start and an empty deployment: {serve_start:.1f} s", flush=True)
    repeats = []
    try:
        for number in range(args.repeats):
            print(f"run {number + 1} of {args.repeats}", flush=True)
            out_dir = folder / str(number)
            out_dir.mkdir()
            # The double forgets its repositories when it stops, the bucket keeps their namespaces: a new
            # repository name per run (a real lakeFS keeps the repository and reuses it), and a registered
            # model of its own, whose champion's commits are in a repository the double still holds.
            fresh = f"smoke-{uuid.uuid4().hex[:8]}"
            parameters = {"06": {"repo_name": fresh, "registered_model": fresh}} if "double" in lakefs else {}
            repeats.append(run_once(notebooks, out_dir, parameters, spans_file))
            sticks.append(yardstick())
            print(f"yardstick: {sticks[-1]:.3f} s", flush=True)
    finally:
        double.close()
        os.environ.pop(timings.TIMINGS_ENV, None)
        stack.down(only=("ray",))  # and up again without the span file
        stack.up()
        shutil.rmtree(folder, ignore_errors=True)
    loaded = model_load(f"models:/{REGISTERED_MODEL}@champion")  # the one 07 and 08 served in these runs
    print(f"A new worker process loading the champion: {loaded:.1f} s", flush=True)
    stick = statistics.median(sticks)
    summary = summarise(repeats, stick)
    if not lakefs:
        ran_06 = any(row["notebook"] == "06" and row["status"] == ["ok"] for row in summary)
        lakefs = f"lakeFS at {load_settings().lakefs_endpoint}" if ran_06 else "not available: notebook 06 skipped"
    targets = verdict(summary, stick)
    starts = {"new process": round(process, 2), "serve": round(serve_start, 2), "model load": round(loaded, 2),
              "model actors": model_actors(notebooks)}
    multiples = floors(summary, round(floor["seconds"], 1), round(pipeline, 2), round(task_pipeline, 2),
                       round(sweep["seconds"], 2), starts)

    path = RESULTS / "smoke.json"
    stored = json.loads(path.read_text()) if path.is_file() else {}
    stored.update({"benchmark": "smoke", "targets_in_yardsticks": TARGETS})
    stored.setdefault("runs", {})[args.label] = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine(),
        "yardstick_seconds": round(stick, 3), "yardsticks_measured": [round(x, 3) for x in sticks],
        "repeats": args.repeats, "lakefs": lakefs,
        "ray_train_empty_fit": {"seconds": round(floor["seconds"], 1), "yardsticks": round(floor["seconds"] / stick, 1),
                                "actors": floor["actors"], "up_after_seconds": floor["up_after_seconds"]},
        "new_worker_process_with_torch": {"seconds": round(process, 2), "yardsticks": round(process / stick, 1)},
        "empty_ray_data_pipeline_two_actors_seconds": round(pipeline, 2),
        "empty_ray_data_pipeline_tasks_seconds": round(task_pipeline, 2),
        "empty_tune_sweep": {**sweep, "seconds": round(sweep["seconds"], 2)},
        "empty_serve_seconds": round(serve_start, 2), "model_load_new_process_seconds": round(loaded, 2),
        "model_actors": starts["model actors"],
        "ray": args.ray, "floors": multiples, "notebooks": summary, "targets": targets, "raw": repeats}
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(stored, indent=2) + "\n")

    print_table(f"Smoke path ({args.label}; median of {args.repeats}; yardstick {stick:.2f} s)",
                [{"notebook": r["notebook"], "status": "/".join(r["status"]), "seconds": r["seconds"],
                  "yardsticks": r["yardsticks"],
                  "largest parts (s)": ", ".join(f"{k} {v:.1f}" for k, v in sorted(
                      r["breakdown_seconds"].items(), key=lambda kv: -kv[1])[:4])} for r in summary],
                ["notebook", "status", "seconds", "yardsticks", "largest parts (s)"])
    print_table("Targets (yardsticks)", [{"check": k, **v} for k, v in targets.items()],
                ["check", "measured", "target", "met"])
    print_table(f"Against the floor ({args.ray}'s Ray: kernel start + imports + Ray start + every fit and pipeline "
                "started, each empty)", [{"notebook": k, **v} for k, v in multiples.items()],
                ["notebook", "seconds", "kernel and ray start", "fits", "actor pipelines", "task pipelines", "sweeps",
                 "trials", "serve starts", "model loads", "floor_each_start", "multiple_each_start", "target", "met"])
    print(f"\nRay Train fit with an empty loop (2 workers): {floor['seconds']:.1f} s = "
          f"{floor['seconds'] / stick:.1f} yardsticks; {floor['actors']} actors, each a new process, up after (s): "
          + ", ".join(f"{name} {up:.1f}" for name, up in floor["up_after_seconds"].items()))
    print(f"A Ray Data pipeline of one row through two actors: {pipeline:.2f} s; through a task: "
          f"{task_pipeline:.2f} s")
    print(f"A Tune sweep of {sweep['trials']} trials ({sweep['max_concurrent']} at a time) that only report once: "
          f"{sweep['seconds']:.2f} s")
    print(f"A new Ray worker process importing PyTorch and Ray Train: {process:.2f} s = "
          f"{process / stick:.1f} yardsticks")
    print(f"\nwritten: {path}")
    return 0 if all(r["status"] == ["ok"] or r["status"] == ["skipped"] for r in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
