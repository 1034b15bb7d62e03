"""The decision core's parts: pairing removals with reports, runs, blame, the budget."""

from __future__ import annotations

import doctest

import pytest

from oomguard._death.record import Death, Task
from oomguard._decide import blame, budget, core, memory, pairing, runs
from oomguard._decide.pairing import Case, DeathPairing, Removal
from oomguard._decide.runs import ANNOTATION, Runs


def removal(worker="tcp://a:1", processing=None, **kw):
    return Removal(worker=worker, host="a", time=0.0, processing=processing or {}, **kw)


def report(worker="tcp://a:1", pid=7, executing=(), grew=None, **fields):
    tasks = tuple(Task(k, k, grew=(grew or {}).get(k)) for k in executing)
    return Death(**{"worker": worker, "pid": pid, "cause": "sigkill", "tasks": tasks, **fields})


@pytest.mark.parametrize("report_first", [False, True])
def test_removal_and_report_pair_whichever_comes_first(report_first):
    pairing = DeathPairing(grace=5.0)
    if report_first:
        assert pairing.reported(report(), now=0.0) is None
        death = pairing.removed(removal(), now=0.1)
    else:
        assert pairing.removed(removal(), now=0.0) is None
        death = pairing.reported(report(), now=0.1)
    assert death.worker == "tcp://a:1" and death.removal and death.report
    assert len(pairing) == 0


def test_a_removal_without_report_expires_as_lost_after_grace():
    pairing = DeathPairing(grace=5.0)
    pairing.removed(removal(), now=0.0)
    assert pairing.expired(now=4.9) == []
    [death] = pairing.expired(now=5.0)
    assert death.report is None and death.removal.worker == "tcp://a:1"


def test_a_late_report_amends_its_death_and_a_repeat_is_refused():
    pairing = DeathPairing(grace=5.0)
    pairing.removed(removal(pid=7), now=0.0)
    [lost] = pairing.expired(now=5.0)
    late = pairing.reported(report(pid=7), now=35.0)
    assert late.late and late.worker == lost.worker
    assert pairing.reported(report(pid=7), now=36.0) is None
    assert pairing.refused == {"duplicate": 1}


def test_a_report_of_another_process_at_the_same_address_is_another_death():
    pairing = DeathPairing(grace=5.0)
    pairing.removed(removal(pid=7), now=0.0)
    assert pairing.reported(report(pid=8), now=0.1) is None
    assert len(pairing.expired(now=10.0)) == 2


def test_a_requested_exit_cancels_the_removal_either_way():
    pairing = DeathPairing(grace=5.0)
    pairing.removed(removal("tcp://a:1"), now=0.0)
    a = pairing.clean("tcp://a:1", now=0.1, requested=True)
    assert pairing.clean("tcp://b:1", now=0.1, requested=True) is None  # removal comes later
    b = pairing.removed(removal("tcp://b:1"), now=0.2)
    # Both come back as "not a death", with the removal whose tasks were held for it.
    assert (a.clean, a.exited, a.worker, a.report) == (True, False, "tcp://a:1", None)
    assert (b.clean, b.exited, b.worker, b.report) == (True, False, "tcp://b:1", None)
    assert a.removal and b.removal
    assert pairing.expired(now=100.0) == []
    assert pairing.clean_exits == 2


@pytest.mark.parametrize("notice_first", [False, True])
def test_a_requested_exit_lets_the_held_tasks_go_uncounted(notice_first):
    """A stopped `dask worker` (SIGTERM: pod deletion, scale-down) sends a clean-exit notice
    and Dask removes its worker "unexpectedly", in either order. The tasks it had were held
    at the removal; they must run elsewhere, with neither count charged. (They were held
    for good: found by the multi-host lab, tests/hosts.)"""
    from oomguard._decide import DecisionCore, Forgive, Hold, Record, Release

    c = DecisionCore(allowed_failures=1, grace=5.0)
    c.submitted(["f-1", "f-2"], ["f-1", "f-2"], {}, now=0.0)
    gone = removal("tcp://a:1", {"f-1": "f-1", "f-2": "f-2"}, pid=7)
    if notice_first:
        assert c.clean_exit("tcp://a:1", now=0.0, requested=True) == []
        out = c.removed(gone, now=0.1)
    else:
        out = c.removed(gone, now=0.0)
        assert out == [Hold(("f-1", "f-2"))]
        out = out + c.clean_exit("tcp://a:1", now=0.1, requested=True)
    assert [type(d) for d in out] == [Hold, Forgive, Release]
    assert set(out[1].keys) == set(out[2].keys) == {"f-1", "f-2"}
    assert not c.held and c.deaths == 0 and c.displaced == 2
    assert not any(isinstance(d, Record) for d in out + c.tick(100.0))
    # Nothing was charged: each key still has its whole budget (one death, then a stop).
    assert c.budget.deaths("f-1") == 0 and not c.budget.over("f-1")
    assert c.policy.status(c.runs.of("f-1").label).infra_failures == 0


@pytest.mark.parametrize("notice_first", [False, True])
def test_an_unrequested_exit_zero_is_a_death_and_stays_within_dasks_bound(notice_first):
    """A task that calls `os._exit(0)`: the worker ends with status 0 and its nanny was not
    asked to stop it. Dask counts each such removal; so does oomguard (cause `exit`, decided
    at the notice, not after the grace timeout): the key stops after allowed + 1 deaths.
    (Forgiven as a clean exit, it killed 259 workers in 90 s.)"""
    from oomguard._decide import DecisionCore, Forgive, Record, Stop

    c = DecisionCore(allowed_failures=1, grace=5.0)
    c.submitted(["x-1"], ["x-1"], {}, now=0.0)
    out = []
    for i in range(2):
        gone = removal(f"tcp://a:{i}", {"x-1": "x-1"}, pid=i)
        now = float(i)
        if notice_first:
            out += c.clean_exit(f"tcp://a:{i}", now=now, requested=False)
            out += c.removed(gone, now=now + 0.1)
        else:
            out += c.removed(gone, now=now)
            out += c.clean_exit(f"tcp://a:{i}", now=now + 0.1, requested=False)
    records = [d for d in out if isinstance(d, Record)]
    assert [r.events[0].cause for r in records] == ["exit", "exit"]
    assert records[0].events[0].evidence["exitcode"] == 0
    assert "not requested" in records[0].events[0].evidence["summary"]
    assert not any(isinstance(d, Forgive) for d in out)
    [stop] = [d for d in out if isinstance(d, Stop)]
    assert stop.keys == ("x-1",) and c.deaths == 2 and c.budget.over("x-1")
    assert c.pairing.clean_exits == 0 and len(c.pairing) == 0


def test_an_exit_notice_pairs_only_with_its_own_process():
    """A worker killed (its report still on the way), restarted at the same address, then
    stopped in order: the stop's notice must not cancel the first death."""
    pairing = DeathPairing(grace=5.0)
    assert pairing.removed(removal("tcp://a:1", pid=7), now=0.0) is None
    assert pairing.clean("tcp://a:1", now=0.5, requested=True, pid=8) is None
    death = pairing.reported(report("tcp://a:1", pid=7), now=1.0)
    assert (death.removal.pid, death.clean) == (7, False)
    assert pairing.removed(removal("tcp://a:1", pid=8), now=1.1).clean
    assert pairing.clean_exits == 1 and len(pairing) == 0


def test_removals_are_never_decided_early_and_unmatched_reports_are_capped():
    pairing = DeathPairing(grace=5.0, max_reports=3)
    for i in range(5000):  # a rack: every removal waits for its report
        pairing.removed(removal(f"tcp://r:{i}"), now=0.0)
    assert pairing.expired(now=1.0) == [] and pairing.pending_removals() == 5000
    for i in range(5):
        pairing.reported(report(f"tcp://w:{i}"), now=0.0)
    pairing.reported(report("tcp://w:0"), now=0.0)  # a repeat for a pending worker
    assert pairing.refused == {"overflow": 2, "duplicate": 1}


def test_drain_decides_everything():
    pairing = DeathPairing(grace=5.0)
    pairing.removed(removal("tcp://a:1"), now=0.0)
    pairing.reported(report("tcp://b:1"), now=0.0)
    assert {d.worker for d in pairing.drain()} == {"tcp://a:1", "tcp://b:1"}
    assert len(pairing) == 0


@pytest.mark.parametrize(
    "annotations, expected",
    [
        ({ANNOTATION: {"x-1": "etl"}}, "etl"),
        ({"span": {"x-1": {"name": ("nightly", "load"), "ids": (1, 2)}}}, "nightly/load"),
        # The explicit annotation wins over the span.
        ({ANNOTATION: {"x-1": "etl"}, "span": {"x-1": {"name": ("s",)}}}, "etl"),
        # Dask's default span means "no span": the key prefix names it.
        ({"span": {"x-1": {"name": ("default",)}}}, "x"),
        ({}, "x"),
    ],
)
def test_pipeline_naming(annotations, expected):
    r = Runs()
    [run] = list(r.observe(["x-1"], ["x-1"], annotations, 0.0))
    assert run.name == expected and r.of("x-1") is run


def test_submissions_without_a_name_join_the_live_run():
    r = Runs()
    for i in range(100):  # [client.submit(f, x) for x in xs]
        r.observe([f"f-{i}"], [f"f-{i}"], {}, float(i))
    assert len({id(r.of(f"f-{i}")) for i in range(100)}) == 1
    for i in range(100):
        r.forget(f"f-{i}")
    [again] = list(r.observe(["f-0"], ["f-0"], {}, 200.0))
    assert again.label == "f#2" and again.started == 200.0


def test_each_span_block_is_its_own_run_and_a_closed_run_takes_no_more():
    r = Runs()

    def span(i):
        return {"span": {f"k-{i}": {"name": ("etl",), "ids": (f"id{i // 2}",)}}}

    runs = [next(iter(r.observe([f"k-{i}"], [f"k-{i}"], span(i), 0.0))) for i in range(4)]
    assert runs[0] is runs[1] and runs[2] is runs[3] and runs[0] is not runs[2]
    assert [x.label for x in (runs[0], runs[2])] == ["etl", "etl#2"]
    r.close(runs[0])
    assert (
        next(iter(r.observe(["k-9"], ["k-9"], {ANNOTATION: {"k-9": "etl"}}, 0.0))).label == "etl#3"
    )


def test_blame_without_a_report_is_never_nobody():
    busy = removal(processing={f"t{i}": f"t{i}" for i in range(5)}, nthreads=2)
    b = blame.blame(Case("tcp://a:1", busy, None))
    assert set(b.executing) == set(busy.processing) and not b.certain
    guessed = removal(processing={"t0": "t0", "t1": "t1"}, executing_guess={"t1": "t1"})
    assert set(blame.blame(Case("tcp://a:1", guessed, None)).executing) == {"t1"}


def test_budget_takes_back_the_charge_of_a_queued_task():
    b = budget.DeathBudget(allowed=3)
    for _ in range(10):
        b.charge(["q"])
        b.settle("q", blamed=False)
    assert b.deaths("q") == 0 and not b.over("q")
    b.charge(["k"], prior={"k": 3})  # submitted before install: Dask's count carries over
    assert b.over("k")


@pytest.mark.parametrize("module", [blame, budget, core, pairing, memory, runs])
def test_doctests(module):
    assert doctest.testmod(module).failed == 0


@pytest.mark.parametrize("comes_back", [True, False])
def test_a_memory_killed_shard_waits_for_a_larger_worker_that_is_restarting(comes_back):
    from oomguard._decide import DecisionCore, Restrict, Stop, Widen

    gib = 2**30
    c = DecisionCore(allowed_failures=3, grace=5.0)
    c.submitted(["k"], ["k"], {}, now=0.0)
    c.worker_added("tcp://small:1", gib)
    c.worker_added("tcp://big:1", 2 * gib)
    c.removed(removal("tcp://big:1", memory_limit=2 * gib), now=0.0)  # restarting
    c.removed(removal("tcp://small:1", {"k": "k"}, memory_limit=gib), now=1.0)
    out = c.reported(
        report(
            "tcp://small:1",
            executing=["k"],
            cause="oom_kill",
            host="small",
            time=1.0,
            memory_limit=gib,
        ),
        now=1.1,
    )
    assert [d for d in out if isinstance(d, Stop)] == []
    assert [d.workers for d in out if isinstance(d, Restrict)] == [frozenset()]
    c.tick(now=7.0)  # the big worker's own death is decided (worker_lost)
    if comes_back:
        assert c.worker_added("tcp://big:1", 2 * gib) == [Widen(("k",), "tcp://big:1")]
        assert not any(isinstance(d, Stop) for d in c.tick(now=100.0))
    else:
        [stop] = [d for d in c.tick(now=62.0) if isinstance(d, Stop)]
        assert "no worker has more than 1 GiB" in stop.exception.message


@pytest.mark.parametrize(
    "grew, named",
    [
        ({"sleepy": 5 * 2**20, "hungry": 900 * 2**20}, "hungry"),  # one task grew the worker
        ({"a": 450 * 2**20, "b": 470 * 2**20}, None),  # both did: no single culprit
        ({"a": 0, "b": 0}, None),  # the samples saw nothing
    ],
)
def test_a_shared_memory_kill_names_the_likely_culprit_and_isolates_it_first(grew, named):
    """A memory kill of a worker executing two tasks: when the samples show one of them
    grew the worker, it is the death's culprit (its only event, its signature) and runs
    alone next; the other was displaced beside it, runs again at once and carries
    nothing. Without a culprit both are suspects, each run alone in turn."""
    from oomguard._decide import DecisionCore, Record, Release, RunAlone, Stop

    gib = 2**30
    c = DecisionCore(allowed_failures=3, grace=5.0)
    keys = sorted(grew, reverse=True)  # the culprit is not simply the first one listed
    c.submitted(keys, keys, {}, now=0.0)
    c.worker_added("tcp://w:1", gib)
    c.removed(removal("tcp://w:1", {k: k for k in keys}, memory_limit=gib, nthreads=2), now=1.0)
    death = report(
        "tcp://w:1", executing=keys, grew=grew, cause="oom_kill", time=1.0, memory_limit=gib
    )
    out = c.reported(death, now=1.1)
    assert not [d for d in out if isinstance(d, Stop)]  # concurrency proves no shard too big
    [record] = [d for d in out if isinstance(d, Record)]
    evidence = record.death.evidence
    assert evidence.get("likely_culprit") == named
    roles = {t.key: t.role for t in record.death.tasks}
    released = [k for d in out if isinstance(d, Release) for k in d.keys]
    if named:
        assert f"likely {named!r}" in evidence["summary"]
        assert evidence["likely_culprit_share"] > 0.9
    # One shard runs alone at a time, the likely culprit first (no worker here can hold:
    # where Dask places it).
    [first] = [d for d in out if isinstance(d, RunAlone)]
    assert first == RunAlone(named or keys[0], None, 600.0)
    assert c.isolation.isolating == (named or keys[0])
    if named:
        [other] = set(keys) - {named}
        assert roles == {named: "culprit", other: "displaced"}
        assert [e.shard for e in record.events] == [named]
        assert released == [other]  # displaced: runs again at once, carries nothing
        assert c.budget.deaths(other) == 1  # still charged: the samples may be wrong
    else:
        assert roles == dict.fromkeys(keys, "suspect")
        assert sorted(e.shard for e in record.events) == sorted(keys)
        assert not released  # the others wait their turn


def _sigkill(worker, keys, stacks, **fields):
    tasks = tuple(Task(k, k.split("-")[0], stack=stacks[k]) for k in keys)
    return report(worker, **{"host": "h", "time": 1.0, "tasks": tasks, **fields})


def test_one_death_is_one_signature_whatever_the_executing_tasks_were_doing():
    from oomguard._decide import DecisionCore, Record

    c = DecisionCore(allowed_failures=3, grace=5.0)
    c.submitted(["load-1", "sort-2"], ["load-1", "sort-2"], {}, now=0.0)
    c.removed(removal("tcp://w:1", {"load-1": "load-1", "sort-2": "sort-2"}, nthreads=2), now=1.0)
    stacks = {"load-1": [["/app/etl.py", 3, "load"]], "sort-2": [["/app/etl.py", 9, "sort"]]}
    out = c.reported(_sigkill("tcp://w:1", ["load-1", "sort-2"], stacks), now=1.1)
    [record] = [d for d in out if isinstance(d, Record)]  # counted once as a death
    assert sorted(e.shard for e in record.events) == ["load-1", "sort-2"]
    assert {e.signature_id for e in record.events} == {record.death.signature_id}
    assert {e.death for e in record.events} == {record.death.id}


def test_a_death_caused_by_a_forgotten_task_still_names_its_pipeline():
    from oomguard._decide import DecisionCore, Record

    c = DecisionCore(allowed_failures=3, grace=5.0)
    c.submitted(["load-1"], ["load-1"], {runs.ANNOTATION: {"load-1": "etl"}}, now=0.0)
    c.forget("load-1")  # released by the client (or its run aborted) while still running
    c.removed(removal("tcp://w:1", {}), now=1.0)
    out = c.reported(_sigkill("tcp://w:1", ["load-1"], {"load-1": None}), now=1.1)
    [record] = [d for d in out if isinstance(d, Record)]
    assert (record.events[0].shard, record.events[0].pipeline) == ("load-1", "etl")


@pytest.mark.parametrize("report_first", [False, True])
def test_a_worker_that_died_before_its_nanny_learned_its_new_address_is_one_death(report_first):
    # The nanny restarted its worker; the new process registered as tcp://a:2, took a task
    # and died before the nanny read its address: the report names the old tcp://a:1.
    p = DeathPairing(grace=5.0)
    gone = removal("tcp://a:2", {"k": "k"}, pid=8, nanny="tcp://a:9")
    stale = report("tcp://a:1", pid=8, executing=["k"], nanny="tcp://a:9")
    if report_first:
        assert p.reported(stale, now=0.0) is None
        death = p.removed(gone, now=0.1)
    else:
        assert p.removed(gone, now=0.0) is None
        death = p.reported(stale, now=0.1)
    assert (death.worker, death.removal, death.report.worker) == (
        "tcp://a:2",
        gone,
        "tcp://a:2",
    )
    assert len(p) == 0 and p.expired(now=100.0) == []


def test_the_same_pid_under_another_nanny_is_another_process():
    p = DeathPairing(grace=5.0)
    assert p.removed(removal("tcp://b:2", pid=8, nanny="tcp://b:9"), now=0.0) is None
    other = report("tcp://a:1", pid=8, nanny="tcp://a:9")
    assert p.reported(other, now=0.1) is None
    assert sorted(d.worker for d in p.expired(now=100.0)) == ["tcp://a:1", "tcp://b:2"]


def test_a_thousand_tasks_erring_with_one_bug_are_parsed_once(monkeypatch):
    from oomguard._decide import DecisionCore, Record
    from oomguard._decide import signatures as core_module

    parsed = []
    real = core_module.fingerprint_dask
    monkeypatch.setattr(
        core_module, "fingerprint_dask", lambda e, t: parsed.append(e) or real(e, t)
    )
    monkeypatch.setattr(core_module, "_DASK_SIGNATURES", type(core_module._DASK_SIGNATURES)())
    c = DecisionCore(allowed_failures=3, grace=5.0)
    tb = '  File "/app/etl.py", line 8, in lookup\n    return table[k]\n'
    ids = set()
    for i in range(1000):
        out, _ = c.task_erred(f"lookup-{i}", f"KeyError({i})", tb, "tcp://w:1", "w", 0, now=1.0)
        ids |= {d.events[0].signature_id for d in out if isinstance(d, Record)}
    assert len(ids) == 1 and len(parsed) == 1
    out, _ = c.task_erred("other", "ValueError('x')", tb, "tcp://w:1", "w", 0, now=1.0)
    assert len(parsed) == 2  # another exception class is another signature


def test_memory_waits_are_told_in_the_pipeline_summary():
    """A worker's admission events (a task waited for host memory, then ran) add up in its
    pipeline run's summary; keys the core does not track are ignored."""
    from oomguard._decide import DecisionCore

    c = DecisionCore(allowed_failures=1, grace=5.0)
    span = {"span": {k: {"name": ("etl",), "ids": ("id1",)} for k in ("x-1", "x-2", "x-3")}}
    c.submitted(["x-1", "x-2", "x-3"], ["x-1", "x-2", "x-3"], span, now=0.0)
    c.memory_waited("x-1", 4.25)
    c.memory_waited("x-2", 7.75)
    c.memory_waited("not-a-task", 100.0)
    for k in ("x-1", "x-2", "x-3"):
        c.transition(k, "processing", "memory")
    [status] = [c.policy.status(p) for p in c.policy.pipelines()]
    assert status.status == "succeeded"
    assert status.summary == ("all 3 shards finished; 2 tasks waited 12 s in total for memory."), (
        status.summary
    )


def test_workers_killed_again_before_they_registered_are_each_one_death():
    """A nanny restarts its worker, and the kernel kills the new process while it starts,
    again and again (a start-up stampede): each report names the predecessor's address
    (Dask sets the new one only once the worker is up) and no removal ever comes. They were
    refused as duplicates: two thirds of the kernel's kills were lost."""
    pairing = DeathPairing(grace=5.0)
    assert pairing.reported(report(pid=7), now=0.0) is None
    first = pairing.reported(report(pid=8), now=0.5)  # another process: decide the first
    assert (first.worker, first.removal, first.report.pid) == ("tcp://a:1", None, 7)
    assert pairing.reported(report(pid=8), now=0.6) is None  # the same one again: refused
    assert pairing.refused == {"duplicate": 1}
    second = pairing.reported(report(pid=9), now=1.0)
    assert second.report.pid == 8
    [third] = pairing.expired(now=6.0)
    assert third.report.pid == 9 and len(pairing) == 0


# --- issue 27: a death without a report is one event; moved shards said as they were ---


def _naps(c, keys, pipeline="naps"):
    c.submitted(keys, keys, {runs.ANNOTATION: {k: pipeline for k in keys}}, now=0.0)


def _lost(c, worker, processing, now, **kw):
    """A worker lost with its nanny (no report): removed, then decided after the grace."""
    out = c.removed(removal(worker, {k: k for k in processing}, **kw), now=now)
    return out + c.tick(now + 10.0)


def test_a_death_without_a_report_is_one_event_naming_its_suspects():
    """A `dask worker --nthreads 1` lost with its nanny while it ran one short task and had
    the next queued behind it (Dask's saturation): two worker_lost events came, one per
    task, and the queued one got an infra failure it never had."""
    from oomguard._decide import DecisionCore, Record

    c = DecisionCore(allowed_failures=3, grace=5.0)
    _naps(c, ["nap-28", "nap-31"])
    out = _lost(c, "tcp://w:1", ["nap-28", "nap-31"], now=1.0, nthreads=1)
    [record] = [d for d in out if isinstance(d, Record)]
    e = record.events[0]
    assert record.death is not None and (e.cause, e.kind, e.pipeline) == (
        "worker_lost",
        "infra",
        "naps",
    )
    assert e.shard == ""  # nobody's own failure
    assert e.evidence["suspects"] == ["nap-28", "nap-31"]
    assert e.evidence["suspects_total"] == 2
    assert "one of 'nap-28', 'nap-31' was running; 1 thread" in e.evidence["summary"]
    assert "executing_tasks" not in e.evidence
    assert e.signature_title == "worker_lost in nap"
    # Neither shard carries a failure of its own; the run counts one death.
    assert c.policy.attempt("nap-28") == c.policy.attempt("nap-31") == 1
    assert c.policy.tracked_shards() == 0
    status = c.policy.status(c.runs.of("nap-28").label)
    assert status.infra_failures == 1 and c.deaths == 1
    assert "after 1 worker death (1 worker_lost)" in status.summary
    # Both still count against Dask's bound.
    assert c.budget.deaths("nap-28") == c.budget.deaths("nap-31") == 1


def test_a_sole_suspect_is_named_and_counted():
    """One task on the worker, or a heartbeat that saw exactly one of them executing: the
    death is that shard's own failure, as before."""
    from oomguard._decide import DecisionCore, Record

    c = DecisionCore(allowed_failures=3, grace=5.0)
    _naps(c, ["nap-1", "nap-2", "nap-3"])
    [alone] = [d for d in _lost(c, "tcp://w:1", ["nap-1"], now=1.0) if isinstance(d, Record)]
    assert alone.events[0].shard == "nap-1" and "suspects" not in alone.events[0].evidence
    out = _lost(c, "tcp://w:2", ["nap-2", "nap-3"], now=20.0, executing_guess={"nap-3": "nap-3"})
    [guessed] = [d for d in out if isinstance(d, Record)]
    assert (
        guessed.events[0].shard == "nap-3"
        and guessed.events[0].evidence["blame"] == "last heartbeat"
    )
    assert (c.policy.attempt("nap-1"), c.policy.attempt("nap-2"), c.policy.attempt("nap-3")) == (
        2,
        1,
        2,
    )


def test_suspects_of_two_pipelines_name_both_and_each_run_counts_the_death():
    from oomguard._decide import DecisionCore, Record

    c = DecisionCore(allowed_failures=3, grace=5.0)
    _naps(c, ["nap-1"], "naps")
    _naps(c, ["load-1"], "etl")
    out = _lost(c, "tcp://w:1", ["nap-1", "load-1"], now=1.0, nthreads=1)
    [record] = [d for d in out if isinstance(d, Record)]
    e = record.events[0]
    assert (e.shard, e.pipeline) == ("", "")
    assert e.evidence["suspect_pipelines"] == ["naps", "etl"]
    assert e.signature_title == "worker_lost in one of load, nap"
    for k in ("nap-1", "load-1"):
        assert c.policy.status(c.runs.of(k).label).infra_failures == 1


def test_many_suspects_are_bounded_in_the_evidence():
    from oomguard._decide import DecisionCore, Record

    keys = [f"nap-{i}" for i in range(100)]
    c = DecisionCore(allowed_failures=3, grace=5.0)
    _naps(c, keys)
    [record] = [
        d for d in _lost(c, "tcp://w:1", keys, now=1.0, nthreads=8) if isinstance(d, Record)
    ]
    ev = record.events[0].evidence
    assert len(ev["suspects"]) == 20 and ev["suspects_total"] == 100
    assert "and 95 more" in ev["summary"] and "8 threads" in ev["summary"]
    assert len(ev["summary"]) < 300


def test_a_killer_queued_behind_a_healthy_task_is_still_stopped_within_dasks_bound():
    """No report ever names the killer: each time it is one of two suspects, so its own
    count never moves. Dask's bound still stops it: allowed + 1 deaths, never more; the
    healthy tasks it shared the worker with are never stopped."""
    from oomguard._decide import DecisionCore, Record, Stop

    allowed = 2
    c = DecisionCore(allowed_failures=allowed, grace=5.0)
    _naps(c, ["kill-1"], "killer")
    records, stops = [], []
    for i in range(allowed + 1):
        calm = f"calm-{i}"
        _naps(c, [calm], "calm")
        out = _lost(c, f"tcp://w:{i}", [calm, "kill-1"], now=100.0 * i, nthreads=1)
        records += [d for d in out if isinstance(d, Record)]
        stops += [d for d in out if isinstance(d, Stop)]
    assert len(records) == allowed + 1  # one event per death
    assert all(r.events[0].shard == "" for r in records)
    [stop] = stops
    assert stop.keys == ("kill-1",) and stop.exception.shard == "kill-1"
    assert f"was on {allowed + 1} " in stop.exception.message
    assert c.policy.attempt("kill-1") == 1  # its own count never moved
    assert c.deaths == allowed + 1


def test_a_late_report_replaces_the_one_event_of_its_death():
    from oomguard._decide import DecisionCore, Record

    c = DecisionCore(allowed_failures=3, grace=5.0)
    _naps(c, ["nap-1", "nap-2"])
    out = _lost(c, "tcp://w:1", ["nap-1", "nap-2"], now=1.0, pid=7, nthreads=1)
    [lost] = [d for d in out if isinstance(d, Record)]
    late = c.reported(_sigkill("tcp://w:1", ["nap-2"], {"nap-2": None}, pid=7), now=30.0)
    [amend] = [d for d in late if isinstance(d, Record)]
    assert amend.amends == lost.events[0].time and amend.events[0].shard == "nap-2"


@pytest.mark.parametrize("said", [True, False])
def test_shards_moved_off_a_stopped_worker_are_said_as_executing_or_queued(said):
    """SIGTERM to `dask worker` while two of its three tasks ran: the summary said "3
    queued shards were moved off dead workers". The nanny's notice names what ran."""
    from oomguard._decide import DecisionCore

    c = DecisionCore(allowed_failures=3, grace=5.0)
    keys = ["nap-1", "nap-2", "nap-3"]
    _naps(c, keys)
    c.removed(removal("tcp://w:1", {k: k for k in keys}, pid=7, nthreads=2), now=1.0)
    executing = ["nap-1", "nap-2"] if said else None
    c.clean_exit("tcp://w:1", now=1.1, requested=True, pid=7, executing=executing)
    for k in keys:
        c.transition(k, "processing", "memory")
    summary = c.policy.status(c.runs.of("nap-1").label).summary
    assert "queued shards" not in summary, summary
    if said:
        assert summary.endswith(
            "3 shards were moved off workers that died or stopped, without counting against "
            "them (2 executing, 1 queued)."
        ), summary
    else:
        assert summary.endswith(
            "3 shards were moved off workers that died or stopped, without counting against them."
        ), summary


def test_shards_a_report_shows_queued_are_said_queued():
    from oomguard._decide import DecisionCore

    c = DecisionCore(allowed_failures=3, grace=5.0)
    keys = ["nap-1", "nap-2"]
    _naps(c, keys)
    c.removed(removal("tcp://w:1", {k: k for k in keys}, nthreads=1), now=1.0)
    c.reported(_sigkill("tcp://w:1", ["nap-1"], {"nap-1": None}), now=1.1)
    for k in keys:
        c.transition(k, "processing", "memory")
    summary = c.policy.status(c.runs.of("nap-1").label).summary
    assert summary.endswith(
        "1 queued shard was moved off workers that died or stopped, without counting against it."
    ), summary
