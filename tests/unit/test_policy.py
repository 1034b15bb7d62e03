"""FailurePolicy: when a shard is a deterministic crasher, and what a pipeline's status says."""

from __future__ import annotations

import pickle
import shlex

import cloudpickle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomguard import Cause, FailureEvent, PipelineAborted
from oomguard._causes import kind_of
from oomguard._decide.policy import FailurePolicy
from oomguard._models import AbortDecision
from oomguard._words import describe_cause

SHARD = "('load', 7)"


def ev(
    cause: str = "oom_kill",
    worker: str = "w1",
    *,
    shard: str = SHARD,
    pipeline: str = "p",
    sig: str = "sigA",
    host: str | None = None,
    time: float = 0.0,
    evidence: dict | None = None,
    title: str = "MemoryError in load_partition",
) -> FailureEvent:
    return FailureEvent(
        kind=kind_of(cause).value,
        cause=cause,
        shard=shard,
        pipeline=pipeline,
        worker=worker,
        host=host if host is not None else f"host-{worker}",
        signature_id=sig,
        signature_title=title,
        evidence=evidence or {},
        time=time,
    )


def run(policy: FailurePolicy, events: list[FailureEvent]) -> list[int]:
    """Indexes of the events that returned a decision."""
    return [i for i, e in enumerate(events) if policy.record(e) is not None]


# ---------------------------------------------------------------- the decision table

CASES = {
    # Count threshold: same worker every time never takes the fast path.
    "three oom_kills on one worker reach the count": (
        [ev("oom_kill", "w1"), ev("oom_kill", "w1"), ev("oom_kill", "w1")],
        {},
        [2],
    ),
    "two on one worker are not enough": ([ev("oom_kill", "w1"), ev("oom_kill", "w1")], {}, []),
    # Fast path: same shard, same signature, two different workers, a shard cause.
    "oom_kill on two workers, same signature": (
        [ev("oom_kill", "w1"), ev("oom_kill", "w2")],
        {},
        [1],
    ),
    "native_crash on two workers": ([ev("native_crash", "w1"), ev("native_crash", "w2")], {}, [1]),
    "memory_terminate on two workers": (
        [ev("memory_terminate", "w1"), ev("memory_terminate", "w2")],
        {},
        [1],
    ),
    "memory_error on two workers": ([ev("memory_error", "w1"), ev("memory_error", "w2")], {}, [1]),
    "oom_kill then memory_terminate, same signature": (
        [ev("oom_kill", "w1"), ev("memory_terminate", "w2")],
        {},
        [1],
    ),
    "different signatures: only the count decides": (
        [ev(sig="a", worker="w1"), ev(sig="b", worker="w2"), ev(sig="c", worker="w3")],
        {},
        [2],
    ),
    "unknown (empty) signature never matches": (
        [ev(sig="", worker="w1"), ev(sig="", worker="w2")],
        {},
        [],
    ),
    "same signature on two workers but different shards": (
        [ev(worker="w1", shard="a"), ev(worker="w2", shard="b")],
        {},
        [],
    ),
    "fast path off by config": (
        [ev("oom_kill", "w1"), ev("oom_kill", "w2")],
        {"abort_on_repeat_signature": False},
        [],
    ),
    "fast path off, count still decides": (
        [ev("oom_kill", "w1"), ev("oom_kill", "w2"), ev("oom_kill", "w3")],
        {"abort_on_repeat_signature": False},
        [2],
    ),
    # Preemption-looking causes never take the fast path, only the count.
    "sigkill on two workers": ([ev("sigkill", "w1"), ev("sigkill", "w2")], {}, []),
    "sigterm on two workers": ([ev("sigterm", "w1"), ev("sigterm", "w2")], {}, []),
    "worker_lost on two workers": ([ev("worker_lost", "w1"), ev("worker_lost", "w2")], {}, []),
    "exit on two workers": ([ev("exit", "w1"), ev("exit", "w2")], {}, []),
    "sigkill three times reaches the count": (
        [ev("sigkill", "w1"), ev("sigkill", "w2"), ev("sigkill", "w3")],
        {},
        [2],
    ),
    "sigkill then oom_kill, same signature: no fast path": (
        [ev("sigkill", "w1"), ev("oom_kill", "w2")],
        {},
        [],
    ),
    "oom_kill then sigkill, same signature: no fast path": (
        [ev("oom_kill", "w1"), ev("sigkill", "w2")],
        {},
        [],
    ),
    # User exceptions are counted but never abort, nor count towards the infra threshold.
    "exceptions never abort": ([ev("exception", f"w{i}") for i in range(6)], {}, []),
    "exceptions do not count towards the threshold": (
        [
            ev("oom_kill", "w1"),
            ev("exception", "w1"),
            ev("exception", "w2"),
            ev("oom_kill", "w1"),
            ev("oom_kill", "w1"),
        ],
        {},
        [4],
    ),
    # One decision per pipeline.
    "no second decision after an abort": (
        [ev("oom_kill", "w1"), ev("oom_kill", "w2"), ev("oom_kill", "w3"), ev("oom_kill", "w4")],
        {},
        [1],
    ),
    "another shard of an aborted pipeline gets no decision": (
        [
            ev(worker="w1", shard="a"),
            ev(worker="w2", shard="a"),
            ev(worker="w1", shard="b"),
            ev(worker="w2", shard="b"),
        ],
        {},
        [1],
    ),
    "other pipelines are untouched": (
        [
            ev(worker="w1", pipeline="p"),
            ev(worker="w2", pipeline="p"),
            ev(worker="w1", pipeline="q", shard="x"),
            ev(worker="w2", pipeline="q", shard="x"),
        ],
        {},
        [1, 3],
    ),
    "same key counted per pipeline it belongs to": (
        [ev(worker="w1", pipeline="p"), ev(worker="w2", pipeline="q")],
        {},
        [],
    ),
    # The threshold is configurable.
    "max 1: the first infra failure decides": (
        [ev("sigkill", "w1")],
        {"max_shard_infra_failures": 1},
        [0],
    ),
    "max 1: user failures still never abort": (
        [ev("exception", "w1")],
        {"max_shard_infra_failures": 1},
        [],
    ),
    "max 5 with the fast path off": (
        [ev("oom_kill", f"w{i}") for i in range(5)],
        {"max_shard_infra_failures": 5, "abort_on_repeat_signature": False},
        [4],
    ),
}


@pytest.mark.parametrize("events, kwargs, expected", CASES.values(), ids=CASES.keys())
def test_decision_table(events, kwargs, expected):
    policy = FailurePolicy(**kwargs)
    policy.pipeline_submitted("p", [SHARD, "a", "b"])
    policy.pipeline_submitted("q", ["x"])
    assert run(policy, events) == expected


def test_decision_reason_count_vs_repeat():
    count = FailurePolicy()
    d = [count.record(ev("oom_kill", "w1")) for _ in range(3)][-1]
    assert d is not None and d.count == 3
    assert "max-shard-infra-failures (3)" in d.message
    assert "same signature" not in d.message

    repeat = FailurePolicy()
    repeat.record(ev("native_crash", "w1"))
    d = repeat.record(ev("native_crash", "w2"))
    assert d is not None and d.count == 2
    assert "same signature on two different workers (w1 and w2)" in d.message


def test_no_decision_for_a_shard_that_already_finished():
    # A late report for a shard that was retried into success must not abort its pipeline.
    policy = FailurePolicy()
    policy.pipeline_submitted("p", [SHARD, "other"])
    policy.record(ev("oom_kill", "w1"))
    policy.shard_done("p", SHARD)
    assert policy.record(ev("oom_kill", "w2")) is None
    assert policy.status("p").infra_failures == 2


def test_events_after_abort_are_still_counted():
    policy = FailurePolicy()
    policy.pipeline_submitted("p", [SHARD, "a"])
    policy.record(ev(worker="w1"))
    assert policy.record(ev(worker="w2")) is not None
    policy.record(ev("sigkill", worker="w3", shard="a"))
    policy.record(ev("exception", worker="w3", shard="a"))
    st_ = policy.status("p")
    assert (st_.infra_failures, st_.user_failures) == (3, 1)
    assert policy.attempt("a") == 3


def test_bad_events_name_the_field_and_count_nothing():
    policy = FailurePolicy()
    policy.pipeline_submitted("p", [SHARD])
    with pytest.raises(ValueError, match="FailureEvent.cause is 'oom'"):
        policy.record(FailureEvent("infra", "oom", SHARD, "p", "w", "h", "s", "t"))
    with pytest.raises(ValueError, match="FailureEvent.kind is 'user'"):
        policy.record(FailureEvent("user", "oom_kill", SHARD, "p", "w", "h", "s", "t"))
    with pytest.raises(ValueError, match="FailureEvent.shard"):
        policy.record(FailureEvent("infra", "oom_kill", "", "p", "w", "h", "s", "t"))
    assert policy.attempt(SHARD) == 1
    assert policy.status("p").infra_failures == 0
    assert policy.tracked_shards() == 0


@pytest.mark.parametrize("bad", [0, -1, 1.5, "3", True, None])
def test_bad_threshold_is_rejected(bad):
    with pytest.raises(ValueError, match="max_shard_infra_failures"):
        FailurePolicy(max_shard_infra_failures=bad)


def test_submitting_a_string_is_rejected():
    with pytest.raises(TypeError, match="shards"):
        FailurePolicy().pipeline_submitted("p", "abc")


# ---------------------------------------------------------------- attempt numbering


def test_attempt_numbers_count_every_failure_of_the_shard():
    policy = FailurePolicy(max_shard_infra_failures=10)
    assert policy.attempt(SHARD) == 1
    policy.record(ev("exception", "w1"))
    assert policy.attempt(SHARD) == 2
    policy.record(ev("sigkill", "w1"))
    assert policy.attempt(SHARD) == 3
    assert policy.attempt("other") == 1  # per shard


def test_displaced_shards_get_no_attempt():
    policy = FailurePolicy()
    policy.pipeline_submitted("p", [SHARD])
    policy.displaced("p", SHARD)
    policy.displaced("p", SHARD)
    assert policy.attempt(SHARD) == 1
    assert policy.status("p").infra_failures == 0
    assert policy.tracked_shards() == 0


def test_forgetting_a_pipeline_drops_its_shard_records():
    policy = FailurePolicy()
    policy.pipeline_submitted("p", [SHARD])
    policy.pipeline_submitted("q", ["x"])
    policy.record(ev(worker="w1"))
    policy.record(ev(worker="w1", pipeline="q", shard="x"))
    assert policy.tracked_shards() == 2
    policy.forget_pipeline("p")
    assert policy.pipelines() == ["q"]
    assert policy.tracked_shards() == 1
    assert policy.attempt(SHARD) == 1 and policy.attempt("x") == 2
    policy.forget_pipeline("p")  # forgetting twice is harmless
    with pytest.raises(KeyError, match="unknown pipeline 'p'"):
        policy.status("p")


def test_memory_is_bounded_by_failed_shards():
    policy = FailurePolicy()
    keys = [f"('x', {i})" for i in range(20_000)]
    policy.pipeline_submitted("big", keys)
    for k in keys:
        policy.shard_done("big", k)
    policy.record(ev("sigkill", "w1", shard=keys[0], pipeline="big"))
    assert policy.tracked_shards() == 1
    assert policy.status("big").status == "succeeded_after_infra_failures"
    # A shard that keeps dying does not grow the record without bound.
    for i in range(500):
        policy.record(ev("sigkill", f"w{i}", shard=keys[1], pipeline="big"))
    assert len(policy._shards[keys[1]].failures) <= 64
    assert policy.attempt(keys[1]) == 501


# ---------------------------------------------------------------- status and summaries


def make(n: int = 40, name: str = "p") -> FailurePolicy:
    policy = FailurePolicy()
    policy.pipeline_submitted(name, [f"s{i}" for i in range(n // 2)])
    policy.pipeline_submitted(name, [f"s{i}" for i in range(n // 2, n)])  # a second graph
    return policy


def finish(policy: FailurePolicy, keys, name: str = "p") -> None:
    for k in keys:
        policy.shard_done(name, k)


def test_plain_success():
    policy = make()
    assert policy.status("p").status == "running"
    finish(policy, [f"s{i}" for i in range(39)])
    s = policy.status("p")
    assert (s.status, s.shards_done) == ("running", 39)
    assert s.summary == "39 of 40 shards finished so far."
    finish(policy, ["s39"])
    s = policy.status("p")
    assert (s.status, s.summary) == ("succeeded", "all 40 shards finished.")


def test_success_after_worker_deaths_never_reads_as_plain_success():
    policy = make()
    policy.record(ev("sigkill", "w1", shard="s3", time=10.0))
    policy.record(ev("native_crash", "w2", shard="s4", time=11.0))
    s = policy.status("p")
    assert s.status == "running"
    assert "2 worker deaths" in s.summary
    finish(policy, [f"s{i}" for i in range(40)])
    s = policy.status("p")
    assert s.status == "succeeded_after_infra_failures"
    assert s.infra_failures == 2
    assert s.summary == (
        "all 40 shards finished, after 2 worker deaths (1 sigkill, 1 native_crash) "
        "that oomguard retried without using task retries."
    )


def test_one_death_that_took_two_shards_is_one_death():
    policy = make()
    policy.record(ev("oom_kill", "w1", shard="s1", time=5.0))
    policy.record(ev("oom_kill", "w1", shard="s2", time=5.0))
    finish(policy, [f"s{i}" for i in range(40)])
    s = policy.status("p")
    assert s.infra_failures == 2
    assert "after 1 worker death (1 oom_kill)" in s.summary


def test_memory_errors_and_retried_exceptions_are_named():
    policy = make()
    policy.record(ev("memory_error", "w1", shard="s1"))
    policy.record(ev("exception", "w1", shard="s2"))
    finish(policy, [f"s{i}" for i in range(40)])
    s = policy.status("p")
    assert s.status == "succeeded_after_infra_failures"
    assert s.summary == (
        "all 40 shards finished, after 1 MemoryError in task code; "
        "task retries absorbed 1 exception."
    )


def test_retried_exceptions_alone_are_success():
    policy = make()
    policy.record(ev("exception", "w1", shard="s1"))
    finish(policy, [f"s{i}" for i in range(40)])
    s = policy.status("p")
    assert (s.status, s.user_failures) == ("succeeded", 1)
    assert s.summary == "all 40 shards finished; task retries absorbed 1 exception."


def test_displaced_and_cancelled_shards_are_said():
    policy = make()
    policy.displaced("p", "s1")
    finish(policy, [f"s{i}" for i in range(38)])
    policy.shard_forgotten("p", "s38")
    policy.shard_forgotten("p", "s39")
    s = policy.status("p")
    assert s.status == "succeeded"
    assert s.summary == (
        "38 of 40 shards finished and 2 were released or cancelled without a result; "
        "1 shard was moved off workers that died or stopped, without counting against it."
    )


def test_user_error_past_retries_fails_the_pipeline():
    policy = make()
    policy.record(ev("exception", "w1", shard="x0", title="ValueError: bad row"))
    policy.pipeline_submitted("p", ["x0"])
    policy.record(ev("exception", "w1", shard="x0", title="ValueError: bad row"))
    finish(policy, [f"s{i}" for i in range(40)])
    assert policy.status("p").status == "running"
    policy.shard_erred("p", "x0", aborted=False)
    s = policy.status("p")
    assert (s.status, s.shards_failed, s.user_failures) == ("failed", 1, 2)
    assert s.summary == "shard 'x0' raised ValueError past its retries; 40 shards finished."


def test_failed_names_the_culprit_not_a_retried_shard():
    policy = make(4)
    policy.record(ev("exception", "w1", shard="s0", title="KeyError: 'a'"))  # retried, fine
    policy.record(ev("exception", "w1", shard="s1", evidence={"exception_type": "pkg.BadInput"}))
    finish(policy, ["s0", "s2"])
    policy.shard_erred("p", "s1", aborted=False)
    policy.shard_erred("p", "s3", aborted=False)  # a dependent of s1
    s = policy.status("p")
    assert s.status == "failed"
    assert s.summary == (
        "shard 's1' raised BadInput past its retries; 2 shards finished, 1 more erred."
    )


def test_killed_worker_like_infra_end_fails_the_pipeline():
    policy = FailurePolicy(max_shard_infra_failures=10)
    policy.pipeline_submitted("p", ["a", "b"])
    policy.record(ev("memory_terminate", "w1", shard="a"))
    policy.record(ev("memory_terminate", "w1", shard="a"))
    policy.shard_done("p", "b")
    policy.shard_erred("p", "a", aborted=False)
    s = policy.status("p")
    assert s.status == "failed"
    assert s.summary == (
        "a worker was killed by the nanny for exceeding its memory limit at shard 'a' "
        "2 times until Dask gave up on it; 1 shard finished."
    )


def test_abort_status_and_summary():
    policy = FailurePolicy()
    keys = [f"k{i}" for i in range(17)] + [SHARD]
    policy.pipeline_submitted("p", keys)
    finish(policy, keys[:12])
    for _ in range(2):
        policy.record(ev("oom_kill", "w1"))
    d = policy.record(ev("oom_kill", "w1"))
    assert d is not None
    s = policy.status("p")
    assert s.status == "aborted"
    assert s.abort_reason == d.message
    assert s.summary == (
        "a worker was OOM-killed by the kernel at shard ('load', 7) 3 times; the pipeline was "
        "aborted; 12 shards had finished, 6 are being aborted."
    )
    for k in keys[12:]:
        policy.shard_erred("p", k, aborted=True)
    s = policy.status("p")
    assert (s.status, s.shards_aborted, s.shards_done) == ("aborted", 6, 12)
    assert s.summary == (
        "a worker was OOM-killed by the kernel at shard ('load', 7) 3 times; the pipeline was "
        "aborted; 12 shards had finished, 6 were aborted."
    )


def test_mixed_causes_are_broken_down():
    policy = FailurePolicy()
    policy.pipeline_submitted("p", [SHARD])
    policy.record(ev("sigkill", "w1"))
    policy.record(ev("oom_kill", "w1"))
    d = policy.record(ev("oom_kill", "w1"))
    assert d is not None and d.cause == "oom_kill"
    assert policy.status("p").summary.startswith(
        "shard ('load', 7) failed 3 times (2 oom_kill, 1 sigkill); the pipeline was aborted"
    )
    assert "2 times its worker was OOM-killed by the kernel" in d.message
    assert "once its worker was killed by SIGKILL with no kernel OOM evidence" in d.message


def test_ending_a_failed_shard_twice_counts_once():
    policy = make(2)
    policy.record(ev("exception", "w1", shard="s0"))
    policy.shard_erred("p", "s0", aborted=False)
    policy.shard_erred("p", "s0", aborted=False)
    assert policy.status("p").shards_failed == 1


def test_reopened_shard_runs_again():
    policy = make(2)
    finish(policy, ["s0", "s1"])
    assert policy.status("p").status == "succeeded"
    policy.shard_reopened("p", "s0")  # its worker died holding the result
    assert policy.status("p").status == "running"
    policy.shard_done("p", "s0")
    assert policy.status("p").status == "succeeded"


def test_pipelines_in_order():
    policy = FailurePolicy()
    policy.pipeline_submitted("b", ["1"])
    policy.pipeline_submitted("a", ["2"])
    assert policy.pipelines() == ["b", "a"]


# ---------------------------------------------------------------- the abort message


def test_abort_message_tells_the_whole_story():
    policy = FailurePolicy()
    keys = [f"k{i}" for i in range(10)] + [SHARD, "bad"]
    policy.pipeline_submitted("etl", keys)
    finish(policy, keys[:9], name="etl")
    policy.record(ev("exception", "w9", shard="bad", pipeline="etl"))
    policy.shard_erred("etl", "bad", aborted=False)
    policy.record(ev("sigkill", "w9", shard="k9", pipeline="etl"))  # crashed, not done
    evidence = {"summary": "kernel oom_kill counted, peak 1.02 GiB of 1 GiB limit"}
    policy.record(
        ev(
            "oom_kill",
            "tcp://10.0.0.1:4001",
            host="node-a",
            pipeline="etl",
            sig="3f2a9c",
            evidence=evidence,
        )
    )
    d = policy.record(
        ev(
            "oom_kill",
            "tcp://10.0.0.2:4001",
            host="node-b",
            pipeline="etl",
            sig="3f2a9c",
            evidence=evidence,
        )
    )
    assert isinstance(d, AbortDecision)
    assert (d.pipeline, d.shard, d.cause, d.count) == ("etl", SHARD, "oom_kill", 2)
    assert (d.signature_id, d.signature_title) == ("3f2a9c", "MemoryError in load_partition")
    assert d.workers == ("tcp://10.0.0.1:4001", "tcp://10.0.0.2:4001")
    assert d.hosts == ("node-a", "node-b")
    assert d.evidence == evidence
    m = d.message
    for part in [
        "pipeline 'etl'",
        f"shard {SHARD} failed 2 times",
        "OOM-killed by the kernel",
        "kernel oom_kill counted, peak 1.02 GiB of 1 GiB limit",
        "MemoryError in load_partition (id 3f2a9c)",
        "tcp://10.0.0.1:4001, tcp://10.0.0.2:4001",
        "node-a, node-b",
        "same signature on two different workers",
        "9 shards done, 2 crashed at least once, 1 erred, 2 unfinished now being aborted",
        "give this shard more memory",
        "`oomguard report --shard \"('load', 7)\"`",
    ]:
        assert part in m, part
    assert "\n" not in m  # one paragraph
    assert shlex.split(f'oomguard report --shard "{SHARD}"')[-1] == SHARD


@pytest.mark.parametrize(
    "cause, evidence, words, advice",
    [
        ("native_crash", {"signal": "SIGSEGV"}, "crashed (SIGSEGV)", "fix the native crash"),
        ("native_crash", {"exitcode": -6}, "crashed (SIGABRT)", "fix the native crash"),
        ("native_crash", {}, "crashed in native code", "fix the native crash"),
        ("memory_terminate", {}, "killed by the nanny for exceeding its memory", "more memory"),
        ("memory_error", {}, "it raised MemoryError", "more memory"),
        ("sigkill", {}, "killed by SIGKILL with no kernel OOM evidence", "earlyoom"),
        ("sigterm", {}, "SIGTERM from outside the nanny", "preemption"),
        ("exit", {"exitcode": 3}, "exited with status 3", "preemption"),
        ("worker_lost", {}, "lost without a death report", "preemption"),
    ],
)
def test_abort_message_words_per_cause(cause, evidence, words, advice):
    policy = FailurePolicy(max_shard_infra_failures=1)
    policy.pipeline_submitted("p", [SHARD])
    d = policy.record(ev(cause, "w1", evidence=evidence))
    assert d is not None
    assert words in d.message and advice in d.message
    assert "failed once" in d.message


def test_shard_keys_that_need_shell_quoting():
    policy = FailurePolicy(max_shard_infra_failures=1)
    for key in ["plain-key", 'say "$HOME"', "('x', 1)"]:
        d = policy.record(ev(shard=key, pipeline=key))
        cmd = d.message.split("`")[1]
        assert shlex.split(cmd) == ["oomguard", "report", "--shard", key]


def test_describe_cause_covers_every_cause():
    for cause in Cause:
        assert describe_cause(cause)
    with pytest.raises(ValueError):
        describe_cause("bogus")


# ---------------------------------------------------------------- PipelineAborted on the wire


def _decision() -> AbortDecision:
    policy = FailurePolicy()
    policy.record(ev("native_crash", "w1", evidence={"signal": "SIGSEGV", "summary": "s"}))
    d = policy.record(ev("native_crash", "w2", evidence={"signal": "SIGSEGV", "summary": "s"}))
    assert d is not None
    return d


@pytest.mark.parametrize(
    "dumps, loads", [(pickle.dumps, pickle.loads), (cloudpickle.dumps, cloudpickle.loads)]
)
def test_pipeline_aborted_pickles_with_its_fields(dumps, loads):
    d = _decision()
    exc = d.exception()
    back = loads(dumps(exc))
    assert isinstance(back, PipelineAborted)
    assert str(back) == d.message == back.message
    assert (back.pipeline, back.shard, back.cause, back.count, back.signature) == (
        "p",
        SHARD,
        "native_crash",
        2,
        "sigA",
    )
    assert back.evidence == {"signal": "SIGSEGV", "summary": "s"}
    with pytest.raises(PipelineAborted, match="oomguard aborted pipeline 'p'"):
        raise back


def test_pipeline_aborted_through_distributed_pickle():
    from distributed.protocol.pickle import dumps, loads

    exc = _decision().exception()
    back = loads(dumps(exc))
    assert (back.shard, back.count, str(back)) == (exc.shard, exc.count, exc.message)


# ---------------------------------------------------------------- properties

causes = st.sampled_from([c.value for c in Cause])
events = st.lists(
    st.tuples(
        causes,
        st.sampled_from(["p", "q"]),
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from(["w1", "w2", "w3"]),
        st.sampled_from(["s1", "s2"]),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(events, st.integers(1, 4), st.booleans())
def test_at_most_one_decision_per_pipeline_and_only_when_deserved(evs, limit, fast):
    policy = FailurePolicy(max_shard_infra_failures=limit, abort_on_repeat_signature=fast)
    decided: dict[str, AbortDecision] = {}
    for cause, pipe, shard, worker, sig in evs:
        before = policy.attempt(f"{pipe}:{shard}")
        d = policy.record(ev(cause, worker, shard=f"{pipe}:{shard}", pipeline=pipe, sig=sig))
        assert policy.attempt(f"{pipe}:{shard}") == before + 1
        if d is None:
            continue
        assert pipe not in decided
        decided[pipe] = d
        assert cause != "exception"
        assert d.count >= limit or (fast and d.count >= 2 and len(d.workers) >= 2)
        assert d.count <= limit


def test_the_summary_names_the_killers_of_the_deaths():
    import dataclasses

    policy = make()
    policy.record(
        dataclasses.replace(ev("sigterm", "w1", shard="s3", time=10.0), killer="earlyoom")
    )
    policy.record(
        dataclasses.replace(ev("oom_kill", "w2", shard="s4", time=11.0), killer="kernel")
    )
    policy.record(
        dataclasses.replace(ev("sigterm", "w3", shard="s5", time=12.0), killer="earlyoom")
    )
    finish(policy, [f"s{i}" for i in range(40)])
    assert policy.status("p").summary == (
        "all 40 shards finished, after 3 worker deaths (2 sigterm, 1 oom_kill; killed by "
        "earlyoom x2, kernel) that oomguard retried without using task retries."
    )
