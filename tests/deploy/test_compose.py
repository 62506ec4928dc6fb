"""docker-compose.yml checked structurally (no Docker engine runs here)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dotenv import dotenv_values

from helpers.settings import ENV_NAMES

ROOT = Path(__file__).resolve().parents[2]
KNOWN_ENV = {name for names in ENV_NAMES.values() for name in names}
RAY_AUTH_ENV = {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"}  # Ray's own: token authentication on every node and driver


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
            assert pins or "requirements.lock" in dockerfile.read_text(), dockerfile


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
    from helpers import versioning
    from workshop import lakefs_service

    entrypoint = compose["services"]["minio-init"]["entrypoint"]
    assert entrypoint[:2] == ["/bin/sh", "-c"]
    init = entrypoint[2]
    # the keys reach mc on stdin, through the shell's own printf: never in a process's command line
    assert "| mc alias import local" in init and '"url":"http://minio:9000"' in init
    assert "mc alias set" not in init and "mc mb --ignore-existing" in init
    for bucket in ("mnist", "mlflow", versioning.LAKEFS_BUCKET, lakefs_service.LAKEFS_BUCKET):
        assert f"local/{bucket}" in init
    assert "anonymous" not in init and "policy" not in init


def lakefs_config() -> dict:
    return yaml.safe_load((ROOT / "docker" / "lakefs.yaml").read_text())


def test_lakefs_runs_on_minio_with_local_kv_and_the_shared_keys(compose):
    lakefs = compose["services"]["lakefs"]
    env, config = lakefs["environment"], lakefs_config()
    assert lakefs["image"].startswith("treeverse/lakefs:")
    assert lakefs["command"] == "run --config /etc/lakefs/config.yaml"
    assert "./docker/lakefs.yaml:/etc/lakefs/config.yaml:ro" in lakefs["volumes"]
    assert env["LAKEFS_BLOCKSTORE_TYPE"] == "s3" and env["LAKEFS_BLOCKSTORE_S3_ENDPOINT"] == "http://minio:9000"
    assert env["LAKEFS_BLOCKSTORE_S3_FORCE_PATH_STYLE"] == "true"
    assert config["database"]["type"] == "local"
    # the installation user's keys are the very variables helpers.settings reads for the client
    assert env["LAKEFS_INSTALLATION_ACCESS_KEY_ID"].startswith("${LAKEFS_ACCESS_KEY_ID")
    assert env["LAKEFS_INSTALLATION_SECRET_ACCESS_KEY"].startswith("${LAKEFS_SECRET_ACCESS_KEY")
    assert {"LAKEFS_ACCESS_KEY_ID", "LAKEFS_SECRET_ACCESS_KEY"} <= set(ENV_NAMES["lakefs_access_key"]) | set(
        ENV_NAMES["lakefs_secret_key"])
    assert lakefs["depends_on"] == {"minio-init": {"condition": "service_completed_successfully"}}
    assert "api/v1/healthcheck" in " ".join(lakefs["healthcheck"]["test"])


def test_lakefs_keeps_its_database_where_its_non_root_user_may_write(compose):
    """The image runs as `lakefs` with home /home/lakefs: a named volume there inherits that ownership.

    A mount point missing from the image is created root-owned, lakeFS can't write its KV database,
    exits, and everything that waits for its health check never starts.
    """
    mounts = dict(reversed(volume.split(":", 1)[0:2]) for volume in compose["services"]["lakefs"]["volumes"]
                  if not volume.startswith("./"))
    assert mounts == {"/home/lakefs": "lakefs-data"}
    database = Path(lakefs_config()["database"]["local"]["path"])
    assert Path("/home/lakefs") in database.parents, "the database lives on the volume"


def test_lakefs_makes_no_calls_home(compose, tmp_path):
    config, env = lakefs_config(), compose["services"]["lakefs"]["environment"]
    assert config["stats"]["enabled"] is False
    assert config["security"] == {"audit_check_url": "", "check_latest_version": False}
    # lakeFS reads an empty variable as unset (the default URL would be used): never rely on one
    assert not [name for name, value in env.items() if value in ("", None)], "empty LAKEFS_* variables do nothing"
    from workshop import lakefs_service

    keys = dict.fromkeys(("encrypt_secret", "access_key_id", "secret_access_key"), "k")
    (tmp_path / "lakefs").mkdir()
    embedded = yaml.safe_load(lakefs_service.config(tmp_path, {"lakefs": 1, "s3": 2}, "a", "s", keys).read_text())
    assert (embedded["stats"], embedded["security"]) == (config["stats"], config["security"]), "both stacks agree"


def test_minio_images_come_from_quay_not_the_withdrawn_docker_hub_repositories(compose):
    for name in ("minio", "minio-init"):
        image = compose["services"][name]["image"]
        assert image.startswith("quay.io/minio/"), f"{name}: {image}"
    assert not [s["image"] for s in compose["services"].values() if s["image"].startswith("minio/")]


def test_jupyter_image_has_cpu_torch_from_the_lock_and_a_non_root_user(compose):
    from workshop import install

    dockerfile = (ROOT / "docker" / "jupyter.Dockerfile").read_text()
    # CPU wheels by default; a GPU image is the same file built with the whole lock (deploy/kuberay/README.md)
    assert re.search(r"^ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu$", dockerfile, re.M)
    assert re.search(r"^COPY requirements\.lock ", dockerfile, re.M) and "requirements.txt" not in dockerfile
    assert 'python -m workshop.install ${TORCH_INDEX_URL:+--torch-from "$TORCH_INDEX_URL"}' in dockerfile
    # what --torch-from installs with hashes: the whole lock but PyPI's torch, torchvision and their GPU libraries
    rest = install.without_torch(ROOT / "requirements.lock")
    names = {line.split("==")[0] for line in rest.splitlines() if line and not line[0].isspace()}
    locked = set(install.lock_entries(ROOT / "requirements.lock"))
    left_out = locked - names
    assert {"torch", "torchvision", "triton"} <= left_out and any(n.startswith("nvidia-") for n in left_out)
    assert all(n in install.TORCH or install.CUDA_PACKAGES.match(n) for n in left_out), left_out
    assert rest.count("--hash=sha256:") > len(names), "every entry kept with its hashes"
    users = re.findall(r"^USER\s+(\S+)", dockerfile, re.M)
    assert users and users[-1] not in ("root", "0")
    assert "--allow-root" not in compose["services"]["jupyter"]["command"]
    assert compose["services"]["jupyter"]["environment"]["JUPYTER_TOKEN"].startswith("${JUPYTER_TOKEN:?")


def test_dockerignore_keeps_environments_state_and_secrets_out_of_the_build():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".venv", ".stack", "runs", ".env", "credentials.json"} <= ignored
    for needed in ("requirements.txt", "pyproject.toml", "README.md", "helpers"):
        assert needed not in ignored and (ROOT / needed).exists()


def test_every_variable_compose_reads_is_documented_in_env_example():
    text = (ROOT / "docker-compose.yml").read_text()
    used = set(re.findall(r"\$\{(\w+)", text))
    assert used <= set(dotenv_values(ROOT / ".env.example")), used - set(dotenv_values(ROOT / ".env.example"))


def test_mlflow_proxies_artifacts_and_allows_its_service_name(compose):
    command = compose["services"]["mlflow"]["command"]
    assert "--artifacts-destination s3://mlflow" in command
    assert "--no-serve-artifacts" not in command
    assert "--allowed-hosts" in command and "mlflow:5000" in command
    # as the embedded stack's: no job runner (GenAI scorer jobs, unused here)
    assert compose["services"]["mlflow"]["environment"]["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"


def test_jupyter_environment_is_what_helpers_config_reads(compose):
    jupyter = compose["services"]["jupyter"]
    assert jupyter["shm_size"]
    unknown = set(jupyter["environment"]) - {"JUPYTER_TOKEN"} - RAY_AUTH_ENV - KNOWN_ENV
    assert not unknown, unknown
    assert {"S3_ENDPOINT", "S3_ACCESS_KEY", "S3_SECRET_KEY", "MLFLOW_TRACKING_URI", "LAKEFS_ENDPOINT",
            "LAKEFS_ACCESS_KEY_ID", "LAKEFS_SECRET_ACCESS_KEY"} <= set(jupyter["environment"])
    assert jupyter["environment"]["LAKEFS_ENDPOINT"] == "http://lakefs:8000"
    assert jupyter["depends_on"]["lakefs"] == {"condition": "service_healthy"}


def test_env_example_documents_only_known_variables():
    example = dotenv_values(ROOT / ".env.example")
    compose_only = {"MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD", "LAKEFS_AUTH_ENCRYPT_SECRET_KEY", "RAY_HEAD_CPUS",
                    "RAY_WORKER_CPUS", "JUPYTER_TOKEN", "MLFLOW_FLASK_SERVER_SECRET_KEY", "RAY_AUTH_TOKEN"}
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


def test_one_lakefs_version_everywhere(compose):
    """Compose's server, the binary `make run` fetches and the SDK (whose API the double follows) agree."""
    import lakefs_sdk

    from workshop import lakefs_binary

    tag = compose["services"]["lakefs"]["image"].rsplit(":", 1)[1]
    pinned = re.search(r"^lakefs-sdk==(\S+)", (ROOT / "requirements.txt").read_text(), re.M)
    assert pinned and tag == lakefs_binary.LAKEFS_VERSION == pinned.group(1) == lakefs_sdk.__version__


def _secrets_check(compose, environment: dict[str, str]) -> subprocess.CompletedProcess:
    """Run the check-secrets service's own shell command (compose's $$ unescaped) with ``environment``."""
    command = compose["services"]["check-secrets"]["entrypoint"].replace("$$", "$")
    assert command.startswith("/bin/sh -c '") and command.rstrip().endswith("'")
    script = command.strip()[len("/bin/sh -c '"):-1]
    return subprocess.run(["/bin/sh", "-c", script], env=environment, capture_output=True, text=True, timeout=10)


def test_compose_refuses_the_placeholder_secrets_of_env_example(compose):
    service = compose["services"]["check-secrets"]
    placeholders = {k: v for k, v in dotenv_values(ROOT / ".env.example").items() if v}
    checked = set(service["environment"])
    assert {k for k, v in placeholders.items() if "change" in v.lower()} - {"S3_ACCESS_KEY", "S3_SECRET_KEY"} \
        <= checked, "every placeholder secret compose reads is checked"
    refused = _secrets_check(compose, placeholders)
    assert refused.returncode == 1
    assert refused.stdout.strip().startswith("MINIO_ROOT_USER in .env is still the placeholder")
    own = {name: f"a-real-value-{i}" for i, name in enumerate(checked)}
    assert _secrets_check(compose, own).returncode == 0
    for name in checked:  # each one alone is caught
        result = _secrets_check(compose, {**own, name: placeholders[name]})
        assert result.returncode == 1 and result.stdout.startswith(f"{name} in .env")
    # nothing starts before the check passed: minio waits for it, everything else waits for minio
    assert compose["services"]["minio"]["depends_on"]["check-secrets"]["condition"] == \
        "service_completed_successfully"


CLIENTS = ("jupyter", "ray-head", "ray-worker")  # every process that talks to MLflow or joins Ray


def test_mlflow_runs_basic_auth_with_its_admin_from_env(compose):
    mlflow = compose["services"]["mlflow"]
    env = mlflow["environment"]
    assert "--app-name basic-auth" in mlflow["command"]
    # the server's admin is the very user every client signs in with
    assert env["MLFLOW_AUTH_ADMIN_USERNAME"].startswith("${MLFLOW_TRACKING_USERNAME:?")
    assert env["MLFLOW_AUTH_ADMIN_PASSWORD"].startswith("${MLFLOW_TRACKING_PASSWORD:?")
    assert env["MLFLOW_FLASK_SERVER_SECRET_KEY"].startswith("${MLFLOW_FLASK_SERVER_SECRET_KEY:?")
    for name in CLIENTS:
        client = compose["services"][name]["environment"]
        assert client["MLFLOW_TRACKING_URI"] == "http://mlflow:5000", name
        assert client["MLFLOW_TRACKING_USERNAME"] == env["MLFLOW_AUTH_ADMIN_USERNAME"], name
        assert client["MLFLOW_TRACKING_PASSWORD"] == env["MLFLOW_AUTH_ADMIN_PASSWORD"], name


def test_mlflow_image_has_the_auth_app_and_a_closed_default_permission():
    import configparser

    dockerfile = (ROOT / "docker" / "mlflow.Dockerfile").read_text()
    requirements = (ROOT / "requirements.txt").read_text()
    for package in ("mlflow", "Flask-WTF", "WTForms", "boto3"):  # the same versions as the notebooks' client
        pinned = re.search(rf"^{package}==(\S+)", requirements, re.M)
        assert pinned and re.search(rf"\b{package}(\[auth\])?==({re.escape(pinned.group(1))})\b", dockerfile), package
    assert '"mlflow[auth]==' in dockerfile, "the auth extra: Flask-WTF for the basic-auth app's forms"
    copied = re.search(r"^COPY (\S+) (\S+)$", dockerfile, re.M)
    assert copied and re.search(rf"^ENV MLFLOW_AUTH_CONFIG_PATH={re.escape(copied.group(2))}$", dockerfile, re.M)
    config = configparser.ConfigParser()
    assert config.read(ROOT / copied.group(1))
    section = config["mlflow"]
    assert section["default_permission"] == "NO_PERMISSIONS"
    assert section["database_uri"].startswith("sqlite:////mlflow/"), "on the mlflow-db volume, beside mlflow.db"
    assert not {"admin_username", "admin_password"} & set(section), "the admin comes from the environment"


def test_mlflow_health_check_needs_no_login(compose):
    from mlflow.server.auth import is_unprotected_route

    test = " ".join(compose["services"]["mlflow"]["healthcheck"]["test"])
    path = re.search(r"http://localhost:5000(/\S*?)'", test).group(1)
    assert path == "/health" and is_unprotected_route(path), "basic auth would answer 401 to the health check"
    assert not is_unprotected_route("/api/2.0/mlflow/experiments/search")


def test_ray_nodes_and_jupyter_use_token_authentication(compose):
    for name in CLIENTS:
        env = compose["services"][name]["environment"]
        assert env["RAY_AUTH_MODE"] == "token", name
        assert env["RAY_AUTH_TOKEN"] == "${RAY_AUTH_TOKEN:?set RAY_AUTH_TOKEN in .env}", name
    # Ray's health endpoints answer without the token, so the head's health check keeps working
    assert "/api/gcs_healthz" in " ".join(compose["services"]["ray-head"]["healthcheck"]["test"])


def test_no_secret_reaches_a_command_line(compose):
    """Secrets travel in the environment: a value in `command:` would show in `ps` and `docker inspect`."""
    secrets = {name for name, value in dotenv_values(ROOT / ".env.example").items() if value and "change" in value}
    secrets |= {"RAY_AUTH_TOKEN", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY", "JUPYTER_TOKEN"}
    for name, service in compose["services"].items():
        for field in ("command", "entrypoint"):
            line = service.get(field, "")
            line = " ".join(line) if isinstance(line, list) else line
            interpolated = set(re.findall(r"(?<!\$)\$\{(\w+)", line))  # ${X}: compose writes the value in
            assert not interpolated & secrets, f"{name}.{field}: {interpolated & secrets}"
            assert not re.search(r"--(token|password|secret)", line), f"{name}.{field}"

