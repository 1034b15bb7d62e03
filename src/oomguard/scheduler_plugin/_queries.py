"""The answers to `oomguard.Failures` and `oomguard report` (the `QUERY_HANDLER` RPC):
JSON-able rows of the history, of this cluster unless asked otherwise."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._config import CLUSTER_NAME_MAX
from ._query_bounds import bounded, capped, pipelines_reply, safe_filters
from ._resolve import fleet_states

if TYPE_CHECKING:
    from .._decide.policy import FailurePolicy
    from .._models import PipelineStatus
    from .._store import FailureStore

_READS = ("events", "deaths", "incidents", "signatures", "shard", "signature")


class Queries:
    """One cluster's history, read for clients: `store` (this scheduler's; the spool of a
    PostgreSQL history, whose reader answers for other clusters), the runs in memory
    (`policy`), `stats` the scheduler side's counts. Nothing here writes."""

    def __init__(
        self,
        store: FailureStore,
        cluster: str,
        policy: FailurePolicy,
        stats: Callable[[], dict],
    ) -> None:
        self.store = store
        self.cluster = cluster
        self.policy = policy
        self.stats = stats

    def live(self) -> list[PipelineStatus]:
        """The statuses of the runs in memory (not yet all written), with this cluster."""
        return [
            dataclasses.replace(self.policy.status(r), cluster=self.cluster)
            for r in self.policy.pipelines()
        ]

    async def answer(self, what: str, filters: dict[str, Any]) -> Any:
        """The events, deaths, shard histories, signatures and pipelines of this cluster
        only, unless `fleet` is true (every cluster in the store) or `cluster` names one
        (`query_scope`)."""
        filters = safe_filters(filters)  # names as the store keeps them
        cluster = query_scope(self.cluster, filters)
        if what == "cluster":
            return self.cluster
        if what == "stats":
            return self.stats()
        # Another cluster's, or every cluster's: from the PostgreSQL history where there is
        # one (this scheduler's store is its spool, of this cluster only).
        history = self.store.history
        store = self.store if history is None or cluster == self.cluster else history.reader
        if what == "signature" and history is not None:
            store = history.reader  # one signature by its id: its row spans every cluster
        if what in ("pipeline", "pipelines", "known"):  # runs in memory: this cluster's only
            live = [] if cluster not in (None, self.cluster) else self.live()
        if what == "pipeline":
            name = filters.get("name", "")
            runs = [s for s in live if s.name == name]
            if runs:
                return max(runs, key=lambda s: s.started).to_dict()
            await asyncio.to_thread(self._flush)
            row = await asyncio.to_thread(store.pipeline, name, cluster)
            return row.to_dict() if row else None
        if what == "pipelines":  # read only: the runs in memory beside the stored ones
            limit = filters.get("limit", 100)
            await asyncio.to_thread(self._flush)
            rows = await asyncio.to_thread(store.pipelines, capped(limit) + len(live), cluster)
            return pipelines_reply(live, rows, limit)
        if what == "known":
            field, value = filters.get("field"), filters.get("value")
            await asyncio.to_thread(self._flush)
            found, names = await asyncio.to_thread(store.known, field, value)
            if field == "pipeline":  # runs not yet written
                running = [p.name for p in live]
                found = found or value in running
                names = list(dict.fromkeys(running + names))
            elif field == "cluster":  # this one, whatever it stored yet
                found = found or value == self.cluster
                names = sorted({self.cluster, *names})
            return {"known": found, "names": names}
        if what not in _READS:
            raise ValueError(
                f"unknown oomguard query {what!r}; expected one of "
                f"{', '.join(sorted([*_READS, 'known', 'pipeline', 'pipelines', 'stats']))}"
            )
        if what != "signature":  # one signature by its id: its row spans every cluster
            filters["cluster"] = cluster
        await asyncio.to_thread(self._flush)
        rows = await asyncio.to_thread(getattr(store, what), **bounded(what, filters))
        if what == "signatures" and store is self.store:  # a fleet's state is the history's
            rows = await asyncio.to_thread(fleet_states, store, rows)
        if rows is None:
            return None
        if isinstance(rows, list):
            return [r.to_dict() for r in rows]
        return rows.to_dict()

    def _flush(self) -> None:
        """What this scheduler recorded so far, committed; and sent to the history while
        it takes events (a moment at most: a history away answers without the newest)."""
        store = self.store
        store.flush()
        if store.history is not None and store.history.shipper.up:
            store.history.shipper.sync(timeout=2.0)


def query_scope(own: str, filters: dict[str, Any]) -> str | None:
    """The cluster a query reads (None: every cluster), taking `fleet` and `cluster` out
    of `filters`: `cluster` when it names one, None for `fleet=True`, else `own`.
    ValueError naming the field for a bad one.

    >>> query_scope("etl", {}), query_scope("etl", {"fleet": True})
    ('etl', None)
    >>> query_scope("etl", {"cluster": "nightly"})
    'nightly'
    """
    fleet = filters.pop("fleet", False)
    cluster = filters.pop("cluster", None)
    if not isinstance(fleet, bool):
        raise ValueError(f"fleet={fleet!r}: expected true or false")
    if cluster is not None:
        if not isinstance(cluster, str) or not 0 < len(cluster) <= CLUSTER_NAME_MAX:
            raise ValueError(f"cluster={cluster!r}: expected a cluster's name")
        return cluster
    return None if fleet else own
