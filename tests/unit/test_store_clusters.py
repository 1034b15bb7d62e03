"""One store, many clusters (issue 29): every event and run carries its cluster's name, a
file of the previous schema keeps its rows as cluster '', a signature counts across
clusters and names them, the reads narrow to one cluster, and `oomguard report --cluster`
does too."""

from __future__ import annotations

import json
import sqlite3

import pytest

from _cli_run import report
from oomguard import FailureEvent, PipelineStatus, SignatureRow
from oomguard._store import MIGRATIONS, FailureStore

T0 = 1_790_000_000.0


def ev(n: int, cluster: str, **kw) -> FailureEvent:
    fields = dict(
        kind="infra",
        cause="oom_kill",
        shard=f"('load', {n})",
        pipeline="etl",
        worker="tcp://10.0.0.1:4000",  # the same address on both clusters
        host="node-1",
        signature_id="sig-a",
        signature_title="MemoryError in parse_block",
        evidence={"n": n},
        time=T0 + n,
        cluster=cluster,
    )
    fields.update(kw)
    return FailureEvent(**fields)


def run(cluster: str, status: str, started: float = T0) -> PipelineStatus:
    return PipelineStatus(
        "etl", status, 3, 0, 0, 1, 0, f"{cluster} {status}", "", started, cluster
    )


def fill(store: FailureStore, events=(), runs=()) -> None:
    for e in events:
        assert store.add(e), store.last_error
    for r in runs:
        store.upsert_pipeline(r)
    assert store.flush(), store.last_error


@pytest.fixture
def store(tmp_path):
    s = FailureStore(str(tmp_path / "store.sqlite3"), batch_interval=0.01)
    s.start()
    yield s
    s.close()


def test_positional_construction_of_the_records_is_unchanged():
    # The new fields come last: code written for the records before still builds them.
    e = FailureEvent("infra", "oom_kill", "k", "etl", "w", "h", "sig", "t", {}, 2, T0)
    assert (e.attempt, e.time, e.cluster) == (2, T0, "")
    p = PipelineStatus("etl", "running", 1, 0, 0, 0, 0, "s", "", T0)
    assert (p.started, p.cluster) == (T0, "")
    s = SignatureRow("sig", "t", 2, 5, T0, T0, ["h"], [], [], [], ["oom_kill"], "trace")
    assert (s.example, s.clusters) == ("trace", [])
    assert SignatureRow.from_dict({**s.to_dict(), "clusters": ("b", "a")}).clusters == ["b", "a"]


def test_a_signature_counts_across_clusters_and_names_them(store):
    fill(store, [ev(1, "nightly"), ev(2, "nightly"), ev(3, "backfill")])
    (row,) = store.signatures()
    assert row.count == 3 and row.clusters == ["backfill", "nightly"]
    assert store.distinct_counts("sig-a")["clusters"] == 2
    # A signature "of a cluster" is one it saw, with its counts across every cluster.
    assert [s.count for s in store.signatures(cluster="backfill")] == [3]
    assert store.signatures(cluster="elsewhere") == []
    assert [e.time for e in store.events(cluster="nightly")] == [T0 + 2, T0 + 1]
    assert [e.cluster for e in store.events()] == ["backfill", "nightly", "nightly"]
    assert [e.cluster for e in store.shard("('load', 3)", cluster="backfill")] == ["backfill"]
    assert store.shard("('load', 3)", cluster="nightly") == []


def test_runs_of_one_name_on_two_clusters_are_two_runs(store):
    # Same name, same start: still two rows, one per cluster; each updates its own.
    fill(store, runs=[run("nightly", "running"), run("backfill", "running")])
    fill(store, runs=[run("nightly", "aborted")])
    assert {(p.cluster, p.status) for p in store.pipelines()} == {
        ("nightly", "aborted"),
        ("backfill", "running"),
    }
    assert [p.status for p in store.pipelines(cluster="nightly")] == ["aborted"]
    assert store.pipeline("etl", cluster="backfill").summary == "backfill running"
    assert [p.cluster for p in store.pipeline_runs("etl", cluster="nightly")] == ["nightly"]
    assert len(store.pipeline_runs("etl")) == 2


def test_a_cluster_that_is_not_text_is_refused_naming_the_field(store):
    assert not store.add(ev(1, 7))  # type: ignore[arg-type]
    assert "'cluster'" in store.last_error
    store.upsert_pipeline(run(None, "running"))  # type: ignore[arg-type]
    assert "'cluster'" in store.last_error


def test_known_clusters_are_the_names_of_events_and_runs(store):
    fill(store, [ev(1, "nightly"), ev(2, "")], [run("backfill", "running")])
    assert store.known("cluster", "nightly") == (True, ["backfill", "nightly"])
    assert store.known("cluster", "nightyl") == (False, ["backfill", "nightly"])


def _schema_3_file(path) -> None:
    """A store as the oomguard before clusters wrote it: one death, one run."""
    conn = sqlite3.connect(path, isolation_level=None)
    for migration in MIGRATIONS[:3]:
        for statement in migration:
            conn.execute(statement)
    conn.execute("PRAGMA user_version = 3")
    conn.execute(
        "INSERT INTO events (time, kind, cause, shard, pipeline, worker, host, signature_id,"
        " signature_title, evidence, attempt, grouping_version, killer) VALUES"
        " (?, 'infra', 'oom_kill', 's', 'etl', 'w', 'h', 'sig-a', 't', '{}', 1, 2, 'kernel')",
        (T0 - 100,),
    )
    conn.execute(
        "INSERT INTO signatures VALUES ('sig-a', 't', 2, 1, ?, ?, 'old trace')",
        (T0 - 100, T0 - 100),
    )
    conn.execute("INSERT INTO signature_members VALUES ('sig-a', 0, 'h')")
    conn.execute("INSERT INTO signature_distinct VALUES ('sig-a', 0, 1, 1)")
    conn.execute(
        "INSERT INTO pipelines VALUES ('etl', ?, 'aborted', 1, 0, 2, 2, 0, 'old', 'why', ?)",
        (T0 - 200, T0 - 100),
    )
    conn.close()


def test_a_store_of_schema_3_keeps_its_rows_as_cluster_empty(tmp_path):
    path = tmp_path / "v3.sqlite3"
    _schema_3_file(path)
    s = FailureStore(str(path), batch_interval=0.01)
    s.start()
    try:
        (old,) = s.events()
        assert (old.cluster, old.killer, old.pipeline) == ("", "kernel", "etl")
        (old_run,) = s.pipelines()
        assert (old_run.cluster, old_run.status, old_run.abort_reason) == ("", "aborted", "why")
        # Its signature goes on counting; '' is no cluster's name, so never a member.
        fill(s, [ev(1, "nightly")], [run("nightly", "running", T0 - 200)])
        (row,) = s.signatures()
        assert (row.count, row.clusters, row.example) == (2, ["nightly"], "old trace")
        assert [e.cluster for e in s.events(cluster="")] == [""]
        # One name and start on two clusters: two runs, the later written first.
        assert [p.cluster for p in s.pipeline_runs("etl")] == ["nightly", ""]
        assert s.pipeline("etl", cluster="").status == "aborted"
        conn = sqlite3.connect(path)
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        conn.close()
        assert {"events_cluster", "pipelines_updated", "pipelines_cluster"} <= indexes
    finally:
        s.close()


# -- oomguard report --cluster ------------------------------------------------------------------


@pytest.fixture
def two_clusters(tmp_path):
    path = tmp_path / "shared.sqlite3"
    s = FailureStore(str(path), batch_interval=0.01)
    s.start()
    fill(
        s,
        [ev(1, "nightly"), ev(2, "nightly"), ev(3, "backfill", signature_id="sig-b")],
        [run("nightly", "aborted"), run("backfill", "succeeded")],
    )
    s.close()
    return path


def test_the_report_reads_the_whole_history_and_names_the_clusters(capsys, two_clusters):
    rc, out, err = report(capsys, "--store", two_clusters, "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert len(doc["events"]) == 3 and len(doc["pipelines"]) == 2
    assert {s["id"]: (s["count"], s["clusters"]) for s in doc["signatures"]} == {
        "sig-a": (2, ["nightly"]),
        "sig-b": (1, ["backfill"]),
    }
    rc, out, _ = report(capsys, "--store", two_clusters, "--signatures")
    assert rc == 0 and "CLUSTERS" in out.splitlines()[1] and "backfill" in out


def test_the_report_narrows_to_one_cluster(capsys, two_clusters):
    rc, out, err = report(capsys, "--store", two_clusters, "--cluster", "backfill", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert [e["cluster"] for e in doc["events"]] == ["backfill"]
    assert [s["id"] for s in doc["signatures"]] == ["sig-b"]
    assert [(p["cluster"], p["status"]) for p in doc["pipelines"]] == [("backfill", "succeeded")]
    rc, out, _ = report(
        capsys, "--store", two_clusters, "--cluster", "nightly", "--pipeline", "etl"
    )
    assert rc == 0 and "nightly aborted" in out and "backfill" not in out


def test_a_cluster_the_history_does_not_have_exits_3_naming_those_it_has(capsys, two_clusters):
    rc, _, err = report(capsys, "--store", two_clusters, "--cluster", "nightyl")
    assert rc == 3
    assert "'nightyl'" in err and "'nightly'" in err and "backfill" in err
    rc, _, err = report(capsys, "--store", two_clusters, "--cluster", "a\x07b")
    assert rc == 2 and "cluster name" in err
