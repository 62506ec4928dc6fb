"""docker-compose.yml checked structurally (no Docker engine runs here)."""

import re
import subprocess
import sys
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
    from helpers import stack, versioning

    init = compose["services"]["minio-init"]["entrypoint"]
    assert "mc alias set local http://minio:9000" in init and "mc mb --ignore-existing" in init
    for bucket in ("mnist", "mlflow", versioning.LAKEFS_BUCKET, stack.LAKEFS_BUCKET):
        assert f"local/{bucket}" in init
    assert "anonymous" not in init and "policy" not in init


def test_lakefs_runs_on_minio_with_local_kv_and_the_shared_keys(compose):
    lakefs = compose["services"]["lakefs"]
    env = lakefs["environment"]
    assert lakefs["image"].startswith("treeverse/lakefs:") and lakefs["command"] == "run"
    assert env["LAKEFS_BLOCKSTORE_TYPE"] == "s3" and env["LAKEFS_BLOCKSTORE_S3_ENDPOINT"] == "http://minio:9000"
    assert env["LAKEFS_BLOCKSTORE_S3_FORCE_PATH_STYLE"] == "true"
    assert env["LAKEFS_DATABASE_TYPE"] == "local" and env["LAKEFS_DATABASE_LOCAL_PATH"].startswith("/home/lakefs/data")
    assert any(v.endswith(":/home/lakefs/data") for v in lakefs["volumes"])
    # the installation user's keys are the very variables helpers.config reads for the client
    assert env["LAKEFS_INSTALLATION_ACCESS_KEY_ID"].startswith("${LAKEFS_ACCESS_KEY_ID")
    assert env["LAKEFS_INSTALLATION_SECRET_ACCESS_KEY"].startswith("${LAKEFS_SECRET_ACCESS_KEY")
    assert {"LAKEFS_ACCESS_KEY_ID", "LAKEFS_SECRET_ACCESS_KEY"} <= set(ENV_NAMES["lakefs_access_key"]) | set(
        ENV_NAMES["lakefs_secret_key"])
    assert env["LAKEFS_STATS_ENABLED"] == "false" and env["LAKEFS_SECURITY_CHECK_LATEST_VERSION"] == "false"
    assert lakefs["depends_on"] == {"minio-init": {"condition": "service_completed_successfully"}}
    assert "api/v1/healthcheck" in " ".join(lakefs["healthcheck"]["test"])


def test_every_variable_compose_reads_is_documented_in_env_example():
    text = (ROOT / "docker-compose.yml").read_text()
    used = set(re.findall(r"\$\{(\w+)", text))
    assert used <= set(dotenv_values(ROOT / ".env.example")), used - set(dotenv_values(ROOT / ".env.example"))


def test_mlflow_proxies_artifacts_and_allows_its_service_name(compose):
    command = compose["services"]["mlflow"]["command"]
    assert "--artifacts-destination s3://mlflow" in command
    assert "--no-serve-artifacts" not in command
    assert "--allowed-hosts" in command and "mlflow:5000" in command


def test_jupyter_environment_is_what_helpers_config_reads(compose):
    jupyter = compose["services"]["jupyter"]
    assert jupyter["shm_size"]
    assert set(jupyter["environment"]) <= KNOWN_ENV, set(jupyter["environment"]) - KNOWN_ENV
    assert {"S3_ENDPOINT", "S3_ACCESS_KEY", "S3_SECRET_KEY", "MLFLOW_TRACKING_URI", "LAKEFS_ENDPOINT",
            "LAKEFS_ACCESS_KEY_ID", "LAKEFS_SECRET_ACCESS_KEY"} <= set(jupyter["environment"])
    assert jupyter["environment"]["LAKEFS_ENDPOINT"] == "http://lakefs:8000"
    assert jupyter["depends_on"]["lakefs"] == {"condition": "service_healthy"}


def test_env_example_documents_only_known_variables():
    example = dotenv_values(ROOT / ".env.example")
    compose_only = {"MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD", "LAKEFS_AUTH_ENCRYPT_SECRET_KEY", "RAY_HEAD_CPUS",
                    "RAY_WORKER_CPUS"}
    assert set(example) <= KNOWN_ENV | compose_only, set(example) - KNOWN_ENV - compose_only
    assert compose_only <= set(example)


def test_compose_file_passes_the_compose_specification_schema():
    result = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
                             str(ROOT / "docker-compose.yml")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_schema_check_rejects_a_broken_file(tmp_path):
    broken = tmp_path / "docker-compose.yml"
    broken.write_text("services:\n  ray-head:\n    image: x:1\n    ports: 8265\n    shm_size: [2gb]\n")
    result = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
                             str(broken)], capture_output=True, text=True)
    assert result.returncode == 1 and "shm_size" in result.stdout + result.stderr


def test_ray_head_workers_and_jupyter_form_one_cluster(compose):
    services = compose["services"]
    head, worker, jupyter = services["ray-head"], services["ray-worker"], services["jupyter"]
    assert {head["image"], worker["image"]} == {jupyter["image"]}, "driver and workers run the same image"
    for flag in ("ray start --head", "--port=6379", "--dashboard-host=0.0.0.0", "--dashboard-port=8265", "--block"):
        assert flag in head["command"], flag
    assert head["ports"] == ["127.0.0.1:8265:8265"] and "8265/api/gcs_healthz" in " ".join(head["healthcheck"]["test"])
    assert "--address=ray-head:6379" in worker["command"] and "--block" in worker["command"]
    assert "ports" not in worker and "container_name" not in worker, "--scale ray-worker=N needs both absent"
    assert worker["depends_on"] == {"ray-head": {"condition": "service_healthy"}}
    for node in (head, worker):
        assert node["shm_size"] and node["environment"]["S3_ENDPOINT"] == "http://minio:9000"
        assert node["environment"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert jupyter["environment"]["RAY_ADDRESS"] == "ray-head:6379"
    assert "ray start --address=ray-head:6379 --num-cpus=0" in jupyter["command"], "the kernels drive the cluster"
    assert jupyter["depends_on"]["ray-head"] == {"condition": "service_healthy"}
