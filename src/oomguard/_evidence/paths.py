"""Where a worker process's crash file and flight record live (outside its worker directory,
which the nanny deletes before its exit callback runs)."""

from __future__ import annotations

import os
import tempfile

from .. import _config


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
