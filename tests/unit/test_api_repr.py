"""What a notebook shows of oomguard's records and result lists: one-line reprs with a
readable local time, HTML tables (escaped) for lists, `to_pandas()`; and the lists still
index, iterate and compare like the plain lists callers already use."""

from __future__ import annotations

import builtins
import datetime
import html
import pickle
import re
import sys

import pytest

from capabilities import require
from oomguard import FailureEvent, PipelineStatus, SignatureRow
from oomguard._client.results import DeathList, EventList, PipelineList, SignatureList
from oomguard._death.record import Attribution, Death, Role, Task

T = datetime.datetime(2026, 5, 1, 14, 3, 7).timestamp()  # local time, as reprs show it
CLOCK = "2026-05-01 14:03:07"

#: The evidence of a real OOM-kill event: ~1.3 KB, which the repr used to print whole.
EVIDENCE = {
    "exitcode": -9,
    "exitcode_source": "nanny: worker process exit status",
    "oom_kill_delta": 1,
    "oom_kill_source": "kernel cgroup counter memory.events of the worker's own group",
    "peak_bytes": 1095216660,
    "peak_source": "kernel peak of the worker's group (memory.peak)",
    "sampled_rss_bytes": 1034223616,
    "sampled_rss_source": "flight recorder, 500 ms before the death",
    "executing_tasks": 1,
    "likely_culprit": "('load-0a1b2c3d4e5f60718293a4b5c6d7e8f9', 17)",
    "stack": ["shardapp/core.py:88 load_shard", "numpy/core/_methods.py:41 _sum"] * 4,
    "summary": "the kernel OOM-killed the worker: oom_kill counted in its cgroup, peak "
    "1.02 GiB of a 1 GiB limit, sampled RSS 986.3 MiB 500 ms before",
}


def event(**changes) -> FailureEvent:
    fields = dict(
        kind="infra",
        cause="oom_kill",
        shard="('load-0a1b', 17)",
        pipeline="etl",
        worker="tcp://10.0.3.11:40211",
        host="10.0.3.11",
        signature_id="6d4c109d5cf8c83f",
        signature_title="oom_kill in shardapp.core.load_shard ← run",
        evidence=EVIDENCE,
        attempt=2,
        time=T,
        id=41,
    )
    fields.update(changes)
    return FailureEvent(**fields)


def signature(**changes) -> SignatureRow:
    fields = dict(
        id="6d4c109d5cf8c83f",
        title="oom_kill in shardapp.core.load_shard ← run",
        grouping_version=1,
        count=3,
        first_seen=T - 3600,
        last_seen=T,
        hosts=["10.0.3.11", "10.0.3.12"],
        workers=["tcp://10.0.3.11:40211"],
        shards=["('load-0a1b', 17)"],
        pipelines=["etl"],
        causes=["oom_kill"],
        example="Traceback (most recent call last):\n  ...",
    )
    fields.update(changes)
    return SignatureRow(**fields)


def status(**changes) -> PipelineStatus:
    fields = dict(
        name="etl",
        status="aborted",
        shards_done=12,
        shards_failed=0,
        shards_aborted=3,
        infra_failures=2,
        user_failures=0,
        summary="aborted: shard ('load-0a1b', 17) was OOM-killed by the kernel twice.",
        abort_reason="oomguard aborted pipeline 'etl' because shard ('load-0a1b', 17) failed "
        "2 times: its worker was OOM-killed by the kernel each time.",
        started=T - 60,
    )
    fields.update(changes)
    return PipelineStatus(**fields)


# --------------------------------------------------------------------------- one record


def test_an_event_repr_is_one_short_line_with_a_readable_time_and_no_evidence():
    # The scenario: each event's repr was ~1.3 KB of evidence dict, time an epoch float.
    text = repr(event())
    assert "\n" not in text and len(text) <= 160, text
    assert CLOCK in text
    for part in ("oom_kill", "('load-0a1b', 17)", "etl", "tcp://10.0.3.11:40211"):
        assert part in text, (part, text)
    assert str(T) not in text and "peak_bytes" not in text
    assert text == (
        "<FailureEvent 2026-05-01 14:03:07 oom_kill shard=('load-0a1b', 17) "
        "attempt=2 pipeline=etl worker=tcp://10.0.3.11:40211>"
    )


def test_a_user_event_says_it_is_one_and_an_unknown_pipeline_shows_as_such():
    text = repr(event(kind="user", cause="exception", pipeline="", attempt=1))
    assert " exception " in text and "pipeline=''" in text and "attempt" not in text, text


def test_signature_and_pipeline_reprs_are_one_short_line():
    s = repr(signature())
    assert s == (
        "<SignatureRow 6d4c109d5cf8c83f 'oom_kill in shardapp.core.load_shard ← run' "
        "count=3 hosts=2 causes=oom_kill last 2026-05-01 14:03:07>"
    ), s
    s = repr(signature(state="regressed"))
    assert "← run' regressed count=3 " in s, s
    p = repr(status())
    assert p == (
        "<PipelineStatus etl aborted started 2026-05-01 14:02:07 done=12 failed=0 "
        "aborted=3 infra=2 user=0>"
    ), p
    assert "started ?" in repr(status(started=0.0))  # 0.0: a run stored before runs had a time


HUGE_PREFIX = "('read-parquet-fused-assign-" + "9f8e7d6c5b4a3928" * 40


@pytest.mark.parametrize(
    "shard, must_keep",
    [
        # A tuple key: the start names the layer, the end holds the index that tells the
        # shards of one layer apart.
        (HUGE_PREFIX + "', 17)", ["('read-parquet", "', 17)"]),
        (HUGE_PREFIX + "', 18)", ["('read-parquet", "', 18)"]),
        # A client.map key: the function's name, then the token that tells its shards apart.
        ("process_shard-" + "0123456789abcdef" * 8, ["process_shard-", "89abcdef"]),
        # Newlines or tabs in a key never break the one line.
        ("a\nb\tc" * 200, ["a b c"]),
    ],
)
def test_a_huge_shard_key_is_shortened_in_the_middle_keeping_both_ends(shard, must_keep):
    text = repr(event(shard=shard))
    assert "\n" not in text and len(text) <= 160, text
    assert "…" in text
    for part in must_keep:
        assert part in text, (part, text)


def test_two_huge_shards_that_differ_only_at_the_end_have_different_reprs():
    a, b = repr(event(shard=HUGE_PREFIX + "', 17)")), repr(event(shard=HUGE_PREFIX + "', 18)"))
    assert a != b


def test_long_titles_pipelines_and_workers_keep_the_repr_short():
    long = "x" * 5000
    for text in (
        repr(event(pipeline=long, worker="tcp://" + long + ":4000")),
        repr(signature(title=long)),
        repr(status(name=long)),
    ):
        assert "\n" not in text and len(text) <= 200, text
    assert repr(event(worker="tcp://" + long + ":4000")).endswith(":4000>")  # the port stays


def test_the_dataclass_behaviour_is_unchanged():
    e = event()
    assert e == FailureEvent.from_dict(e.to_dict())
    assert e.evidence["peak_bytes"] == 1095216660 and e.time == T
    assert pickle.loads(pickle.dumps(e)) == e


# --------------------------------------------------------------------------- lists


def events(n: int = 3) -> EventList:
    return EventList([event(shard=f"('load-0a1b', {i})", id=i, time=T - i) for i in range(n)])


def test_result_lists_are_still_lists():
    plain = [event(shard=f"('load-0a1b', {i})", id=i, time=T - i) for i in range(3)]
    rows = EventList(plain)
    assert isinstance(rows, list) and rows == plain and rows != []
    assert rows[0] == plain[0] and list(rows) == plain and len(rows) == 3
    assert [e.shard for e in rows] == [e.shard for e in plain]
    assert EventList([]) == [] and not EventList([])
    assert type(rows[:2]) is EventList and rows[:2] == plain[:2]  # a slice stays a table
    assert pickle.loads(pickle.dumps(rows)) == plain


def test_a_list_repr_puts_one_event_per_line():
    text = repr(events(3))
    lines = text.splitlines()
    assert len(lines) == 3, text
    assert lines[0].startswith("[<FailureEvent 2026-05-01 14:03:07 oom_kill")
    assert lines[1].startswith(" <FailureEvent ") and lines[2].endswith(">]")
    assert repr(EventList([])) == "[]"


def test_a_long_list_repr_is_summarised():
    text = repr(events(1000))
    lines = text.splitlines()
    assert len(lines) <= 20, text
    assert any("985 more" in line for line in lines), text
    assert "('load-0a1b', 999)" in lines[-1]  # the last one shown is the last one


def test_html_tables_for_events_signatures_and_pipelines():
    page = events(2)._repr_html_()
    assert page.count("<tr") == 3  # the header and two rows
    for header in ("time", "cause", "shard", "pipeline", "worker", "signature"):
        assert f">{header}<" in page, header
    assert CLOCK in page and html.escape("('load-0a1b', 1)") in page
    assert str(T) not in page

    page = SignatureList([signature(state="escalating", last_hour=7)])._repr_html_()
    assert "6d4c109d5cf8c83f" in page and ">3<" in page and "10.0.3.12" in page
    assert ">state<" in page and ">escalating<" in page and ">7<" in page
    page = PipelineList([status()])._repr_html_()
    assert ">aborted<" in page and ">12<" in page and "OOM-killed by the kernel twice" in page


def test_html_escapes_every_value():
    hostile = "<script>alert('x')</script>&\"'"
    rows = EventList(
        [event(shard=hostile, pipeline=hostile, worker=hostile, signature_title=hostile)]
    )
    for page in (
        rows._repr_html_(),
        SignatureList([signature(title=hostile, hosts=[hostile])])._repr_html_(),
        PipelineList([status(name=hostile, summary=hostile, abort_reason=hostile)])._repr_html_(),
    ):
        assert "<script>" not in page and "alert('x')" not in page, page
        assert "&lt;script&gt;" in page
        # Every attribute value is quoted and escaped: no stray quote closes one early.
        for attr in re.findall(r'\s[a-z-]+=("[^"]*"|\S+)', page):
            assert attr.startswith('"'), attr


def test_html_shows_the_whole_shard_key_on_hover_and_a_long_table_is_cut():
    huge = HUGE_PREFIX + "', 17)"
    page = EventList([event(shard=huge)])._repr_html_()
    assert html.escape(huge, quote=True) in page  # in the cell's title attribute
    assert "…" in page
    page = events(1000)._repr_html_()
    assert page.count("<tr") < 80 and "1000 failure events" in page
    assert "more" in page


def test_the_tables_are_well_formed_html(artifacts_dir):
    from html.parser import HTMLParser

    class Balance(HTMLParser):
        def __init__(self):
            super().__init__()
            self.open: list[str] = []

        def handle_starttag(self, tag, attrs):
            self.open.append(tag)

        def handle_endtag(self, tag):
            assert self.open and self.open.pop() == tag, (tag, self.open)

    hostile = "<b>x</b> & 'y'"
    pages = [
        EventList(
            [event(), event(shard=HUGE_PREFIX + "', 17)", pipeline=hostile)], "newest first"
        )._repr_html_(),
        SignatureList(
            [signature(), signature(id="0be3a1f27c9d4e55", title=hostile)]
        )._repr_html_(),
        PipelineList(
            [status(), status(name="backfill", status="running", started=0.0)]
        )._repr_html_(),
        EventList([])._repr_html_(),
    ]
    for page in pages:
        parser = Balance()
        parser.feed(page)
        parser.close()
        assert parser.open == [], parser.open
    # What a notebook shows, kept for a look (CI keeps artifacts/).
    (artifacts_dir / "notebook-tables.html").write_text(
        "<!doctype html><meta charset='utf-8'><body>" + "<br>".join(pages), encoding="utf-8"
    )


def test_an_empty_table_says_so():
    assert "no failure events" in EventList([])._repr_html_()
    assert "no signatures" in SignatureList([])._repr_html_()
    assert "no pipeline runs" in PipelineList([])._repr_html_()


# --------------------------------------------------------------------------- pandas


def test_to_pandas_without_pandas_names_the_install_command(monkeypatch):
    real_import = builtins.__import__

    def no_pandas(name, *args, **kwargs):
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("No module named 'pandas'", name="pandas")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "pandas", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_pandas)
    with pytest.raises(ImportError, match=r"to_pandas\(\) needs pandas: pip install pandas"):
        events(2).to_pandas()


def test_to_pandas_gives_one_row_per_item_with_real_times():
    import importlib.util

    require(importlib.util.find_spec("pandas"), "pandas is not installed (the test extra has it)")
    import pandas as pd

    df = events(3).to_pandas()
    assert list(df.columns[:4]) == ["kind", "cause", "shard", "pipeline"]
    assert len(df) == 3 and df["shard"].tolist() == [f"('load-0a1b', {i})" for i in range(3)]
    assert str(df["time"].dtype).startswith("datetime64") and str(df["time"].dt.tz) == "UTC"
    assert df["time"].iloc[0] == pd.Timestamp(T, unit="s", tz="UTC")
    assert df["evidence"].iloc[0]["peak_bytes"] == 1095216660

    df = SignatureList([signature(state="resolved", resolved_at=T, aliases=["0ld"])]).to_pandas()
    assert df.loc[0, "id"] == "6d4c109d5cf8c83f"
    assert df.loc[0, "hosts"] == ["10.0.3.11", "10.0.3.12"]
    assert str(df["last_seen"].dt.tz) == "UTC"
    assert (df.loc[0, "state"], df.loc[0, "aliases"]) == ("resolved", ["0ld"])
    assert df.loc[0, "resolved_at"] == pd.Timestamp(T, unit="s", tz="UTC")
    assert pd.isna(df.loc[0, "regressed_at"])  # 0.0: never

    df = PipelineList([status(), status(started=0.0)]).to_pandas()
    assert df["started"].iloc[0] == pd.Timestamp(T - 60, unit="s", tz="UTC")
    assert pd.isna(df["started"].iloc[1])  # 0.0 means not known

    empty = EventList([]).to_pandas()
    assert len(empty) == 0 and "shard" in empty.columns


@pytest.mark.parametrize("module", ["oomguard._display", "oomguard._client.filters"])
def test_docstring_examples(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0


# --------------------------------------------------------------------------- deaths


def death(**changes) -> Death:
    fields = dict(
        id="a1b2c3d4e5f60718",
        cluster="etl-prod",
        worker="tcp://10.0.3.11:40211",
        host="10.0.3.11",
        cause="oom_kill",
        time=T,
        tasks=(
            Task("('load-0a1b', 17)", "load-0a1b", role=Role.CULPRIT, pipeline="etl"),
            Task("('agg-9f8e', 3)", "agg-9f8e", role=Role.DISPLACED, pipeline="report"),
            Task("('load-0a1b', 18)", "load-0a1b", role=Role.QUEUED, pipeline="etl"),
        ),
        killer=Attribution("kernel", "kernel counter", "confirmed", "the kernel's OOM killer"),
        evidence=EVIDENCE,
        signature_id="6d4c109d5cf8c83f",
        signature_title="oom_kill in shardapp.core.load_shard ← run",
    )
    fields.update(changes)
    return Death(**fields)


def test_a_death_repr_is_one_short_line_naming_its_culprit():
    text = repr(death())
    assert text == (
        "<Death 2026-05-01 14:03:07 oom_kill killer=kernel worker=tcp://10.0.3.11:40211 "
        "culprit=('load-0a1b', 17) tasks=3>"
    )
    suspects = tuple(Task(f"nap-{i}", role=Role.SUSPECT) for i in range(3))
    text = repr(death(tasks=suspects, killer=None, more={"queued": 40}))
    assert text.endswith("worker=tcp://10.0.3.11:40211 suspects=3 tasks=43>"), text
    assert "\n" not in repr(death(worker="tcp://" + "x" * 500)) and len(repr(death())) <= 160


def test_a_death_round_trips_through_to_dict_and_its_list_is_a_table():
    d = death()
    assert Death.from_dict(d.to_dict()) == d
    assert pickle.loads(pickle.dumps(d)) == d
    deaths = DeathList([d, death(id="b", cause="sigkill", killer=None)], "newest first")
    assert deaths[0] is d and type(deaths[:1]) is DeathList and repr(deaths).count("<Death") == 2
    page = deaths._repr_html_()
    assert "2 worker deaths, newest first" in page
    assert "('load-0a1b', 17)" in html.unescape(page)  # blamed
    assert "1 displaced (report); 1 queued (etl)" in html.unescape(page)  # without blame
    hostile = DeathList([death(worker="<script>alert(1)</script>")])._repr_html_()
    assert "<script>" not in hostile and "&lt;script&gt;" in hostile


def test_death_list_to_pandas_has_one_row_per_death():
    import importlib.util

    require(importlib.util.find_spec("pandas"), "pandas is not installed (the test extra has it)")
    import pandas as pd

    df = DeathList([death(), death(id="b")]).to_pandas()
    assert len(df) == 2 and list(df["id"]) == ["a1b2c3d4e5f60718", "b"]
    assert df["time"].iloc[0] == pd.Timestamp(T, unit="s", tz="UTC")
    roles = [t["role"] for t in df["tasks"].iloc[0]]
    assert roles == ["culprit", "displaced", "queued"]
    assert df["killer"].iloc[0]["name"] == "kernel"
