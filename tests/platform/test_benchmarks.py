"""The smoke benchmark's arithmetic (spans to a breakdown, targets in yardsticks) and the span recorder."""

import json
import sys
import time
from pathlib import Path

import pytest

from helpers import cluster, timings

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_smoke  # noqa: E402


def test_spans_are_recorded_only_when_asked(tmp_path, monkeypatch):
    path = tmp_path / "spans.jsonl"
    monkeypatch.delenv(timings.TIMINGS_ENV, raising=False)
    timings.record("nothing", 1.0, 2.0)
    assert not path.exists()
    monkeypatch.setenv(timings.TIMINGS_ENV, str(path))
    timings.record("a", 1.0, 2.5)
    with timings.span("b"):
        pass
    spans = timings.read(path)
    assert [s["label"] for s in spans] == ["a", "b"] and spans[0]["end"] - spans[0]["start"] == 1.5
    assert 0 < timings.process_started() <= spans[1]["start"]


def test_the_breakdown_sums_labels_and_finds_ray_train_s_start_epochs_and_teardown():
    logged = [{"label": "train: epoch logged", "start": t, "end": t} for t in (22.0, 24.0, 25.5)]
    spans = [{"label": "ray start", "start": 0.0, "end": 8.0}, {"label": "training", "start": 10.0, "end": 40.0},
             {"label": "tune: trial", "start": 1.0, "end": 3.0}, {"label": "tune: trial", "start": 2.0, "end": 2.5},
             *logged]
    parts = bench_smoke.breakdown(spans)
    assert parts["tune: trial"] == {"seconds": 2.5, "count": 2} and "train: epoch logged" not in parts
    assert parts["train: start (fit to the first epoch's end)"]["seconds"] == 12.0
    assert parts["train: epochs after the first"] == {"seconds": 3.5, "count": 2}
    assert parts["train: teardown (last epoch's end to fit's return)"]["seconds"] == 14.5
    assert "train: epochs after the first" not in bench_smoke.breakdown(spans[:2])


def test_epochs_and_trials_are_measured_from_mlflow_outside_the_lesson(settings):
    """The lesson code holds no timer: the benchmark reads the epochs' and trials' times from MLflow."""
    from mlflow.tracking import MlflowClient

    from helpers import tracking

    client = MlflowClient(settings.mlflow_tracking_uri)
    experiment = tracking.experiment_id(client, "tests-bench-spans")
    run_id = client.create_run(experiment).info.run_id
    for epoch, stamp in ((1, 1_000_000), (2, 1_002_500)):
        client.log_metric(run_id, "train_loss", 1.0 / epoch, timestamp=stamp, step=epoch)
    parent = client.create_run(experiment).info.run_id
    child = client.create_run(experiment, tags={"mlflow.parentRunId": parent}).info.run_id
    client.set_terminated(child)
    spans = bench_smoke.mlflow_spans({"MLflow run id": run_id, "MLflow parent run id": parent},
                                     settings.mlflow_tracking_uri)
    assert sorted(s["end"] for s in spans if s["label"] == "train: epoch logged") == [1000.0, 1002.5]
    (trial,) = [s for s in spans if s["label"] == "tune: trial"]
    assert 0 <= trial["end"] - trial["start"] < 60


def test_targets_are_judged_in_yardsticks_of_the_same_run():
    def row(number, seconds, ray=None):
        return {"notebook": number, "status": ["ok"], "seconds": seconds, "yardsticks": seconds / 0.5,
                "breakdown_yardsticks": {"ray start": ray / 0.5} if ray else {}}

    summary = [row("01", 5), row("02", 3), row("03", 20, 4), row("04", 16, 4), row("05", 20, 5)]
    targets = bench_smoke.verdict(summary, 0.5)
    assert targets["notebooks 01-05"] == {"measured": 128.0, "target": 130, "met": True}
    assert targets["04"]["met"] is True and targets["any notebook"]["measured"] == 40.0
    assert targets["ray start"] == {"measured": 10.0, "target": 9, "met": False}
    assert targets["06"]["measured"] is None  # not run: neither met nor missed
    assert bench_smoke.verdict(summary[:3], 0.5)["notebooks 01-05"]["measured"] is None


@pytest.mark.slow
def test_the_yardstick_is_one_plain_pytorch_epoch():
    assert 0.01 < bench_smoke.yardstick(repeats=1) < 60


def test_a_fit_s_actors_are_counted_and_timed_from_the_fit():
    def actor(name, start, job="05000000"):
        return {"ActorClassName": name, "StartTime": start * 1000, "JobID": job}

    table = [actor("TrainController", 95.0),  # an earlier fit's
             actor("TrainController", 102.5), actor("RayTrainWorker", 105.75), actor("RayTrainWorker", 105.5),
             actor("DatasetManager", 107.0), actor("Other", 103.0, job="06000000")]
    started = bench_smoke.actors_started(table, "05000000", since=100.0)
    assert started == {"actors": 4, "up_after_seconds": {"TrainController": 2.5, "RayTrainWorker": 5.5,
                                                         "DatasetManager": 7.0}}
    assert list(started["up_after_seconds"]) == ["TrainController", "RayTrainWorker", "DatasetManager"]
    assert bench_smoke.actors_started(table, "07000000", since=0.0) == {"actors": 0, "up_after_seconds": {}}


def test_the_actors_a_job_started_are_read_from_ray_s_actor_table(settings):
    import ray

    @ray.remote(num_cpus=0)
    class Probe:
        def ping(self) -> bool:
            return True

    cluster.init_ray(settings)
    try:
        before = bench_smoke.actors_of_this_job_since(time.time())
        since = time.time()
        probes = [Probe.remote() for _ in range(2)]
        assert ray.get([probe.ping.remote() for probe in probes]) == [True, True]
        started = bench_smoke.actors_of_this_job_since(since)
    finally:
        cluster.shutdown_ray()
    assert before["actors"] == 0
    (name, up), = started["up_after_seconds"].items()  # one class, named as Ray names it (qualified here)
    assert started["actors"] == 2 and name.endswith("Probe")
    assert 0 <= up < 60  # seconds after `since`: the table's milliseconds read right


def test_notebook_06_s_benchmarks_start_the_lakefs_double_where_no_lakefs_answers_and_clean_up(settings,
                                                                                               monkeypatch):
    import dataclasses
    import os
    import socket

    import common

    from helpers import versioning

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{sock.getsockname()[1]}"
    monkeypatch.setenv("LAKEFS_ENDPOINT", nobody)
    silent = dataclasses.replace(settings, lakefs_endpoint=nobody)
    with common.lakefs_or_double(silent) as lakefs:
        assert "double" in lakefs and os.environ["LAKEFS_ENDPOINT"] != nobody
        from helpers.settings import load_settings

        versioning.connect(load_settings(), timeout=3.0)  # the double answers where the notebook will look
    assert os.environ["LAKEFS_ENDPOINT"] == nobody  # put back as it was


def test_summary_facts_are_read_from_the_cell_tagged_summary(tmp_path):
    import json

    import common

    cell = {"cell_type": "code", "metadata": {"tags": ["summary"]}, "source": [], "outputs": [
        {"output_type": "display_data", "data": {"application/json": {"test accuracy": 0.97}}, "metadata": {}}]}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": [cell]}))
    assert common.summary_facts(path) == {"test accuracy": 0.97}
    path.write_text(json.dumps({"cells": []}))
    assert common.summary_facts(path) == {}


def test_each_ray_notebook_is_judged_against_its_own_floor_every_start_counted():
    def row(number, seconds, fits=0, actors=0, tasks=0, sweeps=0, **parts):
        return {"notebook": number, "status": ["ok"], "seconds": seconds, "breakdown_seconds": parts, "fits": fits,
                "pipelines": {"actors": actors, "tasks": tasks},
                "breakdown_counts": {"sweep": sweeps} if sweeps else {}}

    summary = [row("02", 2.0, **{"kernel start + imports": 1.0}),  # no Ray: no floor
               row("03", 24.0, actors=4, tasks=3, **{"kernel start + imports": 2.5, "ray start": 0.5}),
               row("04", 33.0, fits=1, actors=1, tasks=2, **{"kernel start + imports": 1.0, "ray start": 1.0}),
               row("05", 20.0, actors=1, tasks=2, sweeps=1, **{"kernel start + imports": 1.0, "ray start": 1.0}),
               row("07", 40.0, actors=2, tasks=3, **{"kernel start + imports": 1.0, "ray start": 1.0})]
    floors = bench_smoke.floors(summary, empty_fit_seconds=10.0, empty_pipeline_seconds=2.0,
                                empty_task_pipeline_seconds=0.5, empty_sweep_seconds=6.0)
    assert set(floors) == {"03", "04", "05", "07"}
    assert floors["05"]["floor_each_start"] == 2.0 + 2.0 + 1.0 + 6.0 and floors["05"]["sweeps"] == 1
    assert floors["05"]["met"]  # 20 / 11
    assert floors["03"]["floor_each_start"] == 3.0 + 4 * 2.0 + 3 * 0.5 and floors["03"]["met"]  # 24 / 12.5
    assert floors["04"]["floor_each_start"] == 2.0 + 10.0 + 2.0 + 1.0 and not floors["04"]["met"]  # 33 / 15
    assert floors["04"]["multiple_each_start"] == round(33 / 15, 2) and floors["04"]["target"] == 2.0
    assert floors["07"]["floor_each_start"] == 2.0 + 4.0 + 1.5 and not floors["07"]["met"]


def test_every_start_counted_adds_each_trial_each_serve_start_and_each_model_actor():
    def row(number, seconds, counts, actors=0):
        return {"notebook": number, "status": ["ok"], "seconds": seconds, "fits": 0,
                "breakdown_seconds": {"kernel start + imports": 1.0, "ray start": 1.0},
                "pipelines": {"actors": actors, "tasks": 0}, "breakdown_counts": counts}

    summary = [row("05", 40.0, {"sweep": 1, "tune: trial": 8}),
               row("07", 30.0, {}, actors=1),
               row("08", 30.0, {"serve.run: replica started, model loaded": 1})]
    starts = {"new process": 3.0, "serve": 4.0, "model load": 5.0, "model actors": {"07": 2, "08": 1}}
    floors = bench_smoke.floors(summary, 10.0, 2.0, 0.5, 6.0, starts)
    assert floors["05"]["floor_each_start"] == 2.0 + 6.0 + 8 * 3.0 and floors["05"]["trials"] == 8
    assert floors["07"]["floor_each_start"] == 2.0 + 2.0 + 2 * 5.0 and floors["07"]["model loads"] == 2
    assert floors["08"]["floor_each_start"] == 2.0 + 4.0 + 5.0 and floors["08"]["serve starts"] == 1
    assert floors["08"]["target"] == 2.0 and not floors["08"]["met"]  # 30 / 11
    without = bench_smoke.floors(summary, 10.0, 2.0, 0.5, 6.0)  # the runs before: none of these counted
    assert without["08"]["floor_each_start"] == 2.0 and "trials" not in without["05"]


def test_model_actors_are_read_from_the_notebooks_parameters():
    notebooks = sorted((Path(__file__).parents[2] / "notebooks").glob("0[78]_*.ipynb"))
    assert bench_smoke.model_actors(notebooks) == {"07": 2, "08": 1}


def test_the_empty_sweep_has_notebook_05_s_default_trials_and_concurrency():
    nb = json.loads(next((Path(__file__).parents[2] / "notebooks").glob("05_*.ipynb")).read_text())
    (cell,) = [c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", [])]
    defaults = {}
    exec("".join(cell["source"]), {}, defaults)  # the parameters cell assigns literals only
    assert bench_smoke.sweep_defaults() == (defaults["num_samples"], defaults["max_concurrent"])


def test_the_scale_benchmark_reports_cost_per_object_and_memory_against_the_pointers():
    import bench_scale

    def size(rounds, seconds_per_object):
        n = rounds * bench_scale.ROUND
        t = seconds_per_object * n
        return {"objects": n, "train_images": n * 6 // 7, "test_images": n // 7, "epoch_samples": n * 6 // 7,
                "upload_round_seconds": [t / rounds], "list_recursive_s": t, "list_manifest_s": t / 100,
                "actors_s": t, "packing_s": t, "parquet_read_s": t, "epoch_streamed_s": t, "epoch_cached_s": t,
                "inference_s": t,
                **{f"rss_{m}": {"peak_rss_bytes": 100 * 2**20 + n * 200, "pointer_object_bytes": n * 100,
                                "pointer_text_bytes": n * 40} for m in ("recursive", "manifest")}}

    rows = [size(1, 1e-4), size(2, 1e-4), size(4, 1.5e-4)]  # per object: flat, then 1.5x
    growth = {r["step"]: r for r in bench_scale.growth(rows)}
    assert growth["list, recursive"]["largest / smallest"] == 1.5 and not growth["list, recursive"]["linear enough"]
    assert growth["list, recursive"]["s per 100k at 70k"] == 10.0
    assert growth["upload"]["largest / smallest"] == 1.5
    memory = bench_scale.memory(rows)["manifest"]
    assert memory["growth_over_pointer_objects"] == 2.0  # 200 bytes of RSS per pointer of 100


def test_pipelines_are_counted_from_ray_data_s_executions_and_told_apart_by_their_actors():
    executions = [{"start_time": 10.0, "end_time": 12.0},  # started a pool of actors
                  {"start_time": 13.0, "end_time": 13.5},  # tasks only
                  {"start_time": 20.0, "end_time": None},  # still running at the end: tasks
                  {"start_time": 5.0, "end_time": 6.0}]  # before the notebook began
    actors = [{"ActorClassName": "_MapWorker", "StartTime": 10_400}, {"ActorClassName": "_MapWorker",
                                                                        "StartTime": 10_600},
              {"ActorClassName": "TrainController", "StartTime": 13_100}, {"ActorClassName": "_MapWorker",
                                                                           "StartTime": 5_500}]
    assert bench_smoke.pipelines_run(executions, actors, began=9.0, ended=25.0) == {"actors": 1, "tasks": 2}


def test_fits_are_counted_from_the_train_controllers_that_started_in_the_window():
    actors = [{"ActorClassName": "TrainController", "StartTime": 10_500},
              {"ActorClassName": "RayTrainWorker", "StartTime": 11_000},
              {"ActorClassName": "TrainController", "StartTime": 30_000},
              {"ActorClassName": "TrainController", "StartTime": 9_000}]  # before the notebook began
    assert bench_smoke.fits_started(actors, began=10.0, ended=40.0) == 2


def test_the_ray_init_cell_stands_for_ray_s_start_where_the_notebook_shows_the_call(tmp_path):
    import json

    def cell(source, seconds):
        return {"cell_type": "code", "source": [source], "metadata": {"papermill": {"duration": seconds}}}

    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": [cell("import ray", 1.0), cell("ray.init(address=where.address)", 0.4)]}))
    assert bench_smoke.ray_init_seconds(path) == 0.4
    path.write_text(json.dumps({"cells": [cell("cluster.init_ray()", 0.4)]}))
    assert bench_smoke.ray_init_seconds(path) is None


def test_the_times_and_the_accuracy_the_readme_and_notebooks_state_are_the_measured_ones():
    """README's notebook table and 04's full-size accuracy, and each notebook's Time row, say what
    benchmarks/results/*.json hold (benchmarks/report.py writes them)."""
    import report

    assert report.main(["--check"]) == 0, "run `python benchmarks/report.py` after `make bench`"


def test_the_report_formats_times_and_marks_what_was_not_measured():
    import report

    assert report.duration(None) == "—" and report.duration(42.4) == "42 s" and report.duration(126) == "2.1 min"
    assert report.between("a <!--x--> old <!--y--> b", ("<!--x-->", "<!--y-->"), "new") == "a <!--x-->\nnew\n<!--y--> b"


def test_the_rooms_benchmark_counts_each_process_under_its_service_and_sizes_a_server_from_the_largest_room():
    import bench_rooms

    commands = {"/x/.venv/bin/weed -config_dir=/s mini": "object store",
                "python -m mlflow server --host 127.0.0.1": "MLflow", "ray::RayTrainWorker.train_fn": "Ray",
                "/x/ray/core/src/ray/raylet/raylet --node_id": "Ray", "python -m workshop.ray_service --state s": "Ray",
                "python -m workshop.runner --only 04_distributed": "notebook run",
                "python -m ipykernel_launcher -f /tmp/k.json": "notebook run",
                "python -m jupyter lab --no-browser": "JupyterLab", "make -o .venv/.installed lab": "other"}
    assert {command: bench_rooms.service_of(command) for command in commands} == commands
    rows = [{"phase": "idle", "MB": 1500, "cores": 0.1}, {"phase": "idle", "MB": 1700, "cores": 0.2},
            {"phase": "notebook 04", "MB": 3700, "cores": 1.5}, {"phase": "notebook 04", "MB": 3500, "cores": 2.0}]
    sized = bench_rooms.sizing(rows, cores=16, gigabytes=64, reserved_gb=4)
    assert sized["per learner"] == {"idle": {"MB": 1700, "cores": 0.2}, "notebook 04": {"MB": 3700, "cores": 2.0}}
    assert sized["learners that fit"] == {"idle": {"by memory": 36, "by cores": 80},
                                          "notebook 04": {"by memory": 16, "by cores": 8}}
