"""Settings for every service, read from the environment (all notebooks).

One function, :func:`load_settings`, builds a typed :class:`Settings` object.
Nothing happens at import time. Values are looked up in this order, the
first one found wins:

1. the process environment,
2. a ``.env`` file in the project root (see ``.env.example``),
3. the original articles' ``credentials.json`` (``url``, ``accessKey``,
   ``secretKey``) in the project root, for the object store only,
4. the embedded stack's state file (``.stack/stack.env``) that
   ``python -m workshop.stack up`` writes.

So pointing the same notebooks at a real MinIO, MLflow, lakeFS or Ray
cluster needs environment variables only.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from dotenv import dotenv_values

from helpers.errors import TutorialError

STATE_FILE_NAME = "stack.env"

# Every setting, with the variable names accepted for it (first name is the
# canonical one; the others are MinIO-style and seed-article aliases).
ENV_NAMES: dict[str, tuple[str, ...]] = {
    "s3_endpoint": ("S3_ENDPOINT", "MINIO_ENDPOINT", "MINIO_URL"),
    "s3_access_key": ("S3_ACCESS_KEY", "MINIO_ACCESS_KEY", "MINIO_ROOT_USER"),
    "s3_secret_key": (
        "S3_SECRET_KEY",
        "MINIO_SECRET_KEY",
        "MINIO_SECRET_ACCESS_KEY",
        "MINIO_ROOT_PASSWORD",
    ),
    "s3_secure": ("S3_SECURE", "MINIO_SECURE"),
    "s3_region": ("S3_REGION",),
    "bucket": ("MNIST_BUCKET",),
    "mlflow_tracking_uri": ("MLFLOW_TRACKING_URI",),
    "mlflow_username": ("MLFLOW_TRACKING_USERNAME",),
    "mlflow_password": ("MLFLOW_TRACKING_PASSWORD",),
    "lakefs_endpoint": ("LAKEFS_ENDPOINT",),
    "lakefs_access_key": ("LAKEFS_ACCESS_KEY_ID", "LAKEFS_ACCESS_KEY"),
    "lakefs_secret_key": ("LAKEFS_SECRET_ACCESS_KEY", "LAKEFS_SECRET_KEY"),
    "ray_address": ("RAY_ADDRESS",),
}

_SECRET_FIELDS = {"s3_access_key", "s3_secret_key", "mlflow_password", "lakefs_access_key", "lakefs_secret_key"}


class SettingsError(TutorialError, ValueError):
    """A setting is missing or malformed; the message says which and how to fix it."""


class ParameterError(TutorialError, ValueError):
    """A function was called with a bad parameter value; the message says the allowed values."""


def check_count(name: str, value: object, maximum: int, minimum: int = 1) -> int:
    """``value`` as an int when it is a whole number in ``[minimum, maximum]``, else one :class:`ParameterError`.

    Thread, worker, actor and epoch counts all go through here, before any I/O: a pool of
    size 0 would otherwise wait forever for a free slot.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ParameterError(f"{name} must be a whole number from {minimum} to {maximum:,}, not {value!r}.")
    if not minimum <= value <= maximum:
        raise ParameterError(f"{name}={value} is out of range: use a whole number from {minimum} to {maximum:,}.")
    return int(value)


def check_positive(name: str, value: object, maximum: float | None = None) -> float:
    """``value`` as a float when it is a number above 0 (and at most ``maximum``), else one :class:`ParameterError`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ParameterError(f"{name} must be a number above 0, not {value!r}.")
    if value <= 0 or (maximum is not None and value > maximum):
        allowed = f"above 0 and at most {maximum}" if maximum is not None else "above 0"
        raise ParameterError(f"{name}={value} is out of range: use a number {allowed}.")
    return float(value)


def check_fraction(name: str, value: object) -> float:
    """``value`` as a float when it is a number from 0 up to (not including) 1, else one :class:`ParameterError`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 1:
        raise ParameterError(f"{name} must be a number from 0 up to (not including) 1, not {value!r}.")
    return float(value)


@dataclass(frozen=True)
class Settings:
    """Where every service lives and how to log in to it.

    Secrets are kept out of ``repr()`` so printing the settings in a
    notebook never shows them.
    """

    s3_endpoint: str = ""
    s3_access_key: str = field(default="", repr=False)
    s3_secret_key: str = field(default="", repr=False)
    s3_secure: bool = False
    s3_region: str = "us-east-1"
    bucket: str = "mnist"
    mlflow_tracking_uri: str = ""
    mlflow_username: str = ""
    mlflow_password: str = field(default="", repr=False)
    lakefs_endpoint: str = ""
    lakefs_access_key: str = field(default="", repr=False)
    lakefs_secret_key: str = field(default="", repr=False)
    ray_address: str = ""
    sources: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def s3_host(self) -> str:
        """``host:port`` of the object store, the form the MinIO SDK wants."""
        return self.s3_endpoint.split("://", 1)[-1].rstrip("/")

    @property
    def s3_url(self) -> str:
        """Full URL of the object store (``http://host:port``), for boto3 and pyarrow."""
        scheme = "https" if self.s3_secure else "http"
        return f"{scheme}://{self.s3_host}" if self.s3_host else ""

    def describe(self) -> dict[str, str]:
        """Every setting with secrets masked and where it came from, for display."""
        out = {}
        for f in fields(self):
            if f.name == "sources":
                continue
            value = getattr(self, f.name)
            if f.name in _SECRET_FIELDS:
                value = "****" if value else "(unset)"
            out[f.name] = f"{value}  [{self.sources.get(f.name, 'default')}]"
        return out

    def use_mlflow_credentials(self) -> None:
        """Let this process's MLflow clients sign in to the tracking server (its basic-auth user and password).

        MLflow reads ``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD`` at every request; set here
        from the settings (the embedded stack's, or the ones given), never over ones already set.
        """
        for name, value in (("MLFLOW_TRACKING_USERNAME", self.mlflow_username),
                            ("MLFLOW_TRACKING_PASSWORD", self.mlflow_password)):
            if value:
                os.environ.setdefault(name, value)

    def require_object_store(self) -> None:
        """Raise :class:`SettingsError` naming the fix when the object store is not configured."""
        if not self.s3_endpoint or not self.s3_access_key or not self.s3_secret_key:
            raise SettingsError(
                "No object store is configured. Start the embedded one with "
                "`python -m workshop.stack up` (or `make stack-up`), or set S3_ENDPOINT, "
                "S3_ACCESS_KEY and S3_SECRET_KEY (see .env.example)."
            )


def services_line(settings: Settings, with_mlflow: bool = True) -> str:
    """Which endpoint each service uses and why (``Services: object store URL (S3_ENDPOINT from .env); ...``)."""
    parts = []
    for name, key in [("object store", "s3_endpoint"), ("MLflow", "mlflow_tracking_uri")][:2 if with_mlflow else 1]:
        source, _, alias = settings.sources.get(key, "default").partition(":")
        why = "embedded stack" if source == "stack" else f"{alias} from {source}"
        parts.append(f"{name} {getattr(settings, key)} ({why})")
    return "Services: " + "; ".join(parts)


def project_root(start: Path | None = None) -> Path:
    """The repository root: the nearest folder upwards holding ``pyproject.toml`` and ``helpers/``.

    Falls back to the folder above the installed ``helpers`` package, so
    notebooks find the same ``.env`` and ``.stack`` whether they run from
    ``notebooks/`` or from the root.
    """
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file() and (folder / "helpers").is_dir():
            return folder
    return Path(__file__).resolve().parent.parent


def state_dir(root: Path | None = None) -> Path:
    """Folder of the embedded stack's state (``STACK_STATE_DIR`` or ``<root>/.stack``)."""
    if os.environ.get("STACK_STATE_DIR"):
        return Path(os.environ["STACK_STATE_DIR"]).resolve()
    return (root or project_root()) / ".stack"


def _parse_bool(name: str, raw: str) -> bool:
    text = raw.strip().lower()
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"0", "false", "no", "off", ""}:
        return False
    raise SettingsError(f"{name}={raw!r} is not a boolean: use true or false.")


def credentials_file(root: Path) -> Path | None:
    """The original articles' ``credentials.json``, or None where there is none.

    It is looked for next to the notebook that runs (a notebook's folder is its working directory),
    then in the project root.
    """
    try:
        folders = [Path.cwd(), root]
    except OSError:  # a working directory that was deleted
        folders = [root]
    for folder in dict.fromkeys(folders):
        if (folder / "credentials.json").is_file():
            return folder / "credentials.json"
    return None


def _credentials_json(path: Path | None, root: Path) -> dict[str, str]:
    """Read the original article's credentials.json shape into our variable names.

    Raises:
        SettingsError: the file is not valid JSON (the message names it, with the line and column).
    """
    if path is None:
        return {}
    shown = path.relative_to(root) if path.is_relative_to(root) else path
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise SettingsError(f"{shown} is not valid JSON ({err.msg}: line {err.lineno} column {err.colno}); fix it, "
                            "or delete it to use the embedded stack.") from None
    if not isinstance(data, dict):
        raise SettingsError(f"{shown} must hold a JSON object with url, accessKey and secretKey; fix or delete it.")
    mapping = {"url": "MINIO_URL", "accessKey": "MINIO_ACCESS_KEY", "secretKey": "MINIO_SECRET_ACCESS_KEY"}
    return {env: str(data[key]) for key, env in mapping.items() if data.get(key)}


def _read_env_file(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    return {k: v for k, v in dotenv_values(path).items() if v is not None}


def load_settings(
    environ: Mapping[str, str] | None = None,
    root: Path | None = None,
    stack_state: Path | None = None,
) -> Settings:
    """Build the :class:`Settings` from environment, ``.env``, credentials.json and stack state.

    Args:
        environ: variables to use instead of ``os.environ`` (tests pass their own).
        root: project root holding ``.env``/``credentials.json``; found by default.
        stack_state: the embedded stack's state folder; ``.stack`` by default.

    Returns:
        The settings, with ``sources`` telling where each value came from.

    Raises:
        SettingsError: a value is malformed (for example ``S3_SECURE=maybe``).
    """
    environ = os.environ if environ is None else environ
    root = root or project_root()
    stack_state = stack_state or state_dir(root)
    layers = [
        ("environment", dict(environ)),
        (".env", _read_env_file(root / ".env")),
        ("credentials.json", _credentials_json(credentials_file(root), root)),
        ("stack", _read_env_file(stack_state / STATE_FILE_NAME)),
    ]
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for name, aliases in ENV_NAMES.items():
        for source, layer in layers:
            hit = next((a for a in aliases if layer.get(a, "").strip()), None)
            if hit:
                values[name] = layer[hit].strip()
                sources[name] = f"{source}:{hit}"
                break
    if "s3_secure" in values:
        values["s3_secure"] = _parse_bool("S3_SECURE", str(values["s3_secure"]))
    endpoint = str(values.get("s3_endpoint", ""))
    if endpoint.startswith("https://") and "s3_secure" not in sources:
        values["s3_secure"] = True
    return Settings(**values, sources=sources)  # type: ignore[arg-type]
