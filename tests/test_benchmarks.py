"""The smoke benchmark's arithmetic (spans to a breakdown, targets in yardsticks) and the span recorder."""

import sys
import time
from pathlib import Path

import pytest

from helpers import cluster, timings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
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


def test_the_breakdown_sums_labels_and_finds_ray_train_s_start_and_teardown():
    spans = [{"label": "ray start", "start": 0.0, "end": 8.0}, {"label": "training", "start": 10.0, "end": 40.0},
             {"label": "train: epoch compute", "start": 22.0, "end": 23.0},
             {"label": "train: epoch compute", "start": 24.0, "end": 25.5},
             {"label": "train: checkpoint + report", "start": 25.5, "end": 31.0}]
    parts = bench_smoke.breakdown(spans)
    assert parts["train: epoch compute"] == {"seconds": 2.5, "count": 2}
    assert parts["train: start (fit to first epoch)"]["seconds"] == 12.0
    assert parts["train: teardown (last report to fit's return)"]["seconds"] == 9.0
    assert "train: start (fit to first epoch)" not in bench_smoke.breakdown(spans[:1])


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
