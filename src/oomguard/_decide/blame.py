"""Who a death is blamed on, and how sure that is (pure).

The nanny's flight record names the tasks that were executing when the worker died: they
are blamed, everything else Dask had sent the worker was only queued there (displaced).
When a native crash's dump names the thread that crashed and the flight record the task
that ran on it, that task alone is blamed: the others executing beside it were displaced by
a neighbour's crash.
Without a report (the nanny died too), or with one whose worker left no flight record to
read (it started before oomguard's worker plugin, so an empty list says nothing), the
scheduler's last heartbeat says what was executing; failing that, every task on the worker
is a suspect, as Dask itself would count them, so a killer that took its nanny with it is
never "nobody".

A death without a report is one event. When it leaves one suspect (one task there, or one
the last heartbeat saw executing and still there) that shard is named: the event is its
own failure, as a report's is. When it leaves several, none is named (`Blame.suspected`):
the one event lists them, each still counts against Dask's death budget, but no shard's
own failure count or place in a signature moves.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from .._words import culprit_line
from .deaths import Death
from .runs import ShardKey

FLIGHT_RECORD = "flight record"
CRASHED_THREAD = "the crashing thread (its crash dump and the flight record)"
HEARTBEAT = "last heartbeat"
THREADS = "no more tasks than threads"
EVERYTHING = "every task on the worker (nothing said what was executing)"


@dataclass(frozen=True)
class Blame:
    """`executing`: str(key) -> key (None where the scheduler does not know the key), what
    the death is blamed on. `displaced`: tasks it is certainly not charged to. Without a
    report nothing is certain, so nothing is displaced: every task on the worker keeps
    Dask's own charge (the death budget), while the events blame only `executing`."""

    executing: dict[ShardKey, Any]
    displaced: dict[ShardKey, Any]
    source: str
    #: Of `displaced`: tasks that executed beside the one whose thread crashed.
    neighbours: frozenset[ShardKey] = frozenset()
    #: The report's executing entries not blamed: keys the scheduler did not have in
    #: processing on that worker, or more than its threads (`bounded_entries`).
    ignored: int = 0

    @property
    def certain(self) -> bool:
        return self.source in (FLIGHT_RECORD, CRASHED_THREAD)

    @property
    def suspected(self) -> bool:
        """No report, several suspects: the death names none of them (see the module)."""
        return not self.certain and len(self.executing) > 1


def blame(death: Death, forgotten: Container = ()) -> Blame:
    """>>> from .deaths import Removal
    >>> r = Removal("tcp://a:1", "a", 0.0, {"x": "x", "y": "y"}, nthreads=1)
    >>> b = blame(Death("tcp://a:1", r, {"executing": [{"key": "x"}]}))
    >>> sorted(b.executing), sorted(b.displaced), b.certain
    (['x'], ['y'], True)
    >>> b = blame(Death("tcp://a:1", r, None))
    >>> sorted(b.executing), b.source, b.suspected
    (['x', 'y'], 'every task on the worker (nothing said what was executing)', True)
    >>> ran = [{"key": "x", "crashed": False}, {"key": "y", "crashed": True}]
    >>> b = blame(Death("tcp://a:1", r, {"executing": ran}))
    >>> sorted(b.executing), sorted(b.displaced), sorted(b.neighbours)
    (['y'], ['x'], ['x'])
    >>> unread = {"executing": [], "evidence": {"flight_record": False}}
    >>> b = blame(Death("tcp://a:1", r, unread))
    >>> sorted(b.executing), b.displaced, b.certain
    (['x', 'y'], {}, False)
    """
    processing = death.removal.processing if death.removal is not None else {}
    neighbours: frozenset[ShardKey] = frozenset()
    ignored = 0
    report = death.report if recorded(death.report) else None
    if report is not None:
        ran, ignored = bounded_entries(death, forgotten)
        crashed = [e for e in ran if e.get("crashed")]
        entries = crashed or ran
        executing = {e["key"]: processing.get(e["key"]) for e in _first(entries, death)}
        source = FLIGHT_RECORD
        if crashed and len(crashed) < len(ran):
            source = CRASHED_THREAD
            neighbours = frozenset(e["key"] for e in ran if not e.get("crashed"))
    else:
        removal = death.removal
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
        ran_keys = {e["key"] for e in ran} - neighbours
        displaced = {s: k for s, k in processing.items() if s not in executing.keys() | ran_keys}
    return Blame(executing, displaced, source, neighbours, ignored)


def recorded(report: dict | None) -> bool:
    """A report whose `executing` can be believed: its worker's flight record was read
    (reports of older nannies do not say: believed, as before)."""
    if report is None:
        return False
    evidence = report.get("evidence")
    return not isinstance(evidence, dict) or evidence.get("flight_record") is not False


def bounded_entries(death: Death, forgotten: Container = ()) -> tuple[list[dict], int]:
    """The report's executing entries that count, and how many others it named.

    A report may name up to 64 keys, and each blamed one becomes an event. Only keys the
    scheduler had in processing on that worker count (a removal says which), and those
    it forgot while they may still have run (a thread cannot be stopped); the others
    are ignored, and counted. Without a removal (a late report, or one whose removal
    never came) the scheduler cannot check them: all count, and `_first` bounds them.

    >>> from .deaths import Removal
    >>> r = Removal("tcp://a:1", "a", 0.0, {"x": "x", "y": "y"}, nthreads=1)
    >>> ran = [{"key": k} for k in ("forged", "y", "x")]
    >>> bounded_entries(Death("tcp://a:1", r, {"executing": ran}))
    ([{'key': 'y'}, {'key': 'x'}], 1)
    """
    report, removal = death.report, death.removal
    assert report is not None
    named = report["executing"]
    if removal is None:
        return list(named), 0
    ran = [e for e in named if e["key"] in removal.processing or e["key"] in forgotten]
    return ran, len(named) - len(ran)


def _first(entries: list[dict], death: Death) -> list[dict]:
    """At most as many entries as the worker had threads (as the scheduler knew them; the
    death a late report amends; else one): each blamed entry is an event. The others
    executing there keep Dask's charge, unnamed.

    >>> from .deaths import Removal
    >>> r = Removal("tcp://a:1", "a", 0.0, {"x": "x", "y": "y"}, nthreads=1)
    >>> _first([{"key": "y"}, {"key": "x"}], Death("tcp://a:1", r, {}))
    [{'key': 'y'}]
    """
    threads = death.removal.nthreads if death.removal is not None else death.nthreads
    return entries[: max(1, threads or 1)]


def blamed(death: Death) -> tuple[list[dict], int]:
    """The report's executing entries the death is blamed on (the crashed thread's when
    the dump named it, else all that count, at most one per thread), and how many entries
    were not blamed that way (ignored, or past the threads)."""
    ran, ignored = bounded_entries(death)
    entries = _first(blamed_entries({"executing": ran}), death)
    crashed = any(e.get("crashed") for e in ran)
    cut = 0 if crashed else len(ran) - len(entries)
    return entries, ignored + cut


def blamed_entries(report: dict) -> list[dict]:
    """The report's executing entries a death is blamed on: the one whose thread crashed
    when the nanny matched it (`_death.threads`), else all of them."""
    crashed = [e for e in report["executing"] if e.get("crashed")]
    return crashed or report["executing"]


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


def culprit(executing: list[dict]) -> Culprit | None:
    """The executing task (report entries) that grew most, when it grew at least 65% of
    what all of them grew and the samples saw enough growth to say; otherwise None (no
    single culprit, or nothing measured).

    >>> MiB = 2**20
    >>> culprit([{"key": "a", "grew": 900 * MiB}, {"key": "b", "grew": 100 * MiB}]).shard
    'a'
    >>> culprit([{"key": "a", "grew": 500 * MiB}, {"key": "b", "grew": 520 * MiB}]) is None
    True
    """
    grew = [(e.get("grew") or 0, e["key"]) for e in executing]
    total = sum(g for g, _ in grew)
    if len(grew) < 2 or total < CULPRIT_MIN_BYTES:
        return None
    top, shard = max(grew)
    if top < CULPRIT_MIN_SHARE * total:
        return None
    return Culprit(shard, top, total)
