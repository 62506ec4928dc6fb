"""Generated from notebooks/06_lakefs_parallel_experiments.ipynb by `python -m workshop.export`: edit the notebook.

Lesson 06 · Parallel experiments on lakeFS branches. Above each definition, the cell that teaches it.
"""
import io
import itertools
import json
import string
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import lakefs
import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 - the usual torch alias
from mlflow.tracking import MlflowClient
from torch import nn

from helpers import champion_candidates, tracking
from helpers.cluster import init_ray
from helpers.settings import ParameterError, Settings
from helpers.dataset_cache import read_once
from helpers.listing import smoke_split, split_train_test, split_validation
from helpers.preprocess import dataset_to_numpy, pointers_to_datasets, shuffle_pointers
from helpers.storage import bucket_not_found, endpoint_of, ensure_bucket, get_client, object_store_errors
from helpers.interrupts import stop_cleanly
from helpers.training import (DEFAULT_NUM_WORKERS, DEFAULT_PARAMS, accuracy, accuracy_interval, checkpoint_state,
                              clearly_better, load_checkpoint, log_dataset, log_torch_model, make_trainer,
                              paired_test, predict, unique_run_name)
from helpers.versioning import (LAKEFS_BUCKET, LakeFSError, check_repository_name, check_same_object_store,
                                current_import, lakefs_errors, storage_namespace, wait_for_import)
from helpers.training_support import check_params

INGEST_BRANCH = "ingest"
EXPERIMENT_PREFIX = "exp-"
MODEL_PATH, PARAMS_PATH, METRICS_PATH = "artifacts/model.pt", "config/params.json", "metrics/metrics.json"
EXPERIMENT_FILES = (MODEL_PATH, PARAMS_PATH, METRICS_PATH)
MODEL_LOGGING = threading.Lock()  # MLflow saves a model with torch.export, which is not thread-safe


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 8 (id 37e4b957).
def ensure_repository(client, name: str, settings: Settings, bucket: str = LAKEFS_BUCKET):
    """The repository ``name`` (a ``lakefs.Repository``), created with its namespace bucket if missing.

    Raises:
        LakeFSError: lakeFS refused, or it keeps its data in another object store than ours.
    """
    check_repository_name(name)
    s3 = get_client(settings)
    ensure_bucket(s3, bucket)
    with lakefs_errors(f"creating repository {name!r}"):
        repo = lakefs.repository(name, client=client).create(storage_namespace(name, bucket), exist_ok=True)
    check_same_object_store(repo, s3, settings.s3_endpoint)
    return repo


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 11 (id fe5dbbce).
@dataclass
class ImportResult:
    """What an import committed: the commit id, objects imported, seconds, and whether it was reused."""

    commit_id: str
    objects: int
    seconds: float
    reused: bool

    def __str__(self) -> str:
        how = "already imported" if self.reused else f"imported in {self.seconds:.1f} s"
        return f"{self.objects:,} objects {how} (commit {self.commit_id[:12]})"


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 13 (id 0bdc09e2).
def bucket_usage(bucket: str, settings: Settings, prefix: str = "") -> dict[str, int]:
    """Objects and bytes stored under ``prefix`` of ``bucket`` (an import copies nothing)."""
    client = get_client(settings)
    objects = size = 0
    with object_store_errors(client, bucket):
        for obj in client.list_objects(bucket, prefix=prefix or None, recursive=True):
            objects += 1
            size += int(obj.size or 0)
    return {"objects": objects, "bytes": size}


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 15 (id d9925dc7).
def list_paths(repo, ref: str, prefix: str) -> list[str]:
    """Every object path under ``prefix`` at ``ref`` (a branch, tag or commit id), sorted."""
    with lakefs_errors(f"listing {prefix} at {ref}"):
        return sorted(o.path for o in repo.ref(ref).objects(prefix=prefix, amount=1000))  # pages of 1,000


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 17 (id e0648050).
def import_from_bucket(repo, bucket: str = "mnist", prefixes: Sequence[str] = ("train/", "test/"),
                       branch: str = INGEST_BRANCH, force: bool = False, *, settings: Settings,
                       timeout: float = 1800.0) -> ImportResult:
    """Zero-copy import of ``s3://<bucket>/<prefix>`` for each prefix into ``branch`` (notebook 06).

    The last import is reused while the bucket holds the same objects. A missing bucket raises
    ``BucketNotFound``; a refused, failed or overdue import (cancelled then) a ``LakeFSError``.
    """
    sources = ",".join(f"s3://{bucket}/{p}" for p in prefixes)
    s3 = get_client(settings)
    with object_store_errors(s3, bucket):
        if not s3.bucket_exists(bucket):
            raise bucket_not_found(endpoint_of(s3), bucket)
    with lakefs_errors(f"preparing branch {branch!r}"):
        target = repo.branch(branch).create(repo.properties.default_branch, exist_ok=True)
        head = target.get_commit()
    held = None if force else current_import(repo, head, bucket, prefixes, s3)  # same keys, same ETags
    if held is not None:
        return ImportResult(head.id, held, 0.0, True)

    started = time.perf_counter()
    manager = target.import_data(commit_message=f"Zero-copy import of {', '.join(prefixes)} from s3://{bucket}",
                                 metadata={"import_source": sources, "imported_by": "notebook 06"})
    for prefix in prefixes:
        manager.prefix(f"s3://{bucket}/{prefix}", destination=prefix)
    with lakefs_errors(f"importing {sources}"):
        manager.start()
        status = wait_for_import(manager, sources, timeout)  # polls the status until it completes
    return ImportResult(status.commit.id, int(status.ingested_objects or 0), time.perf_counter() - started, False)


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 21 (id 17ba0791).
def read_bytes(repo, ref: str, path: str) -> bytes:
    """One object's bytes at ``ref`` (a branch, tag or commit id), read through the lakeFS API."""
    with lakefs_errors(f"reading {path} at {ref}"), repo.ref(ref).object(path).reader(mode="rb", pre_sign=False) as f:
        return f.read()


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 23 (id 3d3158aa).
def read_json(repo, ref: str, path: str) -> dict[str, Any]:
    """A JSON object stored at ``path`` in ``ref``."""
    return json.loads(read_bytes(repo, ref, path))


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 26 (id 07401812).
def commit_pointers(repo, ref: str, prefixes: Sequence[str] = ("train/", "test/")) -> tuple[str, dict[str, str]]:
    """The bucket holding the objects under ``prefixes`` at ``ref``, and each object's path -> its key there.

    Raises:
        LakeFSError: nothing is there, or the objects live in more than one bucket.
    """
    with lakefs_errors(f"listing {', '.join(prefixes)} at {ref}"):
        found = [o for prefix in prefixes for o in repo.ref(ref).objects(prefix=prefix, amount=1000)]
    where = {o.path: o.physical_address.removeprefix("s3://").split("/", 1) for o in found}
    buckets = sorted({bucket for bucket, _ in where.values()})
    if len(buckets) != 1:
        raise LakeFSError(f"The objects under {', '.join(prefixes)} at {ref[:12]} are stored in {buckets or 'no'} "
                          "bucket(s): the pointer path reads imported objects of one bucket. Import the data first, "
                          "or read objects written through lakeFS with its S3 gateway.")
    return buckets[0], {path: key for path, (_, key) in where.items()}


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 28 (id d40ab3ab).
def commit_splits(repo, ref: str, smoke_test_size: int) -> tuple[str, list[tuple[list[str], list[int]]]]:
    """The bucket, and ``(keys, labels)`` of the training, validation and test images ``smoke_test_size`` names.

    Chosen from what ``ref`` holds as notebook 02 chooses from a bucket's listing (0: all): the same images as
    notebooks 04, 05 and 07 use, whatever else the bucket holds.
    """
    bucket, key_of = commit_pointers(repo, ref)
    x_train, y_train, x_test, y_test = smoke_split(*split_train_test(sorted(key_of)), smoke_test_size)
    (x_fit, y_fit), (x_val, y_val) = split_validation(x_train, y_train)
    train = shuffle_pointers([key_of[p] for p in x_fit], y_fit, seed=0)
    return bucket, [train, ([key_of[p] for p in x_val], y_val), ([key_of[p] for p in x_test], y_test)]


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 30 (id 10c0eb3e).
def commit_datasets(repo, ref: str, smoke_test_size: int, num_actors: int = 2):
    """Preprocessed Ray Datasets ``(train, validation, test)`` of the images at ``ref`` that ``smoke_test_size`` names.

    The validation images are notebook 02's (training images from MNIST index 50,000), as in notebooks 04 and 05.
    """
    bucket, splits = commit_splits(repo, ref, smoke_test_size)
    return read_once(pointers_to_datasets, bucket, *splits, num_actors=num_actors)


DEFAULT_LR = {"adam": 0.003, "sgd": 0.05}  # each optimizer's peak learning rate when the grid changes the optimizer


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 35 (id b2a8dbc9).
def starting_point(mlflow_client, sweep_experiment: str) -> tuple[dict[str, Any], str]:
    """Notebook 04's parameters with the values notebook 05 chose where a sweep ran, and where they come from."""
    chosen = champion_candidates.chosen_sweep_params(mlflow_client, sweep_experiment)
    if chosen is None:
        return dict(DEFAULT_PARAMS), f"notebook 04's defaults (no finished sweep in {sweep_experiment!r})"
    values, sweep = chosen
    return {**DEFAULT_PARAMS, **{k: v for k, v in values.items() if k in DEFAULT_PARAMS}}, f"notebook 05's {sweep}"


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 37 (id 6639731b).
def experiment_params(overrides: Mapping[str, Any], start: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Notebook 04's training parameters: ``start`` (04's defaults), the optimizer's lr if it changes, ``overrides``."""
    start = dict(start or DEFAULT_PARAMS)
    unknown = set(overrides) - set(DEFAULT_PARAMS)
    if unknown:
        raise ParameterError(f"Unknown experiment parameter(s) {sorted(unknown)}; known (notebook 04's): "
                             f"{sorted(DEFAULT_PARAMS)}.")
    optimizer = overrides.get("optimizer", start["optimizer"])
    if optimizer not in DEFAULT_LR:
        raise ParameterError(f"optimizer must be one of {sorted(DEFAULT_LR)}, not {optimizer!r}.")
    lr = start["lr"] if optimizer == start["optimizer"] else DEFAULT_LR[optimizer]
    return dict(check_params({**start, "lr": lr, **overrides}))


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 39 (id abfefeb8).
def train_with_ray(params: Mapping[str, Any], train, run_id: str | None, settings: Settings,
                   cluster_cpus: float = 2.0) -> tuple[nn.Module, list[dict[str, Any]]]:
    """One Ray Train run of notebook 04's loop with one worker: the trained model and its epoch history."""
    config = {**params, "run_id": run_id, "tracking_uri": settings.mlflow_tracking_uri,  # the loop logs to run_id
              "batch_size_per_worker": params["batch_size_per_worker"] * DEFAULT_NUM_WORKERS}  # 04's global batch
    trainer = make_trainer(config, {"train": train}, num_workers=1, run_name=unique_run_name("experiment"),
                           storage_path=f"{LAKEFS_BUCKET}/ray-results", cluster_cpus=cluster_cpus, settings=settings)
    with stop_cleanly("Training", trainer=trainer):  # an interrupt: one line, and the run stopped (notebook 04)
        result = trainer.fit()
    net, state = load_checkpoint(result.checkpoint)  # notebook 04's loader
    return net, state["history"]


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 41 (id f6ce6be9).
def evaluate(net: nn.Module, dataset, split: str = "val") -> dict[str, float]:
    """``<split>_accuracy`` and ``<split>_loss`` of ``net`` on a materialised dataset (nothing added to them)."""
    x, y = dataset_to_numpy(dataset)
    with torch.no_grad():
        log_probs = net.eval()(torch.as_tensor(x))
    return {f"{split}_accuracy": accuracy(log_probs.argmax(1).numpy(), y),
            f"{split}_loss": float(F.nll_loss(log_probs, torch.as_tensor(y)))}


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 43 (id a854714a).
def encode_metadata(params: Mapping[str, Any], metrics: Mapping[str, float], extra: Mapping[str, str]) -> dict:
    """Commit metadata (string values only): ``param.<name>`` and ``metric.<name>`` as JSON, plus ``extra``."""
    out = {f"param.{k}": json.dumps(v) for k, v in params.items()}
    out.update({f"metric.{k}": json.dumps(v) for k, v in metrics.items()})
    out.update(extra)
    return out


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 45 (id 961defa6).
def decode_metadata(metadata: Mapping[str, str], kind: str) -> dict[str, Any]:
    """The ``param`` or ``metric`` values back from commit metadata."""
    head = f"{kind}."
    return {k[len(head):]: json.loads(v) for k, v in metadata.items() if k.startswith(head)}


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 47 (id 3454d042).
@dataclass
class ExperimentResult:
    """One experiment as committed: branch, commit id, params, metrics, MLflow run id, seconds."""

    branch: str
    commit_id: str
    params: dict[str, Any]
    metrics: dict[str, float]
    mlflow_run_id: str | None
    seconds: float


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 49 (id 3222a55e).
def lakefs_source(repo_name: str, commit_id: str, prefix: str) -> str:
    """The S3 URI of a prefix at a commit through lakeFS's S3 gateway: ``s3://<repository>/<commit>/<prefix>``."""
    return f"s3://{repo_name}/{commit_id}/{prefix}"


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 51 (id 4dc7ffc9).
def start_experiment_run(mlflow_client, repo_name: str, branch: str, params: Mapping[str, Any],
                         experiment: str, lineage: Mapping[str, str] | None) -> str:
    """An MLflow run for the experiment, tagged with its lakeFS data commit, its inputs named at that commit."""
    commit = params["data_commit"]
    run_id = mlflow_client.create_run(
        tracking.experiment_id(mlflow_client, experiment), run_name=branch,
        tags={"lakefs.repository": repo_name, "lakefs.branch": branch, "lakefs.data_commit": commit, **(lineage or {})},
    ).info.run_id
    mlflow_client.log_batch(run_id, params=tracking.as_params(params))
    for split, prefix, context in (("train", "train/", "training"), ("validation", "train/", "validation"),
                                   ("test", "test/", "testing")):
        log_dataset(mlflow_client, run_id, f"mnist-{split}", lakefs_source(repo_name, commit, prefix),
                    params[f"{split}_images"], context, tags={"lakefs.commit": commit})
    return run_id


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 53 (id 1d0a645d).
def commit_experiment(repo, branch: str, net, params: Mapping[str, Any], metrics: Mapping[str, float],
                      extra: Mapping[str, str]):
    """Upload the model (notebook 04's checkpoint format), config and metrics to ``branch``; commit them together."""
    model = io.BytesIO()
    torch.save(checkpoint_state(net, None, params["epochs"], [], dict(params)), model)
    target = repo.branch(branch)
    with lakefs_errors(f"committing experiment {branch!r}"):
        target.object(MODEL_PATH).upload(model.getvalue(), mode="wb", pre_sign=False,
                                         content_type="application/octet-stream")
        target.object(PARAMS_PATH).upload(json.dumps(params, indent=2), mode="w", pre_sign=False,
                                          content_type="application/json")
        target.object(METRICS_PATH).upload(json.dumps(metrics, indent=2), mode="w", pre_sign=False,
                                           content_type="application/json")
        return target.commit(f"Experiment {branch}: model, config and metrics",
                             metadata=encode_metadata(params, metrics, extra))


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 55 (id dbb7c8fc).
def train_experiment(repo, branch: str, params: Mapping[str, Any], datasets, data_commit: str, settings: Settings,
                     experiment: str, cluster_cpus: float = 2.0,
                     lineage: Mapping[str, str] | None = None) -> ExperimentResult:
    """Train one experiment on ``datasets`` (the images at ``data_commit``, where ``branch`` starts) and commit it.

    ``datasets`` is ``commit_datasets``'s ``(train, validation, test)``: it trains on the first, is measured on
    the second, and leaves the test images alone.
    """
    import mlflow

    started = time.perf_counter()
    params = {**params, "data_commit": data_commit, "train_images": datasets[0].count(),
              "validation_images": datasets[1].count(), "test_images": datasets[2].count()}
    mlflow_client, run_id = MlflowClient(settings.mlflow_tracking_uri), None
    try:  # the run ends FAILED (or KILLED) if anything below stops it, never RUNNING
        run_id = start_experiment_run(mlflow_client, repo.id, branch, params, experiment, lineage)
        net, history = train_with_ray(params, datasets[0], run_id, settings, cluster_cpus)
        metrics = {**evaluate(net, datasets[1]), "train_loss": history[-1]["train_loss"]}  # on validation
        mlflow_client.log_batch(run_id, metrics=tracking.as_metrics(
            {k: metrics[k] for k in ("val_accuracy", "val_loss")}, step=params["epochs"]))  # the loop logged the rest
        mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
        with MODEL_LOGGING, mlflow.start_run(run_id=run_id):  # one experiment thread at a time
            model_uri = log_torch_model(net, dataset_to_numpy(datasets[1])[0][:5]).model_uri
        commit = commit_experiment(repo, branch, net, params, metrics, {
            "experiment": branch, "mlflow_run_id": run_id, "mlflow_experiment": experiment,
            "mlflow_model_uri": model_uri})
        mlflow_client.set_tag(run_id, "lakefs.commit", commit.id)
    except BaseException as error:
        tracking.end_run(mlflow_client, run_id, error)
        raise
    mlflow_client.set_terminated(run_id)
    return ExperimentResult(branch, commit.id, params, metrics, run_id, time.perf_counter() - started)


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 57 (id 1574bddb).
def branch_name(overrides: Mapping[str, Any], prefix: str = EXPERIMENT_PREFIX) -> str:
    """A readable branch name from the grid values: ``{"optimizer": "adam", "epochs": 3}`` -> ``exp-adam-3``.

    lakeFS accepts ASCII letters, digits, ``_`` and ``-`` only: anything else becomes ``_``.
    """
    parts = [str(v).replace(".", "_") for v in overrides.values()]
    allowed = set(string.ascii_letters + string.digits + "-_")
    return prefix + "-".join("".join(c if c in allowed else "_" for c in p) for p in parts)


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 59 (id b6e524de).
def experiment_grid(**axes: Sequence[Any]) -> list[dict[str, Any]]:
    """Every combination of the axes: ``experiment_grid(optimizer=["sgd", "adam"], epochs=[1, 3])``."""
    names = list(axes)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*axes.values())]


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 61 (id 45338a65).
def create_experiment_branches(repo, grid: Iterable[Mapping[str, Any]], source: str) -> list[str]:
    """One branch per experiment from ``source`` (a commit id); an existing one is recreated there."""
    grid = list(grid)
    names = [branch_name(overrides) for overrides in grid]
    for overrides in grid:
        experiment_params(overrides)  # fail on a bad grid (a name notebook 04 does not know) before any branch
    if len(set(names)) != len(names):
        raise ParameterError(f"The grid gives two experiments the same branch name: {names}.")
    for name in names:
        with lakefs_errors(f"creating branch {name!r}"):
            branch = repo.branch(name)
            if any(b.id == name for b in repo.branches(prefix=name)):
                branch.delete()
            branch.create(source_reference=source)
    return names


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 63 (id 99fa4765).
def run_experiments(repo, grid: Sequence[Mapping[str, Any]], start: Mapping[str, Any], experiment: str,
                    settings: Settings, smoke_test_size: int, source: str = INGEST_BRANCH,
                    max_concurrent: int | None = None) -> list[ExperimentResult]:
    """Every experiment of ``grid`` on its own branch, from ``start``, each a Ray Train run, ``max_concurrent`` at once.

    Each trains on the images ``smoke_test_size`` names at the source commit. ``max_concurrent`` defaults to the
    number of CPUs Ray has. Results come back in grid order.
    """
    with lakefs_errors(f"resolving {source!r}"):
        source_commit = repo.ref(source).get_commit().id
    branches = create_experiment_branches(repo, grid, source_commit)
    cpus = init_ray(settings)["CPU"]
    datasets = commit_datasets(repo, source_commit, smoke_test_size)  # listed once in lakeFS, read once, shared
    concurrent = min(len(branches), max_concurrent or max(1, int(cpus)))
    share = 1 + (cpus - 1) / concurrent  # each run's CPUs; make_trainer leaves one for Ray Data
    lineage = tracking.lineage_tags()  # the code's git commit (and any changes), found here on the driver
    pool = ThreadPoolExecutor(concurrent)  # each thread waits in fit(); Ray runs the runs side by side
    runs = [pool.submit(train_experiment, repo, b, {**experiment_params(g, start), "smoke_test_size": smoke_test_size},
                        datasets, source_commit, settings, experiment, share, lineage)
            for b, g in zip(branches, grid, strict=True)]
    try:
        return [run.result() for run in runs]
    finally:  # after an error or Ctrl-C: no new experiment starts, and this call returns at once
        pool.shutdown(wait=False, cancel_futures=True)


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 66 (id b3f0c7f6).
def compare_experiments(repo, branches: Sequence[str]):
    """A table of the experiments, read back from lakeFS (commit metadata, metrics file), best on validation first."""
    import pandas as pd

    rows = []
    for name in branches:
        with lakefs_errors(f"reading experiment {name!r}"):
            commit = repo.branch(name).get_commit()
        params = decode_metadata(commit.metadata, "param")
        metrics = read_json(repo, commit.id, METRICS_PATH)
        rows.append({
            "branch": name, "commit": commit.id[:12], "optimizer": params.get("optimizer"),
            "epochs": params.get("epochs"), "lr": params.get("lr"), "train_images": params.get("train_images"),
            "validation_images": params.get("validation_images"), "test_images": params.get("test_images"),
            "val_accuracy": metrics["val_accuracy"],
            **dict(zip(("val_low", "val_high"), accuracy_interval(metrics["val_accuracy"],
                                                                  params.get("validation_images", 0)), strict=True)),
            "val_loss": metrics["val_loss"],
            "train_loss": metrics["train_loss"],
            "metrics_match": decode_metadata(commit.metadata, "metric") == metrics,
            "mlflow_run_id": commit.metadata.get("mlflow_run_id", ""), "commit_id": commit.id,
        })
    table = pd.DataFrame(rows)
    return table.sort_values("val_accuracy", ascending=False, ignore_index=True) if rows else table


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 68 (id 5a9f435e).
def evaluate_commit(repo, ref: str, split: str = "val") -> dict[str, float]:
    """Metrics recomputed from the model committed at ``ref`` on the ``"val"`` (or ``"test"``) images at ``ref``."""
    net, _ = load_checkpoint(read_bytes(repo, ref, MODEL_PATH))  # notebook 04's loader
    _, validation, test = commit_datasets(repo, ref, read_json(repo, ref, PARAMS_PATH).get("smoke_test_size", 0))
    return evaluate(net, validation if split == "val" else test, split)


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 70 (id 508a17eb).
def commit_predictions(repo, ref: str, split: str = "val") -> tuple[np.ndarray, np.ndarray]:
    """The predictions of the model committed at ``ref`` of the ``"val"`` (or ``"test"``) images there, and labels."""
    net, _ = load_checkpoint(read_bytes(repo, ref, MODEL_PATH))  # notebook 04's loader
    _, validation, test = commit_datasets(repo, ref, read_json(repo, ref, PARAMS_PATH).get("smoke_test_size", 0))
    images, labels = dataset_to_numpy(validation if split == "val" else test)
    return predict(net, images), labels


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 80 (id bc33ea4e).
@dataclass
class Promotion:
    """A chosen experiment merged into ``main``: the merge commit and the tag pointing at it."""

    branch: str
    merge_commit: str
    tag: str


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 82 (id 92704caf).
def promote(repo, branch: str, commit_id: str | None = None, tag: str | None = None,
            destination: str | None = None) -> Promotion:
    """Merge the experiment's commit into ``main`` (replacing an earlier one's files) and tag the merge commit.

    ``commit_id`` is the commit that was compared (the table's ``commit_id``): that commit is
    merged, even if the branch moved on since. Without it, the branch's head is merged.

    Raises:
        LakeFSError: the tag is taken (checked before merging), or lakeFS refused the merge or the tag.
    """
    destination = destination or repo.properties.default_branch
    with lakefs_errors(f"reading {branch!r}"):
        source = repo.ref(commit_id) if commit_id else repo.branch(branch)
        compared = source.get_commit()
        taken = {t.id for t in repo.tags(prefix="model-v" if tag is None else tag)}
    if tag is None:
        tag = next(f"model-v{n}" for n in range(1, len(taken) + 2) if f"model-v{n}" not in taken)
    elif tag in taken:
        raise LakeFSError(f"Tag {tag!r} already names another commit (tags never move): choose another tag.")
    with lakefs_errors(f"merging {branch!r} ({compared.id[:12]}) into {destination!r}"):
        merge_commit = source.merge_into(
            destination, message=f"Promote experiment {branch}",
            metadata={"promoted_branch": branch, "promoted_commit": compared.id,
                      **{k: v for k, v in compared.metadata.items()
                         if k.startswith(("metric.", "param.", "mlflow_"))}},
            strategy="source-wins",
        )
    with lakefs_errors(f"merged as {merge_commit[:12]}, but tagging it {tag!r} failed (tag it with "
                       f"repo.tag({tag!r}).create({merge_commit!r}))"):
        repo.tag(tag).create(merge_commit)
    return Promotion(branch, merge_commit, tag)


REGISTERED_MODEL = "mnist-classifier"


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 86 (id 22d200f8).
def register_version(repo, promotion: Promotion, mlflow_client, name: str = REGISTERED_MODEL):
    """Register the promoted model as a new version of ``name``, tagged with its lakeFS lineage."""
    from mlflow.exceptions import MlflowException

    merged = repo.ref(promotion.merge_commit).get_commit().metadata
    try:
        mlflow_client.create_registered_model(name, description="MNIST digits; versions come from notebook 06")
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    model_uri = merged["mlflow_model_uri"]  # models:/<model id>, logged by the chosen experiment's run
    return mlflow_client.create_model_version(
        name, source=model_uri, run_id=merged["mlflow_run_id"], model_id=model_uri.rsplit("/", 1)[-1],
        tags={"lakefs.repository": repo.id, "lakefs.commit": promotion.merge_commit, "lakefs.tag": promotion.tag,
              "lakefs.experiment_commit": merged["promoted_commit"], "mlflow_run_id": merged["mlflow_run_id"],
              "registered_by": "notebook 06"},
        await_creation_for=0)


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 88 (id d5c65f83).
def current_champion(mlflow_client, name: str = REGISTERED_MODEL):
    """The version the alias ``champion`` names now, or None where there is none yet."""
    from mlflow.exceptions import MlflowException

    try:
        return mlflow_client.get_model_version_by_alias(name, "champion")
    except MlflowException as err:
        if err.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 90 (id 0ff21874).
def champion_if_better(mlflow_client, version, images, labels, name: str = REGISTERED_MODEL):
    """Move ``@champion`` to ``version`` if it is clearly better on ``images`` than the current champion (a tie: no).

    Returns the new version's accuracy, the current champion's (None where there was none), whether the alias
    moved, and the paired test's numbers in a line.
    """
    import mlflow

    def predicted(number: str) -> np.ndarray:
        return mlflow.pyfunc.load_model(f"models:/{name}/{number}").predict(images).argmax(1)

    previous = current_champion(mlflow_client, name)
    new = predicted(version.version)
    if previous is None:
        mlflow_client.set_registered_model_alias(name, "champion", version.version)
        return accuracy(new, labels), None, True, "no champion before it"
    old = predicted(previous.version)
    moved = clearly_better(new, old, labels)
    if moved:
        mlflow_client.set_registered_model_alias(name, "champion", version.version)
    return accuracy(new, labels), accuracy(old, labels), moved, paired_test(new, old, labels)


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 99 (id 972a67c4).
@dataclass
class Reproduction:
    """A retrain from a commit: the metric recorded there, the one obtained now, and the verdict."""

    commit_id: str
    params: dict[str, Any]
    recorded: dict[str, float]
    reproduced: dict[str, float]
    tolerance: float
    seconds: float
    differences: dict[str, float] = field(default_factory=dict)

    @property
    def within_tolerance(self) -> bool:
        """Validation accuracy reproduced within ``tolerance`` (absolute)."""
        return self.differences["val_accuracy"] <= self.tolerance

    def __str__(self) -> str:
        verdict, sign = ("reproduced", "<=") if self.within_tolerance else ("NOT reproduced", ">")
        return (f"{verdict}: validation accuracy {self.recorded['val_accuracy']:.4f} recorded, "
                f"{self.reproduced['val_accuracy']:.4f} now (|diff| {self.differences['val_accuracy']:.2g} {sign} "
                f"{self.tolerance}) in {self.seconds:.1f} s")


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 101 (id 8d4cb7e5).
def reproduce(repo, commit_id: str, tolerance: float = 0.005, *, settings: Settings) -> Reproduction:
    """Retrain from a commit's ``config/params.json`` and the data at that commit, and compare the metrics.

    Training is seeded, with one worker and one thread, so on the same machine and torch
    version the numbers match exactly; the tolerance (absolute accuracy)
    allows for other CPUs and BLAS builds.
    """
    started = time.perf_counter()
    params = read_json(repo, commit_id, PARAMS_PATH)
    recorded = read_json(repo, commit_id, METRICS_PATH)
    train, validation, _ = commit_datasets(repo, commit_id, params.get("smoke_test_size", 0))  # what it trained on
    net, history = train_with_ray(params, train, None, settings, init_ray(settings)["CPU"])
    reproduced = {**evaluate(net, validation), "train_loss": history[-1]["train_loss"]}
    differences = {k: abs(reproduced[k] - recorded[k]) for k in reproduced}
    return Reproduction(commit_id, params, recorded, reproduced, tolerance, time.perf_counter() - started, differences)
