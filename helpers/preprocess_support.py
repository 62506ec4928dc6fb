"""What notebook 03's preprocessing calls in one line, kept out of the lesson.

* a logger that stamps every line with the process id, so a learner can see which process (a task, or
  one of the actors) fetched which batch;
* a named Ray actor that counts the objects the workers skipped (``skip_counter_name=...``), so the driver can
  report them by name after the job;
* the bookkeeping of packed versions: of two packings at once the one started last is swapped in, and
  only folders that no reader or packing can still need are deleted.
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


def started_last(filesystem, base: str, version: str, current_file: str) -> bool:
    """Whether ``version`` is newer than the one ``<base>/<current_file>`` names (or none is named yet).

    Version names start with their packing's start time, so of two packings at once the one started
    last wins the swap, and one that finishes late does not swap an older set of shards back in.
    """
    current = _current_version(filesystem, base, current_file)
    return current is None or version > current


def remove_superseded(filesystem, base: str, current_file: str) -> list[str]:
    """Delete the version folders under ``base`` that no reader or packing can still need; returns them.

    Kept: the folder ``current_file`` names, the newest complete one before it (a reader that started
    before the swap still reads it), and everything newer than the current one (packings still being
    written). The other older folders go: superseded shards, failed packings, and packings still
    running that started before the current one, which lost the swap already.
    """
    from pyarrow import fs

    from helpers.storage import is_complete

    current = _current_version(filesystem, base, current_file)
    if current is None:
        return []
    versions = sorted(info.base_name for info in filesystem.get_file_info(fs.FileSelector(base))
                      if info.type == fs.FileType.Directory)
    older = [v for v in versions if v < current]
    previous = next((v for v in reversed(older) if is_complete(filesystem, f"{base}/{v}")), None)
    gone = [v for v in older if v != previous]
    for version in gone:
        try:
            filesystem.delete_dir(f"{base}/{version}")
        except FileNotFoundError:
            pass  # a packing running beside this one removed it first: what was wanted is done
    return gone


def _current_version(filesystem, base: str, current_file: str) -> str | None:
    try:
        with filesystem.open_input_stream(f"{base}/{current_file}") as current:
            return current.read().decode().strip() or None
    except FileNotFoundError:
        return None
