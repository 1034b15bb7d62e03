"""Where a worker process's crash file and flight record live (outside its worker directory,
which the nanny deletes before its exit callback runs)."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterable

from .. import _config, _private

logger = logging.getLogger("oomguard.nanny")


def default_crash_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"oomguard-{os.getuid()}")


def configured_crash_dir() -> str:
    """`oomguard.worker.crash-dir` of this process's config, or the default: what a nanny
    and each of its workers read alike."""
    return _config.get_optional_path("worker.crash-dir") or default_crash_dir()


def crash_path(crash_dir: str, pid: int) -> str:
    return os.path.join(crash_dir, f"{pid}.crash")


def flight_path(crash_dir: str, pid: int) -> str:
    return os.path.join(crash_dir, f"{pid}.flight")


def private_crash_dir(crash_dir: str, configs: Iterable[dict | None] = ()) -> str:
    """The nanny's crash dir: `crash_dir` when private to this user, else a fresh one
    (`_private.private_dir`), written into `configs` (the Dask configs its worker processes
    start with, where a plugin without a crash dir of its own reads it), with the files of
    processes that no longer run removed."""
    crash_dir = _private.private_dir(crash_dir, "crash dir")
    for config in configs:
        # New dicts all the way down: a nanny's config shares its nested dicts with the
        # process's global dask config (dask.config.merge copies only the top level), and
        # an in-process nanny must not change what every other part of the process reads.
        if isinstance(config, dict):
            section = config.get("oomguard")
            section = dict(section) if isinstance(section, dict) else {}
            worker = section.get("worker")
            section["worker"] = {
                **(worker if isinstance(worker, dict) else {}),
                "crash-dir": crash_dir,
            }
            config["oomguard"] = section
    removed = _private.remove_stale(crash_dir)
    if removed:
        logger.info(
            "oomguard: removed %d file(s) of processes that no longer run from %s",
            len(removed),
            crash_dir,
        )
    return crash_dir
