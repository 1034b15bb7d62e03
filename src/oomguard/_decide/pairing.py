"""Pairing a worker's removal with its nanny's death report: each death decided once.

The scheduler removes a dead worker a few milliseconds before or after its nanny's report
arrives; either may come first, and a partitioned nanny's report may come much later. A
removal waits `grace` seconds for its report, then is decided ``worker_lost``; a report
that arrives after that (same worker, same process) *amends* that death instead of making
a second one. A report whose removal never comes is decided on its own after `grace`.

Removals are bounded by the workers Dask really had; only unmatched reports (which any
sender could flood) are capped, and everything refused is counted by reason.

A removal and a report also pair by process (nanny, pid) when their addresses differ: a
worker restarted by its nanny can register, take a task and die before the nanny has read
its new address, and the report then names the address of the previous process.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

from .._causes import Cause
from .._death.record import Death
from .._protocol import DUPLICATE, OVERFLOW
from .runs import ShardKey


@dataclass(frozen=True)
class Removal:
    """What the scheduler knew of a worker when it removed it unexpectedly."""

    worker: str
    host: str
    time: float
    processing: dict[ShardKey, Any]  # str(key) -> key, everything Dask had sent it
    executing_guess: dict[ShardKey, Any] = field(default_factory=dict)  # last heartbeat's view
    nthreads: int = 1
    pid: int | None = None
    memory_limit: int | None = None
    prior: dict[ShardKey, int] = field(default_factory=dict)  # str(key) -> Dask's earlier count
    nanny: str | None = None  # the worker's nanny, which reports its death


@dataclass(frozen=True)
class Case:
    """One death to decide: a removal, its nanny's report (the `Death` it saw), or both.
    `late`: a report for a death already decided without one. `clean`: not a death at all, a removal whose nanny said it
    was asked to stop the worker (its tasks run elsewhere, nothing is blamed). `exited`: its
    nanny said the worker ended with status 0 unasked (a task called `os._exit(0)`): a death
    with no report, counted as Dask counts it."""

    worker: str
    removal: Removal | None
    report: Death | None
    late: bool = False
    lost_at: float | None = None  # with `late`: the time of the worker_lost decision it amends
    clean: bool = False
    exited: bool = False
    # with `clean`: what its nanny said the worker was executing when it was stopped
    # (the flight record's keys, at most 16); None when it did not say
    executing: tuple[ShardKey, ...] | None = None
    # with `late`: the threads of the dead worker, as its removal said (None: not known)
    nthreads: int | None = None

    @property
    def cause(self) -> Cause:
        """Its report's cause; without one `exit` (ended unasked with status 0), else
        `worker_lost`."""
        if self.report is not None:
            return Cause(self.report.cause)
        return Cause.EXIT if self.exited else Cause.WORKER_LOST


class DeathPairing:
    """Holds removals and reports until their partner arrives or `grace` runs out.

    >>> pairing = DeathPairing(grace=5.0)
    >>> pairing.removed(Removal("tcp://a:1", "a", 0.0, {}), now=0.0) is None
    True
    >>> pairing.reported(Death(worker="tcp://a:1", pid=7), now=0.1).removal.worker
    'tcp://a:1'
    """

    def __init__(self, grace: float, *, max_reports: int = 1_000, remember: int = 100_000):
        self.grace = grace
        self.max_reports = max_reports
        self.remember = remember
        self._removals: OrderedDict[str, tuple[float, Removal]] = OrderedDict()
        self._reports: OrderedDict[str, tuple[float, Death]] = OrderedDict()
        # worker -> (when, requested, pid, executing) of nannies' exit notices waiting for
        # a removal
        self._clean: OrderedDict[str, tuple[float, bool, int | None, tuple | None]] = OrderedDict()
        # worker -> {pid: [had a report, removal time]} of its decided deaths (a worker
        # restarted under the same address dies again; an unknown pid gets a key of its
        # own): a later report of that process amends its death (decided worker_lost) or
        # repeats it (refused). At most `remember` deaths in all, oldest workers first.
        self._decided: OrderedDict[str, dict[Any, list]] = OrderedDict()
        self._remembered = 0
        # (nanny, pid) -> the address a removal / a report waits under (checked on use)
        self._removal_of: dict[tuple, str] = {}
        self._report_of: dict[tuple, str] = {}
        self._decided_of: OrderedDict[tuple, str] = OrderedDict()  # of decided deaths
        self.refused: dict[str, int] = {}
        self.clean_exits = 0

    def _refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def _done(self, death: Case) -> Case:
        deaths = self._decided.pop(death.worker, {})
        pid = _pid(death)
        when = death.removal.time if death.removal is not None else None
        threads = death.removal.nthreads if death.removal is not None else None
        if pid not in deaths:
            self._remembered += 1
        deaths[pid if pid is not None else object()] = [death.report is not None, when, threads]
        self._decided[death.worker] = deaths
        nanny = death.removal.nanny if death.removal is not None else None
        if nanny is not None and pid is not None:
            self._decided_of[(nanny, pid)] = death.worker
            while len(self._decided_of) > self.remember:
                self._decided_of.popitem(last=False)
        while self._remembered > self.remember:
            self._remembered -= len(self._decided.popitem(last=False)[1])
        while len(self._decided) > self.remember:
            self._decided.popitem(last=False)
        return death

    def clean(
        self,
        worker: str,
        now: float,
        requested: bool,
        pid: int | None = None,
        executing: tuple[ShardKey, ...] | None = None,
    ) -> Case | None:
        """The worker's nanny says its worker (process `pid`) ended with status 0 or was
        stopped by request. Its removal, before or after this, is then decided at once: not a
        death when the stop was `requested` (a closed nanny, a restart, SIGTERM to `dask
        worker`), else a death without a report (`exited`: the process ended itself; Dask
        counts that too, so a task that keeps doing it stays bounded). A removal of another
        process at the same address (one that died before a restart) is not this one's.
        `executing`: the keys its nanny said the worker was executing when stopped."""
        waiting = self._removals.get(worker)
        if waiting is not None and _same(waiting[1].pid, pid):
            del self._removals[worker]
            return self._exit(Case(worker, waiting[1], None, executing=executing), requested)
        self._clean.pop(worker, None)
        self._clean[worker] = (now, requested, pid, executing)
        while len(self._clean) > self.max_reports:
            self._clean.popitem(last=False)
        return None

    def _exit(self, death: Case, requested: bool) -> Case:
        if requested:
            self.clean_exits += 1
            return replace(death, clean=True)
        return self._done(replace(death, exited=True))

    def removed(self, removal: Removal, now: float) -> Case | None:
        notice = self._clean.get(removal.worker)
        if notice is not None and _same(notice[2], removal.pid):
            del self._clean[removal.worker]
            death = Case(removal.worker, removal, None, executing=notice[3])
            return self._exit(death, notice[1])
        waiting = self._reports.pop(removal.worker, None)
        if waiting is not None:
            return self._done(Case(removal.worker, removal, waiting[1]))
        process = (removal.nanny, removal.pid)
        known = removal.pid is not None and removal.nanny is not None
        stale = self._report_of.pop(process, None) if known else None
        if stale is not None and _is(self._reports.get(stale), process):
            report = self._reports.pop(stale)[1]
            return self._done(
                Case(removal.worker, removal, replace(report, worker=removal.worker))
            )
        earlier = self._removals.pop(removal.worker, None)
        self._removals[removal.worker] = (now, removal)
        if known:
            self._removal_of[process] = removal.worker
        if earlier is not None:  # the same address died twice before a report: decide the first
            return self._done(Case(removal.worker, earlier[1], None))
        return None

    def reported(self, report: Death, now: float) -> Case | None:
        worker = report.worker
        waiting = self._removals.get(worker)
        if waiting is not None and _matches(waiting[1], report):
            del self._removals[worker]
            return self._done(Case(worker, waiting[1], report))
        pid = report.pid
        process = (report.nanny, pid)
        known = pid is not None and process[0] is not None
        moved = self._removal_of.pop(process, None) if known else None
        if moved is not None and moved != worker and _is(self._removals.get(moved), process):
            removal = self._removals.pop(moved)[1]
            return self._done(Case(moved, removal, replace(report, worker=moved)))
        deaths = self._decided.get(worker, {})
        mine = deaths.get(pid) if pid is not None else None
        if mine is None and known:  # decided under the process's newer address?
            other = self._decided_of.get(process)
            if other is not None and other != worker and pid in self._decided.get(other, {}):
                worker, report = other, replace(report, worker=other)
                deaths = self._decided[other]
                mine = deaths[pid]
        if mine is None:  # a death whose process was unknown on one side
            unknown = [d for p, d in deaths.items() if pid is None or not isinstance(p, int)]
            mine = next((d for d in unknown if not d[0]), unknown[0] if unknown else None)
        if mine is not None:
            if mine[0]:
                self._refuse(DUPLICATE)
                return None
            # Decided as worker_lost; this report says what really happened.
            mine[0] = True
            return Case(worker, None, report, late=True, lost_at=mine[1], nthreads=mine[2])
        earlier = self._reports.get(worker)
        if earlier is not None and _same(earlier[1].pid, pid):
            self._refuse(DUPLICATE)
            return None
        if earlier is None and len(self._reports) >= self.max_reports:
            self._refuse(OVERFLOW)
            return None
        self._reports.pop(worker, None)
        self._reports[worker] = (now, report)
        if known:
            self._report_of[process] = worker
        if earlier is not None:
            # Another process at this address died first: a worker restarted by its nanny
            # and killed again before it registered keeps its predecessor's address (Dask
            # sets it only once the new worker is up). Neither will see a removal: decide
            # the first now, as a removal at one address twice is.
            return self._done(Case(worker, None, earlier[1]))
        return None

    def expired(self, now: float, limit: int | None = None) -> list[Case]:
        """Deaths whose partner did not arrive within `grace` (oldest first), at most
        `limit` of them (the rest on the next call)."""
        out: list[Case] = []
        room = limit if limit is not None else float("inf")
        while self._clean and now - next(iter(self._clean.values()))[0] >= self.grace:
            self._clean.popitem(last=False)
        for pending, as_death in (
            (self._removals, lambda w, r: Case(w, r, None)),
            (self._reports, lambda w, r: Case(w, None, r)),
        ):
            while pending and len(out) < room:
                worker, (since, item) = next(iter(pending.items()))
                if now - since < self.grace:
                    break
                pending.popitem(last=False)
                out.append(self._done(as_death(worker, item)))
        # The indexes are checked on use; rebuilt here so what left the queues another way
        # does not pile up in them (amortised O(1)).
        if len(self._removal_of) > 2 * len(self._removals) + 64:
            self._removal_of = {
                (r.nanny, r.pid): w
                for w, (_, r) in self._removals.items()
                if r.pid is not None and r.nanny is not None
            }
        if len(self._report_of) > 2 * len(self._reports) + 64:
            self._report_of = {
                (r.nanny, r.pid): w
                for w, (_, r) in self._reports.items()
                if r.pid is not None and r.nanny is not None
            }
        return out

    def drain(self) -> list[Case]:
        """Everything still waiting, decided now (the plugin is closing)."""
        out = [self._done(Case(w, r, None)) for w, (_, r) in self._removals.items()]
        out += [self._done(Case(w, None, r)) for w, (_, r) in self._reports.items()]
        self._removals.clear()
        self._reports.clear()
        self._removal_of.clear()
        self._report_of.clear()
        self._clean.clear()
        return out

    def only_unmatched_fit(self) -> bool:
        """True when a new report could only be refused: the unmatched reports are at their
        cap and no removal waits for a report (a storm of reports nothing asked for)."""
        return len(self._reports) >= self.max_reports and not self._removals

    def waits(self, worker: str) -> bool:
        """Whether a removal of `worker` waits for its report (O(1))."""
        return worker in self._removals

    def pending_removals(self) -> int:
        return len(self._removals)

    def __len__(self) -> int:
        return len(self._removals) + len(self._reports)


def _pid(death: Case) -> Any:
    if death.report is not None:
        return death.report.pid
    return death.removal.pid if death.removal is not None else None


def _same(a: Any, b: Any) -> bool:
    # A restarted worker can reuse its address: the process must be the same where known.
    return a is None or b is None or a == b


def _is(waiting: tuple | None, process: tuple) -> bool:
    """Whether a waiting (since, removal or report) is of the process (nanny, pid)."""
    if waiting is None:
        return False
    item = waiting[1]
    if isinstance(item, Removal):
        return (item.nanny, item.pid) == process
    return (item.nanny, item.pid) == process


def _matches(removal: Removal, report: Death) -> bool:
    return _same(removal.pid, report.pid)
