"""Which pipeline each task belongs to (pure; no Dask objects, only keys and annotations).

A pipeline is named, in order of precedence, by
1. the ``oomguard_pipeline`` annotation (``with dask.annotate(oomguard_pipeline="etl")``),
2. the ``distributed.span("etl")`` the tasks were submitted in (nested spans join with "/"),
3. otherwise its graph submission: ``<first key's prefix>#<n>``, n counting submissions.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

from dask.utils import key_split

ANNOTATION = "oomguard_pipeline"


class PipelineNames:
    """key -> pipeline, with each shard's "ended" flag so it is counted once.

    >>> names = PipelineNames()
    >>> names.observe(["a-1", "a-2"], {"a-2"}, {ANNOTATION: {"a-1": "etl", "a-2": "etl"}}, "s")
    {'etl': ['a-1', 'a-2']}
    >>> names.get("a-1")
    'etl'
    """

    def __init__(self) -> None:
        self._of: dict[Any, str] = {}  # key -> pipeline
        self._ended: set[Any] = set()  # keys that reached memory or erred
        self._members: dict[str, set] = {}
        self._counter = itertools.count(1)

    def observe(
        self,
        tasks: Iterable[Any],
        keys: Iterable[Any],
        annotations: Mapping[str, Mapping[Any, Any]],
        stimulus_id: str,
    ) -> dict[str, list[Any]]:
        """Name the new tasks of one graph submission; returns {pipeline: [key]}."""
        explicit = annotations.get(ANNOTATION) or {}
        spans = annotations.get("span") or {}
        default: str | None = None
        new: dict[str, list[Any]] = {}
        for key in tasks:
            if key in self._of:
                continue
            name = explicit.get(key) if explicit else None
            if name is None and spans:
                span = spans.get(key)
                parts = tuple(span.get("name") or ()) if span else ()
                if parts and parts != ("default",):
                    name = "/".join(str(p) for p in parts)
            if name is None:
                if default is None:
                    first = next(iter(keys), key)
                    default = f"{key_split(first)}#{next(self._counter)}"
                name = default
            name = str(name)
            self._of[key] = name
            members = self._members.get(name)
            if members is None:
                members = self._members[name] = set()
            members.add(key)
            shards = new.get(name)
            if shards is None:
                shards = new[name] = []
            shards.append(key)
        return new

    def get(self, key: Any) -> str | None:
        return self._of.get(key)

    def end(self, key: Any) -> str | None:
        """Mark the shard finished (memory or erred); its pipeline the first time, else None."""
        name = self._of.get(key)
        if name is None or key in self._ended:
            return None
        self._ended.add(key)
        return name

    def reopen(self, key: Any) -> str | None:
        """A finished shard runs again (its result was lost); its pipeline, else None."""
        if key not in self._ended:
            return None
        self._ended.discard(key)
        return self._of.get(key)

    def forget(self, key: Any) -> tuple[str, bool] | None:
        """Drop the key; (pipeline, ended) or None when it was not tracked."""
        name = self._of.pop(key, None)
        if name is None:
            return None
        ended = key in self._ended
        self._ended.discard(key)
        members = self._members.get(name)
        if members is not None:
            members.discard(key)
            if not members:
                del self._members[name]
        return name, ended

    def keys_of(self, pipeline: str) -> list[Any]:
        return list(self._members.get(pipeline, ()))

    def has_live(self, pipeline: str) -> bool:
        return pipeline in self._members

    def __len__(self) -> int:
        return len(self._of)
