import json
from pathlib import Path

import pytest

from helpers.settings import Settings, SettingsError, load_settings


@pytest.fixture
def root(tmp_path):
    (tmp_path / "stack").mkdir()
    return tmp_path


def write_stack_env(root, **values):
    (root / "stack" / "stack.env").write_text("\n".join(f"{k}={v}" for k, v in values.items()))


def load(root, environ=None):
    return load_settings(environ=environ or {}, root=root, stack_state=root / "stack")


def test_precedence_environment_then_dotenv_then_credentials_then_stack(root):
    write_stack_env(root, S3_ENDPOINT="http://127.0.0.1:1", S3_ACCESS_KEY="stack-key", S3_SECRET_KEY="stack-secret",
                    MLFLOW_TRACKING_URI="http://127.0.0.1:2")
    assert load(root).s3_endpoint == "http://127.0.0.1:1"
    assert load(root).sources["s3_endpoint"] == "stack:S3_ENDPOINT"

    (root / "credentials.json").write_text(json.dumps({"url": "cred-host:9000", "accessKey": "ck", "secretKey": "cs"}))
    s = load(root)
    assert (s.s3_host, s.s3_access_key, s.s3_secret_key) == ("cred-host:9000", "ck", "cs")
    assert s.mlflow_tracking_uri == "http://127.0.0.1:2"  # still from the stack

    (root / ".env").write_text("S3_ENDPOINT=http://dotenv-host:9000\nMLFLOW_TRACKING_URI=http://dotenv:5000\n")
    s = load(root)
    assert s.s3_endpoint == "http://dotenv-host:9000" and s.s3_access_key == "ck"
    assert s.mlflow_tracking_uri == "http://dotenv:5000"

    s = load(root, {"S3_ENDPOINT": "http://env-host:9000", "RAY_ADDRESS": "ray://head:10001"})
    assert s.s3_endpoint == "http://env-host:9000" and s.ray_address == "ray://head:10001"
    assert s.sources["s3_endpoint"] == "environment:S3_ENDPOINT"


def test_seed_variable_names_are_accepted(root):
    s = load(root, {"MINIO_URL": "localhost:9000", "MINIO_ACCESS_KEY": "a", "MINIO_SECRET_ACCESS_KEY": "b"})
    assert s.s3_host == "localhost:9000"
    assert s.s3_url == "http://localhost:9000"
    assert (s.s3_access_key, s.s3_secret_key) == ("a", "b")


def test_https_endpoint_is_secure_and_flag_parsed(root):
    assert load(root, {"S3_ENDPOINT": "https://s3.example:443"}).s3_secure is True
    assert load(root, {"S3_ENDPOINT": "h:1", "S3_SECURE": "yes"}).s3_url == "https://h:1"
    with pytest.raises(SettingsError, match="S3_SECURE"):
        load(root, {"S3_SECURE": "maybe"})


def test_secrets_never_in_repr_or_description(root):
    s = load(root, {"S3_ENDPOINT": "h:1", "S3_ACCESS_KEY": "AK-visible?", "S3_SECRET_KEY": "top-secret-value",
                    "LAKEFS_SECRET_ACCESS_KEY": "lake-secret"})
    text = repr(s) + str(s) + json.dumps(s.describe())
    for secret in ("AK-visible?", "top-secret-value", "lake-secret"):
        assert secret not in text
    assert s.describe()["s3_secret_key"].startswith("****")


def test_missing_object_store_names_the_fix():
    with pytest.raises(SettingsError, match="workshop.stack up"):
        Settings().require_object_store()


def test_bad_credentials_json_is_one_clear_error(root):
    (root / "credentials.json").write_text("{not json")
    with pytest.raises(SettingsError, match="credentials.json is not valid JSON .*: line 1 column 2"):
        load(root)


def test_credentials_json_next_to_the_notebook_is_read_and_a_truncated_one_named(root, tmp_path, monkeypatch):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    monkeypatch.chdir(notebooks)  # a notebook runs in its own folder
    (notebooks / "credentials.json").write_text(json.dumps({"url": "nb-host:9000", "accessKey": "k", "secretKey": "s"}))
    settings = load(root)
    assert settings.s3_endpoint == "nb-host:9000" and settings.sources["s3_endpoint"] == "credentials.json:MINIO_URL"
    (notebooks / "credentials.json").write_text('{"url": "nb-host:9000",\n "accessKey": "k", "secr')  # cut short
    with pytest.raises(SettingsError) as err:
        load(root)
    assert str(err.value).startswith("notebooks/credentials.json is not valid JSON")  # named from the project root
    assert "line 2 column" in str(err.value) and "delete it to use the embedded stack" in str(err.value)


def test_a_notebook_with_a_truncated_credentials_json_beside_it_stops_in_one_line(tmp_path):
    import shutil

    from workshop import runner

    notebook = shutil.copy(runner.notebook_paths(pattern="02_*.ipynb")[0], tmp_path)
    (tmp_path / "credentials.json").write_text('{"url": "http://127.0.0.1:9000", "accessKey": ')
    result = runner.execute(Path(notebook), tmp_path / "out.ipynb")
    assert result.status == "failed", result.message
    assert result.message.startswith(f"SettingsError: {tmp_path / 'credentials.json'} is not valid JSON")
