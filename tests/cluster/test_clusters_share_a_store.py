"""Issue 29, "clusters have names": two real clusters, each with its own
`oomguard.scheduler.cluster-name`, use one store file one after the other and hit the same
crash. The store keeps one signature counted across both and naming both;
`Failures(client)` answers for its own cluster and `fleet=True` for both; `oomguard report
--store` reads the whole history and `--cluster` narrows it."""

from __future__ import annotations

import json
import subprocess
import sys

import distributed
import pytest
from distributed import Client, LocalCluster

import oomguard
from cluster_helpers import wait_for, wait_installed

pytestmark = pytest.mark.timeout(300)


def bad_parse(x):
    raise ValueError(f"cannot parse block {x}")


def crash(client: Client, keys: list[str]) -> None:
    """Each key raises the same ValueError in the pipeline "etl"; wait until stored."""
    with distributed.span("etl"):
        futures = [client.submit(bad_parse, i, key=k) for i, k in enumerate(keys)]
    for f in futures:
        with pytest.raises(ValueError, match="cannot parse block"):
            f.result(timeout=60)
    failures = oomguard.Failures(client)
    wait_for(lambda: len(failures.events()) >= len(keys), f"the events of {keys}")


def run_cluster(store: str, name: str, keys: list[str], check=None) -> None:
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        oomguard.install(client, store=store, cluster_name=name)
        wait_installed(client, n=1)
        crash(client, keys)
        if check is not None:
            check(client)


def report(*argv: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "oomguard._cli", "report", *argv, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_two_clusters_one_history(tmp_path, caplog):
    store = str(tmp_path / "shared" / "oomguard.sqlite3")
    caplog.set_level("INFO", logger="oomguard.scheduler")
    run_cluster(store, "etl-monday", ["parse-1", "parse-2"])
    assert "watching failures of cluster 'etl-monday'" in caplog.text

    def the_second_sees_its_own_and_the_fleet(client: Client) -> None:
        own = oomguard.Failures(client)
        assert own.cluster == "etl-tuesday"
        assert [(e.shard, e.cluster) for e in own.events()] == [("parse-3", "etl-tuesday")]
        fleet = oomguard.Failures(client, fleet=True)
        assert sorted((e.shard, e.cluster) for e in fleet.events()) == [
            ("parse-1", "etl-monday"),
            ("parse-2", "etl-monday"),
            ("parse-3", "etl-tuesday"),
        ]
        # The crash it saw, counted across both clusters.
        (sig,) = own.signatures()
        assert (sig.count, sig.clusters) == (3, ["etl-monday", "etl-tuesday"])
        assert {(p.name, p.cluster) for p in own.pipelines()} == {("etl", "etl-tuesday")}
        assert {p.cluster for p in fleet.pipelines()} == {"etl-monday", "etl-tuesday"}
        assert own.pipeline("etl").cluster == "etl-tuesday"

    run_cluster(store, "etl-tuesday", ["parse-3"], the_second_sees_its_own_and_the_fleet)

    doc = report("--store", store, "--signatures")
    (sig,) = doc["signatures"]
    assert "ValueError" in sig["title"]
    assert (sig["count"], sig["clusters"]) == (3, ["etl-monday", "etl-tuesday"])

    doc = report("--store", store, "--cluster", "etl-monday")
    assert sorted(e["shard"] for e in doc["events"]) == ["parse-1", "parse-2"]
    assert {e["cluster"] for e in doc["events"]} == {"etl-monday"}
    assert [s["id"] for s in doc["signatures"]] == [sig["id"]]
    assert [(p["name"], p["cluster"]) for p in doc["pipelines"]] == [("etl", "etl-monday")]
