"""Where a crash lives, in the store (issue 40), on both backends: each cluster's workers
with their environments (the baseline, newest start wins, bounded per cluster), each
signature's first environment (kept once), and its suspects found when it is read, from
its deaths against the workers of the clusters they died in; a restart keeps all of it."""

from __future__ import annotations

import sqlite3

import pytest

from oomguard import FailureEvent
from oomguard._death.record import Death, Environment
from oomguard._store import FailureStore
from oomguard._store import environments as store_environments
from pg_lab import BACKENDS, store_on

T0 = 1_790_000_000.0


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path):
    s = store_on(request, tmp_path)
    s.start()
    yield s
    s.close()


def env(pool: str, **kw) -> Environment:
    return Environment(
        python="3.11.9", dask="2026.8.0", kernel="6.1.0", labels={"NODE_POOL": pool}, **kw
    )


def nanny(i: int) -> str:
    return f"tcp://10.0.0.{i}:40000"


def death(n: int, slot: int, environment: Environment | None, *, signature: str = "sig-a",
          cluster: str = "c") -> tuple[Death, list[FailureEvent]]:  # fmt: skip
    d = Death(
        id=f"{cluster}-d{n}",
        cluster=cluster,
        worker=f"tcp://10.0.0.{slot}:4{n:04d}",
        nanny=nanny(slot),
        host=f"node-{slot}",
        cause="native_crash",
        time=T0 + n,
        signature_id=signature,
        signature_title="SIGSEGV in read",
        environment=environment,
    )
    event = FailureEvent(
        "infra", d.cause, f"s{n}", "etl", d.worker, d.host, signature, d.signature_title,
        {}, 1, d.time, cluster=cluster, death=d.id,
    )  # fmt: skip
    return d, [event]


def five_workers(store, cluster: str = "c") -> None:
    """Two spot workers and three on-demand ones."""
    for i in range(5):
        pool = "spot" if i < 2 else "ondemand"
        assert store.worker_environment(cluster, nanny(i), env(pool), T0 + i)


def record(store, *deaths) -> None:
    for d, events in deaths:
        assert store.record(d, events), store.last_error
    assert store.flush(), store.last_error


def test_a_pool_whose_workers_alone_die_is_the_suspect(store):
    five_workers(store)
    record(store, *(death(n, n % 2, env("spot")) for n in range(4)))
    row = store.signature("sig-a")
    assert [(s["name"], s["value"]) for s in row.environment_suspects] == [("NODE_POOL", "spot")]
    (s,) = row.environment_suspects
    assert (s["deaths"], s["of_deaths"], s["workers"], s["of_workers"]) == (4, 4, 2, 5)
    assert 0 < s["p"] <= 0.05
    assert row.first_environment["labels"] == {"NODE_POOL": "spot"}
    assert row.first_environment["python"] == "3.11.9"
    (listed,) = store.signatures()
    assert listed.environment_suspects == row.environment_suspects
    # The dashboard's table reads without them.
    (bare,) = store.signatures(environment=False)
    assert bare.environment_suspects == [] and bare.first_environment == {}


def test_deaths_spread_like_the_workers_have_no_suspect(store):
    five_workers(store)
    record(store, *(death(n, n, env("spot" if n < 2 else "ondemand")) for n in range(5)))
    assert store.signature("sig-a").environment_suspects == []


def test_the_first_environment_is_kept_once(store):
    five_workers(store)
    record(store, death(0, 0, None), death(1, 3, env("ondemand")))
    record(store, death(2, 0, env("spot")))
    row = store.signature("sig-a")
    assert row.first_environment["labels"] == {"NODE_POOL": "ondemand"}


def test_a_new_grouping_keeps_the_first_environment_of_the_old_id(store):
    """The old signature's row folded into the new one's (aliases.py) keeps the environment
    of the earlier first death: the old id's, not the new id's own."""
    record(store, death(0, 0, env("spot"), signature="sig-old"))
    d, events = death(1, 1, env("ondemand"), signature="sig-new")
    assert store.record(d, events, grouping_version=3, aliases=[("sig-old", 2)])
    assert store.flush(), store.last_error
    row = store.signature("sig-new")
    assert row.count == 2 and row.aliases == ["sig-old"]
    assert row.first_environment["labels"] == {"NODE_POOL": "spot"}


def test_a_restarted_workers_latest_start_counts_once(store):
    five_workers(store)
    # Slot 2 restarts twice: still one worker of five.
    for t in (T0 + 100, T0 + 200):
        assert store.worker_environment("c", nanny(2), env("ondemand"), t)
    # An older start of slot 4 arriving late changes nothing (else spot would be 3 of 5,
    # too common among the workers to be suspected).
    assert store.worker_environment("c", nanny(4), env("spot"), T0 - 50)
    record(store, *(death(n, n % 2, env("spot")) for n in range(4)))
    (s,) = store.signature("sig-a").environment_suspects
    assert (s["workers"], s["of_workers"]) == (2, 5)


def test_suspects_compare_with_the_workers_of_the_clusters_the_deaths_were_in(store):
    five_workers(store, "c")
    # Another cluster, all spot, where this signature never died: not in its baseline.
    for i in range(10, 30):
        assert store.worker_environment("other", nanny(i), env("spot"), T0)
    record(store, *(death(n, n % 2, env("spot")) for n in range(4)))
    (s,) = store.signature("sig-a").environment_suspects
    assert s["of_workers"] == 5


def test_without_environments_nothing_is_suspected(store):
    record(store, *(death(n, n % 2, None) for n in range(6)))
    row = store.signature("sig-a")
    assert row.environment_suspects == [] and row.first_environment == {}


def test_the_history_survives_a_restart(tmp_path):
    path = str(tmp_path / "s.sqlite3")
    s = FailureStore(path, batch_interval=0.01)
    s.start()
    five_workers(s)
    record(s, *(death(n, n % 2, env("spot")) for n in range(4)))
    s.close()
    again = FailureStore(path)
    again.start()
    try:
        row = again.signature("sig-a")
        assert [x["value"] for x in row.environment_suspects] == ["spot"]
        assert row.first_environment["labels"]["NODE_POOL"] == "spot"
    finally:
        again.close()


def test_each_cluster_keeps_its_latest_workers(tmp_path, monkeypatch):
    monkeypatch.setattr(store_environments, "WORKERS_KEPT", 3)
    s = FailureStore(str(tmp_path / "s.sqlite3"), batch_interval=0.01)
    s.start()
    try:
        five_workers(s, "c")
        five_workers(s, "d")
        assert s.flush()
        conn = sqlite3.connect(s.file)
        kept = conn.execute(
            "SELECT cluster, slot FROM worker_environments ORDER BY cluster, time"
        ).fetchall()
        conn.close()
        assert kept == [(c, nanny(i)) for c in ("c", "d") for i in (2, 3, 4)]
    finally:
        s.close()


def test_a_list_finds_the_suspects_of_its_most_frequent_signatures(tmp_path, monkeypatch):
    monkeypatch.setattr(store_environments, "SUSPECT_ROWS", 1)
    s = FailureStore(str(tmp_path / "s.sqlite3"), batch_interval=0.01)
    s.start()
    try:
        five_workers(s)
        record(s, *(death(n, n % 2, env("spot")) for n in range(5)))
        record(s, *(death(10 + n, n % 2, env("spot"), signature="sig-b") for n in range(4)))
        record(s, death(20, 3, env("ondemand"), signature="sig-c"))  # counted once: no query
        first, second, third = s.signatures()
        assert (first.id, second.id, third.id) == ("sig-a", "sig-b", "sig-c")
        assert first.environment_suspects and second.environment_suspects == []
        assert s.signature("sig-b").environment_suspects  # alone, always
        assert second.first_environment["labels"] == {"NODE_POOL": "spot"}
    finally:
        s.close()


def test_a_bad_environment_is_refused_at_the_door_and_named(tmp_path):
    s = FailureStore(str(tmp_path / "s.sqlite3"))
    s.start()
    try:
        assert not s.worker_environment("c", "n", {"labels": {}}, T0)
        assert "Environment" in s.last_error
        assert not s.worker_environment("c", "n", env("spot"), float("nan"))
        assert "time" in s.last_error
    finally:
        s.close()


def test_a_file_of_the_schema_before_keeps_its_signatures(tmp_path):
    path = tmp_path / "old.sqlite3"
    from oomguard._store import MIGRATIONS
    from oomguard._store.schema import connect, migrate

    conn = connect(str(path))
    migrate(conn, str(path), MIGRATIONS[:6])  # before migration 7, the environments'
    conn.execute("INSERT INTO signatures VALUES ('old', 'an old crash', 1, 3, ?, ?, '')", (T0, T0))
    conn.close()
    s = FailureStore(str(path))
    s.start()
    try:
        row = s.signature("old")
        assert (row.count, row.first_environment, row.environment_suspects) == (3, {}, [])
    finally:
        s.close()


# --------------------------------------------------------------------------- where it is shown


@pytest.fixture
def spot_file(tmp_path):
    """A store file where sig-a died 4 times on the 2 spot workers of 5."""
    path = str(tmp_path / "s.sqlite3")
    s = FailureStore(path, batch_interval=0.01)
    s.start()
    five_workers(s)
    record(s, *(death(n, n % 2, env("spot", image="etl:7")) for n in range(4)))
    record(s, *(death(10 + n, n, env("ondemand"), signature="sig-b") for n in range(2, 5)))
    s.close()
    return path


def test_the_report_names_the_suspect_and_with_signature_the_first_environment(spot_file, capsys):
    import json

    from _cli_run import report

    rc, out, _ = report(capsys, "--store", spot_file, "--signatures")
    assert rc == 0
    lines = " ".join(out.split())
    assert "sig-a suspects: NODE_POOL=spot (4 of 4 deaths, 2 of 5 workers)" in lines
    assert "sig-b suspects" not in lines and "first environment" not in lines
    rc, out, _ = report(capsys, "--store", spot_file, "--signatures", "--signature", "sig-a")
    lines = " ".join(out.split())
    assert "sig-a first environment: python 3.11.9, dask 2026.8.0, kernel 6.1.0, " in lines
    assert "image etl:7; NODE_POOL=spot" in lines
    rc, out, _ = report(capsys, "--store", spot_file, "--signatures", "--json")
    by_id = {s["id"]: s for s in json.loads(out)["signatures"]}
    assert [(s["name"], s["value"]) for s in by_id["sig-a"]["environment_suspects"]] == [
        ("NODE_POOL", "spot")
    ]
    assert by_id["sig-b"]["environment_suspects"] == []
    assert by_id["sig-b"]["first_environment"]["labels"] == {"NODE_POOL": "ondemand"}


def test_the_dashboard_detail_and_the_notebook_table_show_it(spot_file):
    from oomguard._client.results import SignatureList
    from oomguard._models import SignatureRow
    from oomguard.scheduler_plugin._dashboard_data import read_detail

    s = FailureStore(spot_file)
    s.start()
    try:
        text = read_detail(s, "sig-a")
        rows = SignatureList(SignatureRow.from_dict(r.to_dict()) for r in s.signatures())
    finally:
        s.close()
    assert "suspects           NODE_POOL=spot (4 of 4 deaths, 2 of 5 workers)" in text
    assert "first environment  python 3.11.9" in text
    html = rows._repr_html_()
    assert "suspects" in html and "NODE_POOL=spot (4 of 4 deaths, 2 of 5 workers)" in html
    frame = rows.to_pandas()
    assert frame.loc[frame["id"] == "sig-a", "environment_suspects"].iloc[0][0]["value"] == "spot"
    assert "suspect NODE_POOL=spot" in repr(rows[0] if rows[0].id == "sig-a" else rows[1])
