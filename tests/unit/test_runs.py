"""Runs (jobs): everything submitted in one span block, or under one annotation by one
client, is one run however many graphs it arrives in (issue 27). Pure: keys and
annotations only, as the scheduler's `update_graph` hands them over."""

from __future__ import annotations

from oomguard._decide import DecisionCore
from oomguard._decide.runs import ANNOTATION, Runs


def span(keys, name=("block",), block="id1"):
    """The span annotation of keys submitted in one `with span(...)` block."""
    return {"span": {k: {"name": tuple(name), "ids": (block,)} for k in keys}}


def compute(r, keys, annotations, now=0.0, client="c1"):
    """One graph submission (a `.compute()`), then its keys forgotten, as a dataframe's are
    once its result is back: the run(s) it went to."""
    touched = list(r.observe(keys, keys, annotations, now, client=client))
    for k in keys:
        r.forget(k)
    return touched


def test_every_compute_of_one_span_block_is_one_run():
    """A dask.dataframe block: the set_index divisions, the shuffle and a max, each a graph
    of its own, each forgotten before the next arrives."""
    r = Runs()
    graphs = [["divisions-1", "divisions-2"], ["shuffle-1", "mean-1"], ["max-1"]]
    runs = [compute(r, keys, span(keys), float(i)) for i, keys in enumerate(graphs)]
    assert all(len(t) == 1 for t in runs)
    assert len({id(t[0]) for t in runs}) == 1
    [[run], *_] = runs
    assert (run.label, run.name, run.started) == ("block", "block", 0.0)
    assert r.take_ended() == []  # idle, not ended: its block may submit more
    assert len(r.idle()) == 1 and len(r) == 0


def test_a_new_block_of_the_same_name_is_a_new_run():
    r = Runs()
    [first] = compute(r, ["a-1"], span(["a-1"], block="id1"))
    [second] = compute(r, ["a-2"], span(["a-2"], block="id2"), now=5.0)
    assert (first.label, second.label) == ("block", "block#2")
    assert second.name == "block" and second.started == 5.0
    # The first block's later work still goes to the first run.
    [again] = compute(r, ["a-3"], span(["a-3"], block="id1"), now=9.0)
    assert again is first


def test_nested_spans_the_innermost_block_is_the_job_named_outer_inner():
    r = Runs()
    outer = {"span": {"o-1": {"name": ("etl",), "ids": ("o",)}}}
    inner = {"span": {"i-1": {"name": ("etl", "load"), "ids": ("o", "i")}}}
    [o] = compute(r, ["o-1"], outer)
    [i] = compute(r, ["i-1"], inner)
    [i2] = compute(r, ["i-2"], {"span": {"i-2": {"name": ("etl", "load"), "ids": ("o", "i")}}})
    assert (o.name, i.name) == ("etl", "etl/load") and o is not i and i2 is i


def test_an_annotation_is_one_run_per_client_and_a_span_delimits_it():
    r = Runs()
    ann = {ANNOTATION: {"x-1": "etl"}}
    [a] = compute(r, ["x-1"], ann)
    [b] = compute(r, ["x-2"], {ANNOTATION: {"x-2": "etl"}})  # keys all forgotten between
    [other] = compute(r, ["x-3"], {ANNOTATION: {"x-3": "etl"}}, client="c2")
    assert a is b and other is not a and other.label == "etl#2"
    # With a span too, the annotation names the run and the span block delimits it.
    both = {ANNOTATION: {"x-4": "etl"}, **span(["x-4"], name=("s",), block="id7")}
    [c] = compute(r, ["x-4"], both)
    assert c.name == "etl" and c not in (a, other)


def test_unnamed_submissions_still_end_with_their_last_key():
    r = Runs()
    [run] = compute(r, ["f-1"], {})
    assert r.take_ended() == [run] and r.idle() == []
    [again] = compute(r, ["f-2"], {})
    assert again.label == "f#2"


def test_a_closed_run_takes_no_more_and_ends_when_its_keys_are_gone():
    r = Runs()
    [run] = r.observe(["k-1"], ["k-1"], span(["k-1"]), 0.0)
    r.close(run)
    [after] = r.observe(["k-2"], ["k-2"], span(["k-2"]), 1.0)
    assert after is not run and after.label == "block#2"
    r.forget("k-1")
    assert r.take_ended() == [run]
    r.forget("k-2")
    assert r.take_ended() == [] and r.idle() == [after]  # the new run idles in the block


def test_idle_runs_are_bounded_the_oldest_ends_first():
    r = Runs(idle_runs=3)
    runs = [compute(r, [f"k-{i}"], span([f"k-{i}"], block=f"id{i}"))[0] for i in range(5)]
    assert r.idle() == runs[2:]
    assert r.take_ended() == runs[:2]
    # Work that comes later in a dropped block starts a new run of its name.
    [late] = compute(r, ["k-9"], span(["k-9"], block="id0"))
    assert late is not runs[0] and late.label == "block#6"
    # A run with live keys is never dropped, however many idle.
    [busy] = r.observe(["b-1"], ["b-1"], span(["b-1"], block="busy"), 0.0)
    for i in range(10, 20):
        compute(r, [f"k-{i}"], span([f"k-{i}"], block=f"id{i}"))
    assert r.of("b-1") is busy and busy not in r.take_ended() and len(r.idle()) == 3


def test_a_job_whose_worker_died_in_its_first_compute_never_reads_succeeded():
    """The issue's scenario in the decision core: a death during the first compute of a
    block, then a second compute that goes well."""
    c = DecisionCore(allowed_failures=3, grace=5.0)
    first = ["shuffle-1", "shuffle-2"]
    c.submitted(first, first, span(first), now=0.0, client="c1")
    c.removed(_removal("tcp://w:1", {"shuffle-1": "shuffle-1"}), now=1.0)
    c.tick(7.0)  # no report came: decided as worker_lost
    for k in first:
        c.transition(k, "processing", "memory")
        c.forget(k)
    assert c.gone == []  # the job lives on: its block may submit more
    second = ["max-1"]
    c.submitted(second, second, span(second), now=8.0, client="c1")
    c.transition("max-1", "processing", "memory")
    c.forget("max-1")
    [label] = c.policy.pipelines()
    status = c.policy.status(label)
    assert status.status == "succeeded_after_infra_failures", status
    assert status.shards_done == 3 and status.infra_failures >= 1
    assert "1 worker death" in status.summary, status.summary


def _removal(worker, processing):
    from oomguard._decide import Removal

    return Removal(
        worker=worker,
        host="h",
        time=1.0,
        processing=processing,
        executing_guess={},
        nthreads=1,
        pid=1,
        memory_limit=None,
        nanny=f"{worker}-nanny",
    )


def test_a_shard_that_failed_and_comes_back_in_a_later_compute_is_counted_again():
    """The same key in two computes of one job (a dataframe's source partitions are), its
    worker killed in the first: each of its ends counts, so the job ends."""
    c = DecisionCore(allowed_failures=3, grace=5.0)
    for i, now in enumerate((0.0, 10.0)):
        keys = ["part-1", f"agg-{i}"]
        c.submitted(keys, keys, span(keys), now=now, client="c1")
        if i == 0:
            c.removed(_removal("tcp://w:1", {"part-1": "part-1"}), now=1.0)
            c.tick(7.0)
        for k in keys:
            c.transition(k, "processing", "memory")
            c.forget(k)
    [label] = c.policy.pipelines()
    status = c.policy.status(label)
    assert (status.status, status.shards_done) == ("succeeded_after_infra_failures", 4), status
