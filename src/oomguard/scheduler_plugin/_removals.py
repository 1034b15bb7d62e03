"""Dask's removal of a worker, as the decision core's `Removal` (which events count is
`_trust.dask_removal`'s to say; the plugin's `log_event` hook hands them here)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .._decide import Removal

if TYPE_CHECKING:
    from distributed import Scheduler
    from distributed.scheduler import WorkerState


def removal(scheduler: Scheduler, msg: dict[str, Any], ws: WorkerState, host: str) -> Removal:
    """What the scheduler knew of the worker its `remove-worker` event `msg` names, seen
    before Dask reschedules its tasks: everything it had sent there, the last heartbeat's
    view of what executed, and Dask's own count of earlier deaths of each task."""
    tasks = scheduler.tasks
    processing = {str(k): k for k in msg.get("processing-tasks") or ()}
    prior = {}
    for s, k in processing.items():
        ts = tasks.get(k)
        if ts is not None and ts.suspicious > 1:
            prior[s] = ts.suspicious - 1  # Dask counted this death already
    guess = {str(ts.key): ts.key for ts in ws.executing if str(ts.key) in processing}
    return Removal(
        worker=msg["worker"],
        host=host,
        time=time.time(),
        processing=processing,
        executing_guess=guess,
        nthreads=ws.nthreads,
        pid=ws.pid,
        memory_limit=ws.memory_limit,
        prior=prior,
        nanny=ws.nanny,
    )
