"""`PipelineAborted` is Dask's `KilledWorker` (issue 39, point 2): code written for Dask
catches it, reads Dask's fields, and where Dask's own bound stopped the task reads Dask's own
sentence first; oomguard's fields and message ride along and survive pickling."""

from __future__ import annotations

import pickle

import pytest
from distributed import KilledWorker

import oomguard
from oomguard._decide.policy import FailurePolicy
from oomguard._models import FailureEvent


def _aborted(**kw) -> oomguard.PipelineAborted:
    return oomguard.PipelineAborted(
        "oomguard aborted pipeline 'etl': shard ('load', 7) crashed 3 times.",
        pipeline="etl",
        shard="('load', 7)",
        cause="native_crash",
        count=3,
        signature="3f2a",
        evidence={"exitcode": -11},
        **kw,
    )


def test_except_killed_worker_catches_it_with_dasks_fields():
    with pytest.raises(KilledWorker) as caught:
        raise _aborted(task=("load", 7), last_worker="tcp://10.0.0.5:4000", allowed_failures=3)
    e = caught.value
    assert type(e) is oomguard.PipelineAborted and type(e).__module__ == "oomguard"
    assert (e.task, e.last_worker.address, e.allowed_failures) == (
        ("load", 7),
        "tcp://10.0.0.5:4000",
        3,
    )
    assert str(e) == "oomguard aborted pipeline 'etl': shard ('load', 7) crashed 3 times."
    assert (e.pipeline, e.shard, e.cause, e.count, e.signature) == (
        "etl",
        "('load', 7)",
        "native_crash",
        3,
        "3f2a",
    )


def test_it_pickles_with_every_field():
    e = _aborted(task=("load", 7), last_worker="tcp://10.0.0.5:4000", allowed_failures=3)
    back = pickle.loads(pickle.dumps(e))
    assert isinstance(back, KilledWorker) and str(back) == str(e) and repr(back) == repr(e)
    assert back.__dict__ == e.__dict__ and back.args == e.args
    # A pickle from before it was a KilledWorker (no Dask fields) still loads.
    old = pickle.loads(pickle.dumps(oomguard.PipelineAborted("m", shard="s")))
    assert (old.task, old.last_worker.address, old.allowed_failures) == ("s", "", 0)


def test_stopped_at_dasks_bound_it_says_what_dask_would_have_said_first():
    event = FailureEvent(
        "infra", "sigkill", "('load', 7)", "etl", "tcp://10.0.0.5:4000", "node-a", "", ""
    )
    d = FailurePolicy().over_budget(None, event, ("load", 7), deaths=4, allowed=3)
    e = d.exception(("load", 7), 3)
    dask_says = str(KilledWorker(("load", 7), e.last_worker, 3))
    assert dask_says.startswith("Attempted to run task ('load', 7) on 4 different workers")
    assert str(e).startswith(dask_says + " oomguard stopped pipeline 'etl'")
    assert e.last_worker.address == "tcp://10.0.0.5:4000"
