"""The dashboard page's pure data shaping: bins, table columns, the drill-down text."""

from __future__ import annotations

import pytest

from oomguard._models import FailureEvent, PipelineStatus, SignatureRow
from oomguard.scheduler_plugin._dashboard_data import (
    CAUSES,
    MAX_BINS,
    DeathAt,
    Snapshot,
    failure_columns,
    pipeline_columns,
    signature_columns,
    signature_detail,
)

NOW = 1_800_000_000.0


def event(cause: str, age: float, **kw) -> FailureEvent:
    kind = "user" if cause == "exception" else "infra"
    fields = dict(
        shard="('s', 0)",
        pipeline="p",
        worker="tcp://w",
        host="h",
        signature_id="id",
        signature_title="t",
        time=NOW - age,
    )
    fields.update(kw)
    return FailureEvent(kind, cause, **fields)


def test_no_events_no_bins():
    cols = failure_columns([], NOW)
    assert cols["time"] == [] and set(cols) == {"time", "width", *CAUSES}


def test_a_worker_death_counts_once_whatever_the_tasks_it_took():
    """Issue 38: the plot counts deaths as `Failures.deaths()` has them, one per worker death
    (however many tasks it took), and a task's exceptions each."""
    deaths = [
        DeathAt(NOW - 100, "oom_kill"),  # a death of two suspects: one
        DeathAt(NOW - 100, "oom_kill"),  # another worker's, at the same time
        DeathAt(NOW - 50, "native_crash"),
    ]
    exceptions = [event("exception", 30, shard="a"), event("exception", 30, shard="b")]
    snap = Snapshot(deaths=deaths, exceptions=[*exceptions, event("memory_error", 20)])
    cols = failure_columns(snap.failures(), NOW)
    got = {c: sum(cols[c]) for c in ("oom_kill", "native_crash", "exception", "memory_error")}
    assert got == {"oom_kill": 2, "native_crash": 1, "exception": 2, "memory_error": 1}
    assert sum(sum(cols[c]) for c in CAUSES) == len(deaths) + 3


@pytest.mark.parametrize(
    ("ages", "width"),
    [([10, 20], 1), ([50, 3000], 60), ([3599], 60), ([7200], 300), ([86399], 1800)],
)
def test_bin_width_keeps_at_most_max_bins(ages, width):
    cols = failure_columns([event("oom_kill", a) for a in ages], NOW)
    assert cols["width"][0] == width * 1000 * 0.9
    assert len(cols["time"]) <= MAX_BINS + 1
    assert sum(cols["oom_kill"]) == len(ages)
    # Bins are contiguous and end at now.
    step = cols["time"][1] - cols["time"][0] if len(cols["time"]) > 1 else width * 1000
    assert step == width * 1000
    assert cols["time"][-1] / 1000 - width / 2 <= NOW < cols["time"][-1] / 1000 + width / 2


def test_counts_by_cause_and_unknown_cause_is_other():
    events = [
        event("oom_kill", 100),
        event("oom_kill", 100, worker="tcp://w2"),
        event("exception", 30),
        event("martian", 30),
        event("sigterm", -500),
    ]
    cols = failure_columns(events, NOW)
    assert sum(cols["oom_kill"]) == 2
    assert sum(cols["exception"]) == 1
    assert sum(cols["other"]) == 1
    assert cols["sigterm"][-1] == 1  # from a clock ahead of ours: the newest bin
    assert sum(sum(cols[c]) for c in CAUSES) == len(events)


def test_signature_columns():
    row = SignatureRow(
        "abc",
        "<b>t</b>",
        1,
        4,
        NOW - 60,
        NOW,
        hosts=["a", "b"],
        causes=["oom_kill", "sigkill"],
        state="regressed",
    )
    cols = signature_columns([row])
    assert cols == {
        "id": ["abc"],
        "state": ["regressed"],
        "count": [4],
        "hosts": [2],
        "first_seen": [(NOW - 60) * 1000],
        "last_seen": [NOW * 1000],
        "title": ["<b>t</b>"],
        "causes": ["oom_kill, sigkill"],
        "other_clusters": [0],
    }


def test_signature_columns_count_the_other_clusters_that_saw_it():
    rows = [
        SignatureRow("a", "t", 1, 9, NOW, NOW, clusters=["etl", "nightly", "backfill"]),
        SignatureRow("b", "t", 1, 2, NOW, NOW, clusters=["nightly"]),
        SignatureRow("c", "t", 1, 1, NOW, NOW, clusters=["etl"]),
    ]
    assert signature_columns(rows, "etl")["other_clusters"] == [2, 1, 0]


def test_pipeline_columns_live_first_and_not_twice():
    live = [PipelineStatus("a", "running", 1, 0, 0, 0, 0, "s")]
    stored = [
        PipelineStatus("b", "failed", 1, 1, 0, 0, 1, "s"),
        PipelineStatus("a", "running", 0, 0, 0, 0, 0, "old"),
    ]
    cols = pipeline_columns(live, stored)
    assert cols["name"] == ["a", "b"] and cols["source"] == ["live", "stored"]
    assert cols["summary"] == ["s", "s"]


def test_signature_detail_is_the_raw_text():
    trace = "Traceback\n<script>x()</script>\n"
    row = SignatureRow(
        "abc",
        "T",
        1,
        2,
        NOW - 60,
        NOW,
        hosts=["h1"],
        shards=[f"s{i}" for i in range(25)],
        example=trace,
    )
    text = signature_detail(row, [event("oom_kill", 5, evidence={"oom_kill_delta": 1})])
    assert "<script>x()</script>" in text  # escaping is the widget's job: PreText
    assert "... and 5 more" in text and '"oom_kill_delta": 1' in text
    assert signature_detail(row, []).endswith("(none kept: retention dropped them)")
    assert "no longer" in signature_detail(None, [])
    assert "no trace" in signature_detail(SignatureRow("x", "T", 1, 1, NOW, NOW), [])


def test_signature_detail_says_its_state_and_old_ids():
    row = SignatureRow(
        "abc", "T", 3, 9, NOW - 600, NOW, state="regressed", resolved_at=NOW - 300,
        resolved_by="alice", resolve_note="fixed in 1.4", regressed_at=NOW - 60,
        regressions=1, last_hour=2, hourly=0.5, aliases=["old1"],
    )  # fmt: skip
    lines = signature_detail(row, []).splitlines()
    assert "old ids    old1" in lines
    (state,) = [ln for ln in lines if ln.startswith("state ")]
    assert state.startswith("state      regressed; 2 in the last hour, 0.5 an hour before; ")
    assert "resolved" in state and "by alice; note: fixed in 1.4; regressed " in state
