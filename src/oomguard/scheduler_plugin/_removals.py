"""Dask's removal of a worker -> the core's `Removal` (the plugin's `log_event` and
`remove_worker` hooks; which events count is `_trust.dask_removal`'s to say)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from .._decide import Hold, Removal
from . import _setup
from ._actions import address_host
from ._trust import dask_removal

if TYPE_CHECKING:
    from ._plugin import OomguardSchedulerPlugin

logger = logging.getLogger("oomguard.scheduler")


def on_event(plugin: OomguardSchedulerPlugin, msg: Any) -> None:
    """A `remove-worker` event on the topic "all". Dask publishes it after counting the dead
    worker's tasks and before it reschedules them: holds apply now, everything else once
    Dask's transitions ran. Anyone may publish to "all": an event that is not Dask's own
    removal is refused (logged once, counted in `removals_refused`)."""
    if not isinstance(msg, dict) or msg.get("action") != "remove-worker":
        return
    with plugin.guard("log_event"):
        if plugin.bound is not None:  # Dask has counted: its counts back as it left them
            plugin.bound.counted(msg.get("worker"))
        scheduler = plugin.scheduler
        if scheduler is None:
            return  # before start() or after close()
        if not dask_removal(msg, plugin._workers, scheduler.workers):
            plugin.handlers.removals_refused += 1
            plugin.guard.once(
                "removal_refused",
                "oomguard: ignored a remove-worker event naming %r: not a registered worker "
                "that Dask removed (someone else published it); further ones are counted",
                str(msg.get("worker"))[:200],
            )
            return
        worker = msg["worker"]
        ws = plugin._workers.pop(worker)
        name = plugin._hostnames.pop(worker, None) or plugin.host_name(worker)
        plugin.handlers.nannies.removed(worker, ws)
        if msg.get("expected") or plugin.core is None:
            return  # a stop, or an event after close()
        if scheduler.status in _setup.SHUTTING_DOWN:
            return  # the cluster is closing: its workers leave, they do not die
        out = plugin.core.removed(removal(scheduler, msg, ws, name), time.monotonic())
        now = [d for d in out if isinstance(d, Hold)]
        later = [d for d in out if not isinstance(d, Hold)]
        plugin.apply(now)
        if later:
            asyncio.get_running_loop().call_soon(plugin._apply_guarded, later)


def after_removal(plugin: OomguardSchedulerPlugin, worker: str) -> None:
    """Dask's `remove_worker` plugin hook, after Dask moved the worker's tasks. Its event
    was handled already (`on_event`); a worker still held here had no event oomguard saw
    (a Dask release that stops publishing it): its WorkerState and hostname are let go, its
    nanny remembered, and Dask's own count decides its death."""
    scheduler = plugin.scheduler
    if worker not in plugin._workers or (scheduler is not None and worker in scheduler.workers):
        return
    with plugin.guard("log_event"):
        ws = plugin._workers.pop(worker)
        plugin._hostnames.pop(worker, None)
        plugin.handlers.nannies.removed(worker, ws)
        plugin.guard.once(
            "removal_unseen",
            "oomguard: Dask removed the worker %s without a remove-worker event; Dask's "
            "own count decides its death",
            worker,
        )


def removal(scheduler, msg: dict, ws, name: str | None = None) -> Removal:
    tasks = scheduler.tasks
    processing = {str(k): k for k in msg.get("processing-tasks") or ()}
    prior = {}
    for s, k in processing.items():
        ts = tasks.get(k)
        if ts is not None and ts.suspicious > 1:
            prior[s] = ts.suspicious - 1  # Dask counted this death already
    guess = {str(ts.key): ts.key for ts in ws.executing if str(ts.key) in processing}
    address = msg["worker"]
    return Removal(
        worker=address,
        host=name or ws.host or address_host(address),
        time=time.time(),
        processing=processing,
        executing_guess=guess,
        nthreads=ws.nthreads,
        pid=ws.pid,
        memory_limit=ws.memory_limit,
        prior=prior,
        nanny=ws.nanny,
    )
