"""Pipeline runs: which run each task key belongs to (pure; keys and annotations only).

A pipeline is named, in order of precedence, by
1. the ``oomguard_pipeline`` annotation (``with dask.annotate(oomguard_pipeline="etl")``),
2. the ``distributed.span("etl")`` the tasks were submitted in (nested spans join with "/"),
3. otherwise what the submission computes, as a person wrote it: the chain of task prefixes
   from its first output key down to a root task, without Dask's own steps (`finalize`,
   the `-partial`/`-aggregate` phases of one reduction): `random_sample → mean`, or the
   function of a `client.map` (`collection_name`).

A *run* is one execution of a pipeline, judged on its own (its own counters and decision):
- under a span, one ``with span(...)`` block (Dask gives each block its own span id), so a
  second block with the same name is a second run;
- otherwise, consecutive submissions with the same name join the live run of that name
  (``[client.submit(f, x) for x in xs]`` is one run, not one per task) until that run is
  decided (aborted) or has no live keys left; the next submission then starts a new run.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NewType

from dask.utils import key_split

from .._protocol import PIPELINE_ANNOTATION as ANNOTATION

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


class Runs:
    """key -> run, with a str(key) index so a report's key strings find their keys.

    >>> runs = Runs()
    >>> [r.label for r in runs.observe(["a-1"], ["a-1"], {ANNOTATION: {"a-1": "etl"}}, 0.0)]
    ['etl']
    >>> runs.of("a-1").name
    'etl'
    """

    def __init__(self) -> None:
        self._of: dict[Any, tuple[Run, ShardKey]] = {}  # key -> (its run, str(key))
        self._by_str: dict[ShardKey, Any] = {}
        self._live: dict[tuple, Run] = {}  # identity -> the open run
        self._seen: dict[str, int] = {}  # name -> runs started, for labels
        self._ids = itertools.count(1)

    def observe(
        self,
        tasks: Iterable[Any],
        keys: Iterable[Any],
        annotations: Mapping[str, Mapping[Any, Any]],
        now: float,
        name: str | None = None,
    ) -> dict[Run, int]:
        """Assign the new tasks of one graph submission to runs: {run: new keys in it}.
        `name`: the submission's name where no annotation or span gives one (see
        `collection_name`); the first output key's prefix without it."""
        explicit = annotations.get(ANNOTATION) or {}
        spans = annotations.get("span") or {}
        name_hint = name
        default: tuple[str, tuple] | None = None
        touched: dict[Run, int] = {}
        for key in tasks:
            if key in self._of:
                continue
            name = identity = None
            if explicit and (value := explicit.get(key)) is not None:
                name = str(value)
                identity = ("annotation", name)
            elif spans and (span := spans.get(key)):
                parts = tuple(span.get("name") or ())
                if parts and parts != ("default",):
                    name = "/".join(str(p) for p in parts)
                    ids = tuple(span.get("ids") or ())
                    identity = ("span", ids[-1] if ids else name)
            if name is None:
                if default is None:
                    first = name_hint or key_split(next(iter(keys), key))
                    default = (first, ("default", first))
                name, identity = default
            run = self._live.get(identity)
            if run is None or run.closed:
                run = self._start(name, identity, now)
            run.keys.add(key)
            s = str(key)
            self._of[key] = (run, s)
            self._by_str[s] = key
            touched[run] = touched.get(run, 0) + 1
        return touched

    def _start(self, name: str, identity: tuple, now: float) -> Run:
        n = self._seen[name] = self._seen.get(name, 0) + 1
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

    def close(self, run: Run) -> None:
        """The run is decided: submissions with its identity start a new run."""
        run.closed = True
        if self._live.get(run.identity) is run:
            del self._live[run.identity]

    def forget(self, key: Any) -> Run | None:
        """Drop the key; its run, which is gone too once it holds no key."""
        entry = self._of.pop(key, None)
        if entry is None:
            return None
        run, s = entry
        if self._by_str.get(s) == key:  # keys that print alike (1 and "1") keep their own
            del self._by_str[s]
        run.keys.discard(key)
        if not run.keys and self._live.get(run.identity) is run:
            del self._live[run.identity]
        return run

    def __len__(self) -> int:
        return len(self._of)
