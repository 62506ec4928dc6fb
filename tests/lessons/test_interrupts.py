"""The kernel's Interrupt button on a Ray cell: one line, what stopped and what to run next, nothing left running.

A timer thread sends this process SIGINT, as JupyterLab's Interrupt button sends the kernel, while the main
thread is inside Ray Train's ``fit()``, Ray Tune's ``Tuner.fit()`` or a Ray Data pipeline.
"""

import json
import os
import signal
import threading
import time

import psutil
import pytest

from helpers import cluster, interrupts, notebook, preprocess, training
from tests.suite.mnist_buckets import uploaded_bucket
from tests.suite.ray_processes import ray_processes as processes_of_ray

SMOKE = 300


def test_a_test_process_started_with_sigint_ignored_still_interrupts_as_a_kernel_does(tmp_path):
    """`make test &`, nohup or a CI runner start pytest with SIGINT ignored; ipykernel runs each cell with Python's
    handler whatever it inherited, and so does every test process (tests/suite/session.py), or its interrupt tests
    cannot pass."""
    import subprocess
    import sys

    from helpers.settings import project_root

    probe = tmp_path / "test_probe.py"
    probe.write_text("from tests.suite.session import assert_ctrl_c_interrupts\n\n\n"
                     "def test_ctrl_c_interrupts():\n    assert_ctrl_c_interrupts()\n")
    ran = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.suite.session", "-p", "no:cacheprovider",
                          "-q", "--rootdir", str(tmp_path), "-c", os.devnull, str(probe)],
                         cwd=project_root(), capture_output=True, text=True, timeout=120,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # what `&` does
    assert ran.returncode == 0 and "1 passed" in ran.stdout, ran.stdout + ran.stderr


def interrupt_in(seconds: float, seen: dict[str, set[int]] | None = None) -> threading.Timer:
    """SIGINT to this process after ``seconds``, as the Interrupt button sends the kernel.

    ``seen``, if given, is filled just before the press with the pids of the processes of each Ray actor class it
    names (so a test can show that the processes it then sees gone were there).
    """
    def press() -> None:
        for title in seen or {}:
            seen[title] = {proc.pid for proc in ray_processes(title)}
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(seconds, press)
    timer.start()
    return timer


def ray_processes(title: str) -> list[psutil.Process]:
    """Live processes of the Ray this test joined whose title names a Ray actor class."""
    import ray

    return processes_of_ray(ray.get_runtime_context().gcs_address, title)


def gone_within(title: str, seconds: float, among: set[int] | None = None) -> bool:
    """Whether the processes titled ``title`` (only those of the pids ``among``, if given) end within ``seconds``."""
    def left() -> list[psutil.Process]:
        return [proc for proc in ray_processes(title) if among is None or proc.pid in among]

    deadline = time.monotonic() + seconds
    while left() and time.monotonic() < deadline:
        time.sleep(0.5)
    return not left()


def test_an_interrupt_is_one_line_and_the_handler_comes_back():
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(interrupts.Interrupted) as stopped, interrupts.stop_cleanly("Work", "Run it again."):
        raise KeyboardInterrupt
    assert str(stopped.value) == "Work stopped: you interrupted it. Run it again."
    assert signal.getsignal(signal.SIGINT) is handler
    assert notebook.user_error_line(stopped.value) == f"Interrupted: {stopped.value}"


def test_a_handler_installed_inside_the_block_is_undone_and_system_exit_of_others_passes():
    handler = signal.getsignal(signal.SIGINT)
    with interrupts.stop_cleanly("Work"):
        signal.signal(signal.SIGINT, lambda *_: None)  # what Ray Train's fit() leaves behind
    assert signal.getsignal(signal.SIGINT) is handler
    with pytest.raises(SystemExit), interrupts.stop_cleanly("Work"):
        raise SystemExit(3)  # not an interrupt, and no trainer whose Ctrl-C handler could raise it


def test_a_sweep_stopped_by_tune_s_first_ctrl_c_is_an_interrupt():
    class Tuner:  # what Ray Tune's fit() does with the handler: install its own, put the previous back when it fires
        def fit(self, fire: bool):
            previous = signal.getsignal(signal.SIGINT)
            signal.signal(signal.SIGINT, lambda *_: None)
            if fire:
                signal.signal(signal.SIGINT, previous)

    with interrupts.stop_cleanly("The sweep", tuner=Tuner()):
        Tuner().fit(fire=False)
    with pytest.raises(interrupts.Interrupted, match="The sweep stopped"), \
            interrupts.stop_cleanly("The sweep", tuner=Tuner()):
        Tuner().fit(fire=True)


def test_the_resume_line_names_the_checkpoint_ray_train_recorded(tmp_path):
    from types import SimpleNamespace

    from pyarrow import fs

    run_config = SimpleNamespace(storage_filesystem=fs.LocalFileSystem(), storage_path=str(tmp_path), name="run")
    trainer = SimpleNamespace(run_config=run_config)
    assert interrupts.resumes(trainer)() == "Run this cell again: training starts over, as no checkpoint was saved yet."
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoint_manager_snapshot.json").write_text(json.dumps(
        {"latest_checkpoint_result": {"checkpoint_dir_name": "checkpoint_x", "metrics": {"epoch": 5}}}))
    assert interrupts.resumes(trainer)() == "Run this cell again: training resumes from the checkpoint of epoch 5."


@pytest.fixture(scope="module")
def interrupt_bucket(client):
    with uploaded_bucket(client, "stop", SMOKE) as name:
        yield name


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_an_interrupted_fit_stops_its_workers_and_the_rerun_resumes_from_its_checkpoint(settings, interrupt_bucket):
    resources = cluster.init_ray(settings)
    train_ds, _, _ = preprocess.load_datasets(interrupt_bucket, SMOKE, settings)
    params = {**training.DEFAULT_PARAMS, "epochs": 3000, "checkpoint_every": 2, "hidden_sizes": [32]}  # minutes
    name = training.unique_run_name("stop")

    def trainer():
        return training.make_trainer(params, {"train": train_ds}, 2, name, f"{interrupt_bucket}/ray-results",
                                     cluster_cpus=resources["CPU"], settings=settings)

    def fit(run):
        with interrupts.stop_cleanly("Training", interrupts.resumes(run), trainer=run):
            return run.fit()

    first = trainer()
    handler = signal.getsignal(signal.SIGINT)
    pressed = {}

    def press_once_a_checkpoint_is_saved():  # as a learner would: epochs have gone by, a checkpoint is in the bucket
        deadline = time.monotonic() + 240
        while interrupts.latest_checkpoint_epoch(first) is None and time.monotonic() < deadline:
            time.sleep(0.5)
        pressed["running"] = [len(ray_processes(title)) for title in ("RayTrainWorker", "TrainController")]
        pressed["at"] = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=press_once_a_checkpoint_is_saved, daemon=True).start()
    with pytest.raises(interrupts.Interrupted) as stopped:
        fit(first)
    assert time.monotonic() - pressed["at"] < 30, "the cell stops within seconds of the interrupt"
    line = str(stopped.value)
    assert line.startswith("Training stopped: you interrupted it. Run this cell again: training resumes from "
                           "the checkpoint of epoch "), line
    epoch = int(line.rsplit(" ", 1)[1].rstrip("."))
    assert epoch >= 2 and epoch % 2 == 0
    assert signal.getsignal(signal.SIGINT) is handler
    assert pressed["running"] == [2, 1], "the run's two workers and its controller, seen while it ran"
    assert gone_within("RayTrainWorker", 20) and gone_within("TrainController", 20), "nothing left running"
    # the cell again: the same run name, and Ray Train restores that checkpoint
    params["epochs"] = epoch + 2
    result = fit(trainer())
    _, state = training.load_checkpoint(result.checkpoint)
    resumed = [row["epoch"] for row in state["history"] if row.get("resumed_from_here")]
    assert resumed == [epoch] and state["epoch"] == epoch + 2


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_interrupted_pipeline_is_one_line_and_its_actors_stop(settings, interrupt_bucket):
    from helpers import listing

    cluster.init_ray(settings)
    keys, labels, *_ = listing.get_train_test_data(interrupt_bucket, SMOKE, "manifest")
    slow = preprocess.to_ray_dataset(keys[:300] * 200, labels[:300] * 200)  # 60,000 rows: a minute on 2 cores
    before = {proc.pid for proc in ray_processes("ObjectPreprocessor")}  # other pipelines': not this test's business
    seen: dict[str, set[int]] = {"ObjectPreprocessor": set()}
    timer = interrupt_in(12, seen)
    with pytest.raises(interrupts.Interrupted) as stopped, notebook.timed("actors: fetch + decode"):
        preprocess.preprocess_with_actors(slow, interrupt_bucket, num_actors=2).materialize()
    timer.cancel()
    assert str(stopped.value) == ("actors: fetch + decode stopped: you interrupted it. Nothing it made is kept; "
                                  "run the cell again.")
    mine = seen["ObjectPreprocessor"] - before
    assert mine, "the pipeline's actors, seen while it ran"
    # Ray Data releases the pool's actors on an interrupt (it does not kill them): each exits once the batches
    # already sent to it are done, which on two busy cores has taken over 30 s.
    assert gone_within("ObjectPreprocessor", 90, among=mine), "the pipeline's actors stopped"


def test_ray_train_still_hands_its_controller_to_the_method_stop_cleanly_replaces():
    """stop_cleanly keeps Ray Train's own Ctrl-C handler out by replacing this method on the trainer; a Ray version
    without it would bring back the SystemExit (caught, but the run then ends by Ray's handler, not by abort)."""
    import inspect

    from ray.train.torch import TorchTrainer

    assert "controller" in inspect.signature(TorchTrainer._register_sigint_handler).parameters
