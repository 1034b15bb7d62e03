"""The scheduler side's pure parts: pairing removals with reports, naming pipelines."""

from __future__ import annotations

import doctest

import pytest

from oomguard.scheduler_plugin import _deaths, _pipelines
from oomguard.scheduler_plugin._deaths import DeathLedger, Removal
from oomguard.scheduler_plugin._pipelines import ANNOTATION, PipelineNames


def removal(worker="tcp://a:1", **kw):
    return Removal(worker=worker, host="a", time=0.0, processing={}, **kw)


def report(worker="tcp://a:1"):
    return {"worker": worker, "cause": "sigkill"}


@pytest.mark.parametrize("report_first", [False, True])
def test_removal_and_report_pair_whichever_comes_first(report_first):
    ledger = DeathLedger(grace=5.0)
    if report_first:
        assert ledger.reported(report(), now=0.0) is None
        death = ledger.removed(removal(), now=0.1)
    else:
        assert ledger.removed(removal(), now=0.0) is None
        death = ledger.reported(report(), now=0.1)
    assert death.worker == "tcp://a:1" and death.removal and death.report
    assert len(ledger) == 0


def test_a_removal_without_report_expires_as_lost_after_grace():
    ledger = DeathLedger(grace=5.0)
    ledger.removed(removal(), now=0.0)
    assert ledger.expired(now=4.9) == []
    [death] = ledger.expired(now=5.0)
    assert death.report is None and death.removal.worker == "tcp://a:1"


def test_clean_exit_cancels_the_removal_either_way():
    ledger = DeathLedger(grace=5.0)
    ledger.removed(removal("tcp://a:1"), now=0.0)
    ledger.clean("tcp://a:1", now=0.1)
    ledger.clean("tcp://b:1", now=0.1)
    assert ledger.removed(removal("tcp://b:1"), now=0.2) is None
    assert ledger.expired(now=100.0) == []
    assert ledger.clean_exits == 2


def test_unmatched_reports_are_capped_and_counted():
    ledger = DeathLedger(grace=5.0, max_pending=3)
    for i in range(5):
        ledger.reported(report(f"tcp://w:{i}"), now=0.0)
    ledger.reported(report("tcp://w:0"), now=0.0)  # a repeat for a pending worker
    assert len(ledger) == 3 and ledger.dropped == 3
    assert len(ledger.expired(now=5.0)) == 3


def test_drain_keeps_reports_and_drops_removals():
    ledger = DeathLedger(grace=5.0)
    ledger.removed(removal("tcp://a:1"), now=0.0)
    ledger.reported(report("tcp://b:1"), now=0.0)
    [death] = ledger.drain()
    assert death.worker == "tcp://b:1" and len(ledger) == 0


@pytest.mark.parametrize(
    "annotations, expected",
    [
        ({ANNOTATION: {"x-1": "etl"}}, "etl"),
        ({"span": {"x-1": {"name": ("nightly", "load"), "ids": (1, 2)}}}, "nightly/load"),
        # The explicit annotation wins over the span.
        ({ANNOTATION: {"x-1": "etl"}, "span": {"x-1": {"name": ("s",)}}}, "etl"),
        # Dask's default span means "no span": the graph submission names it.
        ({"span": {"x-1": {"name": ("default",)}}}, "x#1"),
        ({}, "x#1"),
    ],
)
def test_pipeline_naming(annotations, expected):
    names = PipelineNames()
    assert names.observe(["x-1"], ["x-1"], annotations, "s") == {expected: ["x-1"]}
    assert names.get("x-1") == expected


def test_each_submission_without_a_name_is_its_own_pipeline():
    names = PipelineNames()
    names.observe([("load", 0)], [("load", 0)], {}, "s1")
    names.observe([("load", 1)], [("load", 1)], {}, "s2")
    assert names.get(("load", 0)) == "load#1" and names.get(("load", 1)) == "load#2"
    # A key submitted again keeps its pipeline.
    assert names.observe([("load", 0)], [("load", 0)], {ANNOTATION: {("load", 0): "x"}}, "s3") == {}


def test_a_shard_ends_once_and_reopens_when_its_result_is_lost():
    names = PipelineNames()
    names.observe(["k"], ["k"], {ANNOTATION: {"k": "p"}}, "s")
    assert names.end("k") == "p"
    assert names.end("k") is None  # counted once
    assert names.reopen("k") == "p"
    assert names.reopen("k") is None
    assert names.end("k") == "p"
    assert names.forget("k") == ("p", True)
    assert names.forget("k") is None
    assert not names.has_live("p") and len(names) == 0


@pytest.mark.parametrize("module", [_deaths, _pipelines])
def test_doctests(module):
    assert doctest.testmod(module).failed == 0
