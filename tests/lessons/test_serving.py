"""Notebooks 07 and 08: 07 runs first and alone (no model anywhere: it trains one with 04 first) and its Parquet
accuracy is the model's; 08 runs alone after it, on 07's bucket and the day's model 04 trained, and registers it;
08's answers equal 07's Parquet predictions and carry the registry's lineage; a roll to another version under load
sees no error; bad input is a 400 and one line. The two share the one training run, as a learner's day does."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import requests

from helpers import champion_candidates, cluster, listing, serving_support, storage, upload
from tests.suite.notebook_runs import load_test_images, solution_output
from workshop import runner

pytestmark = pytest.mark.notebook  # runs notebooks end to end: not in make test-quick

SMOKE = 600  # 600 training, 1,000 validation and 2,000 test images: the learners' smoke size


@pytest.fixture(scope="module")
def predicted(client, settings, tmp_path_factory):
    """Notebook 07 run first and alone (with every solution): no model in its registry or experiments yet."""
    import pyarrow.parquet as pq

    from tests.suite.notebook_runs import run

    suffix = uuid.uuid4().hex[:8]
    bucket = f"t-serve-{suffix}"
    folder = tmp_path_factory.mktemp("predicted")
    try:
        facts = run("07", folder, bucket=bucket, smoke_test_size=SMOKE, registered_model=f"t-none-{suffix}",
                    sweep_experiment=f"t-07-none-{suffix}", training_experiment=f"t-serve-train-{suffix}",
                    experiment=f"t-07-{suffix}")
        parquet = pq.read_table(facts["predictions"].removeprefix("s3://"), filesystem=storage.s3_filesystem(settings))
        yield SimpleNamespace(bucket=bucket, suffix=suffix, facts=facts, parquet=parquet,
                              output=folder / "07_batch_inference.ipynb", training_experiment=f"t-serve-train-{suffix}")
    finally:
        storage.delete_bucket(client, bucket)


@pytest.fixture(scope="module")
def served(predicted, settings, tmp_path_factory):
    """Notebook 08 run alone after 07 (with every solution), then the deployment it teaches, serving its champion.

    A registry name of its own, and 07's bucket and training experiment: 08 finds the day's model 04 trained for
    07, registers it, and needs no training of its own.
    """
    from mlflow.tracking import MlflowClient
    from ray import serve

    from helpers.serving import DigitClassifier, model_lineage, resolve_alias
    from tests.suite.notebook_runs import default_mlflow_stores, summary

    bucket, name = predicted.bucket, f"t-serve-{predicted.suffix}"
    notebook = runner.notebook_paths(pattern="08*.ipynb")[0]
    output = tmp_path_factory.mktemp("served") / notebook.name
    result = runner.execute(notebook, output, {"bucket": bucket, "smoke_test_size": SMOKE, "registered_model": name,
                                               "training_experiment": predicted.training_experiment,
                                               "sweep_experiment": f"t-serve-none-{predicted.suffix}"},
                            solutions=True)
    assert result.status == "ok", result.message
    assert not default_mlflow_stores(), "an MLflow call without a tracking URI made a store in the checkout"
    mlflow_client = MlflowClient(settings.mlflow_tracking_uri)
    version, model_uri = resolve_alias(mlflow_client, name)
    cluster.init_ray(settings)
    port = serving_support.http_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    config = {"model_uri": model_uri, "lineage": model_lineage(mlflow_client, name, version), "max_batch_size": 8,
              "batch_wait_timeout_s": 0.01, "key_digest": serving_support.key_digest(serving_support.api_key())}
    serve.run(DigitClassifier.options(user_config=config).bind(), name="t-serve", route_prefix="/t-serve")
    try:
        yield SimpleNamespace(bucket=bucket, name=name, version=version, facts=summary(output), config=config,
                              url=f"http://127.0.0.1:{port}/t-serve", mlflow=mlflow_client, output=output,
                              deployment=DigitClassifier, training_experiment=predicted.training_experiment)
    finally:
        serve.shutdown()
        cluster.shutdown_ray()


def png_bodies(bucket: str, keys: list[str]) -> list[bytes]:
    """Each key's object as the JSON body notebook 08 sends."""
    client = storage.get_client()
    return [json.dumps({"image": serving_support.to_base64(storage.read_object(client, bucket, key))}).encode()
            for key in keys]


def test_07_runs_first_and_alone_and_the_parquet_accuracy_is_the_model_s(predicted, settings, client):
    """No model anywhere (a registry name and experiment nobody used): 07 trains one with 04 first, then predicts."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from helpers import training

    bucket, suffix, facts = predicted.bucket, predicted.suffix, predicted.facts
    # 04 ran first, headless; its model, the best of the day, became the champion by notebook 06's rule
    assert facts["model source"] == f"t-none-{suffix} version 1 (@champion, registered by notebook 07)"
    assert not catch_up_copies(suffix), "04's executed copy is removed once it ran to the end"
    # the predictions are in the bucket under the run's prefix, and the MLflow run names that prefix
    run_tags = MlflowClient(settings.mlflow_tracking_uri).get_run(facts["MLflow run id"]).data.tags
    assert run_tags["predictions"] == facts["predictions"] and run_tags["model_uri"] == facts["model"]
    prefix = facts["predictions"].removeprefix(f"s3://{bucket}/")
    files = [o.object_name for o in client.list_objects(bucket, prefix=prefix, recursive=True)
             if not o.object_name.endswith("/")]  # pyarrow leaves a folder marker
    assert files[-1] == f"{prefix}_SUCCESS" and all(name.endswith(".parquet") for name in files[:-1])
    table = predicted.parquet
    assert table.column_names == ["key", "label", "predicted", "confidence"] and table.num_rows == 2000
    parquet_accuracy = float((table["label"].to_numpy() == table["predicted"].to_numpy()).mean())
    # the same model, recomputed here on the same test images without Ray
    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
    images, labels = load_test_images(bucket, 2000)
    import torch

    with torch.no_grad():
        predicted_digits = mlflow.pytorch.load_model(facts["model"])(torch.as_tensor(images)).argmax(dim=1).numpy()
    recomputed = training.accuracy(predicted_digits, labels)
    assert parquet_accuracy == recomputed and round(recomputed, 4) == facts["test_accuracy from the Parquet"]
    assert facts["recorded test_accuracy"] == facts["test_accuracy from the Parquet"]  # what notebook 04 logged
    assert sorted(table["key"].to_pylist()) == sorted(listing.get_train_test_data(bucket, SMOKE, "manifest")[2])
    assert facts["driver predictions equal"] is True and facts["wrong"] == round((1 - recomputed) * 2000)
    # exercise 3: on the images it trained on (no validation image among them), the model does better
    by_split = ast.literal_eval(solution_output(predicted.output, 3).strip())
    assert set(by_split) == {"train", "test"} and by_split["train"] > by_split["test"], by_split


def test_08_runs_after_07_registers_a_champion_and_rolls_there_and_back_without_an_error(served):
    facts = served.facts
    assert facts["model version"] == "1" and facts["model"] == f"models:/{served.name}/1"  # 04's model, registered
    assert served.mlflow.get_model_version(served.name, "1").tags["registered_by"] == "notebook 08"
    assert facts["images answered"] == 500 and 0.2 < facts["served accuracy"] <= 1.0  # the first 500; chance: 0.1
    # alone, the only candidate is the champion's own model as a new version: the rule lets it through, the canary
    # shares the requests between the two versions, then the whole goes to version 2, all without an error
    assert facts["versions refused by the rule"] == [] and facts["other version"] == "2"
    assert facts["errors during the canary"] == 0 and facts["versions during the canary"] == ["1", "2"]
    assert facts["errors during the roll"] == 0 and facts["errors during the rollback"] == 0
    assert facts["versions during the roll"] in (["1", "2"], ["2"])
    assert facts["champion at the end"] == "1", "the registry is left as the notebook found it"
    assert facts["aliases at the end"] == ["champion"], "the roll's @challenger is removed"
    assert served.mlflow.get_registered_model(served.name).aliases == {"champion": "1"}
    cells = json.loads(served.output.read_text())["cells"]
    said = "".join("".join(o.get("text", "")) for c in cells for o in c.get("outputs", []))
    assert "into the whole on, every answer came from version 2" in said
    for phase in ("before the roll", "the canary", "the whole", "the rollback"):  # latency and answers/s of each
        line = next(line for line in said.splitlines() if line.startswith(f"{phase}: "))
        assert " 0 errors, p50 " in line and " answers/s; answers by version: " in line, line
    assert serving_support.api_key() not in json.dumps(cells), "the endpoint's key is in no output"


def test_the_http_answers_equal_07_s_parquet_predictions_for_the_same_keys(served, predicted):
    """The same model (04's run, registered by 07 and by 08) answers over HTTP what 07 wrote to Parquet."""
    assert served.mlflow.get_model_version(served.name, served.version).run_id == \
        served.mlflow.get_model_version(f"t-none-{predicted.suffix}", "1").run_id
    parquet = predicted.parquet.to_pandas().set_index("key")
    keys = sorted(parquet.index)[:500]
    bodies = png_bodies(served.bucket, keys)
    load = serving_support.send_load(served.url, bodies, clients=4, requests_per_client=-(-len(keys) // 4))
    answers = serving_support.answers_by_body(load)
    assert load.errors == [] and len(answers) == len(keys)
    http = {key: answers[body] for key, body in zip(keys, bodies, strict=True)}
    assert {key: a["digit"] for key, a in http.items()} == parquet.loc[keys, "predicted"].astype(int).to_dict()
    assert np.allclose([http[key]["confidence"] for key in keys], parquet.loc[keys, "confidence"], atol=1e-4)


def test_every_answer_s_lineage_headers_equal_the_registry_s(served):
    version = served.mlflow.get_model_version(served.name, served.version)
    run = served.mlflow.get_run(version.run_id)
    _, _, keys, _, _ = listing.get_train_test_data(served.bucket, SMOKE, "manifest")
    answer = requests.post(served.url, data=png_bodies(served.bucket, keys[:1])[0],
                           headers=serving_support.auth_headers(), timeout=30)
    assert answer.status_code == 200
    expected = {"X-Model-Version": served.version, "X-MLflow-Run-Id": version.run_id,
                "X-Data-Commit": run.data.tags.get("lakefs.data_commit", "none"),
                "X-Git-Commit": run.data.tags["mlflow.source.git.commit"]}
    assert {header: answer.headers[header] for header in expected} == expected
    body = answer.json()
    assert (body["model_version"], body["mlflow_run_id"], body["git_commit"]) == \
        (served.version, version.run_id, expected["X-Git-Commit"])


def test_without_lakefs_the_champion_rule_crowns_the_best_of_the_day_and_a_tie_keeps_the_champion(served, settings):
    """A leftover champion (an untrained network, as a first smoke model may be) gives way to notebook 04's model,
    clearly better on the validation images by the paired test; run again, the rule finds a tie and moves nothing."""
    import mlflow

    from helpers import training
    from helpers.champion_candidates import ModelChoice
    from helpers.inference import champion_model, hold_champion_rule, validation_images

    name, none = f"t-rule-{uuid.uuid4().hex[:8]}", f"t-rule-none-{uuid.uuid4().hex[:8]}"
    images, labels = validation_images(served.bucket, SMOKE, settings)
    assert len(labels) == 1000
    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
    with mlflow.start_run(experiment_id=served.mlflow.create_experiment(name)):
        leftover = training.log_torch_model(training.build_model("mlp", [32]), images[:5]).model_uri
    serving_support.register_as(served.mlflow, name, ModelChoice(leftover, "an untrained network"), "champion")
    said = hold_champion_rule(served.mlflow, name, served.bucket, SMOKE, "notebook 07", served.training_experiment,
                              none, settings=settings)
    assert said.startswith("@champion is now version 2, registered by notebook 07: the best of the day"), said
    assert said.endswith("better beyond noise"), said  # the paired test's numbers, against the champion before it
    champion = champion_model(served.mlflow, name)
    assert champion.source == f"{name} version 2 (@champion, registered by notebook 07)"
    day = champion_candidates.day_models(served.mlflow, served.training_experiment, none)
    predicted = champion_candidates.predictions({**day, "champion": champion}, images)
    assert training.accuracy(predicted["champion"], labels) >= training.accuracy(predicted["notebook 04"], labels)
    again = hold_champion_rule(served.mlflow, name, served.bucket, SMOKE, "notebook 08", served.training_experiment,
                               none, settings=settings)
    assert again.startswith(f"@champion stays {name} version 2") and again.endswith(
        "(0 disagreements in 1,000 images): McNemar's exact p = 1, a tie"), again  # the same model: no disagreement
    assert served.mlflow.get_model_version_by_alias(name, "champion").version == "2"


def test_a_roll_to_another_version_under_sixteen_clients_sees_no_error(served):
    from ray import serve

    from helpers.serving import model_lineage

    other = next(serving_support.roll_candidates(served.mlflow, served.name, served.version, "unused", "unused"))
    bodies = png_bodies(served.bucket, listing.get_train_test_data(served.bucket, SMOKE, "manifest")[2][:20])

    def roll(version: str) -> None:
        config = {**served.config, "model_uri": f"models:/{served.name}/{version}",
                  "lineage": model_lineage(served.mlflow, served.name, version)}
        serve.run(served.deployment.options(user_config=config).bind(), name="t-serve", route_prefix="/t-serve")

    there = serving_support.send_load(served.url, bodies, clients=16, seconds=5, settle=2,
                                      during=lambda: roll(other.version))
    back = serving_support.send_load(served.url, bodies, clients=16, seconds=5, during=lambda: roll(served.version))
    assert there.errors == [] and back.errors == []
    assert set(serving_support.count_by_version(there)) == {served.version, other.version}
    after_the_roll = [version for began, version in there.versions if began > there.during_ended]
    assert after_the_roll and set(after_the_roll) == {other.version}, "once serve.run returned, only the new version"


def test_an_interrupt_during_a_roll_puts_the_champion_back_and_says_so_in_one_line(served):
    import _thread

    from ray import serve

    from helpers import interrupts
    from helpers.serving import model_lineage

    other = next(serving_support.roll_candidates(served.mlflow, served.name, served.version, "unused", "unused"))
    served.mlflow.set_registered_model_alias(served.name, "challenger", other.version)
    bodies = png_bodies(served.bucket, listing.get_train_test_data(served.bucket, SMOKE, "manifest")[2][:10])

    def deploy(version: str) -> None:
        config = {**served.config, "model_uri": f"models:/{served.name}/{version}",
                  "lineage": model_lineage(served.mlflow, served.name, version)}
        serve.run(served.deployment.options(user_config=config).bind(), name="t-serve", route_prefix="/t-serve")

    def roll_back() -> str:  # notebook 08's
        deploy(served.version)
        served.mlflow.delete_registered_model_alias(served.name, "challenger")
        return f"back on version {served.version}"

    def roll_then_press_interrupt() -> None:  # the learner presses Interrupt once the new version answers
        deploy(other.version)
        _thread.interrupt_main()
        time.sleep(5)

    guard = serving_support.rolled_back_if_stopped("The roll", roll_back)
    with pytest.raises(interrupts.Interrupted) as stopped, guard:
        serving_support.send_load(served.url, bodies, clients=4, seconds=30, during=roll_then_press_interrupt)
    assert str(stopped.value) == f"The roll stopped: you interrupted it. back on version {served.version}"
    after = serving_support.send_load(served.url, bodies, clients=2, requests_per_client=5)
    assert after.errors == [] and set(serving_support.count_by_version(after)) == {served.version}
    assert served.mlflow.get_registered_model(served.name).aliases == {"champion": served.version}


def test_an_error_during_a_roll_puts_the_champion_back_and_is_raised_as_it_was():
    events = []
    with pytest.raises(ValueError, match="a failed deployment"), \
            serving_support.rolled_back_if_stopped("The roll", lambda: events.append("rolled back") or "back"):
        raise ValueError("a failed deployment")
    assert events == ["rolled back"]


def png_header_only(width: int, height: int) -> str:
    """A PNG that declares ``width`` x ``height`` and holds no pixel data, base64: decoding it would fail."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale
    return serving_support.to_base64(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b""))


def as_body(image: str) -> bytes:
    return json.dumps({"image": image}).encode()


def gif_28x28() -> str:
    from PIL import Image

    out = io.BytesIO()
    Image.new("L", (28, 28)).save(out, format="GIF")
    return serving_support.to_base64(out.getvalue())


BAD_BODIES = {
    "an empty body": (b"", "The request has no body."),
    "not JSON": (b"\x89PNG\r\n", "The body is not JSON."),
    "neither field": (b'{"digit": 3}', 'The JSON has neither "image" nor "pixels".'),
    "not an image": (b'{"image": "aGVsbG8="}', '"image" is not a base64 PNG or JPEG.'),
    "not base64": (b'{"image": "%%%"}', '"image" is not a base64 PNG or JPEG.'),
    "the wrong size": (json.dumps({"image": serving_support.blank_png(32)}).encode(),
                       "The image is 32x32 pixels, not 28x28."),
    "783 pixels": (json.dumps({"pixels": [0] * 783}).encode(), '"pixels" holds 783 values, not 784 (28x28).'),
    "a pixel of 300": (json.dumps({"pixels": [300] + [0] * 783}).encode(), '"pixels" must be from 0 to 255.'),
    "words for pixels": (b'{"pixels": ["a", "b"]}', '"pixels" must be numbers.'),
    # each of these answered 500 Internal Server Error from inside the parser
    "JSON nested too deeply": (b"[" * 50_000 + b"]" * 50_000, "The JSON is nested too deeply."),
    "an integer no float holds": (b'{"pixels": [' + b"9" * 400 + b"]}", '"pixels" must be numbers.'),
    "an image far too large to decode": (as_body(png_header_only(20_000, 20_000)),
                                         "The image is far larger than 28x28 pixels."),
    # the declared size is refused before any pixel is decoded (decoding this one would fail: no data)
    "a 5000x5000 header": (as_body(png_header_only(5000, 5000)), "The image is 5000x5000 pixels, not 28x28."),
    "a GIF": (as_body(gif_28x28()), '"image" is not a base64 PNG or JPEG.'),
    "784 pixels nested three deep": (json.dumps({"pixels": [[[0]] * 28] * 28}).encode(), '"pixels" is nested 3 deep'),
}


@pytest.mark.parametrize("what", list(BAD_BODIES))
def test_bad_input_is_a_400_with_one_line_that_says_what_to_send(served, what):
    body, reason = BAD_BODIES[what]
    answer = requests.post(served.url, data=body, headers=serving_support.auth_headers(), timeout=30)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error.startswith(reason) and "\n" not in error and "Send JSON" in error


def test_784_pixels_are_answered_as_the_png_is(served):
    image = upload.load_mnist().split("test")[0][0]
    by_pixels = requests.post(served.url, json={"pixels": image.ravel().tolist()},
                              headers=serving_support.auth_headers(), timeout=30)
    by_png = requests.post(served.url, json={"image": serving_support.to_base64(upload.encode_image(image, "png"))},
                           headers=serving_support.auth_headers(), timeout=30)
    assert by_pixels.status_code == by_png.status_code == 200 and by_pixels.json() == by_png.json()


@pytest.mark.parametrize("authorization", [None, "Bearer wrong-key", "Basic dXNlcjpwYXNz", "Bearer"])
def test_a_request_without_the_endpoint_s_key_is_refused(served, authorization):
    headers = {"Authorization": authorization} if authorization else {}
    answer = requests.post(served.url, json={"pixels": [0] * 784}, headers=headers, timeout=30)
    assert answer.status_code == 401 and "digit" not in answer.text


def test_the_endpoint_s_key_goes_only_to_a_port_serve_s_proxy_holds(served):
    """Between choosing Serve's port and its proxy binding it, any user may bind the port: notebook 08 checks, before
    its first request, that the port is this Ray's own, and stops in one line where it is not. Nothing is sent."""
    from helpers.serving_support import ServePortTaken
    from tests.platform.room_intruder import waiting_at_a_door

    serving_support.check_serve_port(int(served.url.rsplit(":", 1)[1].split("/")[0]))  # Serve's own: nothing said
    with waiting_at_a_door() as (port, heard), pytest.raises(ServePortTaken, match=f"Port {port} is held by another"):
        serving_support.check_serve_port(port)
    assert heard == []


def test_the_endpoint_s_key_is_private_to_its_user_and_curl_reads_it_from_a_file():
    import stat

    from helpers.settings import state_dir

    key = serving_support.api_key()
    for path in (state_dir() / serving_support.KEY_FILE, serving_support.curl_header_file()):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert serving_support.curl_header_file().read_text() == f"Authorization: Bearer {key}\n"
    assert serving_support.authorized(f"Bearer {key}", serving_support.key_digest(key))
    assert not serving_support.authorized(f"Bearer {key}x", serving_support.key_digest(key))


def catch_up_copies(suffix: str) -> list[Path]:
    """The executed copies of notebook 04 that a catch-up run for this test left in the temporary folder."""
    found = []
    for copy in Path(tempfile.gettempdir()).glob("catch-up-04-*/*.ipynb"):
        with contextlib.suppress(OSError, ValueError):
            parameters = json.loads(copy.read_text())["metadata"]["papermill"]["parameters"]
            if any(suffix in str(value) for value in parameters.values()):
                found.append(copy)
    return found
