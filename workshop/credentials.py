"""The embedded stack's keys and logins: made once at random, kept 0600 in its state folder, never on a command line.

The object store's identity, lakeFS's installation keys, MLflow's admin user and form-signing key, and
``stack.env``, where :func:`helpers.settings.load_settings` finds the endpoints and keys.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import string
from pathlib import Path

from helpers.private_files import write_private
from workshop.state_files import RESET_HINT, StackError, read_state_json, state_paths


def load_or_create_s3_keys(state: Path) -> tuple[str, str]:
    """The object store's access key and secret (its identities file, ``s3-identities.json``)."""
    path = state_paths(state)["keys"]
    if path.is_file():
        try:
            creds = read_state_json(path)["identities"][0]["credentials"][0]
            return creds["accessKey"], creds["secretKey"]
        except (KeyError, IndexError, TypeError):
            raise StackError(f"{path} is damaged (no identities[0].credentials[0]). "
                             f"Reset it: {RESET_HINT.format(path=path)}.") from None
    access, secret = "stack-" + secrets.token_hex(6), secrets.token_urlsafe(24)
    identities = {"identities": [{
        "name": "tutorial",
        "credentials": [{"accessKey": access, "secretKey": secret}],
        "actions": ["Admin", "Read", "List", "Tagging", "Write"],
    }]}
    write_private(path, json.dumps(identities, indent=2))
    return access, secret


def _load_or_create_secrets(path: Path, make) -> dict[str, str]:
    """The secrets kept 0600 at ``path``, made once by ``make()``; a file missing one of them is refused."""
    if path.is_file():
        kept = read_state_json(path)
        if not set(make()) <= set(kept):
            raise StackError(f"{path} is damaged (a key is missing). Reset it: {RESET_HINT.format(path=path)}.")
        return kept
    made = make()
    write_private(path, json.dumps(made, indent=2))
    return made


def load_or_create_lakefs_keys(state: Path) -> dict[str, str]:
    """LakeFS's admin key pair and its encryption secret."""
    upper = string.ascii_uppercase + string.digits
    return _load_or_create_secrets(state_paths(state)["lakefs_keys"], lambda: {
        "access_key_id": "AKIAJ" + "".join(secrets.choice(upper) for _ in range(15)),  # lakeFS's key shape
        "secret_access_key": secrets.token_urlsafe(30),
        "encrypt_secret": secrets.token_urlsafe(32),
    })


def load_or_create_mlflow_auth(state: Path) -> dict[str, str]:
    """MLflow's admin user and password, and the server's form-signing key: made once, kept 0600.

    The password is fixed when MLflow creates its user on the first start, so it is kept, never made anew.
    """
    return _load_or_create_secrets(state_paths(state)["mlflow_auth"], lambda: {
        "username": "admin", "password": secrets.token_urlsafe(24), "secret_key": secrets.token_urlsafe(32)})


def fast_admin_login(state: Path, auth: dict[str, str]) -> None:
    """Keep MLflow's admin password as a one-round PBKDF2 hash instead of werkzeug's default scrypt.

    MLflow checks the password of every request against the stored hash: scrypt cost the server 100-350 ms
    of CPU per request, and a notebook makes hundreds (notebook 05 ran 3x slower). The password is 24 random
    bytes: stretching a hash only slows the guessing of weak, human-chosen passwords, so it protects
    nothing here. MLflow created the user (with scrypt) at its first start; the row is rewritten after it.
    """
    import sqlite3

    from werkzeug.security import generate_password_hash

    database = state_paths(state)["mlflow_auth_config"].parent / "basic_auth.db"
    with contextlib.closing(sqlite3.connect(database, timeout=10)) as db, db:
        db.execute("UPDATE users SET password_hash = ? WHERE username = ? AND password_hash NOT LIKE 'pbkdf2:%'",
                   (generate_password_hash(auth["password"], method="pbkdf2:sha256:1"), auth["username"]))


def mlflow_auth_config(state: Path, auth: dict[str, str]) -> Path:
    """MLflow's basic-auth settings (0600): nobody but its admin may read or write anything."""
    config = state_paths(state)["mlflow_auth_config"]
    database = (config.parent / "basic_auth.db").resolve()
    write_private(config, "\n".join([
        "[mlflow]", "default_permission = NO_PERMISSIONS", f"database_uri = sqlite:///{database}",
        f"admin_username = {auth['username']}", f"admin_password = {auth['password']}",
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth"]) + "\n")
    return config


def write_env_file(state: Path, ports: dict[str, int], access: str, secret: str,
                   lakefs_keys: dict[str, str] | None = None, mlflow_auth: dict[str, str] | None = None) -> None:
    """``stack.env``: the endpoints and keys the notebooks' settings read (0600)."""
    # MLflow's URI is written even by `up --no-mlflow`: its port is reserved, and a
    # client then says "not reachable at <uri>" rather than "not configured".
    lines = [
        "# Written by `python -m workshop.stack up`; read by helpers.settings.load_settings().",
        f"S3_ENDPOINT=http://127.0.0.1:{ports['s3']}",
        f"S3_ACCESS_KEY={access}",
        f"S3_SECRET_KEY={secret}",
        "S3_SECURE=false",
        f"MLFLOW_TRACKING_URI=http://127.0.0.1:{ports['mlflow']}",
    ]
    if mlflow_auth:  # MLflow's own variables: its clients sign in with them (basic auth)
        lines += [f"MLFLOW_TRACKING_USERNAME={mlflow_auth['username']}",
                  f"MLFLOW_TRACKING_PASSWORD={mlflow_auth['password']}"]
    if lakefs_keys:  # only where lakeFS runs: otherwise notebook 06 says "no lakeFS configured"
        lines += [
            f"LAKEFS_ENDPOINT=http://127.0.0.1:{ports['lakefs']}",
            f"LAKEFS_ACCESS_KEY_ID={lakefs_keys['access_key_id']}",
            f"LAKEFS_SECRET_ACCESS_KEY={lakefs_keys['secret_access_key']}",
        ]
    write_private(state_paths(state)["env"], "\n".join(lines) + "\n")
