"""Scheduler side of oomguard: ``dask scheduler --preload oomguard.scheduler_plugin``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._handlers import QUERY_HANDLER
from ._plugin import OomguardSchedulerPlugin

if TYPE_CHECKING:
    from distributed import Scheduler

__all__ = ["QUERY_HANDLER", "OomguardSchedulerPlugin"]


def _add_page() -> None:
    # Scheduler preloads are imported before the dashboard is built; dask_setup runs
    # too late for the page to be listed in the "More" menu.
    try:
        from ._dashboard import add_to_dashboard_menu
    except ImportError:  # bokeh missing: no dashboard anyway
        return
    add_to_dashboard_menu()


_add_page()


def dask_setup(scheduler: Scheduler) -> None:
    """Preload hook: adds the plugin; its start() runs when the scheduler starts."""
    scheduler.add_plugin(OomguardSchedulerPlugin(), idempotent=True)
