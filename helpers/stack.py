"""The notebooks' one door to the local platform: ``settings = stack.ensure_stack()`` in each first cell.

The embedded stack, which starts the services no setting names, and the papermill runner live in the
:mod:`workshop` package beside ``helpers``. This module is the only place ``helpers`` reaches them, and
only while one of its functions runs: importing a lesson imports none of the platform
(tests/lessons/test_lessons.py). Where ``helpers`` is copied alone (docker compose's Jupyter image, a cluster's
image), the services are configured, and :func:`ensure_stack` reads the settings only.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path

from helpers.errors import TutorialError
from helpers.settings import Settings, load_settings, services_line


class NoEmbeddedStack(TutorialError, RuntimeError):
    """A service is configured nowhere, and the embedded stack that would start it is not installed here."""


def embedded_stack_installed() -> bool:
    """Whether the platform (:mod:`workshop`) is importable: a checkout, not an image with ``helpers`` only."""
    return importlib.util.find_spec("workshop") is not None and importlib.util.find_spec("workshop.stack") is not None


def ensure_stack(with_mlflow: bool = True) -> Settings:
    """Settings for the configured services, starting the embedded stack for the rest.

    A notebook's first cell calls this, so any notebook can be opened first. Endpoints set in the
    environment, ``.env`` or ``credentials.json`` are used as they are; what is missing comes from the
    embedded stack (:func:`workshop.stack.ensure_stack`).

    Raises:
        NoEmbeddedStack: a service is configured nowhere and the embedded stack is not installed.
    """
    if embedded_stack_installed():
        from workshop import stack

        return stack.ensure_stack(with_mlflow=with_mlflow)
    settings = load_settings()
    wanted = [("S3_ENDPOINT", settings.s3_endpoint), ("MLFLOW_TRACKING_URI", settings.mlflow_tracking_uri)]
    missing = [name for name, value in wanted[:2 if with_mlflow else 1] if not value]
    if missing:
        raise NoEmbeddedStack(f"{' and '.join(missing)} set nowhere, and this installation has no embedded stack "
                              "to start: set them in the environment or in .env (see .env.example), or, in a "
                              "checkout of the repository, run `make install` to install it.")
    settings.use_mlflow_credentials()
    print(services_line(settings, with_mlflow))
    return settings


def run_notebook_first(number: str, parameters: dict) -> str | None:
    """Run notebook ``number`` headless with papermill, as ``make catch-up`` does (:func:`workshop.runner.execute`).

    Returns None when it ran to the end (its executed copy is then deleted), else its error and where that copy is.
    """
    if not embedded_stack_installed():
        raise NoEmbeddedStack(f"Notebook {number} has to run first, and this installation has no notebook runner "
                              f"(the workshop package): run notebook {number} yourself, then this notebook again.")
    from workshop import runner

    (notebook,) = runner.notebook_paths(pattern=f"{number}_*.ipynb")
    output = Path(tempfile.mkdtemp(prefix=f"catch-up-{number}-")) / notebook.name
    result = runner.execute(notebook, output, parameters)
    if result.status != "ok":
        return f"{result.message}; its output is {output}"
    shutil.rmtree(output.parent, ignore_errors=True)
    return None
