"""Every parameter of every notebook, table-driven: declared with a check, its default accepted, each bad value
refused in one ``ParameterError`` that names it. A parameter added to a notebook without a check and a row here
fails ``test_every_parameter_has_a_check_and_rows_here``."""

import ast
import json
import time

import pytest

from helpers.parameters import PARAMETERS, check_parameters
from helpers.settings import ParameterError
from workshop import runner

BUCKET = [("Not_A_Valid_Bucket", "'Not_A_Valid_Bucket' is not a valid bucket name"),
          ("ab", "'ab' is not a valid bucket name"), (5, "5 is not a valid bucket name")]
SMOKE = [(-5, "smoke_test_size=-5 is out of range"), ("abc", "smoke_test_size must be an integer, not 'abc'"),
         (50_001, "smoke_test_size=50001 is out of range"), (1.5, "smoke_test_size must be an integer")]


def counts(name: str, low: int = 1) -> list[tuple[object, str]]:
    return [(low - 1, f"{name}={low - 1} is out of range"), ("3", f"{name} must be a whole number"),
            (2.5, f"{name} must be a whole number"), (True, f"{name} must be a whole number")]


def flags(name: str) -> list[tuple[object, str]]:
    return [("yes", f"{name} must be True or False"), (1, f"{name} must be True or False")]


def names(name: str) -> list[tuple[object, str]]:
    return [("", f"{name} must be a non-empty name"), (3, f"{name} must be a non-empty name")]


# (notebook, parameter) -> bad values and a piece of the one line each must give
TABLE: dict[str, dict[str, list[tuple[object, str]]]] = {
    "01": {"bucket": BUCKET, "smoke_test_size": SMOKE, "append": flags("append"), "threads": counts("threads"),
           "image_format": [("gif", "image_format must be one of 'png', 'jpeg', 'jpg', not 'gif'")]},
    "02": {"bucket": BUCKET, "smoke_test_size": SMOKE},
    "03": {"bucket": BUCKET, "smoke_test_size": SMOKE, "batch_size": counts("batch_size"),
           "num_actors": counts("num_actors"), "threads": counts("threads"),
           "num_blocks": counts("num_blocks"), "live": flags("live")},
    "04": {"bucket": BUCKET, "smoke_test_size": SMOKE, "epochs": counts("epochs"),
           "lr": [(-0.1, "lr=-0.1 is out of range"), (0, "lr=0 is out of range"), ("0.1", "lr must be a number"),
                  (float("nan"), "lr must be a number above 0")],
           "model": [("resnet", "model must be one of 'mlp', 'cnn', not 'resnet'")],
           "optimizer": [("rmsprop", "optimizer must be one of 'adam', 'sgd', not 'rmsprop'")],
           "hidden_sizes": [("[]", "hidden_sizes must be a list such as [256, 128], not the text '[]'"),
                            ("[256, 128]", "-y 'hidden_sizes: [256, 128]'"), ([], "must be a non-empty list"),
                            ([64, 0], "each of hidden_sizes=0 is out of range"), (64, "must be a non-empty list")],
           "batch_size_per_worker": counts("batch_size_per_worker"), "checkpoint_every": counts("checkpoint_every"),
           "cache_shard": flags("cache_shard"), "num_workers": counts("num_workers"), "use_gpu": flags("use_gpu"),
           "fail_at_epoch": counts("fail_at_epoch"), "experiment": names("experiment"), "live": flags("live")},
    "05": {"bucket": BUCKET, "smoke_test_size": SMOKE, "num_samples": counts("num_samples"),
           "max_concurrent": counts("max_concurrent"), "live": flags("live"),
           "searcher": [("grid", "searcher must be one of 'hyperopt', 'optuna', not 'grid'")],
           "scheduler": [("hyperband", "scheduler must be one of 'asha', not 'hyperband'")],
           "epochs": counts("epochs"), "seed": counts("seed", low=0), "num_workers": counts("num_workers", low=0),
           "experiment": names("experiment")},
    "06": {"bucket": BUCKET, "smoke_test_size": SMOKE,
           "repo_name": [("Bad_Name", "Bad_Name"), ("", "repository name")],
           "optimizers": [('["sgd"]', "not the text"), (["rmsprop"], "each of optimizers must be one of 'adam', 'sgd'"),
                          ([], "must be a non-empty list")],
           "epochs": [("[5, 10]", "-y 'epochs: [5, 10]'"), ([0], "each of epochs=0 is out of range"),
                      (3, "must be a non-empty list")],
           "max_concurrent": counts("max_concurrent"), "experiment": names("experiment"),
           "registered_model": names("registered_model"), "training_experiment": names("training_experiment"),
           "sweep_experiment": names("sweep_experiment"),
           "tolerance": [(-0.1, "tolerance must be a number from 0"), (1, "tolerance must be a number from 0"),
                         ("0.01", "tolerance must be a number from 0")]},
    "07": {"bucket": BUCKET, "smoke_test_size": SMOKE,
           "model_uri": [("mnist-classifier", "model_uri must be"), (3, "model_uri must be")],
           "registered_model": names("registered_model"), "training_experiment": names("training_experiment"),
           "sweep_experiment": names("sweep_experiment"), "num_actors": counts("num_actors"),
           "batch_size": counts("batch_size"), "use_gpu": flags("use_gpu"),
           "experiment": names("experiment")},
    "08": {"bucket": BUCKET, "smoke_test_size": SMOKE, "registered_model": names("registered_model"),
           "training_experiment": names("training_experiment"), "sweep_experiment": names("sweep_experiment"),
           "num_replicas": counts("num_replicas"),
           "max_batch_size": counts("max_batch_size"), "use_gpu": flags("use_gpu"),
           "roll_clients": counts("roll_clients"),
           "canary_share": [(0, "canary_share=0 is out of range"), (1.5, "canary_share=1.5 is out of range"),
                            ("0.25", "canary_share must be a number above 0")],
           "batch_wait_timeout_s": [(-0.01, "batch_wait_timeout_s must be a number of seconds from 0 to 10"),
                                    (11, "batch_wait_timeout_s must be a number of seconds from 0 to 10"),
                                    ("0.01", "batch_wait_timeout_s must be a number"),
                                    (float("nan"), "batch_wait_timeout_s must be a number")]},
}


def defaults(number: str) -> dict[str, object]:
    """The notebook's parameters cell, as the values it assigns."""
    notebook = runner.notebook_paths(pattern=f"{number}_*.ipynb")[0]
    cell = next(c for c in json.loads(notebook.read_text())["cells"]
                if "parameters" in c.get("metadata", {}).get("tags", []))
    return {node.targets[0].id: ast.literal_eval(node.value) for node in ast.parse("".join(cell["source"])).body
            if isinstance(node, ast.Assign)}


def test_every_parameter_has_a_check_and_rows_here():
    numbers = [path.name[:2] for path in runner.notebook_paths()]
    assert sorted(PARAMETERS) == sorted(TABLE) == numbers
    for number in numbers:
        assert set(defaults(number)) == set(PARAMETERS[number]) == set(TABLE[number]), number


@pytest.mark.parametrize("number", sorted(TABLE))
def test_every_default_is_accepted(number):
    check_parameters(number, defaults(number))


@pytest.mark.parametrize("number, name, value, message", [
    (number, name, value, message) for number, rows in TABLE.items() for name, bad in rows.items()
    for value, message in bad])
def test_each_bad_value_is_one_parameter_error_naming_it(number, name, value, message):
    with pytest.raises(ParameterError) as err:
        check_parameters(number, {**defaults(number), name: value})
    assert message in str(err.value)
    assert name in str(err.value) or repr(value) in str(err.value) or str(value) in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("number, parameters, message", [
    ("04", {"hidden_sizes": "[]"}, "ParameterError: hidden_sizes must be a list such as [256, 128], not the text '[]'"),
    ("03", {"num_blocks": 0}, "ParameterError: num_blocks=0 is out of range"),
])
def test_papermill_s_text_and_a_zero_stop_the_notebook_at_its_first_cell(bucket, tmp_path, number, parameters,
                                                                        message):
    notebook = runner.notebook_paths(pattern=f"{number}_*.ipynb")[0]
    result = runner.execute(notebook, tmp_path / "out.ipynb", {"bucket": bucket, **parameters})
    assert result.status == "failed" and result.message.startswith(message), result.message
    ran = [c for c in json.loads((tmp_path / "out.ipynb").read_text())["cells"]
           if c["cell_type"] == "code" and c.get("execution_count")]
    assert len(ran) == 3, "the parameters cell, papermill's injected one and the first cell, nothing more"


@pytest.mark.parametrize("arguments, message", [
    (["--before", "abc"], "--before (make catch-up NN=...) must be a notebook's number, one of 01, 02"),
    (["--before", "9"], "not '9'"),
    (["--only", "zzz"], "--only 'zzz' matches no notebook"),
])
def test_the_runner_refuses_a_notebook_that_is_not_there_before_running_any(arguments, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        runner.main(arguments)
    assert stopped.value.code == 2 and message in capsys.readouterr().err


MISSING_MODELS = [
    ("models:/no-such-model@champion", "the registry has no model 'no-such-model' with the alias @champion"),
    ("runs:/0123456789abcdef/model", "MLflow has no run '0123456789abcdef'"),
    ("models:/mnist-classifier/99", "the registry has no version '99' of a model 'mnist-classifier'"),
]


@pytest.mark.parametrize("uri, missing", MISSING_MODELS)
def test_a_model_uri_that_names_nothing_is_one_parameter_error_saying_what_exists(settings, uri, missing):
    """Each kind of ``model_uri`` that names nothing: one line naming the parameter, what was not found and what
    exists instead (not MLflow's RestException from deep inside a load)."""
    from mlflow.tracking import MlflowClient

    from helpers import champion_candidates

    with pytest.raises(ParameterError) as err:
        champion_candidates.check_model_uri(MlflowClient(settings.mlflow_tracking_uri), uri)
    said = str(err.value)
    assert said.startswith(f"model_uri='{uri}' names no model: {missing}. What exists: "), said
    assert "registered models" in said or "no model is registered yet" in said
    assert "notebook 04" in said and "\n" not in said


def test_a_model_uri_that_names_nothing_stops_07_in_one_line_before_any_pipeline(bucket, tmp_path):
    """In the notebook: the one line, before any pipeline starts, and no MLflow traceback shown."""
    uri, missing = MISSING_MODELS[0]
    notebook = runner.notebook_paths(pattern="07_*.ipynb")[0]
    started = time.monotonic()
    result = runner.execute(notebook, tmp_path / "out.ipynb", {"bucket": bucket, "smoke_test_size": 60,
                                                               "model_uri": uri})
    assert time.monotonic() - started < 120
    assert result.status == "failed" and result.message.startswith(f"ParameterError: model_uri='{uri}' names no "
                                                                   f"model: {missing}. What exists: "), result.message
    shown = json.dumps([c.get("outputs", []) for c in json.loads((tmp_path / "out.ipynb").read_text())["cells"]])
    assert "RestException" not in shown and "Traceback" not in shown
