"""A suspect's retry runs alone (issue 38): the decision core's `Isolation` places it, the
scheduler plugin's actions apply that to Dask's task state, and back.

The core is pure (no cluster); the actions run against the few task fields they touch.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

from oomguard._death.record import Death, Task
from oomguard._decide import (
    DecisionCore,
    EndAlone,
    Forgive,
    Hold,
    Record,
    Release,
    Removal,
    RunAlone,
    Stop,
)
from oomguard._protocol import RUN_ALONE_ANNOTATION
from oomguard.scheduler_plugin._actions import HOLD, DaskActions

GiB = 2**30
W1, W2, W3 = "tcp://w1:1", "tcp://w2:1", "tcp://w3:1"


def core(able=(W1, W2), limits=None, seconds=600.0) -> DecisionCore:
    c = DecisionCore(allowed_failures=3, grace=5.0, run_alone_timeout=seconds)
    keys = ["big-1", "nap-1", "nap-2", "nap-3"]  # two pipelines: an abort stops one
    pipelines = {k: "big" if k.startswith("big") else "naps" for k in keys}
    c.submitted(keys, keys, {"oomguard_pipeline": pipelines}, now=0.0)
    for w, limit in (limits or {W1: GiB, W2: 2 * GiB, W3: 4 * GiB}).items():
        c.worker_added(w, limit)
    for w in able:
        c.isolation.worker_able(w, now=0.0)
    return c


def death(c, worker, executing, *, processing=None, now=1.0, pid=1, grew=None, limit=GiB):
    """`worker` was OOM-killed while it executed `executing` (and held `processing`)."""
    tasks = {k: k for k in [*executing, *(processing or ())]}
    out = c.removed(
        Removal(worker, "h", now, tasks, nthreads=2, pid=pid, memory_limit=limit), now=now
    )
    tasks = tuple(Task(k, k.split("-")[0], grew=(grew or {}).get(k)) for k in executing)
    death = Death(
        worker=worker,
        pid=pid,
        cause="oom_kill",
        host="h",
        time=now,
        memory_limit=limit,
        tasks=tasks,
    )
    return out + c.reported(death, now=now)


def of(out, kind):
    return [d for d in out if isinstance(d, kind)]


def test_a_shared_memory_kill_places_the_likely_culprit_on_the_largest_able_worker():
    c = core()  # W3 is the largest but cannot hold (no worker plugin there)
    out = death(c, W1, ["big-1", "nap-1"], grew={"big-1": 900 * 2**20, "nap-1": 2**20})
    assert of(out, RunAlone) == [RunAlone("big-1", W2, 600.0)]  # the culprit first
    # The other was displaced beside it: it runs again at once, wherever Dask places it.
    assert not c.isolation.suspects and "nap-1" not in c.held
    assert [k for d in of(out, Release) for k in d.keys] == ["nap-1"]


def test_without_a_likely_culprit_each_suspect_runs_alone_in_turn():
    c = core()
    out = death(c, W1, ["big-1", "nap-1"])
    assert of(out, RunAlone) == [RunAlone("big-1", W2, 600.0)]
    assert list(c.isolation.suspects) == ["nap-1"] and "nap-1" in c.held  # then the other


def test_a_suspect_that_dies_alone_is_decided_at_once_and_the_next_runs_alone():
    c = core(limits={W1: GiB, W2: GiB})
    out = death(c, W1, ["big-1", "nap-1"])  # no likely culprit: both are suspects
    c.worker_added(W1, GiB)  # its nanny restarted it
    c.isolation.worker_able(W1, now=1.5)
    assert of(out, RunAlone) == [RunAlone("big-1", W2, 600.0)]
    # On W2 it ran alone (what waited at the gate there was queued) and died again.
    out = death(c, W2, ["big-1"], processing=["nap-2"], now=3.0, pid=2)
    [stop] = of(out, Stop)
    assert "no worker has more than 1 GiB" in stop.exception.message  # no second try
    assert of(out, Forgive) == [Forgive(("nap-2",))]  # it never started there
    assert of(out, EndAlone) == [EndAlone("big-1")]
    assert of(out, RunAlone) == [RunAlone("nap-1", W1, 600.0)]  # W2 is restarting


def test_a_suspect_that_waited_at_the_gate_when_its_worker_died_goes_first_again():
    c = core()
    death(c, W1, ["big-1", "nap-1"], grew={"big-1": 900 * 2**20})
    c.worker_added(W1, GiB)
    c.isolation.worker_able(W1, now=1.5)
    # W2 is killed while big-1 waited there for the task running to end (a task of
    # another run, too big alone: W2 has more memory than the other workers).
    out = death(c, W2, ["nap-3"], processing=["big-1"], now=2.0, pid=2)
    assert "big-1" in of(out, Forgive)[0].keys
    assert of(out, RunAlone) == [RunAlone("big-1", W1, 600.0)]  # placed again, first


def test_a_suspect_whose_worker_left_before_it_arrived_is_placed_again():
    c = core()
    death(c, W1, ["big-1", "nap-1"], grew={"big-1": 900 * 2**20})
    assert c.isolation.worker == W2
    c.worker_added(W1, GiB)
    c.isolation.worker_able(W1, now=1.5)
    out = c.isolation.worker_gone(W2, (), now=2.0)  # retired before big-1 got there
    assert out == [Hold(("big-1",)), EndAlone("big-1"), RunAlone("big-1", W1, 600.0)]


def test_with_no_able_worker_here_a_suspect_waits_for_one_then_runs_where_dask_places_it():
    c = core(able=(W2,))
    out = death(c, W2, ["big-1", "nap-1"], grew={"big-1": 900 * 2**20}, limit=2 * GiB)
    assert of(out, RunAlone) == []  # the only able worker is restarting: wait for it
    assert c.tick(now=300.0) == []
    out = c.tick(now=602.0)  # none came within the bound
    assert out == [RunAlone("big-1", None, 600.0)]
    # It ran beside another task and killed the worker again: the evidence says why.
    out = death(c, W1, ["big-1", "nap-2"], now=603.0, pid=2)
    evidence = of(out, Record)[0].death.evidence
    assert "no worker able to hold its other tasks back came within 600 s" in evidence["run_alone"]
    assert evidence["run_alone"] in evidence["summary"]


def test_on_a_cluster_where_no_worker_can_hold_a_suspect_runs_at_once_as_before():
    c = core(able=())
    out = death(c, W1, ["big-1", "nap-1"], grew={"big-1": 900 * 2**20})
    assert of(out, RunAlone) == [RunAlone("big-1", None, 600.0)]


def test_when_the_hold_runs_out_the_next_suspect_runs_and_a_shared_death_says_why():
    c = core(seconds=60.0)
    death(c, W1, ["big-1", "nap-1"])  # no likely culprit: both are suspects
    assert c.tick(now=30.0) == []
    c.worker_added(W1, GiB)
    c.isolation.worker_able(W1, now=40.0)
    out = c.tick(now=61.5)
    assert out == [EndAlone("big-1"), RunAlone("nap-1", W2, 60.0)]
    # big-1 still ran on W2 and, its hold over, beside another task: shared again.
    out = death(c, W2, ["big-1", "nap-2"], now=62.0, pid=2, limit=2 * GiB)
    evidence = of(out, Record)[0].death.evidence
    assert evidence["run_alone"] == (
        f"big-1 was retried to run alone, but its hold of {W2} ran out after 60 s and "
        "other tasks started beside it"
    )
    assert not of(out, Stop)  # shared: nothing proven, each runs alone again


def test_a_key_retried_on_larger_workers_runs_alone_only_on_one():
    c = core(able=(W1, W2), limits={W1: GiB, W2: 2 * GiB, W3: 2 * GiB})
    # big-1 died alone on W1 (1 GiB): retried only on larger workers (W2, W3).
    death(c, W1, ["big-1"])
    assert c.larger.resized["big-1"].limit == GiB
    c.worker_added(W1, GiB)
    c.isolation.worker_able(W1, now=1.5)
    # Then it died beside another task on W2: W1 can hold, but is not larger. It waits
    # for a larger one that can hold.
    out = death(c, W2, ["big-1", "nap-1"], now=2.0, pid=2, limit=2 * GiB)
    assert of(out, RunAlone) == [] and c.isolation.waiting
    assert c.isolation.worker_able(W3, now=3.0) == [RunAlone("big-1", W3, 600.0)]


# --- the actions -----------------------------------------------------------------------


def scheduler(**task):
    shared = {"span": ("x",)}  # Dask may share one annotations dict between tasks
    fields = {
        "key": "k",
        "worker_restrictions": None,
        "loose_restrictions": False,
        "state": "no-worker",
        "processing_on": None,
        "priority": (0, 3, 7),
        "annotations": shared,
    }
    ts = SimpleNamespace(**{**fields, **task})
    events, transitions = [], []
    s = SimpleNamespace(
        tasks={"k": ts},
        log_event=lambda topic, msg: events.append(msg),
        transitions=lambda recs, stimulus_id: transitions.append(dict(recs)),
    )
    return DaskActions(s, store=None, metrics=None, guard=None), ts, events, transitions


def test_run_alone_restricts_annotates_puts_first_and_end_alone_gives_it_all_back():
    actions, ts, events, transitions = scheduler()
    shared = ts.annotations
    actions.apply([Hold(("k",))])
    actions.apply([RunAlone("k", W2, 600.0)])
    assert ts.worker_restrictions == {W2} and ts.loose_restrictions is False
    assert ts.annotations == {"span": ("x",), RUN_ALONE_ANNOTATION: 600.0}
    assert shared == {"span": ("x",)}  # a copy: the other tasks keep theirs
    assert ts.priority == (-math.inf, 3, 7)
    assert transitions == [{"k": "waiting"}]
    assert events[-1] == {"action": "run-alone", "shard": "k", "worker": W2, "hold": 600.0}
    ts.state = "memory"
    actions.apply([EndAlone("k")])
    assert ts.annotations is shared and ts.priority == (0, 3, 7)
    assert ts.worker_restrictions is None and ts.loose_restrictions is False


def test_a_suspect_held_again_keeps_its_own_restrictions_not_its_workers():
    actions, ts, _, transitions = scheduler(worker_restrictions={W1, W2}, loose_restrictions=True)
    actions.apply([Hold(("k",)), RunAlone("k", W2, 600.0)])
    ts.state = "processing"
    actions.apply([Hold(("k",))])  # W2 died under it
    assert ts.worker_restrictions == {HOLD} and ts.priority == (0, 3, 7)
    assert RUN_ALONE_ANNOTATION not in ts.annotations
    ts.state = "no-worker"
    actions.apply([EndAlone("k"), RunAlone("k", W1, 600.0)])  # its death decided
    assert ts.worker_restrictions == {W1}
    ts.state = "memory"
    actions.apply([EndAlone("k")])
    assert ts.worker_restrictions == {W1, W2} and ts.loose_restrictions is True


def test_own_restrictions_that_exclude_the_worker_are_kept():
    actions, ts, _, _ = scheduler(worker_restrictions={W3})
    actions.apply([Hold(("k",)), RunAlone("k", W2, 600.0)])
    assert ts.worker_restrictions == {W3} and ts.priority == (0, 3, 7)
    assert ts.annotations[RUN_ALONE_ANNOTATION] == 600.0  # held there if W3 can hold


def test_a_stop_gives_back_what_run_alone_changed():
    from oomguard._exceptions import PipelineAborted

    actions, ts, _, _ = scheduler()
    actions.apply([Hold(("k",)), RunAlone("k", W2, 600.0)])
    ts.state = "memory"  # nothing to err
    actions._stop(Stop(("k",), PipelineAborted("aborted", pipeline="etl", shard="k")))
    assert ts.priority == (0, 3, 7) and RUN_ALONE_ANNOTATION not in ts.annotations
    assert not actions._alone and not actions._saved
