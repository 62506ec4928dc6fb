"""Generated from notebooks/08_serve_the_champion.ipynb by `python -m workshop.export`: edit the notebook.

Lesson 08 · Serve the champion with Ray Serve. Above each definition, the cell that teaches it.
"""
import asyncio
import random
from typing import Any

import numpy as np
import torch
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

from helpers import serving_support
from helpers.training import clearly_better, paired_test
from helpers.settings import load_settings
from helpers.preprocess import normalise


# From notebooks/08_serve_the_champion.ipynb, cell 7 (id 17c463d3).
def resolve_alias(mlflow_client, name: str, alias: str = "champion") -> tuple[str, str]:
    """``(version, models:/<name>/<version>)`` that ``@alias`` names now: one version, whatever moves later."""
    version = mlflow_client.get_model_version_by_alias(name, alias).version
    return version, f"models:/{name}/{version}"


# From notebooks/08_serve_the_champion.ipynb, cell 9 (id 23532b13).
def model_lineage(mlflow_client, name: str, version: str) -> dict[str, str]:
    """What answers: the model version, its MLflow run, the data commit it trained on, and the code's git commit."""
    model_version = mlflow_client.get_model_version(name, version)
    run_tags = mlflow_client.get_run(model_version.run_id).data.tags
    return {"model_version": str(version), "mlflow_run_id": model_version.run_id,
            "data_commit": run_tags.get("lakefs.data_commit", "none"),
            "git_commit": run_tags.get("mlflow.source.git.commit", "unknown")}


# From notebooks/08_serve_the_champion.ipynb, cell 12 (id f8d93519).
def replica_model(config: dict[str, Any]) -> tuple[Any, torch.device, dict[str, str]]:
    """``(net, device, lineage)`` of ``config["model_uri"]``: loaded from MLflow once, on a GPU with ``use_gpu``."""
    import mlflow

    mlflow.set_tracking_uri(load_settings().mlflow_tracking_uri)
    device = torch.device("cuda" if config.get("use_gpu") else "cpu")
    return mlflow.pytorch.load_model(config["model_uri"]).to(device), device, dict(config["lineage"])


# From notebooks/08_serve_the_champion.ipynb, cell 14 (id 6fc9b14f).
def answer_batch(model: tuple[Any, torch.device, dict[str, str]], images: list[np.ndarray]) -> list[dict[str, Any]]:
    """One forward pass for ``uint8 [28, 28]`` images: each one's digit and confidence, with the model's lineage."""
    net, device, lineage = model
    with torch.no_grad():
        probabilities = net(torch.as_tensor(normalise(np.stack(images)), device=device)).exp()
    confidence, digit = probabilities.max(dim=1)
    return [{"digit": int(d), "confidence": round(float(c), 4), **lineage}
            for d, c in zip(digit.tolist(), confidence.tolist(), strict=True)]


# From notebooks/08_serve_the_champion.ipynb, cell 16 (id 3b92acd9).
def answer_requests(requests: list[tuple[Any, np.ndarray]]) -> list[dict[str, Any]]:
    """Answers to ``(model, image)`` requests, in their order: one forward pass per model among them."""
    answers = {}
    for model in {id(m): m for m, _ in requests}.values():  # one model, or the champion and a canary
        rows = [i for i, (m, _) in enumerate(requests) if m is model]
        answers.update(zip(rows, answer_batch(model, [requests[i][1] for i in rows]), strict=True))
    return [answers[i] for i in range(len(requests))]


# From notebooks/08_serve_the_champion.ipynb, cell 18 (id 4ce635a8).
@serve.deployment(ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=64)
class DigitClassifier:
    """A replica: its model (and a canary's) loaded once, requests answered in batches, each with its lineage."""

    async def reconfigure(self, config: dict[str, Any]) -> None:
        """``user_config``: the model, a canary or none, the batching and the key's digest; called on every update."""
        canary = config.get("canary")  # {"model_uri", "lineage", "share"}: that share of the requests goes to it
        kept, wanted = getattr(self, "loaded", {}), [config, *([{**config, **canary}] if canary else [])]
        self.loaded = {c["model_uri"]: kept.get(c["model_uri"]) or await asyncio.to_thread(replica_model, c)
                       for c in wanted}  # loaded in a thread while the old ones answer; one kept is not reloaded
        self.models = (self.loaded[config["model_uri"]],  # then swapped in one assignment: no request fails
                       (self.loaded[canary["model_uri"]], canary["share"]) if canary else None)
        self.key_digest = config["key_digest"]
        self.predict.set_max_batch_size(config["max_batch_size"])
        self.predict.set_batch_wait_timeout_s(config["batch_wait_timeout_s"])

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.01)
    async def predict(self, requests: list[tuple[Any, np.ndarray]]) -> list[dict[str, Any]]:
        """A batch of ``(model, image)`` requests: one forward pass per model in it (``answer_requests``)."""
        return answer_requests(requests)

    async def answer(self, body: bytes, authorization: str) -> tuple[int, dict[str, Any]]:
        """``(HTTP status, JSON)`` for one request: 401 without the key, 400 for a bad body, else 200."""
        if not serving_support.authorized(authorization, self.key_digest):
            return 401, {"error": "This endpoint needs its key: send 'Authorization: Bearer <key>'."}
        try:
            image = serving_support.parse_image(body)
        except serving_support.BadRequest as err:
            return 400, {"error": str(err)}
        model, canary = self.models
        to_canary = canary is not None and random.random() < canary[1]  # the canary's share of the requests
        return 200, await self.predict((canary[0] if to_canary else model, image))

    async def __call__(self, request: Request) -> JSONResponse:
        """HTTP: the body and the key in, the answer out with its lineage in ``X-...`` headers."""
        status, answer = await self.answer(await request.body(), request.headers.get("authorization", ""))
        return JSONResponse(answer, status_code=status, headers=serving_support.lineage_headers(answer))


# From notebooks/08_serve_the_champion.ipynb, cell 30 (id 0bb46ca0).
def may_roll(name: str, champion: str, challenger: str, images: np.ndarray, labels: np.ndarray) -> tuple[bool, str]:
    """The rule before a roll: version ``challenger`` may take traffic unless ``champion`` is better beyond noise.

    Both predict the same validation ``images``; notebook 04's paired test decides. Returns the verdict and one line.
    """
    import mlflow

    with torch.no_grad():
        new, old = (mlflow.pytorch.load_model(f"models:/{name}/{v}")(torch.as_tensor(images)).argmax(1).numpy()
                    for v in (challenger, champion))
    allowed = not clearly_better(old, new, labels)
    return allowed, (f"version {challenger} against @champion (version {champion}): {paired_test(new, old, labels)}"
                     + ("; it may take a canary's share" if allowed else "; the roll to it is refused"))
