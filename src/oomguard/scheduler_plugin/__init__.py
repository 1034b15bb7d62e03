"""Scheduler side of oomguard: ``dask scheduler --preload oomguard.scheduler_plugin``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._plugin import QUERY_HANDLER, OomguardSchedulerPlugin

if TYPE_CHECKING:
    from distributed import Scheduler

__all__ = ["QUERY_HANDLER", "OomguardSchedulerPlugin"]


def dask_setup(scheduler: Scheduler) -> None:
    """Preload hook: adds the plugin; its start() runs when the scheduler starts."""
    scheduler.add_plugin(OomguardSchedulerPlugin(), idempotent=True)
