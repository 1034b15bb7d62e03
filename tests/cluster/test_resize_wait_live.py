"""A shard retried only on larger workers, against a real scheduler: it waits while there is
none, and runs on the first one that joins.

Dask reads an empty `worker_restrictions` as "no restriction" (`Scheduler.valid_workers`):
a shard restricted to "the larger workers" while none was connected (one restarting) used
to run at once on a worker of the size that had just killed it. And a worker that joins
must reach the shard's restrictions inside the `add_worker` hook, before Dask looks for
no-worker tasks it can run (`Widen`, one per worker added).
"""

from __future__ import annotations

import asyncio

from distributed import Client, Scheduler, Worker
from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.utils_test import gen_test

from oomguard._decide import Restrict, Widen
from oomguard.scheduler_plugin._actions import HOLD, DaskActions

GiB = 2**30


def inc(x):
    return x + 1


class _Widening(SchedulerPlugin):
    """What the oomguard plugin does when a larger worker joins: decisions applied in the
    add_worker hook."""

    name = "test-widening"

    def __init__(self, actions: DaskActions, key: str) -> None:
        self.actions, self.key = actions, key

    def add_worker(self, scheduler, worker):
        self.actions.apply([Widen((self.key,), worker)])


@gen_test(timeout=60)
async def test_a_shard_waiting_for_a_larger_worker_runs_on_the_first_that_joins():
    async with (
        Scheduler(port=0, dashboard_address=":0") as s,
        Worker(s.address, nthreads=1, memory_limit=GiB) as small,
        Client(s.address, asynchronous=True) as c,
    ):
        actions = DaskActions(s, store=None, metrics=None, guard=None)
        fut = c.submit(inc, 1, key="k", workers=[small.address])  # held: the key stays
        assert await fut == 2
        # Its retry: the larger workers are all gone (restarting), so it may run nowhere.
        s.transitions({"k": "released"}, stimulus_id="test-retry")
        actions.apply([Restrict("k", frozenset(), GiB)])
        if s.tasks["k"].state == "released":
            s.transitions({"k": "waiting"}, stimulus_id="test-retry")
        await asyncio.sleep(0.5)
        ts = s.tasks["k"]
        assert ts.state == "no-worker" and ts.worker_restrictions == {HOLD}
        assert not small.state.tasks.get("k")  # not run again at the size that killed it
        s.add_plugin(_Widening(actions, "k"))
        async with Worker(s.address, nthreads=1, memory_limit=2 * GiB) as big:
            for _ in range(100):
                if ts.state == "memory":
                    break
                await asyncio.sleep(0.05)
            assert ts.state == "memory"
            assert {ws.address for ws in ts.who_has} == {big.address}
            assert ts.worker_restrictions == {big.address}
