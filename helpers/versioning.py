"""Data versioning with lakeFS: parallel experiments on branches (notebook 06).

The seed's workflow, with the high-level ``lakefs`` SDK:

1. :func:`connect` to lakeFS (one clear error when it is down or the keys are wrong);
2. :func:`ensure_repository` whose storage namespace is a prefix in the object store;
3. :func:`import_from_bucket`: a zero-copy import of the ``mnist`` bucket's
   ``train/`` and ``test/`` prefixes into an ``ingest`` branch;
4. :func:`run_experiments`: one branch per experiment, created from the
   ingest commit, trained in parallel as Ray tasks; each reads its data
   through lakeFS at that commit and commits ``artifacts/model.pt``,
   ``config/params.json`` and ``metrics/metrics.json`` together, with the
   params, metrics and MLflow run id as commit metadata;
5. :func:`compare_experiments` reads all of that back from lakeFS (not from
   memory), :func:`diff_table` shows what a branch changed, :func:`promote`
   merges the winner into ``main`` and tags it;
6. :func:`reproduce` retrains from a commit id alone and checks the metric.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from helpers import tracking
from helpers.config import ConfigError, ParameterError, Settings, load_settings

if TYPE_CHECKING:
    import torch

LAKEFS_BUCKET = "lakefs"  # the bucket holding every repository's storage namespace
INGEST_BRANCH = "ingest"
EXPERIMENT_PREFIX = "exp-"
MODEL_PATH, PARAMS_PATH, METRICS_PATH = "artifacts/model.pt", "config/params.json", "metrics/metrics.json"
EXPERIMENT_FILES = (MODEL_PATH, PARAMS_PATH, METRICS_PATH)
MLFLOW_EXPERIMENT = "lakefs-experiments"
DEFAULT_LR = {"sgd": 0.05, "adam": 0.002}
BASE_PARAMS: dict[str, Any] = {
    "model": "mlp", "hidden_sizes": [128, 64], "optimizer": "sgd", "epochs": 2, "momentum": 0.9,
    "batch_size": 64, "seed": 0, "train_size": 0, "test_size": 0,
}
HOW_TO_GET_LAKEFS = (
    "Start the full stack with `docker compose up -d` (see README), or put a `lakefs` binary on PATH "
    "(`python -m lakefs.download` where there is internet) and run `python -m helpers.stack up`; "
    "or point LAKEFS_ENDPOINT, LAKEFS_ACCESS_KEY_ID and LAKEFS_SECRET_ACCESS_KEY at a lakeFS server."
)


class LakeFSError(RuntimeError):
    """lakeFS refused or failed an operation; the message says what to do."""


class LakeFSUnavailable(LakeFSError):
    """No lakeFS is configured, or the configured one does not answer."""


class LakeFSAuthError(LakeFSError):
    """lakeFS answered but rejected the access key or secret."""


# --- connecting ---------------------------------------------------------------------------------

def connect(settings: Settings | None = None, timeout: float = 5.0):
    """A ``lakefs.Client`` for the configured server, checked with one request.

    The endpoint and keys come from ``LAKEFS_*`` settings only (passed
    explicitly, so a stray ``~/.lakectl.yaml`` or ``LAKECTL_*`` variable
    can't redirect the tutorial).

    Raises:
        LakeFSUnavailable: nothing is configured, or the server does not answer.
        LakeFSAuthError: the server rejected the keys.
    """
    import lakefs
    import urllib3

    settings = settings or load_settings()
    if not settings.lakefs_endpoint:
        raise LakeFSUnavailable(f"No lakeFS server is configured. {HOW_TO_GET_LAKEFS}")
    if not settings.lakefs_access_key or not settings.lakefs_secret_key:
        raise ConfigError("LAKEFS_ENDPOINT is set but LAKEFS_ACCESS_KEY_ID / LAKEFS_SECRET_ACCESS_KEY are not.")
    client = lakefs.Client(host=settings.lakefs_endpoint, username=settings.lakefs_access_key,
                           password=settings.lakefs_secret_key)
    try:
        client.sdk_client.config_api.get_config(_request_timeout=timeout)
    except urllib3.exceptions.HTTPError as err:  # refused / timed out: urllib3's MaxRetryError and friends
        raise LakeFSUnavailable(
            f"lakeFS at {settings.lakefs_endpoint} is not reachable ({type(err).__name__}). {HOW_TO_GET_LAKEFS}"
        ) from None
    except Exception as err:
        status = getattr(err, "status", None)
        if status in (401, 403):
            raise LakeFSAuthError(
                f"lakeFS at {settings.lakefs_endpoint} rejected the access key (HTTP {status}): check "
                "LAKEFS_ACCESS_KEY_ID and LAKEFS_SECRET_ACCESS_KEY (.env or environment)."
            ) from None
        raise LakeFSUnavailable(f"lakeFS at {settings.lakefs_endpoint} answered with an error: {err}") from None
    return client


@contextlib.contextmanager
def lakefs_errors(action: str) -> Iterator[None]:
    """Turn the SDK's exceptions into one :class:`LakeFSError` line that names ``action``."""
    import lakefs.exceptions as lx

    try:
        yield
    except lx.NotAuthorizedException as err:
        raise LakeFSAuthError(f"{action}: lakeFS rejected the keys ({_reason(err)}).") from None
    except lx.LakeFSException as err:
        raise LakeFSError(f"{action}: {_reason(err)}") from None


def _reason(err: Exception) -> str:
    body = getattr(err, "body", None)  # the SDK parses lakeFS's {"message": ...} when it can
    if isinstance(body, (str, bytes)):
        try:
            body = json.loads(body)
        except ValueError:
            pass
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return str(getattr(err, "reason", None) or err)


# --- repository and import ----------------------------------------------------------------------

def storage_namespace(repo_name: str, bucket: str = LAKEFS_BUCKET) -> str:
    """Where lakeFS keeps a repository's own data: ``s3://lakefs/<repo>``."""
    return f"s3://{bucket}/{repo_name}"


def ensure_repository(client, name: str, settings: Settings | None = None, bucket: str = LAKEFS_BUCKET):
    """The repository ``name``, created (with its namespace bucket) if missing.

    Returns:
        A ``lakefs.Repository``.
    """
    import lakefs

    from helpers.storage import ensure_bucket, get_client

    ensure_bucket(get_client(settings or load_settings()), bucket)
    with lakefs_errors(f"creating repository {name!r}"):
        return lakefs.Repository(name, client=client).create(storage_namespace(name, bucket), exist_ok=True)


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


def import_from_bucket(repo, bucket: str = "mnist", prefixes: Sequence[str] = ("train/", "test/"),
                       branch: str = INGEST_BRANCH, progress: bool = True, poll_seconds: float = 0.5,
                       force: bool = False, settings: Settings | None = None) -> ImportResult:
    """Zero-copy import of ``s3://<bucket>/<prefix>`` for each prefix into ``branch``.

    lakeFS records where the objects already are (their physical addresses)
    and commits pointers to them; no byte is copied. The branch is created
    from ``main`` if missing. When the branch head is already an import of
    the same sources holding as many objects as the bucket has now, it is
    reused; a bucket that grew (or ``force=True``) is imported again.

    Raises:
        LakeFSError: the import failed (the message is lakeFS's).
    """
    from helpers.storage import bucket_usage, get_client

    sources = ",".join(f"s3://{bucket}/{p}" for p in prefixes)
    with lakefs_errors(f"preparing branch {branch!r}"):
        target = repo.branch(branch).create(repo.properties.default_branch, exist_ok=True)
        head = target.get_commit()
    if not force and head.metadata.get("import_source") == sources:
        objects = sum(len(list_paths(repo, head.id, prefix)) for prefix in prefixes)
        client = get_client(settings or load_settings())
        if objects == sum(bucket_usage(bucket, prefix, client)["objects"] for prefix in prefixes):
            return ImportResult(head.id, objects, 0.0, True)

    started = time.perf_counter()
    metadata = {"import_source": sources, "imported_by": "helpers.versioning"}
    message = f"Zero-copy import of {', '.join(prefixes)} from s3://{bucket}"
    manager = target.import_data(commit_message=message, metadata=metadata)
    for prefix in prefixes:
        manager.prefix(f"s3://{bucket}/{prefix}", destination=prefix)
    bar = _progress_bar(progress)
    try:
        with lakefs_errors(f"importing {sources}"):
            manager.start()
            # Poll here rather than manager.wait(): that runs asyncio.run(), which fails inside Jupyter's loop.
            while True:
                status = manager.status()
                if bar is not None:
                    bar.update((status.ingested_objects or 0) - bar.n)
                if status.error is not None:
                    raise LakeFSError(f"importing {sources}: {status.error.message}")
                if status.completed:
                    break
                time.sleep(poll_seconds)
    finally:
        if bar is not None:
            bar.close()
    return ImportResult(status.commit.id, int(status.ingested_objects or 0), time.perf_counter() - started, False)


def _progress_bar(enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(desc="objects imported", unit=" obj")


# --- reading data through lakeFS ----------------------------------------------------------------

def list_paths(repo, ref: str, prefix: str) -> list[str]:
    """Every object path under ``prefix`` at ``ref`` (a branch, tag or commit id), sorted."""
    with lakefs_errors(f"listing {prefix} at {ref}"):
        return sorted(o.path for o in repo.ref(ref).objects(prefix=prefix))


def read_bytes(repo, ref: str, path: str) -> bytes:
    """One object's bytes at ``ref``, read through the lakeFS API."""
    with lakefs_errors(f"reading {path} at {ref}"), repo.ref(ref).object(path).reader(mode="rb", pre_sign=False) as f:
        return f.read()


def read_json(repo, ref: str, path: str) -> dict[str, Any]:
    """A JSON object stored at ``path`` in ``ref``."""
    return json.loads(read_bytes(repo, ref, path))


def select_paths(paths: Sequence[str], limit: int, seed: int) -> list[str]:
    """A seeded, shuffled subset of at most ``limit`` paths (0 = all): the same list for the same commit."""
    order = np.random.default_rng(seed).permutation(len(paths))
    chosen = [paths[i] for i in order]
    return chosen[:limit] if limit else chosen


def read_split(repo, ref: str, split: str, limit: int = 0, seed: int = 0,
               threads: int = 8) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Images, labels and paths of ``split`` ("train" or "test") as stored at ``ref``.

    The listing and every byte come from lakeFS at that ref, so a commit
    id pins exactly which images are read.
    """
    from helpers.data import decode_images
    from helpers.storage import split_train_test

    x_train, y_train, x_test, y_test = split_train_test(list_paths(repo, ref, f"{split}/"))
    labels = dict(zip(x_train, y_train, strict=True)) if split == "train" else dict(zip(x_test, y_test, strict=True))
    paths = select_paths(sorted(labels), limit, seed)
    if not paths:
        raise LakeFSError(f"No {split}/ objects at {ref}: import the data first (import_from_bucket).")
    with ThreadPoolExecutor(threads) as pool:
        bodies = list(pool.map(lambda p: read_bytes(repo, ref, p), paths))
    return decode_images(bodies), np.asarray([labels[p] for p in paths], dtype=np.int64), paths


# --- training one experiment --------------------------------------------------------------------

def experiment_params(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Full training parameters: :data:`BASE_PARAMS`, the optimizer's default lr, then ``overrides``."""
    unknown = set(overrides) - set(BASE_PARAMS) - {"lr"}
    if unknown:
        raise ParameterError(f"Unknown experiment parameter(s) {sorted(unknown)}; known: "
                             f"{sorted([*BASE_PARAMS, 'lr'])}.")
    params = {**BASE_PARAMS, **overrides}
    if params["optimizer"] not in DEFAULT_LR:
        raise ParameterError(f"optimizer must be one of {sorted(DEFAULT_LR)}, not {params['optimizer']!r}.")
    if not isinstance(params["epochs"], int) or params["epochs"] < 1:
        raise ParameterError(f"epochs must be a positive integer, not {params['epochs']!r}.")
    params.setdefault("lr", DEFAULT_LR[params["optimizer"]])
    return params


def branch_name(overrides: Mapping[str, Any], prefix: str = EXPERIMENT_PREFIX) -> str:
    """A readable branch name from the grid values: ``{"optimizer": "adam", "epochs": 3}`` -> ``exp-adam-3``."""
    parts = [str(v).replace(".", "_") for v in overrides.values()]
    return prefix + "-".join("".join(c if c.isalnum() or c in "-_" else "_" for c in p) for p in parts)


def experiment_grid(**axes: Sequence[Any]) -> list[dict[str, Any]]:
    """Every combination of the axes: ``experiment_grid(optimizer=["sgd", "adam"], epochs=[1, 3])``."""
    import itertools

    names = list(axes)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*axes.values())]


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Run torch on one thread: results are bit-identical whatever the machine's thread count."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def fit(params: Mapping[str, Any], x_train: np.ndarray, y_train: np.ndarray,
        on_epoch=None) -> tuple[torch.nn.Module, list[float]]:
    """Train a model deterministically (seeded, one thread); returns it and the per-epoch mean loss."""
    import torch
    import torch.nn.functional as F  # noqa: N812 - the usual torch alias

    from helpers.train import make_optimizer, model_from_params

    with _one_thread():
        torch.manual_seed(params["seed"])
        net = model_from_params(dict(params))
        optimizer = make_optimizer(params["optimizer"], net.parameters(), params["lr"], params["momentum"])
        x, y = torch.as_tensor(x_train), torch.as_tensor(y_train)
        rng = np.random.default_rng(params["seed"])
        losses = []
        for epoch in range(params["epochs"]):
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


def evaluate(net: torch.nn.Module, x_test: np.ndarray, y_test: np.ndarray) -> dict[str, float]:
    """Test accuracy and mean loss, computed from the model (nothing added to them)."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    from helpers.model import accuracy

    net.eval()
    with _one_thread(), torch.no_grad():
        log_probs = net(torch.as_tensor(x_test))
        return {"accuracy": accuracy(log_probs.argmax(1).numpy(), y_test),
                "test_loss": float(F.nll_loss(log_probs, torch.as_tensor(y_test)))}


def _model_bytes(net: torch.nn.Module, params: Mapping[str, Any]) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save({"model_state": net.state_dict(), "params": dict(params)}, buffer)
    return buffer.getvalue()


def load_model(repo, ref: str) -> torch.nn.Module:
    """The model committed at ``ref`` (``artifacts/model.pt``), ready for inference."""
    import torch

    from helpers.train import model_from_params

    saved = torch.load(io.BytesIO(read_bytes(repo, ref, MODEL_PATH)), map_location="cpu", weights_only=True)
    net = model_from_params(saved["params"])
    net.load_state_dict(saved["model_state"])
    return net.eval()


def encode_metadata(params: Mapping[str, Any], metrics: Mapping[str, float], extra: Mapping[str, str]) -> dict:
    """Commit metadata (string values only): ``param.<name>`` and ``metric.<name>`` as JSON, plus ``extra``."""
    out = {f"param.{k}": json.dumps(v) for k, v in params.items()}
    out.update({f"metric.{k}": json.dumps(v) for k, v in metrics.items()})
    out.update(extra)
    return out


def decode_metadata(metadata: Mapping[str, str], kind: str) -> dict[str, Any]:
    """The ``param`` or ``metric`` values back from commit metadata."""
    head = f"{kind}."
    return {k[len(head):]: json.loads(v) for k, v in metadata.items() if k.startswith(head)}


@dataclass
class ExperimentResult:
    """One experiment as committed: branch, commit id, params, metrics, MLflow run id, seconds."""

    branch: str
    commit_id: str
    params: dict[str, Any]
    metrics: dict[str, float]
    mlflow_run_id: str | None
    seconds: float


def train_experiment(settings: Settings, repo_name: str, branch: str, overrides: Mapping[str, Any],
                     mlflow_experiment: str = MLFLOW_EXPERIMENT) -> ExperimentResult:
    """Train one experiment on its branch and commit the model, config and metrics together.

    The data is read through lakeFS at the branch's head commit (the ingest
    commit it was created from); that commit id goes into the params, so
    the experiment's own commit records exactly what it trained on.
    """
    import lakefs

    started = time.perf_counter()
    client = connect(settings)
    repo = lakefs.Repository(repo_name, client=client)
    with lakefs_errors(f"reading branch {branch!r}"):
        data_commit = repo.branch(branch).get_commit().id
    params = experiment_params(overrides)
    x_train, y_train, _ = read_split(repo, data_commit, "train", params["train_size"], params["seed"])
    x_test, y_test, _ = read_split(repo, data_commit, "test", params["test_size"], params["seed"])
    params.update(data_commit=data_commit, train_images=len(y_train), test_images=len(y_test))

    run = tracking.start_run(settings.mlflow_tracking_uri, mlflow_experiment, branch, params,
                             tags={"lakefs.repository": repo_name, "lakefs.branch": branch,
                                   "lakefs.data_commit": data_commit})
    net, losses = fit(params, x_train, y_train,
                      on_epoch=lambda epoch, loss: run.log_metrics({"train_loss": loss}, step=epoch))
    metrics = {**evaluate(net, x_test, y_test), "train_loss": losses[-1]}
    run.log_metrics(metrics, step=params["epochs"])

    target = repo.branch(branch)
    with lakefs_errors(f"committing experiment {branch!r}"):
        target.object(MODEL_PATH).upload(_model_bytes(net, params), mode="wb", pre_sign=False,
                                         content_type="application/octet-stream")
        target.object(PARAMS_PATH).upload(json.dumps(params, indent=2), mode="w", pre_sign=False,
                                          content_type="application/json")
        target.object(METRICS_PATH).upload(json.dumps(metrics, indent=2), mode="w", pre_sign=False,
                                           content_type="application/json")
        extra = {"experiment": branch, "mlflow_run_id": run.run_id or "", "mlflow_experiment": mlflow_experiment}
        commit = target.commit(f"Experiment {branch}: model, config and metrics",
                               metadata=encode_metadata(params, metrics, extra))
    run.set_tags({"lakefs.commit": commit.id})
    run.end()
    return ExperimentResult(branch, commit.id, params, metrics, run.run_id, time.perf_counter() - started)


# --- many experiments in parallel ---------------------------------------------------------------

def create_experiment_branches(repo, grid: Iterable[Mapping[str, Any]], source: str,
                               replace: bool = True) -> list[str]:
    """One branch per experiment from ``source`` (a commit id); existing ones are recreated when ``replace``."""
    names = []
    for overrides in grid:
        experiment_params(overrides)  # fail on a bad grid before any branch is made
        name = branch_name(overrides)
        with lakefs_errors(f"creating branch {name!r}"):
            branch = repo.branch(name)
            if replace and any(b.id == name for b in repo.branches(prefix=name)):
                branch.delete()
            branch.create(source, exist_ok=not replace)
        names.append(name)
    if len(set(names)) != len(names):
        raise ParameterError(f"The grid gives two experiments the same branch name: {names}.")
    return names


def run_experiments(repo, grid: Sequence[Mapping[str, Any]], settings: Settings | None = None,
                    source: str = INGEST_BRANCH, parallel: bool = True) -> list[ExperimentResult]:
    """Run every experiment of ``grid`` on its own branch, in parallel as Ray tasks.

    Args:
        repo: the ``lakefs.Repository``.
        grid: one dict of parameter overrides per experiment (see :func:`experiment_grid`).
        settings: service settings (loaded by default); Ray workers get them as an argument.
        source: branch or commit the experiment branches start from (resolved to one commit first,
            so every experiment starts from the same data even if ``source`` moves meanwhile).
        parallel: run as Ray tasks (one CPU each, so as many at once as Ray has CPUs);
            ``False`` runs them one after another in this process.

    Returns:
        One :class:`ExperimentResult` per grid entry, in grid order.
    """
    settings = settings or load_settings()
    with lakefs_errors(f"resolving {source!r}"):
        source_commit = repo.ref(source).get_commit().id
    branches = create_experiment_branches(repo, grid, source_commit)
    if not parallel:
        return [train_experiment(settings, repo.id, b, g) for b, g in zip(branches, grid, strict=True)]

    import ray

    from helpers.data import init_ray

    init_ray(settings)
    task = ray.remote(num_cpus=1, max_retries=0)(train_experiment)
    refs = [task.remote(settings, repo.id, b, dict(g)) for b, g in zip(branches, grid, strict=True)]
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as err:
        raise err.as_instanceof_cause() from None


# --- reading experiments back -------------------------------------------------------------------

def experiment_branches(repo, prefix: str = EXPERIMENT_PREFIX) -> list[str]:
    """Branches whose head commit is an experiment commit (has ``experiment`` metadata)."""
    with lakefs_errors("listing branches"):
        return [b.id for b in repo.branches(prefix=prefix) if "experiment" in b.get_commit().metadata]


def compare_experiments(repo, branches: Sequence[str] | None = None):
    """A table of every experiment, read back from lakeFS: commit metadata and ``metrics/metrics.json``.

    ``metrics_match`` says whether the metrics in the commit metadata equal
    the committed metrics file (they are written from the same numbers).
    Sorted by accuracy, best first.

    Returns:
        A pandas DataFrame, one row per branch.
    """
    import pandas as pd

    rows = []
    for name in branches if branches is not None else experiment_branches(repo):
        with lakefs_errors(f"reading experiment {name!r}"):
            commit = repo.branch(name).get_commit()
        params = decode_metadata(commit.metadata, "param")
        recorded = decode_metadata(commit.metadata, "metric")
        metrics = read_json(repo, commit.id, METRICS_PATH)
        rows.append({
            "branch": name, "commit": commit.id[:12], "optimizer": params.get("optimizer"),
            "epochs": params.get("epochs"), "lr": params.get("lr"), "train_images": params.get("train_images"),
            "accuracy": metrics["accuracy"], "test_loss": metrics["test_loss"], "train_loss": metrics["train_loss"],
            "metrics_match": recorded == metrics, "mlflow_run_id": commit.metadata.get("mlflow_run_id", ""),
            "commit_id": commit.id,
        })
    table = pd.DataFrame(rows)
    return table.sort_values("accuracy", ascending=False, ignore_index=True) if rows else table


def diff_table(repo, branch: str, base: str = INGEST_BRANCH):
    """What ``branch`` changed relative to ``base`` (lakeFS diff), as a pandas DataFrame."""
    import pandas as pd

    with lakefs_errors(f"diffing {branch!r} against {base!r}"):
        changes = list(repo.ref(base).diff(repo.ref(branch)))
    return pd.DataFrame([{"type": c.type, "path": c.path, "size_bytes": c.size_bytes} for c in changes],
                        columns=["type", "path", "size_bytes"])


def history(repo, ref: str, max_commits: int = 5):
    """The latest commits reachable from ``ref`` (lakeFS log) as a pandas DataFrame."""
    import pandas as pd

    with lakefs_errors(f"reading the log of {ref!r}"):
        commits = list(repo.ref(ref).log(max_amount=max_commits))
    return pd.DataFrame([{"commit": c.id[:12], "message": c.message, "parents": len(c.parents),
                          "metadata keys": len(c.metadata or {})} for c in commits])


@dataclass
class Promotion:
    """A winner merged into ``main``: the merge commit and the tag pointing at it."""

    branch: str
    merge_commit: str
    tag: str


def promote(repo, branch: str, tag: str | None = None, destination: str | None = None) -> Promotion:
    """Merge ``branch`` into ``main`` (the winner replaces an earlier winner's files) and tag the result.

    Args:
        repo: the ``lakefs.Repository``.
        branch: the experiment branch to promote.
        tag: tag name; ``model-vN`` with the next free N by default.
        destination: target branch (the repository's default branch by default).
    """
    destination = destination or repo.properties.default_branch
    with lakefs_errors(f"merging {branch!r} into {destination!r}"):
        head = repo.branch(branch).get_commit()
        merge_commit = repo.branch(branch).merge_into(
            destination, message=f"Promote experiment {branch}",
            metadata={"promoted_branch": branch, "promoted_commit": head.id,
                      **{k: v for k, v in head.metadata.items() if k.startswith(("metric.", "param."))}},
            strategy="source-wins",  # an earlier winner's model/config/metrics are replaced, not a conflict
        )
    if tag is None:
        with lakefs_errors("listing tags"):
            taken = {t.id for t in repo.tags(prefix="model-v")}
        tag = next(f"model-v{n}" for n in range(1, len(taken) + 2) if f"model-v{n}" not in taken)
    with lakefs_errors(f"tagging {merge_commit[:12]} as {tag!r}"):
        repo.tag(tag).create(merge_commit)
    return Promotion(branch, merge_commit, tag)


# --- reproducing ----------------------------------------------------------------------------------

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
        verdict = "reproduced" if self.within_tolerance else "NOT reproduced"
        return (f"{verdict}: accuracy {self.recorded['accuracy']:.4f} recorded, {self.reproduced['accuracy']:.4f} "
                f"now (|diff| {self.differences['accuracy']:.2g} <= {self.tolerance}) in {self.seconds:.1f} s")


def reproduce(repo, commit_id: str, tolerance: float = 0.005) -> Reproduction:
    """Retrain from a commit's ``config/params.json`` and the data at that commit, and compare metrics.

    Training is seeded and single-threaded, so on the same machine and
    torch version the numbers match exactly; the tolerance (absolute
    accuracy, 0.5 points by default) allows for other CPUs and BLAS
    builds.
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


def evaluate_commit(repo, ref: str) -> dict[str, float]:
    """Metrics recomputed from the model committed at ``ref`` on the test images at ``ref``."""
    params = read_json(repo, ref, PARAMS_PATH)
    x_test, y_test, _ = read_split(repo, ref, "test", params["test_size"], params["seed"])
    return evaluate(load_model(repo, ref), x_test, y_test)
