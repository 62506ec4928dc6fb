"""The instructor's live mode: long enough to watch, at its own defaults (a module of its own: the longest test)."""

import pytest

from tests.suite.notebook_runs import run_plain

pytestmark = pytest.mark.notebook


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_live_mode_makes_04_s_epochs_and_05_s_trials_last_long_enough_to_watch(bucket, tmp_path, settings):
    """The instructor's setting: 04's epochs reach MLflow spread over at least 20 s, and 05's trials come and go
    (they start at different times, two at a time), where the smoke defaults are over in a few seconds."""
    from mlflow.tracking import MlflowClient

    from helpers import sweeps

    client, suffix = MlflowClient(settings.mlflow_tracking_uri), bucket[2:12]
    facts = run_plain("04", tmp_path, bucket=bucket, live=True, experiment=f"t-live-04-{suffix}")
    assert facts["epochs"] == 30 and facts["test images"] == 10000  # 12,000 training images: all 10,000 tests
    stamps = sorted(m.timestamp for m in client.get_metric_history(facts["MLflow run id"], "train_loss"))
    assert len(stamps) == 30 and (stamps[-1] - stamps[0]) / 1000 >= 20, "the curves grow for 20 s or more"
    facts = run_plain("05", tmp_path, bucket=bucket, live=True, experiment=f"t-live-05-{suffix}")
    assert facts["trials"] == 12
    starts = sorted(r.info.start_time / 1000 for r in sweeps.child_runs(settings.mlflow_tracking_uri,
                                                                       facts["MLflow parent run id"]))
    assert len(starts) == 12 and starts[-1] - starts[0] >= 20, "new trials keep coming for 20 s or more"
    runs = sweeps.child_runs(settings.mlflow_tracking_uri, facts["MLflow parent run id"])
    overlaps = [a for a in runs for b in runs if a.info.run_id < b.info.run_id
                and a.info.start_time < b.info.end_time and b.info.start_time < a.info.end_time]
    assert overlaps, "two trials train at once"
