"""Generated from notebooks/06_lakefs_parallel_experiments.ipynb by `python -m helpers.export`: edit the notebook.

Lesson 06 · Parallel experiments on lakeFS branches. Above each definition, the cell that teaches it.
"""
import io
import itertools
import json
import string
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

from helpers import tracking
from helpers.config import ParameterError, Settings, check_count, check_fraction, check_positive, load_settings
from helpers.listing import split_train_test
from helpers.preprocess import decode_images
from helpers.storage import (REPAIR_HINT, ObjectDecodeError, bucket_not_found, endpoint_of, ensure_bucket, get_client,
                             object_store_errors)
from helpers.training import (accuracy, checkpoint_state, load_checkpoint, log_dataset, log_torch_model,
                              make_optimizer, model_from_params)
from helpers.versioning import (LAKEFS_BUCKET, LakeFSError, check_repository_name, check_same_object_store, connect,
                                current_import, lakefs_errors, storage_namespace, wait_for_import)

INGEST_BRANCH = "ingest"
EXPERIMENT_PREFIX = "exp-"
MODEL_PATH, PARAMS_PATH, METRICS_PATH = "artifacts/model.pt", "config/params.json", "metrics/metrics.json"
EXPERIMENT_FILES = (MODEL_PATH, PARAMS_PATH, METRICS_PATH)
MLFLOW_EXPERIMENT = "lakefs-experiments"


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 8 (id 37e4b957).
def ensure_repository(client, name: str, settings: Settings | None = None, bucket: str = LAKEFS_BUCKET):
    """The repository ``name`` (a ``lakefs.Repository``), created with its namespace bucket if missing.

    Raises:
        LakeFSError: lakeFS refused, or it keeps its data in another object store than ours.
    """
    check_repository_name(name)
    settings = settings or load_settings()
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
def bucket_usage(bucket: str, prefix: str = "", client=None) -> dict[str, int]:
    """Objects and bytes stored under ``prefix`` of ``bucket`` (an import copies nothing)."""
    client = client or get_client()
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
        return sorted(o.path for o in repo.ref(ref).objects(prefix=prefix))


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 17 (id e0648050).
def import_from_bucket(repo, bucket: str = "mnist", prefixes: Sequence[str] = ("train/", "test/"),
                       branch: str = INGEST_BRANCH, force: bool = False, settings: Settings | None = None,
                       timeout: float = 1800.0) -> ImportResult:
    """Zero-copy import of ``s3://<bucket>/<prefix>`` for each prefix into ``branch`` (notebook 06).

    The last import is reused while the bucket holds the same objects. A missing bucket raises
    ``BucketNotFound``; a refused, failed or overdue import (cancelled then) a ``LakeFSError``.
    """
    sources = ",".join(f"s3://{bucket}/{p}" for p in prefixes)
    s3 = get_client(settings or load_settings())
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


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 25 (id fb342e8b).
def select_paths(paths: Sequence[str], limit: int, seed: int) -> list[str]:
    """A seeded, shuffled subset of at most ``limit`` paths (0 = all): the same list for the same commit."""
    order = np.random.default_rng(seed).permutation(len(paths))
    chosen = [paths[i] for i in order]
    return chosen[:limit] if limit else chosen


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 27 (id 4949d9e1).
def read_split(repo, ref: str, split: str, limit: int = 0, seed: int = 0,
               threads: int = 8) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Images, labels and paths of ``split`` ("train" or "test") as stored at ``ref``: listing and bytes from lakeFS."""
    x_train, y_train, x_test, y_test = split_train_test(list_paths(repo, ref, f"{split}/"))
    labels = dict(zip(x_train, y_train, strict=True)) if split == "train" else dict(zip(x_test, y_test, strict=True))
    paths = select_paths(sorted(labels), limit, seed)
    if not paths:
        raise LakeFSError(f"No {split}/ objects at {ref}: import the data first (import_from_bucket).")
    with ThreadPoolExecutor(threads) as pool:
        bodies = list(pool.map(lambda p: read_bytes(repo, ref, p), paths))
    try:
        images = decode_images(bodies)
    except Exception:  # name the object that is not an image
        for path, body in zip(paths, bodies, strict=True):
            try:
                decode_images([body])
            except Exception as err:
                raise ObjectDecodeError(f"Object '{path}' at lakeFS ref {ref[:12]} is not a readable image "
                                        f"({type(err).__name__}). {REPAIR_HINT}") from None
        raise
    return images, np.asarray([labels[p] for p in paths], dtype=np.int64), paths


DEFAULT_LR = {"sgd": 0.05, "adam": 0.002}
BASE_PARAMS: dict[str, Any] = {
    "model": "mlp", "hidden_sizes": [128, 64], "optimizer": "sgd", "epochs": 2, "momentum": 0.9,
    "batch_size": 64, "seed": 0, "train_size": 0, "test_size": 0,
}


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 32 (id 6639731b).
def experiment_params(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Full training parameters: :data:`BASE_PARAMS`, the optimizer's default lr, then ``overrides``."""
    unknown = set(overrides) - set(BASE_PARAMS) - {"lr"}
    if unknown:
        raise ParameterError(f"Unknown experiment parameter(s) {sorted(unknown)}; known: "
                             f"{sorted([*BASE_PARAMS, 'lr'])}.")
    params = {**BASE_PARAMS, **overrides}
    if params["optimizer"] not in DEFAULT_LR:
        raise ParameterError(f"optimizer must be one of {sorted(DEFAULT_LR)}, not {params['optimizer']!r}.")
    check_count("epochs", params["epochs"], 10_000)
    params.setdefault("lr", DEFAULT_LR[params["optimizer"]])
    check_positive("lr", params["lr"], maximum=10.0)
    check_count("batch_size", params["batch_size"], 100_000)
    for name in ("train_size", "test_size"):  # 0: all the images
        check_count(f"{name} (0: all)", params[name], 70_000, minimum=0)
    check_count("seed", params["seed"], 2**32 - 1, minimum=0)
    check_fraction("momentum", params["momentum"])
    return params


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 34 (id abfefeb8).
def fit(params: Mapping[str, Any], x_train: np.ndarray, y_train: np.ndarray, on_epoch=None):
    """Train a model deterministically (seeded, one thread); returns it and the per-epoch mean loss."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # bit-identical results whatever the machine's thread count
    try:
        torch.manual_seed(params["seed"])
        net = model_from_params(dict(params))
        optimizer = make_optimizer(params["optimizer"], net.parameters(), params["lr"], params["momentum"])
        x, y = torch.as_tensor(x_train), torch.as_tensor(y_train)
        rng = np.random.default_rng(params["seed"])
        losses = []
        for epoch in range(1, params["epochs"] + 1):  # epochs count from 1, as everywhere in the tutorial
            net.train()
            order = torch.as_tensor(rng.permutation(len(x)))
            total = 0.0
            for start in range(0, len(x), params["batch_size"]):
                batch = order[start:start + params["batch_size"]]
                optimizer.zero_grad()
                loss = F.nll_loss(net(x[batch]), y[batch])
                loss.backward()
                optimizer.step()
                total += loss.item() * len(batch)
            losses.append(total / len(x))
            if on_epoch is not None:
                on_epoch(epoch, losses[-1])
        return net, losses
    finally:
        torch.set_num_threads(threads)


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 36 (id f6ce6be9).
def evaluate(net, x_test: np.ndarray, y_test: np.ndarray) -> dict[str, float]:
    """Test accuracy and mean loss, computed from the model (nothing added to them)."""
    net.eval()
    with torch.no_grad():
        log_probs = net(torch.as_tensor(x_test))
        return {"accuracy": accuracy(log_probs.argmax(1).numpy(), y_test),
                "test_loss": float(F.nll_loss(log_probs, torch.as_tensor(y_test)))}


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 38 (id a854714a).
def encode_metadata(params: Mapping[str, Any], metrics: Mapping[str, float], extra: Mapping[str, str]) -> dict:
    """Commit metadata (string values only): ``param.<name>`` and ``metric.<name>`` as JSON, plus ``extra``."""
    out = {f"param.{k}": json.dumps(v) for k, v in params.items()}
    out.update({f"metric.{k}": json.dumps(v) for k, v in metrics.items()})
    out.update(extra)
    return out


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 40 (id 961defa6).
def decode_metadata(metadata: Mapping[str, str], kind: str) -> dict[str, Any]:
    """The ``param`` or ``metric`` values back from commit metadata."""
    head = f"{kind}."
    return {k[len(head):]: json.loads(v) for k, v in metadata.items() if k.startswith(head)}


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 42 (id 3454d042).
@dataclass
class ExperimentResult:
    """One experiment as committed: branch, commit id, params, metrics, MLflow run id, seconds."""

    branch: str
    commit_id: str
    params: dict[str, Any]
    metrics: dict[str, float]
    mlflow_run_id: str | None
    seconds: float


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 44 (id 3222a55e).
def lakefs_source(repo_name: str, commit_id: str, prefix: str) -> str:
    """The S3 URI of a prefix at a commit through lakeFS's S3 gateway: ``s3://<repository>/<commit>/<prefix>``."""
    return f"s3://{repo_name}/{commit_id}/{prefix}"


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 46 (id 4dc7ffc9).
def start_experiment_run(mlflow_client, repo_name: str, branch: str, params: Mapping[str, Any],
                         experiment: str, lineage: Mapping[str, str] | None) -> str:
    """An MLflow run for the experiment, tagged with its lakeFS data commit, its inputs named at that commit."""
    commit = params["data_commit"]
    run_id = mlflow_client.create_run(
        tracking.experiment_id(mlflow_client, experiment), run_name=branch,
        tags={"lakefs.repository": repo_name, "lakefs.branch": branch, "lakefs.data_commit": commit, **(lineage or {})},
    ).info.run_id
    mlflow_client.log_batch(run_id, params=tracking.as_params(params))
    for split, context in (("train", "training"), ("test", "testing")):
        log_dataset(mlflow_client, run_id, f"mnist-{split}", lakefs_source(repo_name, commit, f"{split}/"),
                    params[f"{split}_images"], context, tags={"lakefs.commit": commit})
    return run_id


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 48 (id 1d0a645d).
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


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 50 (id dbb7c8fc).
def train_experiment(settings: Settings, repo_name: str, branch: str, overrides: Mapping[str, Any],
                     mlflow_experiment: str = MLFLOW_EXPERIMENT, lineage: Mapping[str, str] | None = None,
                     ) -> ExperimentResult:
    """Train one experiment on its branch's data and commit the model, config and metrics together (notebook 06)."""
    import mlflow

    started = time.perf_counter()
    repo = lakefs.repository(repo_name, client=connect(settings))
    with lakefs_errors(f"reading branch {branch!r}"):
        data_commit = repo.branch(branch).get_commit().id  # the ingest commit the branch starts from
    params = experiment_params(overrides)
    x_train, y_train, _ = read_split(repo, data_commit, "train", params["train_size"], params["seed"])
    x_test, y_test, _ = read_split(repo, data_commit, "test", params["test_size"], params["seed"])
    params.update(data_commit=data_commit, train_images=len(y_train), test_images=len(y_test))
    mlflow_client, run_id = MlflowClient(settings.mlflow_tracking_uri), None
    try:  # the run ends FAILED (or KILLED) if anything below stops it, never RUNNING
        run_id = start_experiment_run(mlflow_client, repo_name, branch, params, mlflow_experiment, lineage)
        net, losses = fit(params, x_train, y_train, on_epoch=lambda epoch, loss: mlflow_client.log_metric(
            run_id, "train_loss", loss, step=epoch))
        metrics = {**evaluate(net, x_test, y_test), "train_loss": losses[-1]}
        mlflow_client.log_batch(run_id, metrics=tracking.as_metrics(metrics, step=params["epochs"]))
        mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
        with mlflow.start_run(run_id=run_id):
            model_uri = log_torch_model(net, x_test[:5]).model_uri
        commit = commit_experiment(repo, branch, net, params, metrics, {
            "experiment": branch, "mlflow_run_id": run_id, "mlflow_experiment": mlflow_experiment,
            "mlflow_model_uri": model_uri})
        mlflow_client.set_tag(run_id, "lakefs.commit", commit.id)
    except BaseException as error:
        tracking.end_run(mlflow_client, run_id, error)
        raise
    mlflow_client.set_terminated(run_id)
    return ExperimentResult(branch, commit.id, params, metrics, run_id, time.perf_counter() - started)


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 52 (id 1574bddb).
def branch_name(overrides: Mapping[str, Any], prefix: str = EXPERIMENT_PREFIX) -> str:
    """A readable branch name from the grid values: ``{"optimizer": "adam", "epochs": 3}`` -> ``exp-adam-3``.

    lakeFS accepts ASCII letters, digits, ``_`` and ``-`` only: anything else becomes ``_``.
    """
    parts = [str(v).replace(".", "_") for v in overrides.values()]
    allowed = set(string.ascii_letters + string.digits + "-_")
    return prefix + "-".join("".join(c if c in allowed else "_" for c in p) for p in parts)


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 54 (id b6e524de).
def experiment_grid(**axes: Sequence[Any]) -> list[dict[str, Any]]:
    """Every combination of the axes: ``experiment_grid(optimizer=["sgd", "adam"], epochs=[1, 3])``."""
    names = list(axes)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*axes.values())]


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 56 (id 45338a65).
def create_experiment_branches(repo, grid: Iterable[Mapping[str, Any]], source: str) -> list[str]:
    """One branch per experiment from ``source`` (a commit id); an existing one is recreated there."""
    grid = list(grid)
    names = [branch_name(overrides) for overrides in grid]
    for overrides in grid:
        experiment_params(overrides)  # fail on a bad grid before any branch is made
    if len(set(names)) != len(names):
        raise ParameterError(f"The grid gives two experiments the same branch name: {names}.")
    for name in names:
        with lakefs_errors(f"creating branch {name!r}"):
            branch = repo.branch(name)
            if any(b.id == name for b in repo.branches(prefix=name)):
                branch.delete()
            branch.create(source_reference=source)
    return names


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 58 (id 99fa4765).
def run_experiments(repo, grid: Sequence[Mapping[str, Any]], settings: Settings | None = None,
                    source: str = INGEST_BRANCH, parallel: bool = True) -> list[ExperimentResult]:
    """Every experiment of ``grid`` on its own branch, in parallel as Ray tasks (one CPU each), in grid order."""
    settings = settings or load_settings()
    with lakefs_errors(f"resolving {source!r}"):
        source_commit = repo.ref(source).get_commit().id
    branches = create_experiment_branches(repo, grid, source_commit)
    if not parallel:
        return [train_experiment(settings, repo.id, b, g, lineage=tracking.lineage_tags())
                for b, g in zip(branches, grid, strict=True)]
    import ray

    from helpers.cluster import init_ray

    init_ray(settings)
    task = ray.remote(num_cpus=1, max_retries=0)(train_experiment)
    lineage = tracking.lineage_tags()  # the git commit of the code, found here on the driver
    refs = [task.remote(settings, repo.id, b, dict(g), lineage=lineage) for b, g in zip(branches, grid, strict=True)]
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as err:
        raise err.as_instanceof_cause() from None


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 61 (id b3f0c7f6).
def compare_experiments(repo, branches: Sequence[str]):
    """A table of the experiments, read back from lakeFS (commit metadata and metrics file), best first."""
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
            "accuracy": metrics["accuracy"], "test_loss": metrics["test_loss"], "train_loss": metrics["train_loss"],
            "metrics_match": decode_metadata(commit.metadata, "metric") == metrics,
            "mlflow_run_id": commit.metadata.get("mlflow_run_id", ""), "commit_id": commit.id,
        })
    table = pd.DataFrame(rows)
    return table.sort_values("accuracy", ascending=False, ignore_index=True) if rows else table


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 63 (id 5a9f435e).
def evaluate_commit(repo, ref: str) -> dict[str, float]:
    """Metrics recomputed from the model committed at ``ref`` on the test images at ``ref``."""
    params = read_json(repo, ref, PARAMS_PATH)
    x_test, y_test, _ = read_split(repo, ref, "test", params["test_size"], params["seed"])
    net, _ = load_checkpoint(read_bytes(repo, ref, MODEL_PATH))  # notebook 04's loader
    return evaluate(net, x_test, y_test)


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 71 (id bc33ea4e).
@dataclass
class Promotion:
    """A winner merged into ``main``: the merge commit and the tag pointing at it."""

    branch: str
    merge_commit: str
    tag: str


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 73 (id 92704caf).
def promote(repo, branch: str, commit_id: str | None = None, tag: str | None = None,
            destination: str | None = None) -> Promotion:
    """Merge the experiment's commit into ``main`` (replacing an earlier winner's files) and tag the merge commit.

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


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 76 (id 22d200f8).
def register_champion(repo, promotion: Promotion, mlflow_client, name: str = REGISTERED_MODEL):
    """Register the promoted model as a new version of ``name``, tagged with its lakeFS lineage, alias ``champion``."""
    from mlflow.exceptions import MlflowException

    merged = repo.ref(promotion.merge_commit).get_commit().metadata
    try:
        mlflow_client.create_registered_model(name, description="MNIST digits; versions come from notebook 06")
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    model_uri = merged["mlflow_model_uri"]  # models:/<model id>, logged by the winner's run
    version = mlflow_client.create_model_version(
        name, source=model_uri, run_id=merged["mlflow_run_id"], model_id=model_uri.rsplit("/", 1)[-1],
        tags={"lakefs.repository": repo.id, "lakefs.commit": promotion.merge_commit, "lakefs.tag": promotion.tag,
              "lakefs.experiment_commit": merged["promoted_commit"], "mlflow_run_id": merged["mlflow_run_id"]},
        await_creation_for=0)
    mlflow_client.set_registered_model_alias(name, "champion", version.version)
    return version


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 81 (id 972a67c4).
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
        """Accuracy reproduced within ``tolerance`` (absolute)."""
        return self.differences["accuracy"] <= self.tolerance

    def __str__(self) -> str:
        verdict, sign = ("reproduced", "<=") if self.within_tolerance else ("NOT reproduced", ">")
        return (f"{verdict}: accuracy {self.recorded['accuracy']:.4f} recorded, {self.reproduced['accuracy']:.4f} "
                f"now (|diff| {self.differences['accuracy']:.2g} {sign} {self.tolerance}) in {self.seconds:.1f} s")


# From notebooks/06_lakefs_parallel_experiments.ipynb, cell 83 (id 8d4cb7e5).
def reproduce(repo, commit_id: str, tolerance: float = 0.005) -> Reproduction:
    """Retrain from a commit's ``config/params.json`` and the data at that commit, and compare the metrics.

    Training is seeded and single-threaded, so on the same machine and torch
    version the numbers match exactly; the tolerance (absolute accuracy)
    allows for other CPUs and BLAS builds.
    """
    started = time.perf_counter()
    params = read_json(repo, commit_id, PARAMS_PATH)
    recorded = read_json(repo, commit_id, METRICS_PATH)
    x_train, y_train, _ = read_split(repo, commit_id, "train", params["train_size"], params["seed"])
    x_test, y_test, _ = read_split(repo, commit_id, "test", params["test_size"], params["seed"])
    net, losses = fit(params, x_train, y_train)
    reproduced = {**evaluate(net, x_test, y_test), "train_loss": losses[-1]}
    differences = {k: abs(reproduced[k] - recorded[k]) for k in reproduced}
    return Reproduction(commit_id, params, recorded, reproduced, tolerance, time.perf_counter() - started, differences)
