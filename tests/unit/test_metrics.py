"""OomguardMetrics against a fresh CollectorRegistry: values, bounded labels, exposition."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from oomguard._causes import DEATH_CAUSES, Cause, Killer, Kind
from oomguard._death.wire import REASONS
from oomguard._metrics import INTERNAL_ERROR_SITES, LATENCY_BUCKETS, OomguardMetrics
from oomguard._models import FailureEvent
from oomguard._store import FailureStore

NAMES = (
    "oomguard_failures_total",
    "oomguard_worker_deaths_total",
    "oomguard_pipeline_aborts_total",
    "oomguard_signatures",
    "oomguard_signature_max_hosts",
    "oomguard_reports_rejected_total",
    "oomguard_report_latency_seconds",
    "oomguard_cgroup_workers",
    "oomguard_unguarded_nannies",
    "oomguard_internal_errors_total",
    "oomguard_displaced_tasks_total",
)


@pytest.fixture
def reg():
    metrics = OomguardMetrics()
    registry = CollectorRegistry()
    registry.register(metrics)
    return metrics, registry


def value(registry, name, **labels):
    """The sum of the samples of `name` whose labels include `labels` (None: none)."""
    want = set(labels.items())
    found = [
        s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == name and want <= set(s.labels.items())
    ]
    return sum(found) if found else None


def test_counters_count(reg):
    m, r = reg
    m.failure("infra", "oom_kill")
    m.failure(Kind.INFRA, Cause.OOM_KILL)  # enums are their values
    m.failure("user", "exception")
    m.deaths(Cause.NATIVE_CRASH)
    m.pipeline_aborted()
    m.pipeline_aborted()
    m.displaced()
    m.displaced(3)
    m.report_rejected("too_large")
    m.internal_error("transition")
    assert value(r, "oomguard_failures_total", kind="infra", cause="oom_kill") == 2
    assert value(r, "oomguard_failures_total", kind="user", cause="exception") == 1
    assert value(r, "oomguard_failures_total", kind="infra", cause="sigterm") == 0
    assert value(r, "oomguard_worker_deaths_total", cause="native_crash") == 1
    assert value(r, "oomguard_worker_deaths_total", cause="native_crash", killer="unknown") == 1
    m.deaths("sigterm", "earlyoom")
    assert value(r, "oomguard_worker_deaths_total", cause="sigterm", killer="earlyoom") == 1
    assert value(r, "oomguard_pipeline_aborts_total") == 2
    assert value(r, "oomguard_displaced_tasks_total") == 4
    assert value(r, "oomguard_reports_rejected_total", reason="too_large") == 1
    assert value(r, "oomguard_internal_errors_total", where="transition") == 1


def test_gauges_set(reg):
    m, r = reg
    m.set_signatures(12)
    m.set_signature_max_hosts(3)
    m.set_cgroup_workers(8)
    assert value(r, "oomguard_signatures") == 12
    assert value(r, "oomguard_signature_max_hosts") == 3
    assert value(r, "oomguard_cgroup_workers") == 8
    m.set_cgroup_workers(2)  # a gauge goes down too
    assert value(r, "oomguard_cgroup_workers") == 2


def test_latency_histogram(reg):
    m, r = reg
    for s in (0.0005, 0.004, 0.2, 20.0, -1.0):  # -1: clock skew counts as 0
        m.report_latency(s)
    assert value(r, "oomguard_report_latency_seconds_count") == 5
    assert value(r, "oomguard_report_latency_seconds_bucket", le="0.001") == 2
    assert value(r, "oomguard_report_latency_seconds_bucket", le="0.005") == 3
    assert value(r, "oomguard_report_latency_seconds_bucket", le="30.0") == 5
    assert value(r, "oomguard_report_latency_seconds_sum") == pytest.approx(20.2045)
    assert LATENCY_BUCKETS[0] == 0.001 and LATENCY_BUCKETS[-1] == 30.0


def test_unknown_labels_map_to_other(reg):
    m, r = reg
    m.failure("gremlins", "cosmic_ray")
    m.failure("infra", "('load-0a1b', 17)")  # a task key must never become a label
    m.deaths("exception")  # not a death cause
    m.deaths("sigterm", "pid 4242 (chaos-monkey)")  # a process name must never be a label
    m.report_rejected("invalid")  # ReportError's default reason is not in REASONS
    m.report_rejected(None)
    m.internal_error("somewhere/new")
    assert value(r, "oomguard_failures_total", kind="other", cause="other") == 1
    assert value(r, "oomguard_failures_total", kind="infra", cause="other") == 1
    assert value(r, "oomguard_worker_deaths_total", cause="other") == 1
    assert value(r, "oomguard_worker_deaths_total", cause="sigterm", killer="other") == 1
    assert value(r, "oomguard_reports_rejected_total", reason="other") == 2
    assert value(r, "oomguard_internal_errors_total", where="other") == 1
    labels = {v for family in r.collect() for s in family.samples for v in s.labels.values()}
    assert "('load-0a1b', 17)" not in labels and "somewhere/new" not in labels
    assert not any("chaos" in v for v in labels)


def test_bad_values_never_raise_and_are_counted(reg):
    m, r = reg
    m.set_signatures("12")
    m.set_cgroup_workers(-1)
    m.set_signature_max_hosts(float("nan"))
    m.report_latency(float("nan"))
    m.report_latency(None)
    m.displaced(True)
    assert value(r, "oomguard_signatures") == 0
    assert value(r, "oomguard_cgroup_workers") == 0
    assert value(r, "oomguard_report_latency_seconds_count") == 0
    assert value(r, "oomguard_displaced_tasks_total") == 0
    assert value(r, "oomguard_internal_errors_total", where="metrics") == 6


def test_series_exist_at_zero_before_any_event(reg):
    _, r = reg
    for cause in Cause:
        kind = "user" if cause is Cause.EXCEPTION else "infra"
        assert value(r, "oomguard_failures_total", kind=kind, cause=cause.value) == 0
    for cause in DEATH_CAUSES:
        for killer in Killer:
            assert value(r, "oomguard_worker_deaths_total", cause=cause, killer=killer) == 0
    # Bounded: every cause and killer, plus `other`, and nothing else, ever.
    deaths = {
        tuple(sorted(s.labels.items()))
        for family in r.collect()
        for s in family.samples
        if s.name == "oomguard_worker_deaths_total"
    }
    assert len(deaths) == len(DEATH_CAUSES) * len(Killer)
    for reason in REASONS | {"other"}:
        assert value(r, "oomguard_reports_rejected_total", reason=reason) == 0
    for where in INTERNAL_ERROR_SITES | {"other"}:
        assert value(r, "oomguard_internal_errors_total", where=where) == 0
    assert value(r, "oomguard_pipeline_aborts_total") == 0
    assert value(r, "oomguard_report_latency_seconds_count") == 0


def test_text_exposition_names_every_metric(reg):
    m, r = reg
    m.failure("infra", "oom_kill")
    text = generate_latest(r).decode()
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    for name in NAMES:
        assert name in text
    # The parser drops _total from counter family names.
    assert families["oomguard_failures"] == "counter"
    assert families["oomguard_report_latency_seconds"] == "histogram"
    assert families["oomguard_signatures"] == "gauge"
    assert 'oomguard_failures_total{cause="oom_kill",kind="infra"} 1.0' in text


def test_register_once_per_registry():
    m = OomguardMetrics()
    r = CollectorRegistry()
    assert m.register(r) is True
    assert OomguardMetrics().register(r) is False  # names taken: refused, not raised
    m.unregister(r)
    m.unregister(r)  # idempotent
    assert r.get_sample_value("oomguard_pipeline_aborts_total") is None
    assert OomguardMetrics().register(r) is True


def test_store_totals(tmp_path):
    store = FailureStore(str(tmp_path / "s.sqlite3"))
    store.start()
    try:
        assert store.totals() == (0, 0)
        for i, (sig, host) in enumerate(
            [("a", "h1"), ("a", "h2"), ("a", "h2"), ("b", "h1"), ("c", "h3")]
        ):
            store.add(
                FailureEvent(
                    "infra",
                    "oom_kill",
                    f"s{i}",
                    "p",
                    "w",
                    host,
                    sig,
                    f"title {sig}",
                    time=1000.0 + i,
                )
            )
        assert store.flush()
        assert store.totals() == (3, 2)
    finally:
        store.close()
