"""oomguard's Prometheus metrics: one collector owning every `oomguard_*` metric.

Knows nothing of Dask. The scheduler plugin makes one `OomguardMetrics`, registers it as a
single collector into `prometheus_client.REGISTRY` (which Dask's scheduler serves on
`/metrics`) in `start()`, and unregisters it in `close()`. Every recording method is O(1),
does no I/O and never raises: it runs inside scheduler hooks.

Label values come from fixed sets (`Cause`, `Kind`, `_protocol.REJECT_REASONS`,
`INTERNAL_ERROR_SITES`); anything else is counted under "other", so a bad report or a bug
can never blow up the number of series. Task keys and signature ids are never labels.
Every known label combination is created at 0 so alerts and dashboards see the series
before the first failure.

==================================  =========  ===========================================
metric                              type       meaning
==================================  =========  ===========================================
oomguard_failures_total             counter    failure events, by {kind, cause}: one per
                                               task a death is blamed on, one per task
                                               exception (a death of two suspects: 2)
oomguard_worker_deaths_total        counter    unexpected worker deaths decided, once per
                                               death (as `Failures.deaths()`), by {cause,
                                               killer} (a `Killer`: 10 values, bounded);
                                               labelled as first decided (a late report
                                               amends the stored death, not the count)
oomguard_pipeline_aborts_total      counter    pipelines aborted on a doomed shard
oomguard_displaced_tasks_total      counter    tasks rescheduled off a dead worker, no count
oomguard_reports_rejected_total     counter    death reports refused, by {reason}
oomguard_report_latency_seconds     histogram  worker death to report at the scheduler
oomguard_signatures                 gauge      distinct crash signatures in the store
oomguard_signature_max_hosts        gauge      most distinct hosts any one signature hit
oomguard_signature_regressions_total counter   signatures seen again after a person
                                               resolved them, once per regression (with
                                               a PostgreSQL history: by the scheduler
                                               whose death brought it back)
oomguard_cgroup_workers             gauge      workers running under a per-worker cgroup
oomguard_unguarded_nannies          gauge      nannies running their worker without oomguard
oomguard_internal_errors_total      counter    oomguard's own bugs caught, by {where}
oomguard_store_errors_total         counter    failure store troubles, by {kind}
                                               (STORE_ERROR_KINDS)
oomguard_history_up                 gauge      1 while the PostgreSQL history takes
                                               events, 0 while it is away (only with one)
oomguard_history_spool_events       gauge      events in the spool not sent to it yet
oomguard_history_set_aside_total    counter    rows it refused, set aside (kept in the
                                               spool only), by {kind} (SET_ASIDE_KINDS)
==================================  =========  ===========================================
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry

from ._causes import DEATH_CAUSES, Cause, Killer, Kind, kind_of
from ._protocol import REJECT_REASONS, SCHEDULER_GUARD_SITES, SET_ASIDE_KINDS

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

OTHER = "other"

#: Where the scheduler side catches its own errors; `internal_error(where)` takes these.
INTERNAL_ERROR_SITES = SCHEDULER_GUARD_SITES

#: Death-to-report latency: a report crosses one RPC (ms) but may wait for the nanny to
#: notice the exit and read cgroup counters, and a grace timeout caps it at tens of seconds.
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

_CAUSES = frozenset(c.value for c in Cause)
_KINDS = frozenset(k.value for k in Kind)
_DEATH_CAUSES = frozenset(c.value for c in DEATH_CAUSES)
_KILLERS = frozenset(k.value for k in Killer)
_REASONS = REJECT_REASONS
#: A store that could not be opened (one per start: corrupt, newer_schema, foreign,
#: unwritable), events refused at the queue's cap, times the disk was full, writes lost.
STORE_ERROR_KINDS = frozenset(
    {
        "corrupt",
        "newer_schema",
        "foreign",
        "unwritable",
        "queue_full",
        "disk_full",
        "write_failed",
        "history_away",  # the PostgreSQL history went away (once per outage)
        "history_unusable",  # no driver, or a schema from a newer oomguard: not sent
    }
)


def _label(value: Any, allowed: frozenset[str]) -> str:
    # str() of a StrEnum member is its value; anything unknown folds into one series.
    try:
        s = str(value)
    except Exception:
        return OTHER
    return s if s in allowed else OTHER


def _count(value: Any) -> float | None:
    # A gauge of "how many": a non-negative finite number; bools and junk are refused.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return float(value)


class OomguardMetrics(Collector):
    """Every oomguard metric, collected as one unit (register it once per registry).

    >>> from prometheus_client import CollectorRegistry, generate_latest
    >>> metrics = OomguardMetrics()
    >>> registry = CollectorRegistry()
    >>> registry.register(metrics)
    >>> metrics.failure("infra", "oom_kill")
    >>> registry.get_sample_value(
    ...     "oomguard_failures_total", {"kind": "infra", "cause": "oom_kill"})
    1.0
    >>> b"oomguard_signatures" in generate_latest(registry)
    True
    """

    failures: Counter
    worker_deaths: Counter
    pipeline_aborts: Counter
    displaced_tasks: Counter
    reports_rejected: Counter
    report_latency_seconds: Histogram
    signatures: Gauge
    signature_max_hosts: Gauge
    signature_regressions: Counter
    cgroup_workers: Gauge
    unguarded_nannies: Gauge
    internal_errors: Counter
    store_errors: Counter

    def __init__(self) -> None:
        # registry=None: the metrics belong to this collector, not to the global registry.
        self.failures = Counter(
            "oomguard_failures_total",
            "Failure events recorded, one per event: one per task a worker death is blamed on "
            "(its culprit, or each suspect) and one per task exception. Worker deaths, once "
            "each: oomguard_worker_deaths_total.",
            ["kind", "cause"],
            registry=None,
        )
        self.worker_deaths = Counter(
            "oomguard_worker_deaths_total",
            "Unexpected worker deaths decided by oomguard, once per death however many tasks "
            "it took (as Failures.deaths() lists them), by cause and killer as first decided.",
            ["cause", "killer"],
            registry=None,
        )
        self.pipeline_aborts = Counter(
            "oomguard_pipeline_aborts_total",
            "Pipelines aborted because one of their shards would never finish.",
            registry=None,
        )
        self.displaced_tasks = Counter(
            "oomguard_displaced_tasks_total",
            "Tasks rescheduled from a dead worker without counting it against them.",
            registry=None,
        )
        self.reports_rejected = Counter(
            "oomguard_reports_rejected_total",
            "Death reports refused by the scheduler's validator, by reason.",
            ["reason"],
            registry=None,
        )
        self.report_latency_seconds = Histogram(
            "oomguard_report_latency_seconds",
            "Time from a worker's death (seen by its nanny) to its report at the scheduler.",
            buckets=LATENCY_BUCKETS,
            registry=None,
        )
        self.signatures = Gauge(
            "oomguard_signatures",
            "Distinct crash signatures in the failure store.",
            registry=None,
        )
        self.signature_max_hosts = Gauge(
            "oomguard_signature_max_hosts",
            "The largest number of distinct hosts any one crash signature was seen on.",
            registry=None,
        )
        self.signature_regressions = Counter(
            "oomguard_signature_regressions_total",
            "Crash signatures seen again after a person resolved them, once per regression "
            "(`oomguard report --signatures` shows them as regressed).",
            registry=None,
        )
        self.cgroup_workers = Gauge(
            "oomguard_cgroup_workers",
            "Workers running under a per-worker memory cgroup.",
            registry=None,
        )
        self.unguarded_nannies = Gauge(
            "oomguard_unguarded_nannies",
            "Nannies whose oomguard setup failed and that run their worker without it "
            "(oomguard.worker.on-setup-error: warn); the scheduler log says why.",
            registry=None,
        )
        self.internal_errors = Counter(
            "oomguard_internal_errors_total",
            "Errors inside oomguard itself, caught so Dask carries on; see the scheduler log.",
            ["where"],
            registry=None,
        )
        self.store_errors = Counter(
            "oomguard_store_errors_total",
            "Failure store troubles: a store that could not be opened (by why), events "
            "refused at the write queue's cap, times the disk was full, writes lost.",
            ["kind"],
            registry=None,
        )
        self.history_up = Gauge(
            "oomguard_history_up",
            "1 while the PostgreSQL failure history takes events, 0 while it is away "
            "(they wait in the scheduler's spool). Only with a postgresql:// store.",
            registry=None,
        )
        self.history_spool_events = Gauge(
            "oomguard_history_spool_events",
            "Failure events in the scheduler's spool not yet sent to the PostgreSQL history.",
            registry=None,
        )
        self.history_set_aside = Counter(
            "oomguard_history_set_aside_total",
            "Rows the PostgreSQL history refused as data, set aside: kept in the spool, "
            "not sent; every other row went through. `oomguard doctor --store` lists them.",
            ["kind"],
            registry=None,
        )
        self.has_history = False  # the three above are exported only with a history
        self._metrics = (
            self.failures,
            self.worker_deaths,
            self.pipeline_aborts,
            self.displaced_tasks,
            self.reports_rejected,
            self.report_latency_seconds,
            self.signatures,
            self.signature_max_hosts,
            self.signature_regressions,
            self.cgroup_workers,
            self.unguarded_nannies,
            self.internal_errors,
            self.store_errors,
        )
        # Pre-create every known series at 0: rate() and absent() alerts need them to exist.
        for cause in Cause:
            self.failures.labels(kind=kind_of(cause).value, cause=cause.value)
        for cause in _DEATH_CAUSES:
            for killer in _KILLERS:
                self.worker_deaths.labels(cause=cause, killer=killer)
        for reason in _REASONS | {OTHER}:
            self.reports_rejected.labels(reason=reason)
        for where in INTERNAL_ERROR_SITES | {OTHER}:
            self.internal_errors.labels(where=where)
        for kind in STORE_ERROR_KINDS | {OTHER}:
            self.store_errors.labels(kind=kind)
        for kind in SET_ASIDE_KINDS:
            self.history_set_aside.labels(kind=kind)

    # -- the collector protocol ---------------------------------------------------------

    def _all(self) -> tuple:
        if self.has_history:
            history = (self.history_up, self.history_spool_events, self.history_set_aside)
            return (*self._metrics, *history)
        return self._metrics

    def collect(self) -> Iterator[Metric]:
        for metric in self._all():
            yield from metric.collect()

    def describe(self) -> list[Metric]:
        # Lets a registry check names without sampling values.
        return [m for metric in self._all() for m in metric.describe()]

    def register(self, registry: CollectorRegistry | None = None) -> bool:
        """Register into `registry` (default: the global one Dask serves on `/metrics`).
        False, not an error, when the names are taken (another oomguard in this process).

        >>> metrics.register()
        True
        """
        try:
            (REGISTRY if registry is None else registry).register(self)
        except ValueError:  # "Duplicated timeseries": a second scheduler in one process
            return False
        return True

    def unregister(self, registry: CollectorRegistry | None = None) -> None:
        """Undo `register`; a no-op when this collector is not registered there.

        >>> metrics.unregister()
        """
        try:
            (REGISTRY if registry is None else registry).unregister(self)
        except KeyError:
            pass

    # -- recording (called from scheduler hooks: O(1), no I/O, never raises) -----------

    def failure(self, kind: str, cause: str) -> None:
        """One failure event of `kind` ("infra" | "user") with `cause` (a `Cause`).

        >>> metrics.failure(Kind.INFRA, Cause.OOM_KILL)
        """
        self.failures.labels(kind=_label(kind, _KINDS), cause=_label(cause, _CAUSES)).inc()

    def deaths(self, cause: str, killer: str = "unknown") -> None:
        """One unexpected worker death, decided with `cause` (one of DEATH_CAUSES) and
        `killer` (a `Killer`); anything else is `other`.

        >>> metrics.deaths("worker_lost", "unknown")
        """
        self.worker_deaths.labels(
            cause=_label(cause, _DEATH_CAUSES), killer=_label(killer, _KILLERS)
        ).inc()

    def pipeline_aborted(self) -> None:
        """One pipeline aborted.

        >>> metrics.pipeline_aborted()
        """
        self.pipeline_aborts.inc()

    def displaced(self, n: int = 1) -> None:
        """`n` tasks rescheduled from a dead worker without a count against them.

        >>> metrics.displaced()
        """
        amount = _count(n)
        if amount is None:
            self.internal_error("metrics")
            return
        self.displaced_tasks.inc(amount)

    def report_rejected(self, reason: str) -> None:
        """One death report refused; `reason` is `ReportError.reason`.

        >>> metrics.report_rejected("too_large")
        """
        self.reports_rejected.labels(reason=_label(reason, _REASONS)).inc()

    def report_latency(self, seconds: float) -> None:
        """Observe one death-to-report latency; clock skew below 0 counts as 0.

        >>> metrics.report_latency(0.004)
        """
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            self.internal_error("metrics")
            return
        if math.isnan(seconds):
            self.internal_error("metrics")
            return
        self.report_latency_seconds.observe(max(0.0, float(seconds)))

    def set_signatures(self, n: int) -> None:
        """The number of distinct signatures in the store.

        >>> metrics.set_signatures(12)
        """
        self._set(self.signatures, n)

    def set_signature_max_hosts(self, n: int) -> None:
        """The largest number of distinct hosts any one signature was seen on.

        >>> metrics.set_signature_max_hosts(3)
        """
        self._set(self.signature_max_hosts, n)

    def signature_regressed(self, n: int = 1) -> None:
        """`n` signatures found regressed (seen again after their resolve).

        >>> metrics.signature_regressed()
        """
        amount = _count(n)
        if amount is None:
            self.internal_error("metrics")
            return
        self.signature_regressions.inc(amount)

    def set_cgroup_workers(self, n: int) -> None:
        """The number of workers under a per-worker memory cgroup.

        >>> metrics.set_cgroup_workers(8)
        """
        self._set(self.cgroup_workers, n)

    def set_unguarded_nannies(self, n: int) -> None:
        """The number of nannies running their worker without oomguard.

        >>> metrics.set_unguarded_nannies(1)
        """
        self._set(self.unguarded_nannies, n)

    def internal_error(self, where: str) -> None:
        """One error caught inside oomguard at `where` (see INTERNAL_ERROR_SITES).

        >>> metrics.internal_error("transition")
        """
        self.internal_errors.labels(where=_label(where, INTERNAL_ERROR_SITES)).inc()

    def store_error(self, kind: str, n: int = 1) -> None:
        """`n` store troubles of `kind` (see STORE_ERROR_KINDS).

        >>> metrics.store_error("disk_full")
        """
        amount = _count(n)
        if amount is None:
            self.internal_error("metrics")
            return
        self.store_errors.labels(kind=_label(kind, STORE_ERROR_KINDS)).inc(amount)

    def set_history(self, up: bool, spooled: int) -> None:
        """The PostgreSQL history's state: reachable or not, and events waiting for it.

        >>> metrics.set_history(False, 1200)
        """
        self.has_history = True
        self.history_up.set(1 if up else 0)
        self._set(self.history_spool_events, spooled)

    def set_aside(self, kind: str, n: int = 1) -> None:
        """`n` rows of `kind` (SET_ASIDE_KINDS) the history refused and the shipper set aside.

        >>> metrics.set_aside("run")
        """
        amount = _count(n)
        if amount is None or kind not in SET_ASIDE_KINDS:
            self.internal_error("metrics")
            return
        self.history_set_aside.labels(kind=kind).inc(amount)

    def _set(self, gauge: Gauge, n: Any) -> None:
        value = _count(n)
        if value is None:
            self.internal_error("metrics")
            return
        gauge.set(value)
