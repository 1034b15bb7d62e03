"""A worker joining a cluster with shards retried on larger workers: cheap, and it counts.

Adding a worker used to hand every restricted key its whole new set of workers (a frozenset
copied twice, sorted for the event log, copied again for Dask): O(keys x workers) per worker
added; at 1,000 keys and 2,000 larger workers, 76 ms of event loop in the decision core alone
per worker added, before the adapter's copies (0.1 ms now; docs/performance.md, "Scale").
Now one `Widen` names the keys and the worker; its cost is measured, never timed here.
"""

from __future__ import annotations

from types import SimpleNamespace

from oomguard._death.record import Death, Task
from oomguard._decide import DecisionCore, Hold, Release, Removal, Restrict, Widen
from oomguard.scheduler_plugin._actions import HOLD, DaskActions

GiB = 2**30


def _core(n_big: int, n_keys: int) -> tuple[DecisionCore, list]:
    """A core with `n_big` 8 GiB workers and `n_keys` shards that each died of an OOM kill
    on a 4 GiB worker (so each is retried only on the larger ones)."""
    core = DecisionCore()
    for i in range(n_big):
        core.worker_added(f"tcp://10.0.{i // 250}.{i % 250}:1", 8 * GiB)
    keys = [f"load-{k}" for k in range(n_keys)]
    core.submitted(keys, keys, {}, now=0.0)
    restricted = []
    for k, key in enumerate(keys):
        small = f"tcp://10.1.{k // 250}.{k % 250}:1"
        core.worker_added(small, 4 * GiB)
        core.removed(
            Removal(small, "h", 0.0, {key: key}, pid=k + 1, memory_limit=4 * GiB), now=1.0
        )
        death = Death(
            worker=small,
            pid=k + 1,
            cause="oom_kill",
            host="h",
            time=1.0,
            memory_limit=4 * GiB,
            tasks=(Task(key, "load"),),
        )
        out = core.reported(death, now=1.0)
        restricted += [d.key for d in out if isinstance(d, Restrict)]
    assert restricted == keys
    return core, keys


def test_a_worker_added_is_one_widen_whatever_the_number_of_larger_workers():
    core, keys = _core(n_big=2000, n_keys=300)
    out = core.worker_added("tcp://10.9.0.1:1", 8 * GiB)
    assert out == [Widen(tuple(keys), "tcp://10.9.0.1:1")]
    assert core.worker_added("tcp://10.9.0.2:1", 4 * GiB) == []  # not larger: nothing
    assert core.worker_added("tcp://10.9.0.3:1", 0) == [Widen(tuple(keys), "tcp://10.9.0.3:1")]


def test_a_shard_that_waits_for_a_larger_worker_runs_nowhere_until_one_comes():
    # Dask reads an empty worker_restrictions as "no restriction": a shard killed for memory
    # whose larger worker is restarting must wait, not run on a worker of the same size.
    ts = SimpleNamespace(
        key="k",
        worker_restrictions=None,
        loose_restrictions=True,
        state="processing",
        processing_on=None,
    )
    events, transitions = [], []
    scheduler = SimpleNamespace(
        tasks={"k": ts},
        log_event=lambda topic, msg: events.append(msg),
        transitions=lambda recs, stimulus_id: transitions.append(dict(recs)),
    )
    actions = DaskActions(scheduler, store=None, metrics=None, guard=None)
    actions.apply([Hold(("k",))])  # its worker died: held until the death is decided
    actions.apply([Restrict("k", frozenset(), GiB)])  # no larger worker right now
    ts.state = "no-worker"
    actions.apply([Release(("k",))])
    assert ts.worker_restrictions == {HOLD}  # not set(): that would be any worker
    assert transitions == [{"k": "waiting"}]
    actions.apply([Widen(("k",), "tcp://big:1")])  # the larger worker is back
    assert ts.worker_restrictions == {"tcp://big:1"} and not ts.loose_restrictions
    assert events[-1]["action"] == "retry-resize-widened"
    assert events[-1]["worker"] == "tcp://big:1" and events[-1]["shards"] == ["k"]


def test_a_held_shard_gets_the_new_worker_when_it_is_released():
    ts = SimpleNamespace(
        key="k",
        worker_restrictions=None,
        loose_restrictions=True,
        state="processing",
        processing_on=None,
    )
    scheduler = SimpleNamespace(
        tasks={"k": ts},
        log_event=lambda topic, msg: None,
        transitions=lambda recs, stimulus_id: None,
    )
    actions = DaskActions(scheduler, store=None, metrics=None, guard=None)
    actions.apply([Hold(("k",)), Restrict("k", frozenset({"tcp://big:1"}), GiB)])
    actions.apply([Widen(("k",), "tcp://big:2")])
    assert ts.worker_restrictions == {HOLD}  # still held
    actions.apply([Release(("k",))])
    assert ts.worker_restrictions == {"tcp://big:1", "tcp://big:2"}
