"""The scheduler's RPCs: death reports and clean-exit notices from nannies, and queries
from `oomguard.Failures` and `oomguard report`.

Trust (`_trust.py`): a report or notice is accepted only for a worker that registered with
a nanny, over a connection from that nanny's host, and a report only when its `nanny` field
is that nanny. Anything else is refused and counted
(`oomguard_reports_rejected_total{reason="unregistered"|"wrong_nanny"|"unknown_sender"}`).
This is as strong as Dask's own model allows without TLS: any client may run code on the
scheduler (`client.run_on_scheduler`) unless the cluster uses TLS with authentication, so
oomguard defends against mistakes and stray senders, not against a client that already
holds the keys. See docs/security.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from typing import TYPE_CHECKING, Any

from .._config import CLUSTER_NAME_MAX
from .._exceptions import ReportError
from .._protocol import (
    CLEAN_EXIT_HANDLER,
    OVERFLOW,
    QUERY_HANDLER,
    REPORT_HANDLER,
    UNGUARDED_HANDLER,
    UNKNOWN_SENDER,
    UNREGISTERED,
    WORKER_GROUP_PREFIX,
    WRONG_NANNY,
)
from ._query_bounds import bounded
from ._trust import CGROUP_NANNIES, Bounded, NannyBook

if TYPE_CHECKING:
    from distributed import Scheduler

    from ._plugin import OomguardSchedulerPlugin

logger = logging.getLogger("oomguard.scheduler")


def sender_matches(peer: str | None, worker: str, nanny: str | None, local: str = "") -> bool:
    """Whether a connection from `peer` may speak for `worker`, whose nanny is `nanny`.

    The peer's host must be the nanny's (the nanny connects from its own host; its port is
    ephemeral). Whether `nanny` is the worker's registered nanny is `NannyBook.check`'s
    part. In-process connections (`inproc://`) are the scheduler's own.

    >>> sender_matches("tcp://10.0.0.5:53122", "tcp://10.0.0.5:40001", "tcp://10.0.0.5:40000")
    True
    >>> sender_matches("tcp://10.0.0.9:53122", "tcp://10.0.0.5:40001", "tcp://10.0.0.5:40000")
    False
    >>> sender_matches("tcp://127.0.0.1:53122", "tcp://127.9.0.1:4000", None)  # loopback
    True
    """
    if not peer:
        return False
    if peer.startswith("inproc://"):
        return True
    owner = nanny or worker
    host = _host(peer)
    return host != "" and host == _host(owner)


@functools.lru_cache(maxsize=4096)  # per report in a storm: parse each address once
def _host(address: str) -> str:
    import ipaddress

    from distributed.comm import get_address_host

    try:
        host = get_address_host(address)
    except Exception:
        return ""
    try:
        if ipaddress.ip_address(host).is_loopback:  # 127.0.0.0/8 and ::1: this machine
            return "localhost"
    except ValueError:
        pass
    return host


class Handlers:
    """The RPCs, registered on the scheduler by the plugin's start() and removed on close.

    They keep what they count and what nannies tell them, and reach the plugin only through
    its public surface: what it holds (`scheduler`, `core`, `intake`, `store`, `policy`,
    `guard`, `metrics`) and what it does (`apply`, `persist_pipelines`, `worker_state`,
    `metrics_snapshot`).
    """

    plugin: OomguardSchedulerPlugin  # the plugin served
    reports: int  # death reports accepted (handed to the core)
    rejected: dict[str, int]  # reports and notices refused here, by reason
    latencies: list[float]  # seconds from a death to its report, the last 1,000
    unguarded_nannies: dict[str, str]  # nanny -> why its worker runs without oomguard
    nannies: NannyBook  # worker -> its registered nanny, kept a while past its removal
    removals_refused: int  # remove-worker events on "all" that were not Dask's (_removals)
    _cgroup_nannies: Bounded  # nannies whose workers have their own cgroup (CGROUP_NANNIES)

    def __init__(self, plugin: OomguardSchedulerPlugin) -> None:
        self.plugin = plugin
        self.reports = 0
        self.rejected = {}
        self.latencies = []
        self.unguarded_nannies = {}
        self.nannies = NannyBook(plugin.worker_state)
        self.removals_refused = 0
        self._cgroup_nannies = Bounded(CGROUP_NANNIES)

    def register(self, scheduler: Scheduler) -> None:
        scheduler.handlers[REPORT_HANDLER] = self.report
        scheduler.handlers[CLEAN_EXIT_HANDLER] = self.clean_exit
        scheduler.handlers[QUERY_HANDLER] = self.query
        scheduler.handlers[UNGUARDED_HANDLER] = self.unguarded

    def unregister(self, scheduler: Scheduler) -> None:
        for name, fn in (
            (REPORT_HANDLER, self.report),
            (CLEAN_EXIT_HANDLER, self.clean_exit),
            (QUERY_HANDLER, self.query),
            (UNGUARDED_HANDLER, self.unguarded),
        ):
            if scheduler.handlers.get(name) == fn:
                del scheduler.handlers[name]

    def trusted(self, peer: str | None, worker: Any, nanny: Any = ...) -> bool:
        """Whether `peer` may speak for `worker` (`nanny`: the report's own field; a notice
        has none); a refusal is counted and its reason logged once."""
        reason = self.nannies.check(peer, worker, nanny, sender_matches)
        if reason is None:
            return True
        why = {
            UNKNOWN_SENDER: "not sent from the host of its registered nanny",
            UNREGISTERED: "no such worker registered with a nanny",
            WRONG_NANNY: f"names the nanny {nanny!r}, not the one its worker registered with",
        }[reason]
        field = "nanny" if reason == WRONG_NANNY else "worker"
        self.reject(ReportError(field, f"{worker!r}: {why}", reason))
        return False

    async def report(self, comm=None, report: Any = None, **extra: Any) -> dict:
        """RPC from a nanny: one death report as msgpack bytes. Only queued here; the
        intake thread decodes and validates it (never unpickles)."""
        plugin = self.plugin
        with plugin.guard("report"):
            if not isinstance(report, bytes | bytearray | memoryview):
                e = ReportError(
                    "report", f"expected msgpack bytes, got {type(report).__name__}", "wrong_type"
                )
                self.reject(e)
                return {"status": "rejected", "reason": e.reason, "field": e.field}
            # Refused unread (and counted) by the intake when it is full or the pairing has
            # no room (`room`): decoding a storm only to drop it starves the loop. The
            # sender is checked against the report's worker once it is decoded.
            if not plugin.intake.submit(bytes(report), getattr(comm, "peer_address", None)):
                self.refused(OVERFLOW)
                return {"status": OVERFLOW}
            return {"status": "queued"}
        return {"status": "error"}

    async def clean_exit(
        self, comm=None, worker: Any = None, requested: Any = False, pid: Any = None, **extra: Any
    ) -> dict:
        """RPC from a nanny: its worker (process `pid`) ended with status 0, `requested`
        (close, restart, SIGTERM) or not (it ended itself). Without the field: not
        requested, the safe side (a death, counted as Dask counts it)."""
        if not isinstance(worker, str) or not 0 < len(worker) <= 256:
            self.reject(ReportError("worker", "expected a worker address", "wrong_type"))
            return {"status": "rejected", "field": "worker"}
        if not isinstance(requested, bool):
            self.reject(ReportError("requested", "expected true or false", "wrong_type"))
            return {"status": "rejected", "field": "requested"}
        if pid is not None and (type(pid) is not int or pid <= 0):
            self.reject(ReportError("pid", "expected a positive integer", "wrong_type"))
            return {"status": "rejected", "field": "pid"}
        stopped = extra.get("stopped_by")
        if stopped is not None:
            try:
                stopped = _stopped_by(stopped)
            except ReportError as e:
                self.reject(e)
                return {"status": "rejected", "field": e.field}
        if not self.trusted(getattr(comm, "peer_address", None), worker):
            return {"status": "rejected", "field": "worker"}
        with self.plugin.guard("report"):
            if stopped is not None and requested:
                # The nanny itself got a signal (an eviction, a container stop): its tasks
                # are moved without a count, as for any requested stop, and leave a trace.
                self.plugin.actions.nanny_stopped(
                    worker, stopped["signal"], stopped["executing"], self.plugin.core.pipeline_of
                )
            # A removal that waited for this is decided now (its held tasks go back to Dask).
            core = self.plugin.core
            said = stopped["executing"] if stopped is not None and requested else None
            self.plugin.apply(core.clean_exit(worker, time.monotonic(), requested, pid, said))
        return {"status": "ok"}

    async def unguarded(self, comm=None, nanny: Any = None, reason: Any = "", **extra: Any):
        """RPC from a nanny whose oomguard setup failed (on-setup-error: warn): its worker
        runs without oomguard. Counted while a worker of that nanny is here, and logged."""
        if not isinstance(nanny, str) or not 0 < len(nanny) <= 256:
            return {"status": "rejected"}
        if not sender_matches(getattr(comm, "peer_address", None), nanny, nanny):
            self.reject(
                ReportError("nanny", f"not sent from the host of {nanny!r}", UNKNOWN_SENDER)
            )
            return {"status": "rejected"}
        with self.plugin.guard("unguarded"):
            self.unguarded_nanny(nanny, str(reason)[:512])
        return {"status": "ok"}

    def on_reports(self, results: list) -> None:
        """A batch of decoded reports from the intake thread, on the event loop."""
        plugin = self.plugin
        for death, arrived, peer in results:
            with plugin.guard("report"):
                if isinstance(death, ReportError):
                    self.reject(death)
                    continue
                if not self.trusted(peer, death.worker, death.nanny):
                    continue
                latencies = self.latencies
                latencies.append(max(0.0, arrived - death.time))
                del latencies[:-1000]
                plugin.metrics.report_latency(latencies[-1])
                cgroup_name = (death.cgroup.path if death.cgroup else "").rsplit("/", 1)[-1]
                if cgroup_name.startswith(WORKER_GROUP_PREFIX):
                    self._cgroup_nannies.add(self.nannies.nanny_of(death.worker))
                    plugin.metrics.set_cgroup_workers(len(self._cgroup_nannies))
                before = dict(plugin.core.pairing.refused)
                out = plugin.core.reported(death, time.monotonic())
                reason = _refusal(before, plugin.core.pairing.refused)
                if reason is None:
                    self.reports += 1  # accepted
                else:
                    self.refused(reason)  # counted by the pairing, which refused it
                plugin.apply(out)

    def unguarded_nanny(self, nanny: str, reason: str) -> None:
        if nanny not in self.unguarded_nannies:
            logger.warning(
                "oomguard: the nanny %s runs its worker WITHOUT oomguard: %s", nanny, reason
            )
        self.unguarded_nannies[nanny] = reason
        self.plugin.metrics.set_unguarded_nannies(len(self.unguarded_nannies))

    def prune_unguarded(self) -> None:
        """Nannies are counted as unguarded while a worker of theirs is here."""
        if not self.unguarded_nannies:
            return
        live = {ws.nanny for ws in self.plugin.scheduler.workers.values()}
        for nanny in [n for n in self.unguarded_nannies if n not in live]:
            del self.unguarded_nannies[nanny]
        self.plugin.metrics.set_unguarded_nannies(len(self.unguarded_nannies))

    def room(self) -> int | None:
        """How many more death reports the pairing could take (the intake counts those
        it holds against this): none past its cap on unmatched reports, unless a removal
        waits, whose report any of them may be (never refused unread)."""
        plugin = self.plugin
        pairing = plugin.core.pairing
        if pairing.pending_removals():
            return None
        return pairing.max_reports - len(pairing)

    def refused(self, reason: str) -> None:
        """A death report refused by the intake or the pairing, which count it (`counts`):
        the metric, and a line in the log for the first of a reason other than overflow."""
        self.plugin.metrics.report_rejected(reason)
        if reason != OVERFLOW:
            e = ReportError("report", f"refused ({reason})", reason)
            self.plugin.guard.once(
                e.reason, "oomguard: rejected a death report (%s); further ones are counted", e
            )

    def reject(self, e: ReportError) -> None:
        plugin = self.plugin
        self.rejected[e.reason] = self.rejected.get(e.reason, 0) + 1
        plugin.metrics.report_rejected(e.reason)
        plugin.guard.once(
            e.reason, "oomguard: rejected a death report (%s); further ones are counted", e
        )

    def counts(self) -> dict[str, Any]:
        """Death reports so far, each counted once, by what took or refused it: `reports`
        accepted (here), `rejected` by reason (here; a duplicate by the pairing), and
        `overflow`: refused unread by the intake, or past the pairing's cap."""
        core, intake = self.plugin.core, self.plugin.intake
        refused = dict(core.pairing.refused) if core is not None else {}
        overflow = refused.pop(OVERFLOW, 0) + (intake.overflow if intake is not None else 0)
        rejected = dict(self.rejected)
        for reason, n in refused.items():
            rejected[reason] = rejected.get(reason, 0) + n
        return {"reports": self.reports, "rejected": rejected, "overflow": overflow}

    async def query(self, comm=None, what: str = "", **filters: Any) -> Any:
        """RPC for `oomguard.Failures` and `oomguard report`: JSON-able rows. The events,
        deaths, shard histories, signatures and pipelines of this cluster only, unless
        `fleet` is true (every cluster in the store) or `cluster` names one
        (`query_scope`)."""
        plugin = self.plugin
        cluster = query_scope(plugin.cluster, filters)
        if what == "cluster":
            return plugin.cluster
        # Another cluster's, or every cluster's: from the PostgreSQL history where there is
        # one (this scheduler's store is its spool, of this cluster only).
        history = plugin.store.history
        store = plugin.store if history is None or cluster == plugin.cluster else history.reader
        if what == "signature" and history is not None:
            store = history.reader  # one signature by its id: its row spans every cluster
        if what == "pipeline":
            name = filters.get("name", "")
            live = [] if cluster not in (None, plugin.cluster) else self._live()
            live = [s for s in live if s.name == name]
            if live:
                return max(live, key=lambda s: s.started).to_dict()
            await asyncio.to_thread(self._flush)
            row = await asyncio.to_thread(store.pipeline, name, cluster)
            return row.to_dict() if row else None
        if what == "pipelines":
            await asyncio.to_thread(self._flush)
            plugin.persist_pipelines(final=True)
            await asyncio.to_thread(self._flush)
            rows = await asyncio.to_thread(store.pipelines, filters.get("limit", 100), cluster)
            return [r.to_dict() for r in rows]
        if what == "stats":
            return plugin.metrics_snapshot()
        if what == "known":
            field, value = filters.get("field"), filters.get("value")
            await asyncio.to_thread(self._flush)
            found, names = await asyncio.to_thread(store.known, field, value)
            if field == "pipeline":  # runs not yet written
                live = [p.name for p in self._live()]
                found = found or value in live
                names = list(dict.fromkeys(live + names))
            elif field == "cluster":  # this one, whatever it stored yet
                found = found or value == plugin.cluster
                names = sorted({plugin.cluster, *names})
            return {"known": found, "names": names}
        readers = {
            "events": store.events,
            "deaths": store.deaths,
            "signatures": store.signatures,
            "shard": store.shard,
            "signature": store.signature,
        }
        if what not in readers:
            raise ValueError(
                f"unknown oomguard query {what!r}; expected one of "
                f"{', '.join(sorted(readers) + ['known', 'pipeline', 'pipelines', 'stats'])}"
            )
        if what != "signature":  # one signature by its id: its row spans every cluster
            filters["cluster"] = cluster
        await asyncio.to_thread(self._flush)
        rows = await asyncio.to_thread(readers[what], **bounded(what, filters))
        if rows is None:
            return None
        if isinstance(rows, list):
            return [r.to_dict() for r in rows]
        return rows.to_dict()

    def _flush(self) -> None:
        """What this scheduler recorded so far, committed; and sent to the history while
        it takes events (a moment at most: a history away answers without the newest)."""
        store = self.plugin.store
        store.flush()
        if store.history is not None and store.history.shipper.up:
            store.history.shipper.sync(timeout=2.0)

    def _live(self) -> list:
        """The statuses of the runs in memory (not yet all written), with this cluster."""
        plugin = self.plugin
        policy = plugin.policy
        return [
            dataclasses.replace(policy.status(r), cluster=plugin.cluster)
            for r in policy.pipelines()
        ]


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


def _stopped_by(v: Any) -> dict:
    """A nanny's `stopped_by` ({signal, executing}), checked as a report's fields are."""
    if not isinstance(v, dict) or set(v) != {"signal", "executing"}:
        raise ReportError("stopped_by", "expected {signal, executing}", "wrong_type")
    sig, keys = v["signal"], v["executing"]
    if not isinstance(sig, str) or not 0 < len(sig) <= 16:
        raise ReportError("stopped_by.signal", "expected a signal name", "wrong_type")
    if not isinstance(keys, (list, tuple)) or len(keys) > 16:
        raise ReportError("stopped_by.executing", "expected at most 16 task keys", "too_large")
    if not all(isinstance(k, str) and len(k) <= 1024 for k in keys):
        raise ReportError("stopped_by.executing", "expected task keys as str", "wrong_type")
    return {"signal": sig, "executing": list(keys)}


def _refusal(before: dict[str, int], after: dict[str, int]) -> str | None:
    """The reason whose count went up between two readings of `DeathPairing.refused`."""
    return next((reason for reason, n in after.items() if n != before.get(reason, 0)), None)
