"""Dask's bound on deaths per task kept, decided with the death report in hand.

Dask's `Scheduler.remove_worker` adds one to `ts.suspicious` of every task processing on the
removed worker and errs each one past `allowed_failures` with `KilledWorker` at once: 2-5 ms
before the nanny's death report could say whether the task was executing there or only
queued (DASK_NOTES.md). oomguard holds a dead worker's tasks until the death is decided
(`_decide`), and stops a task past the bound with a `KilledWorker` that says what Dask's
would have said (`PipelineAborted`), or lets it run again when it was only queued.

So that Dask does not decide first, `remove_worker` is wrapped on this scheduler instance
(and its "unregister" RPC handler, which Dask bound at its start): for an unexpected
removal, each task oomguard holds that Dask would err now has its count lowered by the
deaths that take it past the bound, for Dask's counting loop only; the `remove-worker`
event Dask publishes right after that loop (`_removals.on_event`) puts the count back
(`counted`), in the same step of the event loop, so `ts.suspicious` reads what Dask counted.
`allowed_failures` is never changed; tasks oomguard does not hold (stopped ones) are
decided by Dask as without oomguard. A task held at the bound waits at most the report
grace (`oomguard.scheduler.report-grace-timeout`) for its decision.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distributed import Scheduler
    from distributed.scheduler import TaskState


class DaskBound:
    """The wrap of one scheduler's `remove_worker`; `uninstall()` gives Dask its own back.

    >>> bound = DaskBound(scheduler, holds=lambda key: True)  # doctest: +SKIP
    >>> bound.install()                                         # doctest: +SKIP
    """

    def __init__(self, scheduler: Scheduler, holds: Callable[[Any], bool]) -> None:
        self.scheduler = scheduler
        self.holds = holds  # whether oomguard will hold this key when its worker dies
        self.lowered: dict[str, list[tuple[TaskState, int]]] = {}  # worker -> counts lowered
        self._original: Callable[..., Any] | None = None
        self._wrapped: Callable[..., Any] | None = None

    def install(self) -> bool:
        """Wrap `remove_worker`; False (nothing changed) where Dask lacks it."""
        s = self.scheduler
        original = getattr(s, "remove_worker", None)
        if not callable(original) or s.handlers.get("unregister") != original:
            return False

        @functools.wraps(original)
        async def remove_worker(*args, **kwargs):
            address = kwargs.get("address", args[0] if args else None)
            worker = None if kwargs.get("expected") else self._lower(address)
            try:
                return await original(*args, **kwargs)
            finally:
                if worker is not None:
                    self.counted(worker)  # Dask returned before its loop: no event came

        self._original, self._wrapped = original, remove_worker
        s.remove_worker = remove_worker  # type: ignore[method-assign]
        s.handlers["unregister"] = remove_worker
        return True

    def uninstall(self) -> None:
        s = self.scheduler
        if self._wrapped is None:
            return
        if s.__dict__.get("remove_worker") is self._wrapped:
            del s.remove_worker
        if s.handlers.get("unregister") is self._wrapped:
            s.handlers["unregister"] = self._original
        for worker in list(self.lowered):
            self.counted(worker)
        self._original = self._wrapped = None

    def _lower(self, address: Any) -> str | None:
        """Lower the counts Dask would take past its bound in this removal (see above)."""
        s = self.scheduler
        if not isinstance(address, str):
            return None
        ws = s.workers.get(address) or s.workers.get(s.aliases.get(address, ""))
        if ws is None:
            return None
        allowed = s.allowed_failures
        lowered = []
        for ts in ws.processing:
            if ts.suspicious >= allowed and self.holds(ts.key):
                by = ts.suspicious - allowed + 1
                ts.suspicious -= by
                lowered.append((ts, by))
        if not lowered:
            return None
        self.lowered[ws.address] = lowered
        return ws.address

    def counted(self, worker: str) -> None:
        """Dask counted the deaths of this removal: the lowered counts go back up."""
        for ts, by in self.lowered.pop(worker, ()):
            ts.suspicious += by
