"""No retry at the same size: the pure resize decision."""

from __future__ import annotations

import pytest

from oomguard._decide.memory import resize
from oomguard._decide.policy import FailurePolicy
from oomguard._models import FailureEvent

GiB = 2**30
WORKERS = {"tcp://small:1": 4 * GiB, "tcp://mid:1": 8 * GiB, "tcp://big:1": 16 * GiB}


@pytest.mark.parametrize("cause", ["oom_kill", "memory_terminate", "memory_error"])
def test_only_larger_workers(cause):
    r = resize(cause, 4 * GiB, WORKERS)
    assert r.workers == {"tcp://mid:1", "tcp://big:1"} and not r.abort


def test_second_kill_moves_further_up():
    assert resize("oom_kill", 8 * GiB, WORKERS).workers == {"tcp://big:1"}


def test_no_larger_worker_aborts_with_the_message():
    r = resize("oom_kill", 16 * GiB, WORKERS)
    assert r.abort
    assert r.message == "no worker has more than 16 GiB; the shard needed more"


def test_unlimited_worker_counts_as_larger():
    assert resize("oom_kill", 4 * GiB, {"a": 4 * GiB, "b": 0}).workers == {"b"}


def test_user_restrictions_narrow_the_choice():
    r = resize("oom_kill", 4 * GiB, WORKERS, allowed={"tcp://small:1", "tcp://mid:1"})
    assert r.workers == {"tcp://mid:1"}
    assert resize("oom_kill", 4 * GiB, WORKERS, allowed={"tcp://small:1"}).abort


@pytest.mark.parametrize(
    "cause, limit",
    [
        ("native_crash", 4 * GiB),
        ("sigkill", 4 * GiB),
        ("oom_kill", None),
        ("oom_kill", 0),
        ("bogus", 4 * GiB),
    ],
)
def test_nothing_to_decide(cause, limit):
    assert resize(cause, limit, WORKERS) is None


def test_abort_decision_reads_well():
    ev = FailureEvent(
        "infra",
        "oom_kill",
        "('load', 7)",
        "etl",
        "tcp://small:1",
        "node-a",
        "3f2a",
        "oom_kill in load",
        {"summary": "oom_kill counted"},
    )
    policy = FailurePolicy()
    policy.pipeline_submitted("etl", ["('load', 7)"])
    policy.record(ev)  # its first failure
    d = policy.no_larger("etl", ev, 4 * GiB)
    assert d.pipeline == "etl" and d.count == 1 and d.cause == "oom_kill"
    assert policy.status("etl").status == "aborted"
    assert "no worker has more than 4 GiB; the shard needed more" in d.message
    assert "('load', 7)" in d.message and "OOM-killed" in d.message
    assert d.exception().shard == "('load', 7)"
