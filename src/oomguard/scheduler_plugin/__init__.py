"""Scheduler side of oomguard: ``dask scheduler --preload oomguard.scheduler_plugin``."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .._protocol import QUERY_HANDLER
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
    """Preload hook: adds the plugin; its start() runs when the scheduler starts.

    Settings are checked here first. Under `dask scheduler`, a bad one stops the process
    with one line naming the key, the value and what is expected (exit status 2), not a
    traceback; a scheduler started in the user's own process gets the ConfigError."""
    from .. import _config
    from .._exceptions import ConfigError
    from .._log import follow_dask_logging, stop_cli

    try:
        follow_dask_logging()  # the warnings of check_keys go where Dask's lines go
        _config.check_keys(logging.getLogger("oomguard.scheduler"))
        _config.scheduler_settings()
    except ConfigError as e:
        follow_dask_logging()
        stop_cli("scheduler", e)
        raise
    scheduler.add_plugin(OomguardSchedulerPlugin(), idempotent=True)
