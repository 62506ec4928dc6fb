"""What notebook 03's preprocessing calls in one line, kept out of the lesson.

* a logger that stamps every line with the process id, so a learner can see which process (a task, or
  one of the actors) fetched which batch;
* a named Ray actor that counts the objects the workers skipped (``skip_bad=True``), so the driver can
  report them by name after the job.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

LOG_FILE_NAME = "preprocess.log"


def create_logger(log_dir: str | Path | None = None, name: str = "preprocess") -> logging.Logger:
    """A logger that stamps every line with the process id, to stdout and ``<log_dir>/preprocess.log``."""
    log_dir = Path(log_dir or os.environ.get("PREPROCESS_LOG_DIR") or Path(os.environ.get("TMPDIR", "/tmp")))
    logger = logging.getLogger(f"helpers.{name}")
    if getattr(logger, "_log_dir", None) != str(log_dir):
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        log_dir.mkdir(parents=True, exist_ok=True)
        fmt = logging.Formatter("%(process)d %(asctime)s | %(levelname)s | %(message)s")
        for handler in (logging.StreamHandler(sys.stdout), logging.FileHandler(log_dir / LOG_FILE_NAME)):
            handler.setFormatter(fmt)
            logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        logger._log_dir = str(log_dir)  # type: ignore[attr-defined]
    return logger


def read_log(log_dir: str | Path) -> list[str]:
    """Lines the pid-stamped logger wrote to ``<log_dir>/preprocess.log``."""
    path = Path(log_dir) / LOG_FILE_NAME
    return path.read_text().splitlines() if path.is_file() else []


def node_id() -> str:
    """Short id of the Ray node this code runs on ('-' outside Ray)."""
    import ray

    return ray.get_runtime_context().get_node_id()[:8] if ray.is_initialized() else "-"


class SkipCounter:
    """Counts objects skipped by the workers (a named Ray actor shared by all of them)."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def add(self, keys: list[str]) -> None:
        """Record skipped keys."""
        self.keys.extend(keys)

    def get(self) -> list[str]:
        """All keys skipped so far."""
        return list(self.keys)


def skip_counter(name: str):
    """The named :class:`SkipCounter` actor ``name`` (created on first use)."""
    import ray

    return ray.remote(num_cpus=0)(SkipCounter).options(name=name, get_if_exists=True, lifetime="detached").remote()


def skipped_keys(name: str) -> list[str]:
    """Keys the workers skipped under counter ``name``; the counter is removed afterwards."""
    import ray

    try:
        counter = ray.get_actor(name)
    except ValueError:
        return []
    keys = ray.get(counter.get.remote())
    ray.kill(counter)
    return keys
