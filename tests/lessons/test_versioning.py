"""lakeFS experiments end to end: import, parallel experiment branches, comparison, merge, reproduce.

Run against the lakeFS named by LAKEFS_ENDPOINT when one is configured,
otherwise against the lakeFS API test double (tests/fakes/lakefs_double.py).
"""

import contextlib
import dataclasses
import io
import json
import signal
import socket
import time
import uuid

import lakefs
import pytest
from mlflow.tracking import MlflowClient

from helpers import lakefs_experiments as exp
from helpers import listing, storage, tracking, training, upload, versioning
from helpers.settings import ParameterError, load_settings
from tests.suite.mnist_buckets import lakefs_images, uploaded_bucket

SMOKE = 240  # 240 training, 400 validation and 800 test images: 1,440 objects
GRID = [{"optimizer": "sgd", "epochs": 1}, {"optimizer": "adam", "epochs": 2}]
START = exp.DEFAULT_PARAMS  # notebook 04's defaults: where no sweep ran
EXPERIMENT = "tests-lakefs"
pytestmark = [pytest.mark.lakefs, pytest.mark.slow]


@pytest.fixture(scope="module")
def lk_settings(lakefs_kind, settings):
    return load_settings()  # now with the LAKEFS_* variables of the session's lakeFS


@pytest.fixture(scope="module")
def source_bucket(client):
    with uploaded_bucket(client, "lakefs", SMOKE) as name:
        yield name


@pytest.fixture(scope="module")
def repo(lk_settings, source_bucket):
    name = f"t-{uuid.uuid4().hex[:10]}"
    repository = exp.ensure_repository(versioning.connect(lk_settings), name, lk_settings)
    yield repository
    repository.delete()


@pytest.fixture(scope="module")
def imported(repo, source_bucket, client, lk_settings):
    before = exp.bucket_usage(source_bucket, lk_settings)
    result = exp.import_from_bucket(repo, source_bucket, settings=lk_settings)
    return before, result


@pytest.fixture(scope="module")
def experiments(repo, imported, lk_settings):
    return exp.run_experiments(repo, GRID, START, EXPERIMENT, lk_settings, SMOKE)


def test_import_is_zero_copy_and_reads_return_the_original_bytes(repo, imported, source_bucket, client, lk_settings):
    before, result = imported
    keys = [k for k in listing.list_objects_parallel(source_bucket, client=client) if k.startswith(("train/", "test/"))]
    assert result.objects == len(keys) == 1440 and not result.reused
    assert exp.bucket_usage(source_bucket, lk_settings) == before  # nothing copied into the bucket
    assert exp.list_paths(repo, exp.INGEST_BRANCH, "") == sorted(keys)
    key = keys[7]
    stat = repo.ref(exp.INGEST_BRANCH).object(key).stat()
    assert stat.physical_address == f"s3://{source_bucket}/{key}"
    assert exp.read_bytes(repo, exp.INGEST_BRANCH, key) == storage.read_object(client, source_bucket, key)
    commit = repo.ref(result.commit_id).get_commit()
    assert commit.metadata["import_source"] == f"s3://{source_bucket}/train/,s3://{source_bucket}/test/"


def test_a_second_import_of_the_same_sources_is_reused(repo, imported, source_bucket, lk_settings):
    again = exp.import_from_bucket(repo, source_bucket, settings=lk_settings)
    assert again.reused and again.commit_id == imported[1].commit_id and again.objects == imported[1].objects


@contextlib.contextmanager
def repository_over_a_new_bucket(lk_settings, client, prefix: str, smoke_test_size: int):
    """A fresh repository and a fresh bucket of ``smoke_test_size`` images; both removed afterwards."""
    with uploaded_bucket(client, prefix, smoke_test_size) as name:
        repository = exp.ensure_repository(versioning.connect(lk_settings), f"t-{uuid.uuid4().hex[:10]}",
                                           lk_settings)
        try:
            yield repository, name
        finally:
            repository.delete()


def test_a_bucket_that_grew_is_imported_again(lk_settings, client):
    with repository_over_a_new_bucket(lk_settings, client, "grow", 60) as (repository, name):
        first = exp.import_from_bucket(repository, name, settings=lk_settings)
        upload.upload_mnist(name, 120, client=client, progress=False)  # 360 more images arrive
        second = exp.import_from_bucket(repository, name, settings=lk_settings)
        assert (first.objects, second.objects) == (360, 720) and not second.reused
        assert repository.ref(second.commit_id).get_commit().parents == [first.commit_id]


def test_each_experiment_commits_three_files_with_params_and_recomputed_metrics(repo, experiments, imported):
    assert [r.branch for r in experiments] == ["exp-sgd-1", "exp-adam-2"]
    for result in experiments:
        commit = repo.ref(result.commit_id).get_commit()
        assert commit.parents == [imported[1].commit_id]  # branched from the ingest commit
        files = [p for p in exp.list_paths(repo, result.commit_id, "") if not p.startswith(("train/", "test/"))]
        assert files == sorted(exp.EXPERIMENT_FILES)
        params = exp.read_json(repo, result.commit_id, exp.PARAMS_PATH)
        metrics = exp.read_json(repo, result.commit_id, exp.METRICS_PATH)
        assert exp.decode_metadata(commit.metadata, "param") == params == result.params
        assert exp.decode_metadata(commit.metadata, "metric") == metrics == result.metrics
        assert params["data_commit"] == imported[1].commit_id
        assert (params["train_images"], params["validation_images"], params["test_images"]) == (SMOKE, 400, 800)
        assert params["smoke_test_size"] == SMOKE  # what evaluate_commit and reproduce read the images by
        assert set(metrics) == {"val_accuracy", "val_loss", "train_loss"}  # no test number: none was chosen yet
        recomputed = exp.evaluate_commit(repo, result.commit_id)
        assert recomputed["val_accuracy"] == metrics["val_accuracy"]  # not accuracy + 0.5
        assert recomputed["val_loss"] == pytest.approx(metrics["val_loss"], abs=1e-6)
        assert 0 <= metrics["val_accuracy"] <= 1.0  # sgd after one epoch on 200 images may be no better than chance


def test_mlflow_run_and_lakefs_commit_point_at_each_other(repo, experiments, lk_settings):
    uri = lk_settings.mlflow_tracking_uri
    for result in experiments:
        commit = repo.ref(result.commit_id).get_commit()
        assert commit.metadata["mlflow_run_id"] == result.mlflow_run_id
        run = MlflowClient(uri).get_run(result.mlflow_run_id)
        assert run.data.tags["lakefs.commit"] == result.commit_id
        assert run.data.tags["lakefs.branch"] == result.branch and run.data.tags["lakefs.repository"] == repo.id
        logged = run.data.metrics
        assert logged["val_accuracy"] == result.metrics["val_accuracy"] and "test_accuracy" not in logged
        data = result.params["data_commit"]
        sources = {i.dataset.name: json.loads(i.dataset.source)["uri"] for i in run.inputs.dataset_inputs}
        assert sources == {"mnist-train": f"s3://{repo.id}/{data}/train/", "mnist-test": f"s3://{repo.id}/{data}/test/",
                           "mnist-validation": f"s3://{repo.id}/{data}/train/"}
        assert run.data.tags[tracking.GIT_COMMIT_TAG] == tracking.lineage_tags()[tracking.GIT_COMMIT_TAG]
        assert commit.metadata["mlflow_model_uri"].startswith("models:/")


def test_comparison_table_equals_what_lakefs_holds(repo, experiments):
    table = exp.compare_experiments(repo, [r.branch for r in experiments])
    assert sorted(table.branch) == sorted(r.branch for r in experiments)
    assert list(table.val_accuracy) == sorted(table.val_accuracy, reverse=True)
    for row in table.itertuples():
        head = repo.branch(row.branch).get_commit()
        stored = json.loads(repo.ref(head.id).object(exp.METRICS_PATH).reader(pre_sign=False).read())
        assert row.commit_id == head.id and row.metrics_match
        assert (row.val_accuracy, row.val_loss, row.train_loss) == (stored["val_accuracy"], stored["val_loss"],
                                                                  stored["train_loss"])
        assert row.optimizer == json.loads(head.metadata["param.optimizer"])


def test_diff_against_ingest_shows_only_the_experiment_files(repo, experiments):
    diff = list(repo.ref(exp.INGEST_BRANCH).diff(repo.ref(experiments[0].branch)))
    assert sorted(c.path for c in diff) == sorted(exp.EXPERIMENT_FILES) and {c.type for c in diff} == {"added"}


def test_commits_are_immutable_and_branches_are_pointers(repo, experiments):
    old = experiments[0].commit_id
    branch = repo.branch(f"scratch-{uuid.uuid4().hex[:6]}").create(old)
    assert branch.get_commit().id == old  # a new branch is a pointer: no new commit, no copy
    branch.object(exp.METRICS_PATH).upload('{"accuracy": 1.5}', mode="w", pre_sign=False)
    assert [c.path for c in branch.uncommitted()] == [exp.METRICS_PATH]
    assert exp.read_json(repo, f"{branch.id}@", exp.METRICS_PATH) == experiments[0].metrics  # committed
    assert exp.read_json(repo, branch.id, exp.METRICS_PATH) == {"accuracy": 1.5}  # staged
    new = branch.commit("overwrite metrics").get_commit()
    assert new.parents == [old] and branch.get_commit().id == new.id and not list(branch.uncommitted())
    assert exp.read_json(repo, old, exp.METRICS_PATH) == experiments[0].metrics
    assert exp.read_json(repo, f"{branch.id}~1", exp.METRICS_PATH) == experiments[0].metrics
    branch.delete()
    assert exp.read_json(repo, new.id, exp.METRICS_PATH) == {"accuracy": 1.5}  # commits outlive it


def test_promote_merges_the_winner_into_main_and_tags_it(repo, experiments):
    first = exp.promote(repo, experiments[1].branch)
    assert first.tag == "model-v1" and repo.tag("model-v1").get_commit().id == first.merge_commit
    assert repo.branch("main").get_commit().id == first.merge_commit
    assert exp.read_json(repo, "main", exp.METRICS_PATH) == experiments[1].metrics
    assert len(exp.list_paths(repo, "model-v1", "train/")) == SMOKE + 400  # training and validation images
    second = exp.promote(repo, experiments[0].branch)  # the new winner replaces the old one's files
    assert second.tag == "model-v2"
    assert exp.read_json(repo, "model-v2", exp.METRICS_PATH) == experiments[0].metrics
    assert exp.read_json(repo, "model-v1", exp.METRICS_PATH) == experiments[1].metrics


def test_the_promoted_model_becomes_the_champion_and_a_new_winner_moves_the_alias(repo, experiments, lk_settings):
    import mlflow

    uri = lk_settings.mlflow_tracking_uri
    mlflow.set_tracking_uri(uri)
    client, name = MlflowClient(uri), f"t-model-{uuid.uuid4().hex[:8]}"
    # the two promotions test_promote made: model-v1 (experiments[1]), then model-v2 (experiments[0])
    promotions = [exp.Promotion(e.branch, repo.tag(tag).get_commit().id, tag)
                  for e, tag in ((experiments[1], "model-v1"), (experiments[0], "model-v2"))]
    x_val, y_val = lakefs_images(repo, promotions[0].merge_commit, "validation")
    first = exp.register_version(repo, promotions[0], client, name)
    assert exp.current_champion(client, name) is None  # registered, not yet crowned
    new, old, moved, said = exp.champion_if_better(client, first, x_val, y_val, name)
    assert (old, moved, said) == (None, True, "no champion before it") and new == experiments[1].metrics["val_accuracy"]
    assert client.get_model_version_by_alias(name, "champion").version == "1"
    # the second promotion's model is measured against the champion on the same images: it moves only if clearly better
    promotion = promotions[1]
    second = exp.register_version(repo, promotion, client, name)
    assert (int(first.version), int(second.version)) == (1, 2)
    new, old, moved, said = exp.champion_if_better(client, second, x_val, y_val, name)
    assert (new, old) == (experiments[0].metrics["val_accuracy"], experiments[1].metrics["val_accuracy"])
    predicted = {number: mlflow.pyfunc.load_model(f"models:/{name}/{number}").predict(x_val).argmax(1)
                 for number in ("1", "2")}  # the two versions' predictions of the same images: the paired test's
    assert moved == training.clearly_better(predicted["2"], predicted["1"], y_val)
    assert said == training.paired_test(predicted["2"], predicted["1"], y_val)
    champion_version = client.get_model_version_by_alias(name, "champion")
    assert champion_version.version == ("2" if moved else "1")
    winner = promotion if moved else promotions[0]
    assert champion_version.tags["lakefs.commit"] == winner.merge_commit
    champion = mlflow.pyfunc.load_model(f"models:/{name}@champion")
    assert float((champion.predict(x_val).argmax(axis=1) == y_val).mean()) == (new if moved else old)
    # the champion's own model as a new version is a tie, and a tie keeps the champion; so does the other model
    for again in (winner, promotions[0] if moved else promotion):
        tie_or_worse = exp.register_version(repo, again, client, name)
        assert exp.champion_if_better(client, tie_or_worse, x_val, y_val, name)[2] is False
        assert client.get_model_version_by_alias(name, "champion").version == champion_version.version


def test_reproduce_from_a_commit_id_alone(repo, experiments, lk_settings):
    result = experiments[1]
    handler = signal.getsignal(signal.SIGINT)
    reproduction = exp.reproduce(repo, result.commit_id, settings=lk_settings)
    assert signal.getsignal(signal.SIGINT) is handler  # Ray Train's fit() leaves its own behind: put back
    assert reproduction.within_tolerance and reproduction.recorded == result.metrics
    assert reproduction.params == result.params
    assert reproduction.reproduced["val_accuracy"] == pytest.approx(result.metrics["val_accuracy"],
                                                                    abs=reproduction.tolerance)


def test_rerunning_an_experiment_replaces_its_branch(repo, experiments, lk_settings):
    again = exp.run_experiments(repo, GRID[:1], START, EXPERIMENT, lk_settings, SMOKE)
    assert again[0].branch == experiments[0].branch and again[0].commit_id != experiments[0].commit_id
    assert again[0].metrics == experiments[0].metrics  # same data, same seed: the same model


def test_a_bad_grid_fails_before_any_branch_is_made(repo, lk_settings):
    branches = {b.id for b in repo.branches()}
    with pytest.raises(ParameterError, match="optimizer must be one of"):
        exp.run_experiments(repo, [{"optimizer": "rmsprop"}], START, EXPERIMENT, lk_settings, SMOKE)
    with pytest.raises(ParameterError, match="Unknown experiment parameter"):
        exp.run_experiments(repo, [{"optimiser": "sgd"}], START, EXPERIMENT, lk_settings, SMOKE)
    assert {b.id for b in repo.branches()} == branches


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_lakefs_gives_one_clear_error(lk_settings):
    down = dataclasses.replace(lk_settings, lakefs_endpoint=f"http://127.0.0.1:{_free_port()}")
    with pytest.raises(versioning.LakeFSUnavailable, match="not reachable") as err:
        versioning.connect(down)
    assert down.lakefs_endpoint in str(err.value) and "docker compose up" in str(err.value)
    with pytest.raises(versioning.LakeFSUnavailable, match="No lakeFS server is configured"):
        versioning.connect(dataclasses.replace(lk_settings, lakefs_endpoint=""))


def test_wrong_keys_give_one_clear_error(lk_settings):
    wrong = dataclasses.replace(lk_settings, lakefs_secret_key="not-the-secret")
    with pytest.raises(versioning.LakeFSAuthError, match="LAKEFS_SECRET_ACCESS_KEY"):
        versioning.connect(wrong)


def test_lakefs_refusals_come_back_as_one_line(repo, lk_settings):
    with pytest.raises(versioning.LakeFSError, match="reading config/params.json at no-such-branch"):
        exp.read_bytes(repo, "no-such-branch", "config/params.json")
    client = versioning.connect(lk_settings)
    with pytest.raises(lakefs.exceptions.ConflictException):  # creating it twice without exist_ok is refused
        lakefs.Repository(repo.id, client=client).create(versioning.storage_namespace(repo.id))


def test_merging_conflicting_changes_needs_a_strategy(repo, imported):
    names = [f"c-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    for name, text in zip(names, ["left", "right"], strict=True):
        branch = repo.branch(name).create(imported[1].commit_id)
        branch.object("notes.txt").upload(text, mode="w", pre_sign=False)
        branch.commit(f"notes from {name}")
    repo.branch(names[0]).merge_into(names[1], strategy="source-wins")
    assert exp.read_bytes(repo, names[1], "notes.txt") == b"left"
    assert repo.branch(names[1]).get_commit().metadata[".lakefs.merge.strategy"] == "source-wins"
    with pytest.raises(lakefs.exceptions.BadRequestException):  # lakeFS knows two strategies, not this one
        repo.branch(names[0]).merge_into(names[1], strategy="mine-wins")
    repo.branch(names[1]).object("notes.txt").upload("changed again", mode="w", pre_sign=False)
    repo.branch(names[1]).commit("more notes")
    repo.branch(names[0]).object("notes.txt").upload("left, changed", mode="w", pre_sign=False)
    repo.branch(names[0]).commit("left changes")
    with pytest.raises(lakefs.exceptions.ConflictException):
        repo.branch(names[0]).merge_into(names[1])
    for name in names:
        repo.branch(name).delete()


def test_a_namespace_left_by_a_deleted_repository_is_refused_with_the_fix(lk_settings, source_bucket):
    client, name = versioning.connect(lk_settings), f"t-{uuid.uuid4().hex[:10]}"
    exp.ensure_repository(client, name, lk_settings).delete()  # lakeFS keeps the namespace's data
    with pytest.raises(versioning.LakeFSError) as err:
        exp.ensure_repository(client, name, lk_settings)
    assert "storage namespace already in use" in str(err.value) and "choose another repository name" in str(err.value)


def test_a_lakefs_on_another_object_store_is_named(lk_settings, client, source_bucket):
    lk, name = versioning.connect(lk_settings), f"t-{uuid.uuid4().hex[:10]}"
    repository = exp.ensure_repository(lk, name, lk_settings)
    try:
        # what S3_ENDPOINT shows when lakeFS writes elsewhere: no marker in the repository's namespace
        client.remove_object(versioning.LAKEFS_BUCKET, f"{name}/{versioning.NAMESPACE_MARKER}")
        with pytest.raises(versioning.LakeFSError, match="another object store") as err:
            exp.ensure_repository(lk, name, lk_settings)
        assert lk_settings.s3_endpoint in str(err.value) and "LAKEFS_ENDPOINT" in str(err.value)
    finally:
        repository.delete()


def test_a_forced_import_of_unchanged_data_commits_as_a_source_wins_merge(lk_settings, client):
    with repository_over_a_new_bucket(lk_settings, client, "again", 60) as (repository, name):
        first = exp.import_from_bucket(repository, name, settings=lk_settings)
        again = exp.import_from_bucket(repository, name, settings=lk_settings, force=True)
        assert not again.reused and again.commit_id != first.commit_id and again.objects == first.objects
        metadata = repository.ref(again.commit_id).get_commit().metadata
        assert metadata[".lakefs.merge.strategy"] == "source-wins" and metadata["import_source"]
        assert list(repository.ref(first.commit_id).diff(repository.ref(again.commit_id))) == []


def test_branch_names_are_ascii_as_lakefs_requires(repo, imported):
    assert exp.branch_name({"optimizer": "adam", "note": "größe 1.5"}) == "exp-adam-gr__e_1_5"
    with pytest.raises(lakefs.exceptions.BadRequestException):
        repo.branch("exp-größe").create(imported[1].commit_id)


def test_diff_compares_content_not_where_it_is_stored(repo, imported):
    name = f"d-{uuid.uuid4().hex[:6]}"
    branch = repo.branch(name).create(imported[1].commit_id)
    try:
        branch.object("notes.txt").upload("same", mode="w", pre_sign=False, content_type="text/plain")
        before = branch.commit("notes").get_commit().id
        branch.object("notes.txt").upload("same", mode="w", pre_sign=False, content_type="text/plain")
        branch.object("other.txt").upload("x", mode="w", pre_sign=False, content_type="text/plain")
        same = branch.commit("the same notes again, stored anew").get_commit().id
        assert [c.path for c in repo.ref(before).diff(repo.ref(same))] == ["other.txt"]
        branch.object("notes.txt").upload("same", mode="w", pre_sign=False, content_type="application/json")
        retyped = branch.commit("same bytes, another content type").get_commit().id
        assert [(c.path, c.type) for c in repo.ref(same).diff(repo.ref(retyped))] == [("notes.txt", "changed")]
    finally:
        branch.delete()


# --- hardening: what was compared is what is promoted, imports reused only when nothing changed -----------------


def test_an_overwritten_source_object_is_imported_again_not_reused(lk_settings, client):
    with repository_over_a_new_bucket(lk_settings, client, "etag", 60) as (repository, name):
        first = exp.import_from_bucket(repository, name, settings=lk_settings)
        other = upload.encode_image(listing.fetch_image(name, "train/0/00001.png", client=client))
        client.put_object(name, "train/5/00000.png", io.BytesIO(other), len(other))  # same keys, same count
        second = exp.import_from_bucket(repository, name, settings=lk_settings)
        assert not second.reused and second.commit_id != first.commit_id
        assert exp.read_bytes(repository, second.commit_id, "train/5/00000.png") == other
        assert exp.import_from_bucket(repository, name, settings=lk_settings).reused  # now nothing changed


def test_promote_merges_the_compared_commit_even_if_the_branch_moved_on(repo, experiments, imported):
    compared = experiments[0]
    moved, target = f"moved-{uuid.uuid4().hex[:6]}", f"target-{uuid.uuid4().hex[:6]}"
    branch = repo.branch(moved).create(compared.commit_id)
    branch.object("late.txt").upload("committed after the comparison", mode="w", pre_sign=False)
    branch.commit("a late change")
    repo.branch(target).create(imported[1].commit_id)
    tag = f"t-{uuid.uuid4().hex[:6]}"
    promotion = exp.promote(repo, moved, compared.commit_id, tag=tag, destination=target)
    merged = repo.ref(promotion.merge_commit).get_commit()
    assert merged.metadata["promoted_commit"] == compared.commit_id
    assert exp.read_json(repo, target, exp.METRICS_PATH) == compared.metrics
    assert "late.txt" not in exp.list_paths(repo, target, "")
    assert repo.tag(tag).get_commit().id == promotion.merge_commit
    head = repo.branch(target).get_commit().id
    with pytest.raises(versioning.LakeFSError, match=f"Tag '{tag}' already names another commit"):
        exp.promote(repo, moved, tag=tag, destination=target)  # checked before merging: target unchanged
    assert repo.branch(target).get_commit().id == head


@pytest.mark.parametrize("name", ["Bad_Name", "ab", "-x-repo", "x" * 64, 7])
def test_a_bad_repository_name_is_refused_before_any_call(lk_settings, name):
    with pytest.raises(ParameterError, match="is not a valid lakeFS repository name"):
        exp.ensure_repository(None, name, lk_settings)


def test_a_missing_source_bucket_is_named(repo, lk_settings):
    with pytest.raises(storage.BucketNotFound, match="t-no-such-bucket.*upload_mnist"):
        exp.import_from_bucket(repo, "t-no-such-bucket", settings=lk_settings)


def test_an_import_past_its_deadline_is_cancelled_and_commits_nothing(repo, source_bucket, lakefs_kind, lk_settings):
    if lakefs_kind != "double":
        pytest.skip("a real lakeFS may finish this small import before its first status poll")
    branch = f"late-{uuid.uuid4().hex[:6]}"
    with pytest.raises(versioning.LakeFSError, match="did not finish within 0 s and was cancelled"):
        exp.import_from_bucket(repo, source_bucket, branch=branch, settings=lk_settings, timeout=0)
    time.sleep(0.5)  # the import's own thread has had time to finish, had it not been cancelled
    head = repo.branch(branch).get_commit()
    assert head.id == repo.branch(repo.properties.default_branch).get_commit().id  # still where it was created
    assert "import_source" not in (head.metadata or {})


class PolledJustBeforeItCompleted:
    """An import manager whose first poll answers what lakeFS said just before the import completed."""

    def __init__(self, manager, earlier_status):
        self.manager, self.earlier = manager, earlier_status

    def status(self):
        earlier, self.earlier = self.earlier, None
        return earlier or self.manager.status()

    def cancel(self):
        return self.manager.cancel()


def test_an_import_that_completes_between_the_last_poll_and_the_cancel_is_kept(repo, source_bucket):
    branch = repo.branch(f"raced-{uuid.uuid4().hex[:6]}").create(repo.properties.default_branch)
    manager = branch.import_data(commit_message="an import that beats its deadline by a hair")
    for prefix in ("train/", "test/"):  # the double pauses 0.05 s after each
        manager.prefix(f"s3://{source_bucket}/{prefix}", destination=prefix)
    manager.start()
    earlier = manager.status()
    if earlier.completed:
        pytest.skip("the import completed before its first poll: there is no race to stage")
    deadline = time.monotonic() + 60
    while not manager.status().completed:
        assert time.monotonic() < deadline and manager.status().error is None
        time.sleep(0.1)
    status = versioning.wait_for_import(PolledJustBeforeItCompleted(manager, earlier), "train/, test/", timeout=0)
    assert status.completed and branch.get_commit().id == status.commit.id  # lakeFS refused the cancel: kept


def test_every_lakefs_request_has_a_timeout(lk_settings):
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        client = lakefs.Client(host=f"http://127.0.0.1:{silent.getsockname()[1]}", username="a", password="b")
        versioning.bound_requests(client, connect_timeout=1, read_timeout=1)
        started = time.monotonic()
        with pytest.raises(Exception):  # noqa: B017 - urllib3's timeout, wrapped by the SDK
            client.sdk_client.repositories_api.list_repositories()
        assert time.monotonic() - started < 15  # without a timeout this waits for ever


def test_the_pointers_at_a_commit_are_the_imported_objects_of_one_bucket(repo, imported, source_bucket):
    bucket, key_of = exp.commit_pointers(repo, imported[1].commit_id)
    assert bucket == source_bucket and len(key_of) == 1440
    assert all(key == path for path, key in key_of.items())  # imported to the same paths: the bucket's own keys


def test_training_data_written_through_lakefs_is_refused_in_one_line(repo, imported):
    name = f"mixed-{uuid.uuid4().hex[:6]}"
    branch = repo.branch(name).create(imported[1].commit_id)
    branch.object("test/3/new.png").upload("stored in the namespace", mode="w", pre_sign=False)
    branch.commit("an object written through lakeFS beside the imported ones")
    try:
        with pytest.raises(versioning.LakeFSError, match=r"bucket\(s\).*S3 gateway"):
            exp.commit_datasets(repo, name, SMOKE)
    finally:
        branch.delete()


def test_a_commit_gives_the_images_a_smoke_size_names_as_a_bucket_s_listing_does(repo, imported, source_bucket):
    """The bucket holds 240 + 400 + 800 images: at a smoke size of 120, 06 takes the 120 + 200 + 400 that
    notebooks 04, 05 and 07 take from the same bucket (notebook 02's pointers from its manifest)."""
    bucket, (train, validation, test) = exp.commit_splits(repo, imported[1].commit_id, 120)
    x_train, _, x_test, _, _ = listing.get_train_test_data(source_bucket, 120, "manifest")
    assert bucket == source_bucket and (len(train[0]), len(validation[0]), len(test[0])) == (120, 200, 400)
    assert sorted(train[0] + validation[0]) == sorted(x_train) and sorted(test[0]) == sorted(x_test)
    assert sorted(validation[0]) == sorted(listing.split_validation(x_train, [0] * len(x_train))[1][0])
    everything = exp.commit_splits(repo, imported[1].commit_id, 0)[1]
    assert [len(keys) for keys, _ in everything] == [SMOKE, 400, 800]  # 0: all the commit holds


def test_the_same_pointers_are_read_once_and_other_pointers_again(repo, imported, experiments):
    first = exp.commit_datasets(repo, imported[1].commit_id, SMOKE)
    assert exp.commit_datasets(repo, experiments[0].commit_id, SMOKE) is first  # an experiment adds files, not images
    name = f"fewer-{uuid.uuid4().hex[:6]}"
    branch = repo.branch(name).create(imported[1].commit_id)
    gone = next(iter(exp.list_paths(repo, name, "train/")))
    branch.object(gone).delete()
    branch.commit("one training image fewer")
    try:
        train, validation, test = exp.commit_datasets(repo, name, SMOKE)
        counts = [train.count(), validation.count(), test.count()]
        assert counts == [first[0].count() - 1, first[1].count(), first[2].count()]
    finally:
        branch.delete()


@pytest.mark.parametrize("override, message", [
    ({"train_size": 5}, "Unknown experiment parameter"),  # notebook 04's names only
    ({"batch_size_per_worker": 0}, "batch_size_per_worker=0 is out of range"),
    ({"cache_shard": "yes"}, "cache_shard must be True or False"),
    ({"lr": -0.1}, "lr=-0.1 is out of range"),
    ({"epochs": "3"}, "epochs must be a whole number"),
    ({"momentum": 1.5}, "momentum must be a number from 0 up to"),
])
def test_bad_experiment_parameters_are_one_clear_error(override, message):
    with pytest.raises(ParameterError, match=message):
        exp.experiment_params(override)
