"""MLflow plumbing: a checked client, experiments made safely, parameters as strings (notebooks 04-06).

The notebooks call ``MlflowClient`` themselves (create a run, log into it
by run id, end it); this module only does what every one of them needs
and no learner has to read.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from helpers.errors import TutorialError

_REQUEST_TIMEOUT_S = 3.0
# MLflow's client retries a failed request 7 times with a backoff factor of 2 and waits 120 s for
# an answer: minutes per call when the server went away. These bounds make it seconds.
BOUNDED_REQUESTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
_OFF: dict[str, str] = {}  # tracking URI -> why tracking went off (said once)


def bounded_requests() -> dict[str, str]:
    """Bound MLflow's HTTP timeout and retries in this process (values already set are kept); returns them.

    Ray workers get the same values with the other settings (:func:`helpers.worker_env.settings_env`).
    """
    for name, value in BOUNDED_REQUESTS.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in BOUNDED_REQUESTS}


def still_up(uri: str) -> bool:
    """Whether MLflow still answers at ``uri``: checked once per call until it does not.

    The first time it does not, one line says that tracking is off and why; from then on
    this returns False at once, and a notebook goes on with the training result it holds.
    """
    if uri in _OFF:
        return False
    ok, reason = tracking_available(uri)
    if not ok:
        _OFF[uri] = reason
        print(f"MLflow tracking is off from here on: {reason}. The training result is kept and used below; "
              "restart MLflow (`python -m workshop.stack up`) and run the notebook again to log it.")
    return ok


def end_status(error: BaseException | None) -> str:
    """The MLflow run status for how a block ended: FINISHED, FAILED on an error, KILLED on an interrupt.

    A clean exit (``SystemExit(0)``, which is how Ray Tune stops a trial its scheduler cut short) is FINISHED.
    """
    from helpers.interrupts import Interrupted

    if error is None or (isinstance(error, SystemExit) and error.code in (0, None)):
        return "FINISHED"
    return "FAILED" if isinstance(error, Exception) and not isinstance(error, Interrupted) else "KILLED"


@contextlib.contextmanager
def run_status(client, run_id: str | None):
    """Mark run ``run_id`` RUNNING for the block; if the block stops it, KILLED (an interrupt) or FAILED (an error).

    A run is never left RUNNING by a block that did not finish, and running the block again (a resumed
    training) marks it RUNNING again. A block that ends normally leaves the run RUNNING: the code after it
    logs more and ends it. An object-store outage also tags it for :func:`interrupted_run`.
    """
    if client is not None and run_id:
        with contextlib.suppress(Exception):  # tracking gone: said elsewhere, and never stops the work
            client.update_run(run_id, status="RUNNING")
    try:
        yield
    except BaseException as error:
        end_run(client, run_id, error)
        raise


RESUMABLE_TAG = "resume_after_outage"  # on a run an object-store outage stopped: the next one resumes it


def mark_resumable(client, run_id: str, error: BaseException) -> None:
    """Tag run ``run_id`` :data:`RESUMABLE_TAG` when an object-store outage stopped it, for :func:`interrupted_run`."""
    from helpers.storage import outage_during

    if outage_during(error) is not None:
        with contextlib.suppress(Exception):  # tracking gone too: the run just starts over next time
            client.set_tag(run_id, RESUMABLE_TAG, "true")


def end_run(client, run_id: str | None, error: BaseException | None = None) -> None:
    """Mark run ``run_id`` ended with :func:`end_status` (and :func:`mark_resumable`).

    A tracking outage here is ignored: it is said elsewhere, and must not hide the error that ended the run.
    """
    if client is None or not run_id:
        return
    try:
        if error is not None:
            mark_resumable(client, run_id, error)
        client.set_terminated(run_id, status=end_status(error))
    except Exception:  # noqa: BLE001, S110 - ending a run must never hide the error that ended it
        pass


def interrupted_run(client, experiment: str, params: Mapping[str, Any]):
    """The latest run of ``experiment`` that an object-store outage stopped, logged with these ``params``; else None.

    Starting it again under the same run name makes Ray Train restore its last checkpoint from the bucket,
    and logging into the same MLflow run keeps each epoch in it once.
    """
    wanted = {param.key: param.value for param in as_params(params)}
    runs = client.search_runs([experiment], filter_string=f"tags.{RESUMABLE_TAG} = 'true'",
                              order_by=["attributes.start_time DESC"], max_results=20)
    return next((run for run in runs if run.data.params == wanted), None)


def resume_run(client, run) -> tuple[str, str]:
    """Reopen ``run`` (from :func:`interrupted_run`): ``(run_id, run_name)``, with one line saying so."""
    client.delete_tag(run.info.run_id, RESUMABLE_TAG)
    client.update_run(run.info.run_id, status="RUNNING")
    print(f"Resuming {run.info.run_name}, which an object-store outage stopped: Ray Train restores its last "
          "checkpoint from the bucket, and its MLflow run goes on.")
    return run.info.run_id, run.info.run_name


class TrackingUnavailable(TutorialError, RuntimeError):
    """No MLflow server answers at the configured tracking URI."""


def tracking_available(uri: str, timeout: float = _REQUEST_TIMEOUT_S) -> tuple[bool, str]:
    """Whether an MLflow server answers ``GET <uri>/health``; the reason when not."""
    if not uri:
        return False, "no MLFLOW_TRACKING_URI is configured"
    if not uri.startswith(("http://", "https://")):
        return True, ""  # a local file or database store needs no server
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as response:
            return response.status == 200, f"HTTP {response.status}"
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        return False, f"the MLflow server at {uri} is not reachable ({reason})"


def connect(uri: str):
    """An ``MlflowClient`` for ``uri``, checked with one request.

    Raises:
        TrackingUnavailable: nothing answers; the message names the fix.
    """
    from mlflow.tracking import MlflowClient

    bounded_requests()
    ok, reason = tracking_available(uri)
    if not ok:
        raise TrackingUnavailable(f"MLflow tracking is unavailable: {reason}. Start it with "
                                  "`python -m workshop.stack up`, or set MLFLOW_TRACKING_URI.")
    return MlflowClient(tracking_uri=uri)


def experiment_id(client, name: str) -> str:
    """The experiment's id, created if missing (safe when parallel workers create it at the same time)."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return client.get_experiment_by_name(name).experiment_id


def as_params(params: Mapping[str, Any]) -> list:
    """MLflow ``Param`` entities for ``log_batch``: values as strings, lists and dicts as JSON."""
    from mlflow.entities import Param

    return [Param(k, json.dumps(v) if isinstance(v, (list, tuple, dict)) else str(v)) for k, v in params.items()]


def as_metrics(metrics: Mapping[str, float], step: int = 0) -> list:
    """MLflow ``Metric`` entities for ``log_batch``, all at ``step`` and the current time."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    return [Metric(k, float(v), now, step) for k, v in metrics.items()]


def backfill_epochs(client, run_id: str, history: list[Mapping[str, Any]], keys: tuple[str, ...]) -> int:
    """After a training run resumed: log the checkpointed epochs MLflow missed; the last epoch it now holds.

    Rank 0 logs each epoch as it ends, so MLflow usually holds epochs past the checkpoint the run resumed
    from: the loop runs them again but must not log them twice.
    """
    from mlflow.entities import Metric

    logged = {m.step for m in client.get_metric_history(run_id, keys[0])}
    now = int(time.time() * 1000)
    missing = [Metric(key, float(row[key]), now, int(row["epoch"]))
               for row in history if row["epoch"] not in logged for key in keys if key in row]
    if missing:
        client.log_batch(run_id, metrics=missing)
    return max(logged | {int(row["epoch"]) for row in history} | {0})


GIT_COMMIT_TAG = "mlflow.source.git.commit"  # MLflow's own tag for the code version
GIT_DIRTY_TAG = "git.dirty"  # "true" when the working tree held changes the commit does not
GIT_DIFF_TAG = "git.diff_sha256"  # a hash of those changes, so two dirty runs can be told apart


def lineage_tags() -> dict[str, str]:
    """The code a run ran: the git commit, whether the tree had changes, and their hash ({} outside a checkout).

    Changes to notebooks' outputs alone are not changes of the code (:mod:`helpers.code_version`).
    """
    from helpers import code_version

    state = code_version.current()
    if state is None:
        return {}
    tags = {GIT_COMMIT_TAG: state.commit, GIT_DIRTY_TAG: str(state.dirty).lower()}
    if state.dirty:
        tags[GIT_DIFF_TAG] = state.diff_sha256
    return tags


def run_url(uri: str, experiment: str, run_id: str) -> str:
    """Link to a run in the MLflow UI ('' for a tracking URI that is not a server)."""
    return f"{uri.rstrip('/')}/#/experiments/{experiment}/runs/{run_id}" if uri.startswith("http") else ""


def metric_history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """``(step, value)`` pairs of one metric, ordered by step."""
    from mlflow.tracking import MlflowClient

    return sorted((m.step, m.value) for m in MlflowClient(uri).get_metric_history(run_id, key))


def end_trial_runs_callback():
    """A Ray Tune callback that ends, from the driver, the MLflow run of each trial once Tune says it ended.

    A trial the scheduler stops exits at its next report, and its process may be stopped before the
    trial's own ``finally`` ends its run: without this, such runs would show RUNNING in MLflow forever.
    A run the trial already ended is left as it is.
    """
    from mlflow.tracking import MlflowClient
    from ray import tune

    class EndTrialRuns(tune.Callback):
        def on_trial_complete(self, iteration, trials, trial, **info):
            self._end(trial, "FINISHED")  # finished, or stopped early by the scheduler: both ended cleanly

        def on_trial_error(self, iteration, trials, trial, **info):
            self._end(trial, "FAILED")

        @staticmethod
        def _end(trial, status: str) -> None:
            config = trial.config
            if not (config.get("tracking_uri") and config.get("parent_run_id")):
                return
            try:
                client = MlflowClient(config["tracking_uri"])
                parent = client.get_run(config["parent_run_id"])
                for run in client.search_runs(
                        [parent.info.experiment_id],
                        filter_string=f"tags.mlflow.parentRunId = '{config['parent_run_id']}' "
                                      f"and tags.trial = '{trial}' and attributes.status = 'RUNNING'"):
                    client.set_terminated(run.info.run_id, status=status)
            except Exception:  # noqa: BLE001, S110 - a tracking outage must not stop the sweep; it is said elsewhere
                pass

    return EndTrialRuns()
