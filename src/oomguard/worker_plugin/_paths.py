"""Where a worker process's crash file and flight record live (outside its worker directory,
which the nanny deletes before its exit callback runs)."""

from __future__ import annotations

import os
import tempfile


def default_crash_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"oomguard-{os.getuid()}")


def crash_path(crash_dir: str, pid: int) -> str:
    return os.path.join(crash_dir, f"{pid}.crash")


def flight_path(crash_dir: str, pid: int) -> str:
    return os.path.join(crash_dir, f"{pid}.flight")
