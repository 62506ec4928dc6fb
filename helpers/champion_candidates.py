"""The day's trained models, found in MLflow: notebook 04's latest run and notebook 05's best trial (06, 07, 08).

06 (choosing on validation images) and 07 compare their champion with the day's other models on the same images.
04's latest finished run logs its model; 05's latest sweep logs its chosen model in its parent run, with the
chosen configuration's tuned values as chosen_*.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class ModelChoice:
    """A model a notebook can load: its MLflow URI, where it came from, and the test accuracy recorded for it."""

    uri: str
    source: str
    recorded_accuracy: float | None = None


def _finished_runs(client, experiment: str, max_results: int = 20) -> list[Any]:
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    return client.search_runs([found.experiment_id], "attributes.status = 'FINISHED'",
                              order_by=["attributes.start_time DESC"], max_results=max_results)


def _logged_model(client, run) -> str | None:
    models = client.search_logged_models([run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'")
    return f"models:/{models[0].model_id}" if models else None


def latest_training_model(client, experiment: str) -> ModelChoice | None:
    """The model logged by the latest finished run of ``experiment`` (notebook 04's), or None."""
    for run in _finished_runs(client, experiment):
        uri = _logged_model(client, run)
        if uri:
            return ModelChoice(uri, f"notebook 04's run {run.info.run_name}", run.data.metrics.get("test_accuracy"))
    return None


def latest_sweep(client, experiment: str):
    """The latest finished sweep of ``experiment`` (notebook 05's parent run, which holds its chosen model), or None."""
    for run in _finished_runs(client, experiment, max_results=50):
        if "mlflow.parentRunId" not in run.data.tags and any(key.startswith("chosen_") for key in run.data.params):
            return run
    return None


def chosen_sweep_model(client, experiment: str) -> ModelChoice | None:
    """The model the latest finished sweep of ``experiment`` chose (notebook 05's), or None."""
    run = latest_sweep(client, experiment)
    uri = _logged_model(client, run) if run else None
    if not uri:
        return None
    return ModelChoice(uri, f"notebook 05's sweep {run.info.run_name}", run.data.metrics.get("test_accuracy"))


def chosen_sweep_params(client, experiment: str) -> tuple[dict[str, Any], str] | None:
    """The tuned values the latest finished sweep chose, and the sweep's name; None without a sweep."""
    run = latest_sweep(client, experiment)
    if run is None:
        return None
    params = {}
    for key, text in run.data.params.items():
        if key.startswith("chosen_"):
            try:
                params[key[len("chosen_"):]] = json.loads(text)
            except ValueError:
                params[key[len("chosen_"):]] = text
    return params, run.info.run_name


def day_models(client, training_experiment: str, sweep_experiment: str) -> dict[str, ModelChoice]:
    """Notebook 04's latest model and notebook 05's chosen one, by name, where they exist."""
    found = {"notebook 04": latest_training_model(client, training_experiment),
             "notebook 05": chosen_sweep_model(client, sweep_experiment)}
    return {name: choice for name, choice in found.items() if choice is not None}


def predictions(models: dict[str, ModelChoice], images: np.ndarray) -> dict[str, np.ndarray]:
    """Each model's predictions of the same images, made here: what accuracies and paired tests are computed from."""
    import mlflow
    import torch

    out = {}
    for name, choice in models.items():
        net = mlflow.pytorch.load_model(choice.uri)
        with torch.no_grad():
            out[name] = net(torch.as_tensor(images)).argmax(dim=1).numpy()
    return out


def _registered_models_line(client) -> str:
    models = client.search_registered_models(max_results=20)
    if not models:
        return "no model is registered yet (notebook 06 registers mnist-classifier)"
    described = []
    for model in models:
        aliases = ", ".join(f"@{alias} -> version {version}" for alias, version in (model.aliases or {}).items())
        described.append(f"{model.name}" + (f" ({aliases})" if aliases else ""))
    return "registered models: " + "; ".join(described)


def _training_runs_line(client, experiment: str) -> str:
    runs = _finished_runs(client, experiment, max_results=3)
    if not runs:
        return f"no finished run in {experiment!r} (notebook 04)"
    return f"notebook 04's latest runs in {experiment!r}: " + ", ".join(
        f"runs:/{run.info.run_id}/model ({run.info.run_name})" for run in runs)


def check_model_uri(client, uri: str, parameter: str = "model_uri",
                    training_experiment: str = "mnist-ray-train") -> str:
    """``uri`` if it names a model MLflow has; else one :class:`ParameterError` naming what exists instead.

    ``models:/<name>@<alias>`` and ``models:/<name>/<version>`` are looked up in the registry,
    ``models:/<model id>`` among the logged models, ``runs:/<run id>/<path>`` among the runs; a model that
    is not there would otherwise end in a raw ``RestException`` from deep inside MLflow, with no fix named.

    Returns:
        The URI, unchanged.
    """
    from mlflow.exceptions import MlflowException

    from helpers.settings import ParameterError

    problem = None
    if uri.startswith("models:/") and "@" in uri:
        name, alias = uri[len("models:/"):].split("@", 1)
        try:
            client.get_model_version_by_alias(name, alias)
        except MlflowException:
            problem = f"the registry has no model {name!r} with the alias @{alias}"
    elif uri.startswith("models:/") and "/" in uri[len("models:/"):]:
        name, version = uri[len("models:/"):].split("/", 1)
        try:
            client.get_model_version(name, version)
        except MlflowException:
            problem = f"the registry has no version {version!r} of a model {name!r}"
    elif uri.startswith("models:/"):
        try:
            client.get_logged_model(uri[len("models:/"):])
        except MlflowException:
            problem = f"MLflow has no logged model {uri[len('models:/'):]!r}"
    elif uri.startswith("runs:/"):
        run_id = uri[len("runs:/"):].split("/", 1)[0]
        try:
            client.get_run(run_id)
        except MlflowException:
            problem = f"MLflow has no run {run_id!r}"
    else:
        problem = "it is neither a models:/ nor a runs:/ URI"
    if problem is None:
        return uri
    raise ParameterError(f"{parameter}={uri!r} names no model: {problem}. What exists: "
                         f"{_registered_models_line(client)}; {_training_runs_line(client, training_experiment)}. "
                         f"Use one of those, or {parameter}=\"\" for the champion.")

