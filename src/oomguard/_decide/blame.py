"""Who a death is blamed on, and how sure that is: each task's `Role` (pure).

The nanny's flight record names the tasks that were executing when the worker died: they
are blamed, everything else Dask had sent the worker was only queued there (`QUEUED`).
When a native crash's dump names the thread that crashed and the flight record the task
that ran on it, that task alone is the `CULPRIT`: the others executing beside it were
`DISPLACED` by a neighbour's crash. A memory kill of a worker executing several tasks
proves no single one too big; when the samples show one of them grew most (`culprit`),
it is the culprit and the others were displaced beside it (still charged against Dask's
bound: the samples can be wrong), else each is a `SUSPECT`. One task blamed alone is the
culprit; several with nothing to tell them apart are suspects.

Without a report (the nanny died too), or with one whose worker left no flight record to
read (it started before oomguard's worker plugin, so an empty list says nothing), the
scheduler's last heartbeat says what was executing; failing that, every task on the worker
is a suspect, as Dask itself would count them, so a killer that took its nanny with it is
never "nobody". A death without a report is one event: when it leaves one suspect that
shard is named (the culprit); when it leaves several, none is (`Blame.suspected`): each
still counts against Dask's death budget, but no shard's own failure count or place in a
signature moves.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._causes import memory_death
from .._death.record import Death, Role, Task
from .._words import culprit_line
from .pairing import Case
from .runs import ShardKey

FLIGHT_RECORD = "flight record"
CRASHED_THREAD = "the crashing thread (its crash dump and the flight record)"
HEARTBEAT = "last heartbeat"
THREADS = "no more tasks than threads"
EVERYTHING = "every task on the worker (nothing said what was executing)"


@dataclass(frozen=True)
class Blame:
    """`executing`: str(key) -> key (None where the scheduler does not know the key), what
    the death is blamed on (its culprit or its suspects). `displaced`: tasks it is
    certainly not charged to (queued there, or beside a crash). `beside`: tasks executing
    beside a memory kill's likely culprit, displaced but still charged. Without a report
    nothing is certain, so nothing is displaced: every task on the worker keeps Dask's own
    charge (the death budget), while the events blame only `executing`. `roles` says each
    task's part."""

    executing: dict[ShardKey, Any]
    displaced: dict[ShardKey, Any]
    source: str
    #: Of `displaced`: tasks that executed beside the one whose thread crashed.
    neighbours: frozenset[ShardKey] = frozenset()
    #: The report's executing entries not blamed: keys the scheduler did not have in
    #: processing on that worker, or more than its threads (`bounded_entries`).
    ignored: int = 0
    #: A memory kill of a worker executing several tasks, known from its flight record.
    shared: bool = False
    likely: Culprit | None = None
    beside: dict[ShardKey, Any] = field(default_factory=dict)
    roles: dict[ShardKey, Role] = field(default_factory=dict)

    @property
    def certain(self) -> bool:
        return self.source in (FLIGHT_RECORD, CRASHED_THREAD)

    @property
    def suspected(self) -> bool:
        """No report, several suspects: the death names none of them (see the module)."""
        return not self.certain and len(self.executing) > 1


def blame(case: Case, forgotten: Container = ()) -> Blame:
    """Each task's part in the death of `case`.

    >>> from .pairing import Removal
    >>> r = Removal("tcp://a:1", "a", 0.0, {"x": "x", "y": "y"}, nthreads=1)
    >>> b = blame(Case("tcp://a:1", r, Death(tasks=(Task("x"),))))
    >>> sorted(b.executing), sorted(b.displaced), b.certain, b.roles["y"]
    (['x'], ['y'], True, <Role.QUEUED: 'queued'>)
    >>> b = blame(Case("tcp://a:1", r, None))
    >>> sorted(b.executing), b.source, b.suspected
    (['x', 'y'], 'every task on the worker (nothing said what was executing)', True)
    >>> ran = (Task("x", crashed=False), Task("y", crashed=True))
    >>> b = blame(Case("tcp://a:1", r, Death(tasks=ran)))
    >>> sorted(b.executing), sorted(b.displaced), sorted(b.neighbours)
    (['y'], ['x'], ['x'])
    >>> unread = Death(evidence={"flight_record": False})
    >>> b = blame(Case("tcp://a:1", r, unread))
    >>> sorted(b.executing), b.displaced, b.certain
    (['x', 'y'], {}, False)
    """
    processing = case.removal.processing if case.removal is not None else {}
    neighbours: frozenset[ShardKey] = frozenset()
    ignored = 0
    report = case.report if recorded(case.report) else None
    if report is not None:
        ran, ignored = bounded_entries(case, forgotten)
        crashed = [e for e in ran if e.crashed]
        entries = _first(crashed or ran, case)
        executing = {e.key: processing.get(e.key) for e in entries}
        source = FLIGHT_RECORD
        if crashed and len(crashed) < len(ran):
            source = CRASHED_THREAD
            neighbours = frozenset(e.key for e in ran if not e.crashed)
    else:
        removal = case.removal
        if removal is None:  # a report with no flight record, its removal not (yet) seen
            return Blame({}, {}, EVERYTHING)
        if removal.executing_guess:
            executing, source = dict(removal.executing_guess), HEARTBEAT
        elif len(processing) <= removal.nthreads:
            executing, source = dict(processing), THREADS
        else:
            executing, source = dict(processing), EVERYTHING
    displaced = {}
    if report is not None:
        # Executing there (beyond the threads, or beside a crash) is never displaced
        # unless it was the crash's neighbour: it keeps Dask's own charge.
        ran_keys = {e.key for e in ran} - neighbours
        displaced = {s: k for s, k in processing.items() if s not in executing.keys() | ran_keys}
    # A memory death (not a task's MemoryError) can be shared: several tasks growing
    # together on one worker. The samples may name the one that grew most.
    known = sum(k is not None for k in executing.values())
    shared = memory_kill(case) and source in (FLIGHT_RECORD, CRASHED_THREAD) and known > 1
    likely, beside = None, {}
    if shared:
        likely = culprit([e for e in report.tasks if e.key in executing])
        if likely is not None:
            beside = {s: k for s, k in executing.items() if s != likely.shard}
            executing = {likely.shard: executing[likely.shard]}
    roles: dict[ShardKey, Role] = {s: Role.QUEUED for s in processing}
    lone = len(executing) == 1 or likely is not None
    roles.update(dict.fromkeys(executing, Role.CULPRIT if lone else Role.SUSPECT))
    roles.update(dict.fromkeys([*beside, *neighbours], Role.DISPLACED))
    return Blame(executing, displaced, source, neighbours, ignored, shared, likely, beside, roles)


def memory_kill(case: Case) -> bool:
    """A memory death of the worker (its report says so: a counted OOM kill, the nanny's
    memory terminate, a userspace OOM killer's kill of the host's largest process)."""
    return memory_death(case.cause, case.report.evidence if case.report else None)


def recorded(report: Death | None) -> bool:
    """A report whose `tasks` can be believed: its worker's flight record was read
    (reports of older nannies do not say: believed, as before)."""
    if report is None:
        return False
    return report.evidence.get("flight_record") is not False


def bounded_entries(case: Case, forgotten: Container = ()) -> tuple[list[Task], int]:
    """The report's executing entries that count, and how many others it named.

    A report may name up to 64 keys, and each blamed one becomes an event. Only keys the
    scheduler had in processing on that worker count (a removal says which), and those
    it forgot while they may still have run (a thread cannot be stopped); the others
    are ignored, and counted. Without a removal (a late report, or one whose removal
    never came) the scheduler cannot check them: all count, and `_first` bounds them.

    >>> from .pairing import Removal
    >>> r = Removal("tcp://a:1", "a", 0.0, {"x": "x", "y": "y"}, nthreads=1)
    >>> ran = tuple(Task(k) for k in ("forged", "y", "x"))
    >>> [t.key for t in bounded_entries(Case("tcp://a:1", r, Death(tasks=ran)))[0]]
    ['y', 'x']
    """
    report, removal = case.report, case.removal
    assert report is not None
    named = report.tasks
    if removal is None:
        return list(named), 0
    ran = [e for e in named if e.key in removal.processing or e.key in forgotten]
    return ran, len(named) - len(ran)


def _first(entries: Sequence[Task], case: Case) -> list[Task]:
    """At most as many entries as the worker had threads (as the scheduler knew them; the
    death a late report amends; else one): each blamed entry is an event. The others
    executing there keep Dask's charge, unnamed.

    >>> from .pairing import Removal
    >>> r = Removal("tcp://a:1", "a", 0.0, {"x": "x", "y": "y"}, nthreads=1)
    >>> [t.key for t in _first([Task("y"), Task("x")], Case("tcp://a:1", r, Death()))]
    ['y']
    """
    threads = case.removal.nthreads if case.removal is not None else case.nthreads
    return list(entries[: max(1, threads or 1)])


def blamed(case: Case) -> tuple[list[Task], int]:
    """The report's executing entries the death is blamed on (the crashed thread's when
    the dump named it, else all that count, at most one per thread), and how many entries
    were not blamed that way (ignored, or past the threads)."""
    ran, ignored = bounded_entries(case)
    crashed = [e for e in ran if e.crashed]
    entries = _first(crashed or ran, case)
    cut = 0 if crashed else len(ran) - len(entries)
    return entries, ignored + cut


#: Below this much sampled growth of the executing tasks together, the samples missed the
#: growth (it came after the last one) and naming a culprit would be noise.
CULPRIT_MIN_BYTES = 64 * 2**20
CULPRIT_MIN_SHARE = 0.65


@dataclass(frozen=True)
class Culprit:
    """The task that most likely made a worker run out of memory while it executed others.

    `grew` is its estimated growth (`oomguard._host.growth`), `total` all executing tasks'
    together; `share` says how sure: "likely" from 80%, "possibly" from 65% (below that
    there is no single culprit).
    """

    shard: ShardKey
    grew: int
    total: int

    @property
    def share(self) -> float:
        return self.grew / self.total

    @property
    def certainty(self) -> str:
        return "likely" if self.share >= 0.8 else "possibly"

    def describe(self) -> str:
        """
        >>> Culprit("big-1", 1900 * 2**20, 2000 * 2**20).describe()
        "likely 'big-1': 1.86 GiB of the 1.95 GiB the executing tasks grew (95%, sampled)"
        """
        return culprit_line(self.certainty, self.shard, self.grew, self.total)


def culprit(executing: Sequence[Task]) -> Culprit | None:
    """The executing task that grew most, when it grew at least 65% of what all of them
    grew and the samples saw enough growth to say; otherwise None (no single culprit, or
    nothing measured).

    >>> MiB = 2**20
    >>> culprit([Task("a", grew=900 * MiB), Task("b", grew=100 * MiB)]).shard
    'a'
    >>> culprit([Task("a", grew=500 * MiB), Task("b", grew=520 * MiB)]) is None
    True
    """
    grew = [(e.grew or 0, e.key) for e in executing]
    total = sum(g for g, _ in grew)
    if len(grew) < 2 or total < CULPRIT_MIN_BYTES:
        return None
    top, shard = max(grew)
    if top < CULPRIT_MIN_SHARE * total:
        return None
    return Culprit(shard, top, total)
