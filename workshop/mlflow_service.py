"""The MLflow tracking server in the embedded stack: its command line and its environment.

A sqlite backend store, artifacts proxied by the server into a bucket of the object store (clients need no
S3 keys), and basic auth on every request but ``/health``: its admin login is made by
:mod:`workshop.credentials`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from helpers.settings import Settings
from workshop.credentials import mlflow_auth_config
from workshop.state_files import state_paths

MLFLOW_BUCKET = "mlflow"


def command(state: Path, ports: dict[str, int]) -> list[str]:
    """``mlflow server``'s command line: one worker on 127.0.0.1, basic auth, artifacts in the object store."""
    db = state_paths(state)["mlflow_db"]
    return [
        sys.executable, "-m", "mlflow", "server",
        "--host", "127.0.0.1", "--port", str(ports["mlflow"]), "--workers", "1",
        "--backend-store-uri", f"sqlite:///{db}",
        "--app-name", "basic-auth",  # every request but /health signs in: see mlflow_auth_config
        "--artifacts-destination", f"s3://{MLFLOW_BUCKET}/artifacts",
    ]


def environment(state: Path, settings: Settings, auth: dict[str, str]) -> dict[str, str]:
    """The tracking server's environment: its artifact store's keys and its login's configuration."""
    return {"MLFLOW_S3_ENDPOINT_URL": settings.s3_url, "AWS_ACCESS_KEY_ID": settings.s3_access_key,
            "AWS_SECRET_ACCESS_KEY": settings.s3_secret_key, "AWS_DEFAULT_REGION": settings.s3_region,
            # its job runner (GenAI scorer jobs, unused here): eight more processes, ~30 s of CPU per start
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
            "MLFLOW_AUTH_CONFIG_PATH": str(mlflow_auth_config(state, auth)),
            "MLFLOW_FLASK_SERVER_SECRET_KEY": auth["secret_key"]}
