"""Pairing a worker's removal with its nanny's death report (pure; no Dask).

The scheduler removes a dead worker a few milliseconds before or after its nanny's report
arrives; either may come first. A removal waits `grace` seconds for its report, then is
decided as ``worker_lost`` (the host or pod died with its nanny). A report waits the same
time for its removal, then is decided on its own.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Removal:
    """What the scheduler knew of a worker when it removed it unexpectedly."""

    worker: str
    host: str
    time: float
    processing: dict[str, Any]  # str(key) -> key
    executing_guess: dict[str, Any] = field(default_factory=dict)  # from heartbeats
    nthreads: int = 1


@dataclass
class Death:
    """One death to decide: a removal, a report, or both."""

    worker: str
    removal: Removal | None
    report: dict | None


class DeathLedger:
    """Holds removals and reports until their partner arrives or `grace` runs out.

    >>> ledger = DeathLedger(grace=5.0)
    >>> ledger.removed(Removal("tcp://a:1", "a", 0.0, {}), now=0.0) is None
    True
    >>> ledger.reported({"worker": "tcp://a:1"}, now=0.1).removal.worker
    'tcp://a:1'
    """

    def __init__(self, grace: float, max_pending: int = 1_000):
        self.grace = grace
        self.max_pending = max_pending
        self._removals: OrderedDict[str, tuple[float, Removal]] = OrderedDict()
        self._reports: OrderedDict[str, tuple[float, dict]] = OrderedDict()
        self._clean: OrderedDict[str, float] = OrderedDict()  # nannies said: not a death
        self.overflow = 0  # entries pushed out by max_pending; decided early, not lost
        self.clean_exits = 0
        self.dropped = 0  # unmatched reports refused past max_pending (or a repeat)

    def clean(self, worker: str, now: float) -> None:
        """The worker's nanny says its exit was requested or clean (status 0): its removal,
        before or after this, is not a death."""
        if self._removals.pop(worker, None) is not None:
            self.clean_exits += 1
            return
        self._clean[worker] = now
        while len(self._clean) > self.max_pending:
            self._clean.popitem(last=False)

    def removed(self, removal: Removal, now: float) -> Death | None:
        if self._clean.pop(removal.worker, None) is not None:
            self.clean_exits += 1
            return None
        waiting = self._reports.pop(removal.worker, None)
        if waiting is not None:
            return Death(removal.worker, removal, waiting[1])
        self._removals[removal.worker] = (now, removal)
        return None

    def reported(self, report: dict, now: float) -> Death | None:
        worker = report["worker"]
        waiting = self._removals.pop(worker, None)
        if waiting is not None:
            return Death(worker, waiting[1], report)
        if worker in self._reports or len(self._reports) >= self.max_pending:
            # A flood of reports no removal matches (a storm, or a hostile sender):
            # refused and counted, never queued without bound.
            self.dropped += 1
            return None
        self._reports[worker] = (now, report)
        return None

    def expired(self, now: float) -> list[Death]:
        """Deaths whose partner did not arrive within `grace` (oldest first)."""
        out: list[Death] = []
        while self._clean and now - next(iter(self._clean.values())) >= self.grace:
            self._clean.popitem(last=False)
        for pending, make in (
            (self._removals, lambda w, r: Death(w, r, None)),
            (self._reports, lambda w, r: Death(w, None, r)),
        ):
            while pending:
                worker, (since, item) = next(iter(pending.items()))
                if now - since < self.grace and len(pending) <= self.max_pending:
                    break
                if now - since < self.grace:
                    self.overflow += 1
                pending.popitem(last=False)
                out.append(make(worker, item))
        return out

    def drain(self) -> list[Death]:
        """Reports still waiting (scheduler closing). Removals without a report are
        dropped: while the scheduler closes, workers leave without being deaths."""
        out = [Death(w, None, r) for w, (_, r) in self._reports.items()]
        self._removals.clear()
        self._reports.clear()
        self._clean.clear()
        return out

    def __len__(self) -> int:
        return len(self._removals) + len(self._reports)
