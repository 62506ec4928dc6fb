"""Generated from notebooks/08_serve_the_champion.ipynb by `python -m workshop.export`: edit the notebook.

Lesson 08 · Serve the champion with Ray Serve. Above each definition, the cell that teaches it.
"""
from typing import Any

import numpy as np
import torch
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

from helpers import serving_support
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


# From notebooks/08_serve_the_champion.ipynb, cell 12 (id 4ce635a8).
@serve.deployment(ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=64)
class DigitClassifier:
    """A replica: the model loaded once, requests answered in batches, every answer with its lineage."""

    def reconfigure(self, config: dict[str, Any]) -> None:
        """``user_config``: the model (URI, lineage), the batching and the key's digest; called on every update."""
        import mlflow
        mlflow.set_tracking_uri(load_settings().mlflow_tracking_uri)
        device = torch.device("cuda" if config.get("use_gpu") else "cpu")
        net = mlflow.pytorch.load_model(config["model_uri"]).to(device)  # loaded before the swap: none fails
        self.model = (net, device, dict(config["lineage"]))  # one assignment: a batch sees one model
        self.key_digest = config["key_digest"]
        self.predict.set_max_batch_size(config["max_batch_size"])
        self.predict.set_batch_wait_timeout_s(config["batch_wait_timeout_s"])

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.01)
    async def predict(self, images: list[np.ndarray]) -> list[dict[str, Any]]:
        """A batch of ``uint8 [28, 28]`` images -> each one's digit, confidence and lineage."""
        net, device, lineage = self.model
        with torch.no_grad():
            probabilities = net(torch.as_tensor(normalise(np.stack(images)), device=device)).exp()
        confidence, digit = probabilities.max(dim=1)
        return [{"digit": int(d), "confidence": round(float(c), 4), **lineage}
                for d, c in zip(digit.tolist(), confidence.tolist(), strict=True)]

    async def answer(self, body: bytes, authorization: str) -> tuple[int, dict[str, Any]]:
        """``(HTTP status, JSON)`` for one request: 401 without the key, 400 for a bad body, else 200."""
        if not serving_support.authorized(authorization, self.key_digest):
            return 401, {"error": "This endpoint needs its key: send 'Authorization: Bearer <key>'."}
        try:
            image = serving_support.parse_image(body)
        except serving_support.BadRequest as err:
            return 400, {"error": str(err)}
        return 200, await self.predict(image)

    async def __call__(self, request: Request) -> JSONResponse:
        """HTTP: the body and the key in, the answer out with its lineage in ``X-...`` headers."""
        status, answer = await self.answer(await request.body(), request.headers.get("authorization", ""))
        return JSONResponse(answer, status_code=status, headers=serving_support.lineage_headers(answer))
