"""docker-compose.yml checked structurally (no Docker engine runs here)."""

import re
from pathlib import Path

import pytest
import yaml
from dotenv import dotenv_values

from helpers.config import ENV_NAMES

ROOT = Path(__file__).resolve().parent.parent
KNOWN_ENV = {name for names in ENV_NAMES.values() for name in names}


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_every_image_is_pinned(compose):
    for name, service in compose["services"].items():
        image = service["image"]
        tag = image.rsplit(":", 1)[-1] if ":" in image else ""
        assert tag and tag != "latest" and re.search(r"\d", tag), f"{name}: {image} is not pinned"
        if "build" in service:
            dockerfile = ROOT / service["build"]["dockerfile"]
            pins = re.findall(r"(\w[\w-]*)==[\d.]+", dockerfile.read_text())
            assert pins or "requirements.txt" in dockerfile.read_text(), dockerfile


def test_long_running_services_have_health_checks_and_wait_for_health(compose):
    services = compose["services"]
    for name, service in services.items():
        if service.get("restart") == "no":  # one-shot init job
            continue
        assert "healthcheck" in service, name
        for dependency, condition in service.get("depends_on", {}).items():
            expected = "service_completed_successfully" if services[dependency].get("restart") == "no" \
                else "service_healthy"
            assert condition["condition"] == expected, f"{name} -> {dependency}"


def test_ports_are_published_on_loopback_only(compose):
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name}: {port}"


def test_buckets_created_without_public_policy(compose):
    init = compose["services"]["minio-init"]["entrypoint"]
    assert "mc mb --ignore-existing" in init and "local/mnist" in init and "local/mlflow" in init
    assert "anonymous" not in init and "policy" not in init


def test_mlflow_proxies_artifacts_and_allows_its_service_name(compose):
    command = compose["services"]["mlflow"]["command"]
    assert "--artifacts-destination s3://mlflow" in command
    assert "--no-serve-artifacts" not in command
    assert "--allowed-hosts" in command and "mlflow:5000" in command


def test_jupyter_environment_is_what_helpers_config_reads(compose):
    jupyter = compose["services"]["jupyter"]
    assert jupyter["shm_size"]
    assert set(jupyter["environment"]) <= KNOWN_ENV, set(jupyter["environment"]) - KNOWN_ENV
    assert {"S3_ENDPOINT", "S3_ACCESS_KEY", "S3_SECRET_KEY", "MLFLOW_TRACKING_URI"} <= set(jupyter["environment"])


def test_env_example_documents_only_known_variables():
    example = dotenv_values(ROOT / ".env.example")
    compose_only = {"MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD"}
    assert set(example) <= KNOWN_ENV | compose_only, set(example) - KNOWN_ENV - compose_only
    assert compose_only <= set(example)
