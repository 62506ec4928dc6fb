"""The secrets a stack and its lab keep, and a scan of every process's command line for them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import psutil


def stack_secrets(state: Path, home: Path | None = None) -> dict[str, str]:
    """Every secret a stack's state folder (and its user's Ray token) holds, by what it is."""
    found: dict[str, str] = {}

    def read_json(name: str) -> dict:
        path = state / name
        return json.loads(path.read_text()) if path.is_file() else {}

    credentials = read_json("s3-identities.json").get("identities", [{}])[0].get("credentials", [{}])[0]
    found["S3 secret key"] = credentials.get("secretKey", "")
    auth = read_json("mlflow-auth.json")
    found["MLflow password"], found["MLflow server key"] = auth.get("password", ""), auth.get("secret_key", "")
    lakefs = read_json("lakefs-keys.json")
    found["lakeFS secret key"], found["lakeFS encryption secret"] = (lakefs.get("secret_access_key", ""),
                                                                     lakefs.get("encrypt_secret", ""))
    security = state / "seaweedfs" / "security.toml"
    if security.is_file():
        for i, key in enumerate(re.findall(r'^key = "([^"]+)"$', security.read_text(), re.M)):
            found[f"SeaweedFS JWT key {i}"] = key
    for name, what in (("jupyter-token", "JupyterLab token"), ("dashboard-sign-in-keys", "sign-in key")):
        path = state / name
        for i, value in enumerate(path.read_text().split() if path.is_file() else []):
            found[f"{what} {i}"] = value
    for where, ray_token in (("home", (home or Path.home()) / ".ray" / "auth_token"), ("stack", state / "ray_token")):
        if ray_token.is_file():
            found[f"Ray token ({where})"] = ray_token.read_text().strip()
    return {what: value for what, value in found.items() if value}


def on_command_lines(secrets: dict[str, str]) -> list[str]:
    """``"<what> in pid N (<program>)"`` for each secret that shows in any process's command line."""
    leaks = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        leaks += [f"{what} in pid {process.info['pid']} ({line[:60]})" for what, value in secrets.items()
                  if value in line]
    return leaks
