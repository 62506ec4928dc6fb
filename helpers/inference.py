"""Generated from notebooks/07_batch_inference.ipynb by `python -m workshop.export`: edit the notebook.

Lesson 07 · Batch inference with Ray Data. Above each definition, the cell that teaches it.
"""
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch import nn

from helpers.champion_candidates import ModelChoice, day_models, predictions
from helpers.settings import Settings, check_count, load_settings
from helpers.inference_support import train_first
from helpers.listing import get_train_test_data, split_validation
from helpers.preprocess import decode_images, preprocess_with_actors, to_ray_dataset
from helpers.serving_support import register_as
from helpers.storage import get_client, read_object
from helpers.training import accuracy, clearly_better, paired_test, with_interval
from helpers.training_support import require_gpus

PREDICTIONS_PREFIX = "predictions"  # predictions/<run name>/ in the data bucket


# From notebooks/07_batch_inference.ipynb, cell 8 (id 19e4b353).
def champion_model(mlflow_client, name: str) -> ModelChoice | None:
    """The version ``@champion`` of registered model ``name`` names, as a fixed URI; None if none."""
    from mlflow.exceptions import MlflowException

    try:
        version = mlflow_client.get_model_version_by_alias(name, "champion")
    except MlflowException as err:
        if err.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise
    recorded = mlflow_client.get_run(version.run_id).data.metrics.get("test_accuracy")
    registered_by = version.tags.get("registered_by", "a notebook that did not say")
    return ModelChoice(f"models:/{name}/{version.version}", f"{name} version {version.version} (@champion, "
                       f"registered by {registered_by})", recorded)


# From notebooks/07_batch_inference.ipynb, cell 10 (id 9c973f90).
def validation_images(bucket: str, smoke_test_size: int, settings: Settings) -> tuple[np.ndarray, np.ndarray]:
    """Notebook 02's validation images of a bucket (at a smoke size), decoded in the driver, with their labels."""
    client = get_client(settings)
    x_train, y_train, *_ = get_train_test_data(bucket, smoke_test_size, "manifest", client)
    keys, labels = split_validation(x_train, y_train)[1]
    with ThreadPoolExecutor(16) as pool:
        images = decode_images(list(pool.map(lambda key: read_object(client, bucket, key), keys)))
    return images, np.asarray(labels)


# From notebooks/07_batch_inference.ipynb, cell 12 (id 1a672cea).
def hold_champion_rule(client, name: str, bucket: str, smoke_test_size: int, registered_by: str,
                       training_experiment: str = "mnist-ray-train", sweep_experiment: str = "mnist-tune", *,
                       settings: Settings) -> str:
    """Notebook 06's champion rule where 06 did not run: the day's models against ``@champion``, on validation.

    Returns one line saying what it did: nothing (a tie, or worse), or which version is now ``@champion``.
    """
    day = day_models(client, training_experiment, sweep_experiment)
    champion = champion_model(client, name)
    if not day and champion is None:
        train_first(bucket, smoke_test_size, training_experiment)
        day = day_models(client, training_experiment, sweep_experiment)
    if not day:
        return f"@champion stays {champion.source}: no model of the day to compare it with"
    images, labels = validation_images(bucket, smoke_test_size, settings)
    if champion is not None:
        day["champion"] = champion
    predicted, n = predictions(day, images), len(labels)  # each model's predictions of the same images
    scores = {key: accuracy(p, labels) for key, p in predicted.items()}
    best = max((key for key in day if key != "champion"), key=lambda key: scores[key])
    said = f"the best of the day, {day[best].source}: {with_interval(scores[best], n)} on the validation images"
    if champion is not None and not clearly_better(predicted[best], predicted["champion"], labels):
        return (f"@champion stays {champion.source}, {with_interval(scores['champion'], n)}; {said}; against the "
                f"champion it is {paired_test(predicted[best], predicted['champion'], labels)}")
    if champion is not None:
        said += f"; against the champion before it, it is {paired_test(predicted[best], predicted['champion'], labels)}"
    version = register_as(client, name, day[best], "champion", tags={"registered_by": registered_by})
    return f"@champion is now version {version.version}, registered by {registered_by}: {said}"


# From notebooks/07_batch_inference.ipynb, cell 15 (id aa20abf1).
class Predictor:
    """Holds the model in a Ray actor: preprocessed batches in, each image's prediction and its confidence out."""

    def __init__(self, model_uri: str, use_gpu: bool = False) -> None:
        import mlflow

        mlflow.set_tracking_uri(load_settings().mlflow_tracking_uri)
        self.device = torch.device("cuda" if use_gpu else "cpu")
        self.net = mlflow.pytorch.load_model(model_uri).to(self.device)  # once per actor, not per batch

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``{"X", "y", "key"}`` -> ``{"key", "label", "predicted", "confidence"}``."""
        with torch.no_grad():
            probabilities = self.net(torch.as_tensor(batch["X"], device=self.device)).exp()
        confidence, predicted = probabilities.max(dim=1)
        return {"key": batch["key"], "label": batch["y"], "predicted": predicted.cpu().numpy(),
                "confidence": confidence.cpu().numpy()}


# From notebooks/07_batch_inference.ipynb, cell 17 (id 0e2c8ccf).
def predict_pointers(keys, labels, bucket: str, model_uri: str, num_actors: int = 2, batch_size: int = 500,
                     use_gpu: bool = False):
    """A lazy Ray Dataset of predictions for the images behind ``keys``: fetched, decoded and predicted by actors."""
    check_count("batch_size", batch_size, 100_000)
    if use_gpu:
        require_gpus(num_actors)  # without them Ray would wait for ever
    batch_size = max(1, min(batch_size, -(-len(keys) // num_actors)))  # a batch for every actor, at least
    pointers = to_ray_dataset(keys, labels).map(lambda row: {**row, "key": row["X"]})
    images = preprocess_with_actors(pointers, bucket, batch_size=batch_size, num_actors=num_actors, num_cpus=0.25)
    with warnings.catch_warnings():  # max_restarts is a plain remote argument here, which Ray warns about
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        return images.map_batches(Predictor, fn_constructor_kwargs={"model_uri": model_uri, "use_gpu": use_gpu},
                                  batch_size=batch_size, concurrency=num_actors, max_restarts=0,
                                  num_cpus=0.25, num_gpus=1 if use_gpu else 0)


# From notebooks/07_batch_inference.ipynb, cell 29 (id 224c2041).
def predict_in_driver(keys, labels, bucket: str, net: nn.Module, settings: Settings,
                      threads: int = 16) -> dict[str, np.ndarray]:
    """The same predictions without Ray: objects fetched by a thread pool, decoded and predicted in this process."""
    client = get_client(settings, max_connections=threads)
    with ThreadPoolExecutor(threads) as pool:
        bodies = list(pool.map(lambda key: read_object(client, bucket, key), keys))
    with torch.no_grad():
        predicted = net(torch.as_tensor(decode_images(bodies))).argmax(dim=1).numpy()
    return {"key": np.asarray(keys), "label": np.asarray(labels), "predicted": predicted}
