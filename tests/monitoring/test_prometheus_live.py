"""The chart's alerts and dashboard queries against a live scheduler, and a real Prometheus.

A real `dask scheduler --preload oomguard.scheduler_plugin` and one `dask worker` with the
nanny preload and a per-worker memory cgroup, as subprocesses. First every metric name (and
label value, and grouping label) that a rule or a Grafana panel uses must be on the
scheduler's `/metrics`. Then Debian's Prometheus scrapes it every second with the chart's
rules loaded; a shard larger than its worker is OOM-killed by the kernel, oomguard aborts
its pipeline (no larger worker), and the abort and OOM-kill alerts must fire, and no other.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import distributed
import pytest
from prometheus_client.parser import text_string_to_metric_families
from promlib import (
    TARGET_LABELS,
    Prometheus,
    alerts_of,
    binary,
    dashboard,
    grouping_labels,
    merged,
    panel_queries,
    rule_groups,
    selectors,
    write_rules,
)

import oomguard
from chartlib import CHART, NAMESPACE, RELEASE
from cluster_helpers import DaskScheduler, require_worker_groups, wait_for
from oomguard._cli.demo_run import load_shard
from oomguard._host.cgroup import can_create_child

LIMIT = 256 * 2**20  # the worker's memory limit, and its cgroup's
POD = f"{RELEASE}-oomguard-scheduler-5d8c7b9f4-abcde"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("monitoring")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    env["DASK_OOMGUARD__SCHEDULER__STORE"] = str(tmp / "failures.sqlite3")
    sched = DaskScheduler(tmp, env)
    worker = None
    try:
        address = sched.address()
        dash = json.loads(sched.file.read_text())["services"]["dashboard"]
        worker_env = {
            **env,
            "DASK_OOMGUARD__WORKER__CGROUP_LIMIT": "true" if can_create_child()[0] else "false",
            "DASK_OOMGUARD__WORKER__SAMPLE_INTERVAL": "100ms",
            "DASK_OOMGUARD__WORKER__CRASH_DIR": str(tmp / "crash"),
            # The kernel, not the nanny's memory monitor, stops the shard.
            "DASK_DISTRIBUTED__WORKER__MEMORY__TERMINATE": "False",
            "DASK_DISTRIBUTED__WORKER__MEMORY__PAUSE": "False",
            "DASK_DISTRIBUTED__WORKER__MEMORY__SPILL": "False",
            "DASK_DISTRIBUTED__WORKER__MEMORY__TARGET": "False",
            "DASK_TEMPORARY_DIRECTORY": str(tmp),
        }
        worker = subprocess.Popen(
            [os.path.join(os.path.dirname(sys.executable), "dask"), "worker", address,
             "--nworkers", "1", "--nthreads", "1", "--memory-limit", str(LIMIT),
             "--no-dashboard", "--preload-nanny", "oomguard.worker_plugin"],
            env=worker_env, stdout=subprocess.DEVNULL, stderr=open(tmp / "worker.log", "w"),
            start_new_session=True,
        )  # fmt: skip
        # The plugin registers its collector in its start(), a moment after the scheduler
        # file is written.
        wait_for(
            lambda: "oomguard_pipeline_aborts_total" in scrape(dash),
            lambda: f"no oomguard_ metric on /metrics: {sched.text()[-2000:]}",
            timeout=30,
            interval=0.2,
        )
        yield {"address": address, "dashboard": dash, "scheduler": sched, "tmp": tmp}
    finally:
        if worker is not None:
            os.killpg(worker.pid, 15)
            try:
                worker.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, 9)
                worker.wait()
        sched.stop()


def scrape(port: int) -> dict[str, list[dict[str, str]]]:
    """Sample name -> the label sets of its series, from the scheduler's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(dict(sample.labels))
    return out


def unexported(expr: str, exported: dict[str, list[dict[str, str]]]) -> list[str]:
    """What `expr` asks of the scheduler that its /metrics does not have: metric names
    (sample names: a histogram is only its _bucket, _count and _sum, a counter its _total),
    label values it matches on, labels it groups by. Scrape labels are not asked."""
    found = selectors(expr)
    out = []
    missed = set(re.findall(r"\boomguard_\w+", expr)) - {name for name, _ in found}
    assert not missed, f"the selector parser missed {missed} in {expr}"
    for name, matchers in found:
        series = exported.get(name)
        if not series:
            out.append(f"{name}: no such series")
            continue
        for label, (op, value) in matchers.items():
            if label in TARGET_LABELS or op.startswith("!"):
                continue
            have = {s.get(label) for s in series}
            wanted = value.split("|") if op == "=~" else [value]
            out += [f'{name}{{{label}="{v}"}}: no such series' for v in wanted if v not in have]
        for label in grouping_labels(expr) - TARGET_LABELS:
            if any(label not in s for s in series):
                out.append(f"{name}: not every series has the label {label!r} to group by")
    return out


def _monitoring_values() -> dict:
    # Every cause the chart's schema lets oomKillCauses name.
    schema = json.loads((CHART / "values.schema.json").read_text())
    rule = schema["properties"]["metrics"]["properties"]["prometheusRule"]["properties"]
    causes = rule["oomKillCauses"]["items"]["enum"]
    return merged({"metrics": {"prometheusRule": {"oomKillCauses": causes}}})


def test_every_metric_a_rule_or_panel_uses_is_exported(lab):
    exported = scrape(lab["dashboard"])
    values = _monitoring_values()
    queries = [(name, r["expr"]) for name, r in alerts_of(rule_groups(values)).items()]
    queries += panel_queries(dashboard(values))
    assert len(queries) >= 5 + 9
    problems = {f"{where}: {p}" for where, expr in queries for p in unexported(expr, exported)}
    assert problems == set()


@pytest.mark.parametrize(
    "expr, wrong",
    [
        ("rate(oomguard_report_latency_seconds[5m])", "oomguard_report_latency_seconds: no"),
        ("increase(oomguard_pipeline_aborts[1h])", "oomguard_pipeline_aborts: no"),
        ("oomguard_failure_total", "oomguard_failure_total: no"),
        ('oomguard_worker_deaths_total{killer=~"earlyom|kubelet"}', 'killer="earlyom"'),
        ("sum by (node) (oomguard_failures_total)", "the label 'node' to group by"),
    ],
)
def test_the_check_tells_what_is_not_exported(lab, expr, wrong):
    got = unexported(expr, scrape(lab["dashboard"]))
    assert any(wrong in p for p in got), got


def test_the_check_knows_histogram_and_counter_suffixes(lab):
    exported = scrape(lab["dashboard"])
    for expr in (
        "sum(rate(oomguard_report_latency_seconds_count[5m]))",
        "sum(rate(oomguard_report_latency_seconds_sum[5m]))",
        "sum by (le) (oomguard_report_latency_seconds_bucket)",
        "oomguard_displaced_tasks_total",
    ):
        assert unexported(expr, exported) == [], expr


def _grafana(expr: str) -> str:
    """A panel's query as Grafana sends it: this release's namespace, every scheduler pod
    (the variable's "All"), the dashboard's time range."""
    return (
        expr.replace("$namespace", NAMESPACE)
        .replace("$scheduler", ".*")
        .replace("$__range", "1h")
        .replace("$__rate_interval", "1m")
    )


def _firing(prom: Prometheus) -> dict[str, dict]:
    return {n: a for n, a in prom.alerts().items() if a["state"] == "firing"}


@pytest.mark.timeout(180)
def test_a_real_prometheus_fires_the_abort_and_oom_kill_alerts(lab, tmp_path):
    require_worker_groups()
    binary("prometheus")
    start = time.monotonic()
    # One OOM kill must alert here: oomKillsPerHour (a documented value) is 0; the rules'
    # text is the chart's, as rendered.
    values = merged({"metrics": {"prometheusRule": {"oomKillsPerHour": 0}}})
    rules = write_rules(tmp_path / "rules.yaml", values)
    target = (f"127.0.0.1:{lab['dashboard']}", {"namespace": NAMESPACE, "pod": POD})
    with (
        Prometheus(tmp_path, rules, [target]) as prom,
        distributed.Client(lab["address"], timeout=60) as client,
    ):
        client.wait_for_workers(1, timeout=60)
        # increase() is 0 for a counter whose first sample is already 1: let Prometheus
        # scrape the counters at 0, and evaluate every rule on that, before the kill.
        wait_for(
            lambda: prom.query("count_over_time(oomguard_pipeline_aborts_total[1m]) >= 2"),
            lambda: f"no two scrapes of the scheduler: {prom.api('targets')} {prom.text()}",
            timeout=30,
        )
        t0 = time.time()
        wait_for(
            lambda: prom.evaluated_since(t0),
            lambda: f"rules not evaluated: {prom.api('rules')}",
            timeout=30,
        )
        rules_loaded = {r["name"] for g in prom.api("rules")["groups"] for r in g["rules"]}
        assert rules_loaded == set(alerts_of(rule_groups(values)))
        assert prom.alerts() == {}  # quiet before any death
        before = _panels(prom)

        with distributed.span("etl"):
            # The demo's crasher (importable by the worker, as a test module is not): it
            # reads a shard four times the worker's memory.
            crasher = client.submit(load_shard, 7, 4 * LIMIT, key=("etl", 7), pure=False)
        with pytest.raises(oomguard.PipelineAborted) as aborted:
            crasher.result(timeout=90)
        events = oomguard.Failures(client).events(pipeline="etl")
        assert {e.cause for e in events} == {"oom_kill"}, (events, aborted.value)
        kill_done = time.monotonic()

        fired = wait_for(
            lambda: (
                (f := _firing(prom)).keys() >= {"OomguardPipelineAborted", "OomguardOomKillsHigh"}
                and f
            ),
            lambda: f"alerts: {prom.alerts()}\n{lab['scheduler'].text()[-2000:]}",
            timeout=30,
        )
        alert_seconds = time.monotonic() - kill_done
        time.sleep(2)  # two more evaluations: nothing else fires
        assert set(_firing(prom)) == {"OomguardPipelineAborted", "OomguardOomKillsHigh"}
        for alert in fired.values():
            assert alert["labels"]["severity"] == "warning"
            assert (
                f"oomguard report --scheduler tcp://{RELEASE}-oomguard-scheduler:8786"
                in (alert["annotations"]["description"])
            )
        # The dashboard's panels, as Grafana would ask for them, see the same.
        after = _panels(prom)
        assert before["panel 3 'Pipelines aborted'"] == {"": 0.0}
        assert after["panel 3 'Pipelines aborted'"][""] > 0
        assert after["panel 1 'Failures per hour by cause'"]["oom_kill"] > 0
        assert after["panel 1 'Failures per hour by cause'"].get("exception", 0) == 0
    print(
        f"\nreal Prometheus: {time.monotonic() - start:.1f} s in all; "
        f"both alerts firing {alert_seconds:.1f} s after the abort"
    )


def _panels(prom: Prometheus) -> dict[str, dict[str, float]]:
    """Every panel query and variable, run by Prometheus as Grafana would send it: where ->
    {the series' distinguishing label value ("" for one series): value}."""
    out: dict[str, dict[str, float]] = {}
    for where, expr in panel_queries(dashboard(merged(None))):
        if where.startswith("variable"):
            label = "namespace" if "namespace" in where else "pod"
            got = prom.api(f"label/{label}/values", **{"match[]": _grafana(expr)})
            assert (NAMESPACE if label == "namespace" else POD) in got, (where, got)
            continue
        result = prom.query(_grafana(expr))
        assert result, f"{where}: {_grafana(expr)} returned nothing"
        for r in result:
            key = next(iter(r["metric"].values()), "")
            out.setdefault(where, {})[key] = float(r["value"][1])
    return out
