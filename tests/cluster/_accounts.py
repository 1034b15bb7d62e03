"""One death, one account: what each surface counts, read from a real cluster (issue 38).

Dask's own unexpected `remove-worker` events are the truth; the tests compare
`Failures.deaths()`, the signatures' counts, /metrics and the dashboard against them.
"""

from __future__ import annotations

import re
import time
import urllib.request

from distributed import Client

import oomguard
from cluster_helpers import wait_for


def unexpected_removals(client: Client) -> int:
    """Dask's own count of worker deaths: its unexpected `remove-worker` events."""
    return sum(
        1
        for _, msg in client.get_events("all")
        if isinstance(msg, dict)
        and msg.get("action") == "remove-worker"
        and not msg.get("expected")
    )


def deaths_on_metrics(client: Client) -> float:
    """oomguard_worker_deaths_total on the scheduler's /metrics, every label summed."""
    url = client.dashboard_link.replace("/status", "/metrics")
    text = urllib.request.urlopen(url, timeout=30).read().decode()
    values = re.findall(r"^oomguard_worker_deaths_total\{[^}]*\} (\S+)$", text, re.M)
    assert values, text[:2000]
    return sum(float(v) for v in values)


def dashboard_deaths(dask_scheduler) -> tuple[int, int]:
    """(the deaths the dashboard's header counts, the death bars of its plot)."""
    from oomguard.scheduler_plugin._dashboard_data import (
        TASK_CAUSES,
        failure_columns,
        read_store,
    )

    plugin = dask_scheduler.plugins["oomguard"]
    plugin.store.flush()
    now = time.time()
    snap = read_store(plugin.store, now, plugin.cluster)
    cols = failure_columns(snap.failures(), now)
    bars = sum(sum(v) for c, v in cols.items() if c not in ("time", "width", *TASK_CAUSES))
    return len(snap.deaths), bars


def counted_once_everywhere(client: Client) -> list:
    """Once every removal is decided: assert that the deaths `Failures.deaths()` lists, the
    sum of their signatures' counts, /metrics and the dashboard's header and plot all equal
    Dask's own count. The deaths, for more checks."""
    failures = oomguard.Failures(client)
    wait_for(
        lambda: failures._query("stats").get("pending_deaths") == 0,
        lambda: f"deaths still undecided: {failures._query('stats')}",
        timeout=120,
    )
    truth = unexpected_removals(client)
    deaths = failures.deaths()
    assert len(deaths) == truth, (truth, deaths)
    signatures = {s.id: s for s in failures.signatures()}
    carried = {d.signature_id for d in deaths}
    assert sum(signatures[i].count for i in carried) == truth
    assert deaths_on_metrics(client) == truth
    header, bars = client.run_on_scheduler(dashboard_deaths)
    assert header == bars == truth
    return deaths
