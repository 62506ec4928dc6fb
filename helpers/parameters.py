"""Every notebook's parameters, declared here by type and range and checked in one call (notebooks 01-07).

Each notebook's first code cell after its ``parameters`` cell calls :func:`check_parameters`, so a bad
value stops the notebook before any work, in one :class:`~helpers.settings.ParameterError` that names the
parameter, instead of a library's error about a name the learner never set (Ray's ``parallelism``, say).

papermill passes ``-p name value`` as text unless the value reads as a number or a boolean: a list
given with ``-p`` arrives as a string, and the message for it says to use ``-y`` (YAML) instead.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping

from helpers.settings import ParameterError, check_count, check_fraction, check_positive

Check = Callable[[str, object], None]


def count(maximum: int, minimum: int = 1) -> Check:
    """A whole number in ``[minimum, maximum]``."""

    def check(name: str, value: object) -> None:
        check_count(name, value, maximum, minimum)

    return check


def positive(maximum: float | None = None) -> Check:
    """A number above 0 (at most ``maximum``)."""

    def check(name: str, value: object) -> None:
        check_positive(name, value, maximum)

    return check


def fraction(name: str, value: object) -> None:
    """A number from 0 up to (not including) 1."""
    check_fraction(name, value)


def flag(name: str, value: object) -> None:
    """True or False (papermill's ``-p name True`` gives a boolean)."""
    if not isinstance(value, bool):
        raise ParameterError(f"{name} must be True or False, not {value!r}.")


def one_of(*choices: object) -> Check:
    """One of ``choices``."""

    def check(name: str, value: object) -> None:
        if value not in choices:
            raise ParameterError(f"{name} must be one of {', '.join(map(repr, choices))}, not {value!r}.")

    return check


def optional(inner: Check) -> Check:
    """None, or what ``inner`` accepts."""
    return lambda name, value: None if value is None else inner(name, value)


def text(name: str, value: object) -> None:
    """A non-empty name (an MLflow experiment, say)."""
    if not isinstance(value, str) or not value.strip():
        raise ParameterError(f"{name} must be a non-empty name, not {value!r}.")


def list_of(each: Check, example: str) -> Check:
    """A non-empty list whose every item ``each`` accepts; ``example`` shows one in the message."""

    def check(name: str, value: object) -> None:
        if isinstance(value, str):
            raise ParameterError(
                f"{name} must be a list such as {example}, not the text {value!r}: papermill's -p passes lists as "
                f"text. Give it as YAML with -y, e.g. papermill in.ipynb out.ipynb -y '{name}: {example}'.")
        if not isinstance(value, (list, tuple)) or not value:
            raise ParameterError(f"{name} must be a non-empty list such as {example}, not {value!r}.")
        for item in value:
            each(f"each of {name}", item)

    return check


def bucket(name: str, value: object) -> None:
    """An S3 bucket name."""
    from helpers.storage import check_bucket_name

    check_bucket_name(value)


def smoke_size(name: str, value: object) -> None:
    """0 (all of MNIST) or a number of training images."""
    from helpers.storage import smoke_sizes

    smoke_sizes(value)  # type: ignore[arg-type]


def model_uri(name: str, value: object) -> None:
    """"" (choose the model automatically) or an MLflow model URI such as ``models:/mnist-classifier@champion``."""
    if not isinstance(value, str) or (value and ":/" not in value):
        raise ParameterError(f"{name} must be \"\" (the champion, else notebook 04's latest model) or an MLflow "
                             f"model URI such as 'models:/mnist-classifier@champion', not {value!r}.")


def repository(name: str, value: object) -> None:
    """A lakeFS repository name."""
    from helpers.versioning import check_repository_name

    check_repository_name(value)


def seconds(most: float) -> Check:
    """A wait in seconds: a number from 0 up to ``most``."""
    def check(name: str, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
                or not 0 <= value <= most:
            raise ParameterError(f"{name} must be a number of seconds from 0 to {most:g}, not {value!r}.")
    return check


COMMON = {"bucket": bucket, "smoke_test_size": smoke_size}
TRAINING = {"epochs": count(10_000), "lr": positive(10.0), "batch_size_per_worker": count(100_000)}
PARAMETERS: dict[str, dict[str, Check]] = {
    "01": {**COMMON, "image_format": one_of("png", "jpeg", "jpg"), "append": flag, "threads": count(256)},
    "02": {**COMMON},
    "03": {**COMMON, "batch_size": count(100_000), "num_actors": count(1024), "threads": count(256),
           "num_blocks": optional(count(100_000)), "live": flag},
    "04": {**COMMON, **TRAINING, "model": one_of("mlp", "cnn"), "hidden_sizes": list_of(count(100_000), "[256, 128]"),
           "optimizer": one_of("adam", "sgd"), "checkpoint_every": count(10_000), "cache_shard": flag,
           "num_workers": count(1024), "use_gpu": flag, "fail_at_epoch": optional(count(10_000)), "experiment": text,
           "live": flag},
    "05": {**COMMON, "num_samples": count(10_000), "max_concurrent": count(1024),
           "searcher": one_of("hyperopt", "optuna"), "scheduler": optional(one_of("asha")),
           "epochs": count(10_000), "seed": count(2**32 - 1, minimum=0), "num_workers": count(1024, minimum=0),
           "experiment": text, "live": flag},
    "06": {**COMMON, "repo_name": repository, "optimizers": list_of(one_of("adam", "sgd"), '["adam", "sgd"]'),
           "epochs": list_of(count(10_000), "[5, 10]"), "max_concurrent": count(1024), "tolerance": fraction,
           "experiment": text, "registered_model": text, "training_experiment": text, "sweep_experiment": text},
    "07": {**COMMON, "model_uri": model_uri, "registered_model": text, "training_experiment": text,
           "sweep_experiment": text, "num_actors": count(1024), "batch_size": count(100_000), "use_gpu": flag,
           "experiment": text},
    "08": {**COMMON, "registered_model": text, "training_experiment": text, "sweep_experiment": text,
           "num_replicas": count(64),
           "max_batch_size": count(1024), "batch_wait_timeout_s": seconds(10.0), "use_gpu": flag,
           "roll_clients": count(256), "canary_share": positive(1.0)},
}

# What ``live=True`` sets: sizes at which the instructor notes' "watch it live" moments last long enough to
# watch (about 30-90 s on a 2-core laptop): 03's actors, 04's epochs reaching MLflow, 05's trials coming and going.
LIVE: dict[str, dict[str, object]] = {
    "03": {"smoke_test_size": 30_000},
    "04": {"smoke_test_size": 12_000, "epochs": 30, "batch_size_per_worker": 64, "cache_shard": False},
    "05": {"smoke_test_size": 20_000, "num_samples": 12, "epochs": 10, "max_concurrent": 2},
}


def live_mode(notebook: str, values: dict[str, object]) -> None:
    """With ``live`` True in ``values`` (a notebook's globals): set :data:`LIVE`'s sizes there and say so in one line.

    The smoke defaults stay fast for everyone else; an instructor sets ``live = True`` in the parameters cell
    (or ``-p live True``) to show the dashboard and MLflow while the work is still going on.
    """
    if not values.get("live"):
        return
    changes = {name: value for name, value in LIVE[notebook].items() if values.get(name) != value}
    values.update(changes)
    said = ", ".join(f"{name} {value!r}" for name, value in changes.items()) or "the sizes it already has"
    print(f"Live mode: {said}; the upload, if any, and the work take longer. Watch the dashboard and MLflow now.")


def check_parameters(notebook: str, values: Mapping[str, object]) -> None:
    """Check the parameters of notebook ``notebook`` (``"04"``) found in ``values`` (its ``globals()``).

    Raises:
        ParameterError: the first parameter with a value outside its declared type or range, by name.
    """
    for name, check in PARAMETERS[notebook].items():
        if name in values:
            check(name, values[name])
