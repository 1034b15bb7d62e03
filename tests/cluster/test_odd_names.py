"""Names any client gives, on a real cluster writing a real PostgreSQL history (issue 39):
spans and `oomguard_pipeline` annotations named with a NUL, 4,000 characters (or 4,000
bytes of UTF-8), control characters or a bidi override, then normal spans. Before, one such name failed the
shipper's batch for good and no later run reached the history while `sync()` said True.
Now each name is made safe where it enters (printable, at most 1 KiB, a long one keeps its
start and a hash), every run arrives, and the `pipelines` query neither writes nor ships."""

from __future__ import annotations

import dask
import pytest
from distributed import Client, LocalCluster, span
from distributed.diagnostics.plugin import SchedulerPlugin

import oomguard
from cluster_helpers import wait_for
from oomguard._protocol import PIPELINE_ANNOTATION
from oomguard._safe_text import NAME_BYTES, safe_name
from oomguard._store.pg import pg_connect

pytestmark = pytest.mark.timeout(300)

# (A lone surrogate never reaches the scheduler this way: Dask's own stream cannot carry
# it. tests/unit/test_history_trust.py gives the store one directly.)
ODD = ["nul\x00span", "x" * 4000, "esc\x1b]0;t\x07\nline", "é" * 2000, "bidi\u202eevil"]


def inc(x: int) -> int:
    return x + 1


def history_runs(url: str) -> set[str]:
    import psycopg

    with pg_connect(url) as conn:
        try:
            rows = conn.execute("SELECT name FROM pipelines WHERE cluster = 'odd'")
        except psycopg.errors.UndefinedTable:  # no scheduler connected yet
            return set()
        return {r[0] for r in rows}


class Given(SchedulerPlugin):
    """What Dask gave the scheduler's plugins as pipeline names: each span's and each
    `oomguard_pipeline` annotation's, as they arrived."""

    name = "test-given-names"

    def __init__(self) -> None:
        self.names: list[str] = []

    def update_graph(self, scheduler, *, annotations, **kw):
        for span_ in (annotations.get("span") or {}).values():
            self.names.append("/".join(span_["name"]))
        self.names += list((annotations.get(PIPELINE_ANNOTATION) or {}).values())


def test_odd_names_then_normal_runs_all_reach_the_history(pg_url, tmp_path):
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        oomguard.install(
            client, store=pg_url, spool=str(tmp_path / "spool.sqlite3"), cluster_name="odd"
        )
        client.register_plugin(Given())
        for i, name in enumerate(ODD):
            with span(name):
                assert _compute(client, f"odd-{i}") == 1
            with dask.annotate(oomguard_pipeline=name + "-annotated"):
                assert client.submit(inc, 2, pure=False).result(60) == 3
        for i in range(5):
            with dask.annotate(oomguard_pipeline=f"normal-{i}"):
                assert client.submit(inc, 3, pure=False).result(60) == 4
        given = client.run_on_scheduler(lambda dask_scheduler: _given(dask_scheduler))
        # Dask itself may tag a submission with the span of the block before (seen with
        # distributed 2026.8): what must arrive is every name the scheduler was given.
        assert {f"normal-{i}" for i in range(5)} <= given and len(given) >= 12, given
        expected = {safe_name(n) for n in given}
        runs = wait_for(
            lambda: (r := history_runs(pg_url)) >= expected and r,
            lambda: f"runs in the history: {sorted(history_runs(pg_url))}; given {given}",
            timeout=120,
            interval=0.5,
        )
        assert runs == expected  # every run arrived, each under its safe name
        for name in runs:
            assert name.isprintable() and len(name.encode()) <= NAME_BYTES, name[:80]
        assert any(n.startswith("x" * 900) for n in runs)  # a readable start, then a hash
        # The client finds a run by the name it gave: its filter is made safe alike.
        failures = oomguard.Failures(client)
        assert failures.pipeline("nul\x00span-annotated").name == "nul\\x00span-annotated"
        # The pipelines query reads: it writes no run again and ships nothing again.
        before = client.run_on_scheduler(_shipped_and_queued)
        for _ in range(5):
            assert len(failures.pipelines(limit=None)) >= len(expected)
        assert client.run_on_scheduler(_shipped_and_queued) == before


def _given(dask_scheduler) -> set[str]:
    return set(dask_scheduler.plugins[Given.name].names)


def _compute(client: Client, key: str) -> int:
    """One task computed in the span block around the call."""
    return client.compute(dask.delayed(inc)(0, dask_key_name=key)).result(60)


def _shipped_and_queued(dask_scheduler=None):
    plugin = dask_scheduler.plugins["oomguard"]
    store = plugin.store
    return store.writer._enqueued, store.history.shipper.sent
