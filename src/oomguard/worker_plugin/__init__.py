"""Worker side of oomguard: ``dask worker --preload-nanny oomguard.worker_plugin``.

The nanny plugin watches the worker process and reports each death; it installs the worker
plugin (crash file + flight recorder) in every worker process it starts.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from .._protocol import CLEAN_EXIT_HANDLER, REPORT_HANDLER, UNGUARDED_HANDLER
from .._protocol import DEATH_TOPIC as EVENT_TOPIC
from ._nanny import OomguardNannyPlugin
from ._worker import OomguardWorkerPlugin

if TYPE_CHECKING:
    from distributed import Nanny

__all__ = [
    "CLEAN_EXIT_HANDLER",
    "EVENT_TOPIC",
    "REPORT_HANDLER",
    "UNGUARDED_HANDLER",
    "OomguardNannyPlugin",
    "OomguardWorkerPlugin",
]


async def dask_setup(nanny: Nanny) -> None:
    """Preload hook for ``--preload-nanny``: runs before the nanny starts its worker.

    A nanny whose oomguard cannot be set up must not run a worker that users believe is
    guarded (Dask itself logs a failed preload and goes on): under `dask worker` the
    process ends with one line naming the setting (exit status 2); elsewhere the error is
    raised. `oomguard.worker.on-setup-error: warn` runs the worker unguarded instead, with
    a WARNING."""
    from .. import _config
    from .._exceptions import OomguardError
    from .._log import follow_dask_logging, stop_cli

    plugin = OomguardNannyPlugin()
    on_error = "fail"  # also when on-setup-error itself is the bad setting
    try:
        on_error = _config.get_choice("worker.on-setup-error", ("fail", "warn"))
        nanny.plugins[plugin.name] = plugin
        # Nanny.close() calls teardown() on everything in nanny.plugins.
        await plugin.setup(nanny)
    except (OomguardError, ValueError, OSError) as e:
        nanny.plugins.pop(plugin.name, None)
        follow_dask_logging()
        if on_error == "warn":
            logging.getLogger("oomguard.nanny").warning(
                "oomguard: %s The worker runs WITHOUT oomguard (on-setup-error: warn).", e
            )
            task = asyncio.get_running_loop().create_task(_say_unguarded(nanny, str(e)))
            _TELLING.add(task)
            task.add_done_callback(_TELLING.discard)
            return
        stop_cli("worker", e)
        raise


_TELLING: set = set()


async def _say_unguarded(nanny: Nanny, reason: str, attempts: int = 60) -> None:
    """Tell the scheduler (its oomguard counts and logs it) once this nanny is up."""
    from distributed.core import Status

    for _ in range(attempts):
        await asyncio.sleep(1.0)
        if nanny.status in (Status.closing, Status.closed):
            return
        if nanny.status != Status.running:
            continue
        try:
            await asyncio.wait_for(
                getattr(nanny.scheduler, UNGUARDED_HANDLER)(nanny=nanny.address, reason=reason), 5
            )
            return
        except Exception:
            continue  # the scheduler's oomguard may not be up yet
