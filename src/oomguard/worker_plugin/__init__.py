"""Worker side of oomguard: ``dask worker --preload-nanny oomguard.worker_plugin``.

The nanny plugin watches the worker process and reports each death; it installs the worker
plugin (crash file + flight recorder) in every worker process it starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._nanny import CLEAN_EXIT_HANDLER, EVENT_TOPIC, REPORT_HANDLER, OomguardNannyPlugin
from ._worker import OomguardWorkerPlugin

if TYPE_CHECKING:
    from distributed import Nanny

__all__ = [
    "CLEAN_EXIT_HANDLER",
    "EVENT_TOPIC",
    "REPORT_HANDLER",
    "OomguardNannyPlugin",
    "OomguardWorkerPlugin",
]


async def dask_setup(nanny: Nanny) -> None:
    """Preload hook for ``--preload-nanny``: runs before the nanny starts its worker."""
    plugin = OomguardNannyPlugin()
    nanny.plugins[plugin.name] = plugin
    # Nanny.close() calls teardown() on everything in nanny.plugins.
    await plugin.setup(nanny)
