"""What notebook 07 calls in one line, kept out of the lesson: training a model first when none exists yet."""

from __future__ import annotations

from helpers import stack
from helpers.errors import TutorialError


class NoModelYet(TutorialError, RuntimeError):
    """Notebook 04, run to train a first model, did not finish."""


def train_first(bucket: str, smoke_test_size: int, experiment: str, epochs: int = 3) -> None:
    """Run notebook 04 headless (as ``make catch-up NN=07`` would) so that ``experiment`` holds a model.

    Notebook 07 calls this only when neither the registry nor ``experiment`` has a model: it lets 07 run
    first and alone. Fewer epochs than 04's default keep the wait near a minute at smoke size.

    Raises:
        NoModelYet: notebook 04 failed; the message has its error and where its output notebook is.
    """
    print(f"No model yet: running notebook 04 first ({epochs} epochs, experiment {experiment!r}); about a minute")
    failed = stack.run_notebook_first("04", {"bucket": bucket, "smoke_test_size": smoke_test_size, "epochs": epochs,
                                             "experiment": experiment})
    if failed:
        raise NoModelYet(f"Notebook 04 could not train a first model ({failed}). Run notebook 04 yourself, then "
                         "this notebook again.")
