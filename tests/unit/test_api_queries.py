"""`oomguard.Failures` as a notebook user meets it, against an in-process scheduler (no
worker processes) whose store holds a known history: its repr, the result types, a pipeline
that does not exist, and filters that are refused as the CLI refuses them."""

from __future__ import annotations

import argparse
import datetime
import time

import pytest
from distributed import Client, LocalCluster

import oomguard
from oomguard import FailureEvent, PipelineStatus
from oomguard._cli import main
from oomguard._client import filters as _filters
from oomguard._client.results import EventList, PipelineList, SignatureList

NOW = time.time()  # reset when the history is stored (the `cluster` fixture)

#: (cause, shard, pipeline, signature, hours ago)
HISTORY = [
    ("oom_kill", "('load', 7)", "etl", "sig-oom", 3.0),
    ("oom_kill", "('load', 7)", "etl", "sig-oom", 2.5),
    ("exception", "('parse', 2)", "etl", "sig-key", 2.0),
    ("native_crash", "('load', 3)", "backfill", "sig-segv", 0.5),
    ("oom_kill", "('load', 8)", "backfill", "sig-oom", 0.25),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # "Hours ago" from when the history is stored, not from when this module was imported: a
    # busy suite reaches these tests half an hour later, and `since="1h"` then lost one.
    global NOW
    NOW = time.time()
    store = tmp_path_factory.mktemp("api") / "failures.sqlite3"
    with (
        LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        oomguard.install(client, store=str(store))
        plugin = cluster.scheduler.plugins["oomguard"]
        for i, (cause, shard, pipeline, sig, hours) in enumerate(HISTORY):
            plugin.store.add(
                FailureEvent(
                    kind="user" if cause == "exception" else "infra",
                    cause=cause,
                    shard=shard,
                    pipeline=pipeline,
                    worker=f"tcp://10.0.0.{i}:4000",
                    host=f"10.0.0.{i}",
                    signature_id=sig,
                    signature_title=f"{cause} in load",
                    attempt=1,
                    evidence={"summary": "x" * 1000},
                    time=NOW - hours * 3600,
                    cluster=plugin.cluster,  # as the plugin stamps what it stores
                )
            )
        for name, started, state in (
            ("etl", NOW - 4 * 3600, "succeeded"),
            ("etl", NOW - 3 * 3600, "aborted"),
            ("backfill", NOW - 3600, "running"),
        ):
            plugin.store.upsert_pipeline(
                PipelineStatus(
                    name=name,
                    status=state,
                    shards_done=1,
                    shards_failed=0,
                    shards_aborted=0,
                    infra_failures=0,
                    user_failures=0,
                    summary="",
                    started=started,
                    cluster=plugin.cluster,
                )
            )
        assert plugin.store.flush()
        yield cluster, client


@pytest.fixture
def failures(cluster):
    return oomguard.Failures(cluster[1])


def test_the_repr_names_the_scheduler_and_counts_the_history(cluster, failures):
    # The scenario: `<oomguard._client.api.Failures object at 0x…>`.
    address = cluster[1].scheduler.address
    assert repr(failures) == f"<Failures {address} 5 events, 3 signatures>"


def test_the_repr_of_an_unreachable_history_is_still_one_line_and_quick():
    with (
        LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cl,
        Client(cl) as client,
    ):
        address = client.scheduler.address
        start = time.monotonic()
        text = repr(oomguard.Failures(client))  # no oomguard on this scheduler
        assert time.monotonic() - start < 10
        assert text.startswith(f"<Failures {address} ") and "\n" not in text, text
        assert "oomguard" in text, text  # says what is probably missing
    assert repr(oomguard.Failures(client)).startswith("<Failures ")  # closed: no raise


def test_results_are_tables_and_still_lists(failures):
    events = failures.events()
    assert type(events) is EventList and len(events) == 5
    assert [e.shard for e in events][:2] == ["('load', 8)", "('load', 3)"]  # newest first
    assert events[0] == failures.events(limit=1)[0]
    assert "<table" in events._repr_html_()
    assert type(failures.signatures()) is SignatureList
    assert type(failures.pipelines()) is PipelineList
    history = failures.shard(("load", 7))
    assert type(history) is EventList and [e.attempt for e in history] == [1, 1]
    assert "oldest first" in history._repr_html_()


def test_a_pipeline_that_does_not_exist_raises_key_error_naming_the_known_ones(failures):
    # The scenario: pipeline("typo") returned None; the next line failed with AttributeError.
    with pytest.raises(KeyError) as info:
        failures.pipeline("typo")
    message = str(info.value)
    assert "'typo'" in message and "'etl'" in message and "'backfill'" in message, message
    assert message.index("'backfill'") < message.index("'etl'")  # most recent first


def test_a_pipeline_is_its_latest_run_and_a_run_label_is_explained(failures):
    assert failures.pipeline("etl").status == "aborted"  # the later of the two runs
    with pytest.raises(KeyError) as info:
        failures.pipeline("etl#2")
    message = str(info.value)
    assert "pipeline('etl')" in message and "started" in message, message


@pytest.mark.parametrize(
    "call, argument, value, expected",
    [
        (lambda f: f.events(cause="oom"), "cause", "'oom'", "oom_kill"),
        (lambda f: f.signatures(cause="oom"), "cause", "'oom'", "oom_kill"),
        (lambda f: f.events(kind="system"), "kind", "'system'", "infra"),
        (lambda f: f.events(limit=-5), "limit", "-5", "positive"),
        (lambda f: f.events(limit=0), "limit", "0", "positive"),
        (lambda f: f.events(limit=2.5), "limit", "2.5", "positive"),
        (lambda f: f.events(limit=True), "limit", "True", "positive"),
        (lambda f: f.signatures(limit=-1), "limit", "-1", "positive"),
        (lambda f: f.pipelines(limit=-1), "limit", "-1", "positive"),
        (lambda f: f.events(since="soon"), "since", "'soon'", "1h"),
        (lambda f: f.signatures(since="yesterday"), "since", "'yesterday'", "ISO"),
        (lambda f: f.events(since=-3600), "since", "-3600", "span back from now"),
        (lambda f: f.events(since=float("nan")), "since", "nan", "seconds since the epoch"),
        (lambda f: f.events(since=NOW * 1000), "since", "", "seconds, not milliseconds"),
        (lambda f: f.events(since=[1]), "since", "[1]", "datetime"),
        (lambda f: f.events(pipeline=7), "pipeline", "7", "str"),
        (lambda f: f.events(signature=b"ab"), "signature", "b'ab'", "str"),
        (lambda f: f.pipeline(None), "name", "None", "str"),
    ],
)
def test_an_invalid_filter_raises_value_error_naming_argument_value_and_what_is_expected(
    failures, call, argument, value, expected
):
    # The scenario: since="1h", cause="oom", kind="system", limit=-5 returned [] silently.
    with pytest.raises(ValueError) as info:
        call(failures)
    message = str(info.value)
    assert message.startswith(f"{argument}={value}"), message
    assert expected in message and "\n" not in message, message


def test_a_misspelt_cause_suggests_the_right_one(failures):
    with pytest.raises(ValueError, match="did you mean 'oom_kill'"):
        failures.events(cause="oom")


def test_the_cli_refuses_the_same_values(capsys):
    for argv in (["--cause", "oom"], ["--kind", "system"], ["--limit", "-5"], ["--since", "soon"]):
        with pytest.raises(SystemExit) as info:
            main(["report", "--store", "/nonexistent", *argv])
        assert info.value.code == 2, argv
    assert "soon" in capsys.readouterr().err


def test_since_takes_what_the_cli_takes_and_python_times(failures):
    # "1h" is the CLI's --since 1h: a span back from now, not a silent [].
    recent = [e.shard for e in failures.events(since="1h")]
    assert recent == ["('load', 8)", "('load', 3)"]
    assert [e.shard for e in failures.events(since=datetime.timedelta(hours=1))] == recent
    assert [e.shard for e in failures.events(since=NOW - 3600)] == recent
    an_hour_ago = datetime.datetime.fromtimestamp(NOW - 3600)
    assert [e.shard for e in failures.events(since=an_hour_ago)] == recent
    assert [e.shard for e in failures.events(since=an_hour_ago.isoformat())] == recent
    assert len(failures.signatures(since="1h")) == 2


def test_valid_filters_narrow_as_before(failures):
    assert {e.cause for e in failures.events(cause="oom_kill")} == {"oom_kill"}
    assert {e.cause for e in failures.events(cause=oomguard.Cause.OOM_KILL)} == {"oom_kill"}
    assert [e.kind for e in failures.events(kind="user")] == ["user"]
    assert len(failures.events(limit=2)) == 2 and len(failures.events(limit=None)) == 5
    assert [e.shard for e in failures.events(shard=("load", 7))] == ["('load', 7)"] * 2
    with pytest.warns(UserWarning, match="names no pipeline"):
        assert failures.events(pipeline="nothing") == []  # still [], with a hint


# Issue 27: events(pipeline="typo"), signature="zzz" and `oomguard report --pipeline typo`
# returned nothing with no hint and exit 0; pipeline("segV") offered no "did you mean".


def test_a_filter_on_an_unknown_pipeline_or_signature_warns_with_the_closest_name(failures):
    with pytest.warns(UserWarning) as caught:
        assert failures.events(pipeline="etll") == []
    message = str(caught[0].message)
    assert message.startswith("pipeline='etll' names no pipeline in the history"), message
    assert "'backfill'" in message and "did you mean 'etl'?" in message, message
    with pytest.warns(UserWarning, match=r"signature='sig-om' .*did you mean 'sig-oom'\?"):
        assert failures.events(signature="sig-om") == []
    with pytest.warns(UserWarning, match="did you mean 'backfill'"):
        assert failures.signatures(pipeline="Backfill") == []


def test_a_known_name_that_other_filters_exclude_gives_no_warning(failures):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert failures.events(pipeline="etl", cause="native_crash") == []
        assert failures.events(signature="sig-segv", kind="user") == []


def test_a_pipeline_that_does_not_exist_says_which_one_was_meant(failures):
    with pytest.raises(KeyError, match="Did you mean 'etl'"):
        failures.pipeline("ETL")


@pytest.mark.parametrize(
    "flag, check, options, text",
    [
        ("--since", _filters.since, {}, "soon"),
        ("--cause", _filters.cause, {}, "oom"),
        ("--kind", _filters.kind, {}, "system"),
        ("--limit", _filters.limit, {"parse": int, "allow_none": False}, "-5"),
    ],
)
def test_one_check_serves_the_api_and_the_command_line(capsys, flag, check, options, text):
    parser = argparse.ArgumentParser(prog="report")
    parser.add_argument(flag, type=_filters.for_argparse(check, **options))
    with pytest.raises(SystemExit):
        parser.parse_args([flag, text])
    cli = capsys.readouterr().err.splitlines()[-1]
    value = int(text) if "parse" in options else text
    with pytest.raises(ValueError) as info:
        check(value)
    api = str(info.value)
    # "argument --since: 'soon' is neither ..." and "since='soon' is neither ...".
    assert cli.startswith(f"report: error: argument {flag}: {value!r} "), cli
    assert api.startswith(f"{flag[2:]}={value!r} "), api
    assert cli.split(f"{value!r} ", 1)[1] == api.split(f"{value!r} ", 1)[1].replace(
        " or None for no limit", ""
    )


@pytest.mark.parametrize(
    "flag, value, hint",
    [("--pipeline", "etll", "did you mean 'etl'?"), ("--signature", "zzz", "'sig-oom'")],
)
def test_the_report_of_an_unknown_name_exits_3_naming_the_known_ones(
    cluster, capsys, flag, value, hint
):
    code = main(["report", "--scheduler", cluster[1].scheduler.address, flag, value])
    err = capsys.readouterr().err
    assert code == 3, err
    assert err.startswith(f"oomguard report: {flag} {value!r} names no "), err
    assert hint in err and len(err.strip().splitlines()) == 1, err
    # A known name with nothing to show is still a success.
    assert (
        main(
            [
                "report",
                "--scheduler",
                cluster[1].scheduler.address,
                flag,
                "etl" if flag == "--pipeline" else "sig-oom",
                "--cause",
                "exit",
            ]
        )
        == 0
    )


# --------------------------------------------------------------------------- arguments
# Issue 27: Failures(client, timeout=-1).events() raised "could not convert string to float:
# '1-1'" from deep in Dask; Failures("tcp://...") raised AttributeError: 'str' object has
# no attribute 'sync'.


@pytest.mark.parametrize(
    "timeout, shown",
    [(-1, "-1"), (0, "0"), (float("nan"), "nan"), ("5", "'5'"), (True, "True")],
)
def test_a_bad_timeout_is_refused_up_front_naming_it(cluster, timeout, shown):
    with pytest.raises(ValueError) as info:
        oomguard.Failures(cluster[1], timeout=timeout)
    message = str(info.value)
    assert message.startswith(f"timeout={shown} "), message
    assert "positive number of seconds" in message and "\n" not in message, message


def test_a_good_timeout_is_taken(cluster):
    assert oomguard.Failures(cluster[1], timeout=2.5).timeout == 2.5
    assert oomguard.Failures(cluster[1], timeout=None).timeout is None


@pytest.mark.parametrize("client", ["tcp://127.0.0.1:8786", None, 7])
def test_something_other_than_a_client_is_refused_naming_it(client):
    with pytest.raises(TypeError) as info:
        oomguard.Failures(client)
    message = str(info.value)
    assert message.startswith(f"client={client!r} is not a distributed.Client"), message
    assert "Client(" in message and "\n" not in message, message
    with pytest.raises(TypeError, match=r"^client=.* is not a distributed.Client"):
        oomguard.install(client)


def test_failures_answers_for_its_own_cluster_unless_asked_for_the_fleet(tmp_path):
    # Issue 29: one store, two clusters; this scheduler is "etl-prod".
    with (
        LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        oomguard.install(client, store=str(tmp_path / "shared.sqlite3"), cluster_name="etl-prod")
        store = cluster.scheduler.plugins["oomguard"].store
        for n, name in enumerate(["etl-prod", "etl-prod", "etl-dev"]):
            store.add(
                FailureEvent(
                    "infra",
                    "oom_kill",
                    f"('load', {n})",
                    "etl",
                    "tcp://w:1",
                    "h",
                    "sig",
                    "t",
                    time=NOW + n,
                    cluster=name,
                )
            )
        store.upsert_pipeline(
            PipelineStatus("etl", "failed", 1, 1, 0, 1, 0, "", cluster="etl-dev")
        )
        assert store.flush()
        own, fleet = oomguard.Failures(client), oomguard.Failures(client, fleet=True)
        assert own.cluster == fleet.cluster == "etl-prod"
        assert [e.shard for e in own.events()] == ["('load', 1)", "('load', 0)"]
        assert len(fleet.events()) == 3 and len(fleet.shard("('load', 2)")) == 1
        assert own.shard("('load', 2)") == []
        (sig,) = own.signatures()
        assert (sig.count, sig.clusters) == (3, ["etl-dev", "etl-prod"])
        assert own.pipelines() == [] and [p.cluster for p in fleet.pipelines()] == ["etl-dev"]
        assert fleet.pipeline("etl").cluster == "etl-dev"
        with pytest.raises(KeyError):
            own.pipeline("etl")
        with pytest.raises(TypeError, match="fleet="):
            oomguard.Failures(client, fleet="yes")
        with pytest.raises(ValueError, match="cluster="):
            client.sync(client.scheduler.oomguard_query, what="events", cluster=7)


def test_deaths_are_one_row_each_with_their_tasks_and_the_roles_they_had(tmp_path, monkeypatch):
    """Issue 38: `Failures.deaths()` has one row per worker death (a death of two suspects
    is one row, two events); a shard or pipeline that was only displaced finds the death,
    and its role says so; the fleet sees every cluster's; pages join up."""
    from oomguard._client import api
    from oomguard._client.results import DeathList
    from oomguard._death.record import Death, Role, Task

    def record(store, n, cluster, tasks, cause="oom_kill"):
        death = Death(
            id=f"d{n}", cluster=cluster, worker=f"tcp://10.0.0.{n}:4000", host=f"10.0.0.{n}",
            cause=cause, time=NOW + n, tasks=tasks, signature_id="sig-oom",
            signature_title="oom_kill in load",
        )  # fmt: skip
        blamed = [t for t in tasks if t.role in (Role.CULPRIT, Role.SUSPECT)]
        events = [
            FailureEvent(
                "infra",
                cause,
                t.key,
                t.pipeline,
                death.worker,
                death.host,
                "sig-oom",
                "oom_kill in load",
                time=death.time,
                cluster=cluster,
                death=death.id,
            )  # fmt: skip
            for t in blamed
        ]
        assert store.record(death, events), store.last_error

    with (
        LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        oomguard.install(client, store=str(tmp_path / "deaths.sqlite3"), cluster_name="etl-prod")
        store = cluster.scheduler.plugins["oomguard"].store
        nap = [Task(f"nap-{i}", role=Role.SUSPECT, pipeline="etl") for i in (1, 2)]
        record(store, 1, "etl-prod", tuple(nap))
        load = Task("('load', 7)", role=Role.CULPRIT, pipeline="etl")
        agg = Task("('agg', 3)", role=Role.DISPLACED, pipeline="report")
        record(store, 2, "etl-prod", (load, agg))
        record(store, 3, "etl-dev", (load,), cause="sigkill")
        assert store.flush()
        failures = oomguard.Failures(client)
        deaths = failures.deaths()
        assert type(deaths) is DeathList and [d.id for d in deaths] == ["d2", "d1"]
        assert len(failures.events()) == 3  # the two suspects' and the culprit's
        assert failures.signatures()[0].count == 3  # one per death, on both clusters
        (d2,) = failures.deaths(pipeline="report")
        assert d2.role_of("('agg', 3)") is Role.DISPLACED and d2.killer is None
        assert [d.id for d in failures.deaths(shard=("agg", 3))] == ["d2"]
        assert failures.deaths(shard="nap-2")[0].with_role(Role.SUSPECT) == tuple(nap)
        assert [d.id for d in failures.deaths(worker="tcp://10.0.0.1:4000")] == ["d1"]
        assert failures.deaths(cause="sigkill") == [] and len(failures.deaths(since="1h")) == 2
        fleet = oomguard.Failures(client, fleet=True)
        assert [d.cluster for d in fleet.deaths()] == ["etl-dev", "etl-prod", "etl-prod"]
        monkeypatch.setattr(api, "_PAGE_ROWS", 1)  # one row per reply: the cursor joins them
        assert [d.id for d in fleet.deaths(limit=None)] == ["d3", "d2", "d1"]
        assert [d.id for d in fleet.deaths(limit=2)] == ["d3", "d2"]
        with pytest.raises(ValueError, match="did you mean 'oom_kill'"):
            failures.deaths(cause="oom")
        with pytest.warns(UserWarning, match="names no pipeline"):
            assert failures.deaths(pipeline="nothing") == []
        with pytest.raises(
            ValueError, match=r"before=\[1.0, 2\]: expected \[time, id\] of a death"
        ):
            client.sync(client.scheduler.oomguard_query, what="deaths", before=[1.0, 2])
