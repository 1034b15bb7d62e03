"""Pipeline runs: which run each task key belongs to (pure; keys and annotations only).

A pipeline is named, in order of precedence, by
1. the ``oomguard_pipeline`` annotation (``with dask.annotate(oomguard_pipeline="etl")``),
2. the ``distributed.span("etl")`` the tasks were submitted in (nested spans join with "/"),
3. otherwise what the submission computes, as a person wrote it: the chain of task prefixes
   from its first output key down to a root task, without Dask's own steps (`finalize`,
   the `-partial`/`-aggregate` phases of one reduction): `random_sample → mean`, or the
   function of a `client.map` (`collection_name`).
Whoever submits chooses the name, so it is made safe once per run (`_safe_text.safe_name`:
one printable line of at most 1 KiB; a longer one keeps its start and a hash of the whole).

A *run* (a *job*: what the user wrapped) is one execution of a pipeline, judged on its own
(its own counters and decision), however many graphs it arrives in (a dask.dataframe makes
one per `.compute()` and per eager step such as `set_index`'s divisions):
- under a span, everything submitted in one ``with span(...)`` block (Dask gives each block
  its own span id; nested spans: the innermost block is the job, named "outer/inner"), so a
  second block with the same name is a second run (labelled "etl#2" here; stored under the
  name "etl" with its start time, as every run is);
- under the annotation without a span, everything its client submits with that name (the
  scheduler never sees the ``with`` end); with a span too, the span's block delimits it;
- otherwise, consecutive submissions with the same name join the live run of that name
  (``[client.submit(f, x) for x in xs]`` is one run, not one per task) until that run has no
  live keys left; the next submission then starts a new run.
A run that is decided (aborted) takes no more keys: later submissions with its identity
start a new run. A span or annotation run is kept once its keys are all forgotten (more
work in its block may come); the `IDLE_RUNS` most recently emptied are kept, and past that
the oldest is dropped: work that comes later in its block starts a new run of its name.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NewType

from dask.utils import key_split

from .._protocol import PIPELINE_ANNOTATION as ANNOTATION
from .._safe_text import safe_name

#: Span and annotation runs kept after their keys are all forgotten, most recent last. A run
#: is a few hundred bytes of counters, plus a record per shard that failed.
IDLE_RUNS = 1_000
#: Pipeline names whose run count is kept (to label a name's second run "etl#2"), least
#: recently started dropped first. A name seen again after it was dropped is numbered past
#: every count dropped so far, so a label is never given twice.
SEEN_NAMES = 10_000

#: A task key as `str(key)`: how reports, events and the policy name a shard.
ShardKey = NewType("ShardKey", str)
#: One run of a pipeline ("etl", "etl#2"): the policy's key for it. Not the pipeline's
#: name, which several runs share.
RunLabel = NewType("RunLabel", str)

#: Steps Dask adds around the user's own (dropped), and the suffixes of the phases of one
#: operation (`sum-partial`, `sum-aggregate`, `mean_chunk`, `mean_combine-partial`).
_DASK_STEPS = ("finalize", "repartition", "rechunk-merge", "rechunk-split", "store-map")
_PHASES = (
    "-aggregate",
    "-partial",
    "-part",
    "-combine",
    "-chunk",
    "-agg",
    "-tree",
    "-fused",
    "-lambda",
    "_agg",
    "_combine",
    "_chunk",
    "_aggregate",
)


def collection_name(prefixes: Iterable[str], most: int = 3) -> str | None:
    """A name a person recognises for a submission, from its task prefixes along one path
    from the output down to a root (output first, as a graph walk finds them).

    >>> collection_name(["finalize-hlgfinalizecompute", "mean_agg-aggregate",
    ...                  "mean_combine-partial", "mean_chunk", "random_sample"])
    'random_sample → mean'
    >>> collection_name(["finalize-hlgfinalizecompute", "sum-aggregate", "sum-part",
    ...                  "filter-lambda"])
    'filter → sum'
    >>> collection_name(["abs"]), collection_name(["finalize"])
    ('abs', None)
    >>> collection_name(["e", "d", "c", "b", "a"])  # the root and the last steps
    'a → … → d → e'
    """
    chain: list[str] = []
    for prefix in prefixes:
        if prefix.startswith(_DASK_STEPS):
            continue
        name = prefix
        changed = True
        while changed:  # mean_combine-partial -> mean_combine -> mean
            changed = False
            for suffix in _PHASES:
                if name.endswith(suffix) and len(name) > len(suffix):
                    name, changed = name[: -len(suffix)], True
        if name and (not chain or chain[-1] != name):
            chain.append(name)
    if not chain:
        return None
    chain.reverse()  # root first
    if len(chain) > most:
        chain = [chain[0], "…", *chain[-(most - 1) :]]
    return " → ".join(chain)


@dataclass(eq=False)
class Run:
    """One run of a pipeline. `label` is unique in this scheduler's life ("etl", "etl#2")."""

    label: RunLabel
    name: str
    started: float
    identity: tuple
    keys: set = field(default_factory=set)
    closed: bool = False  # decided (aborted): later submissions start a new run

    @property
    def held_open(self) -> bool:
        """Kept when empty: a span block or an annotation may submit more to it."""
        return self.identity[0] != "default"


#: Pipeline names of forgotten keys kept for deaths they cause later (`Runs.forgotten`).
FORGOTTEN_NAMES = 10_000


class Runs:
    """key -> run, with a str(key) index so a report's key strings find their keys.

    >>> runs = Runs()
    >>> [r.label for r in runs.observe(["a-1"], ["a-1"], {ANNOTATION: {"a-1": "etl"}}, 0.0)]
    ['etl']
    >>> runs.of("a-1").name
    'etl'
    """

    def __init__(self, idle_runs: int = IDLE_RUNS, seen_names: int = SEEN_NAMES) -> None:
        self._of: dict[Any, tuple[Run, ShardKey]] = {}  # key -> (its run, str(key))
        self._by_str: dict[ShardKey, Any] = {}
        self._live: dict[tuple, Run] = {}  # identity -> the open run (idle ones too)
        self._idle: OrderedDict[tuple, Run] = OrderedDict()  # open runs with no key, oldest 1st
        self._idle_runs = idle_runs
        self._seen: OrderedDict[str, int] = OrderedDict()  # name -> runs started, for labels
        self._seen_names = seen_names
        self._dropped = 0  # the highest count dropped from `_seen`
        self._ids = itertools.count(1)
        #: Runs that ended for good (no key left and nothing more can join): the owner
        #: persists their status, then forgets them (`take_ended`).
        self.ended: list[Run] = []
        #: str(key) -> the run's name of keys forgotten lately (~100 bytes each): a
        #: forgotten task may still be running (released, or its run aborted: Python
        #: cannot stop a thread), and a death it causes later still names its pipeline.
        self.forgotten: OrderedDict[ShardKey, str] = OrderedDict()

    def observe(
        self,
        tasks: Iterable[Any],
        keys: Iterable[Any],
        annotations: Mapping[str, Mapping[Any, Any]],
        now: float,
        name: str | None = None,
        client: str = "",
    ) -> dict[Run, list]:
        """Assign the new tasks of one graph submission to runs: {run: its new keys}.
        `name`: the submission's name where no annotation or span gives one (see
        `collection_name`); the first output key's prefix without it. `client`: who
        submitted it (an annotation's run is per client)."""
        explicit = annotations.get(ANNOTATION) or {}
        spans = annotations.get("span") or {}
        name_hint = name
        default: tuple[str, tuple] | None = None
        touched: dict[Run, list] = {}
        for key in tasks:
            if key in self._of:
                continue
            name = identity = None
            block = None
            if spans and (span := spans.get(key)):
                parts = tuple(span.get("name") or ())
                if parts and parts != ("default",):
                    ids = tuple(span.get("ids") or ())
                    name = "/".join(str(p) for p in parts)
                    block = ids[-1] if ids else name  # the innermost `with` block
                    identity = ("span", block)
            if explicit and (value := explicit.get(key)) is not None:
                name = str(value)
                identity = ("annotation", name, block if block is not None else client)
            if name is None:
                if default is None:
                    first = name_hint or key_split(next(iter(keys), key))
                    default = (first, ("default", first))
                name, identity = default
            run = self._live.get(identity)
            if run is None or run.closed:
                run = self._start(name, identity, now)
            elif not run.keys:
                self._idle.pop(identity, None)  # more work in its block
            run.keys.add(key)
            s = str(key)
            self._of[key] = (run, s)
            self._by_str[s] = key
            touched.setdefault(run, []).append(key)
        return touched

    def _start(self, name: str, identity: tuple, now: float) -> Run:
        name = safe_name(name)  # a client's span or annotation: printable and bounded
        seen = self._seen
        n = seen[name] = seen.pop(name, 0 if not self._dropped else self._dropped) + 1
        if len(seen) > self._seen_names:
            self._dropped = max(self._dropped, seen.popitem(last=False)[1])
        run = Run(
            label=RunLabel(name if n == 1 else f"{name}#{n}"),
            name=name,
            started=now,
            identity=identity,
        )
        self._live[identity] = run
        return run

    def of(self, key: Any) -> Run | None:
        entry = self._of.get(key)
        return entry[0] if entry is not None else None

    def key(self, s: ShardKey) -> Any:
        """The tracked key whose str() is `s`, or None."""
        return self._by_str.get(s)

    def name_of(self, s: ShardKey) -> str:
        """The pipeline (its run's name) of the key whose str() is `s`, tracked or
        forgotten lately; "" when none is known."""
        entry = self._of.get(self._by_str.get(s))
        return entry[0].name if entry is not None else self.forgotten.get(s, "")

    def close(self, run: Run) -> None:
        """The run is decided: submissions with its identity start a new run."""
        run.closed = True
        if self._live.get(run.identity) is run:
            del self._live[run.identity]
        if self._idle.get(run.identity) is run:
            del self._idle[run.identity]
            self.ended.append(run)

    def forget(self, key: Any) -> Run | None:
        """Drop the key; its run. A run left with no key ends (`ended`), unless it is a
        span or annotation run still open: that one idles, the last `IDLE_RUNS` of them."""
        entry = self._of.pop(key, None)
        if entry is None:
            return None
        run, s = entry
        if self._by_str.get(s) == key:  # keys that print alike (1 and "1") keep their own
            del self._by_str[s]
        self.forgotten[s] = run.name
        if len(self.forgotten) > FORGOTTEN_NAMES:
            self.forgotten.popitem(last=False)
        run.keys.discard(key)
        if not run.keys:
            if self._live.get(run.identity) is not run:
                self.ended.append(run)  # closed, or replaced by a newer run
            elif not run.held_open:
                del self._live[run.identity]
                self.ended.append(run)
            else:
                self._idle[run.identity] = run
                while len(self._idle) > self._idle_runs:
                    _, oldest = self._idle.popitem(last=False)
                    del self._live[oldest.identity]
                    self.ended.append(oldest)
        return run

    def take_ended(self) -> list[Run]:
        """The runs that ended since the last call."""
        ended, self.ended = self.ended, []
        return ended

    def idle(self) -> list[Run]:
        """Open span or annotation runs that hold no key now (at most `IDLE_RUNS`), oldest
        first."""
        return list(self._idle.values())

    def __len__(self) -> int:
        return len(self._of)
