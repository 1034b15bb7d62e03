"""Chaos (issue 8, part 1): workers die at random, of random causes, mid-pipeline.

A cluster of two nannies (one worker of 400 MiB, one of 800 MiB; each worker in its own
memory cgroup), oomguard installed as a user would. A pipeline of shards runs while a killer picks a random worker (one executing
a shard it has not hit before: a shard hit twice by memory causes *is* a deterministic
crasher to oomguard) and a random cause, in equal numbers. Memory deaths hit the small
worker only: since issue 7 a memory death on the largest worker means "no worker is big
enough for this shard" and aborts the pipeline at once, by design.

  sigkill           kill -9 from outside
  sigterm           SIGTERM from outside
  native_crash      a real segfault (NULL read) in the worker process
  oom_kill          the kernel's OOM killer: the worker maps past its cgroup's limit
  memory_terminate  the nanny's memory termination: the worker creeps past 95% of its limit

Default: 100 shards and 10 deaths (CI-sized). ``--long`` / ``OOMGUARD_LONG=1``: 500 shards
and 50 deaths. Every death must give exactly one event, with the right cause, blaming the
shard that was executing; the pipeline is never aborted; the result is correct.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import threading
import time

import dask
import distributed
import pytest
from distributed import Client, Nanny, Scheduler, SpecCluster

import oomguard
from capabilities import require
from oomguard._host import cgroup as _cgroup

pytestmark = pytest.mark.timeout(900)

LIMIT = 400 * 2**20
SHARD_SECONDS = 1.0
CAUSES = ("sigkill", "sigterm", "native_crash", "oom_kill", "memory_terminate")
MEMORY = ("oom_kill", "memory_terminate")


def work(i, seconds=SHARD_SECONDS):
    time.sleep(seconds)
    return i * i


def _right(planned: str, event) -> bool:
    """The event names the planned cause. One race is real, not a misclassification: the
    nanny's 100 ms memory monitor can catch a worker filling its cgroup before the kernel
    does, and then the nanny's kill is what ended it (its own event is the evidence)."""
    if event.cause == planned:
        return True
    return (
        planned == "oom_kill"
        and event.cause == "memory_terminate"
        and event.evidence.get("nanny_memory_kill") is True
    )


# --- ways to die, run inside the victim worker (client.run, wait=False: coroutines) ---


async def _segfault():
    import ctypes

    ctypes.string_at(0)


async def _map_past_limit(limit):
    # MAP_POPULATE faults every page in one system call: the cgroup hits its limit in the
    # kernel, long before the nanny's 100 ms memory monitor could act.
    import mmap

    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE
    return mmap.mmap(-1, 2 * limit, flags=flags)


async def _creep_past_terminate(limit):
    # Grow to just past the nanny's terminate threshold (95%) and stay there, below the
    # cgroup's limit, so the nanny and not the kernel ends the worker.
    import threading

    import psutil

    def creep():
        held = []
        proc = psutil.Process()
        while proc.memory_info().rss < 0.955 * limit:
            held.append(bytearray(4 * 2**20))
            time.sleep(0.002)
        time.sleep(60)

    threading.Thread(target=creep, daemon=True).start()


def _unfinished(dask_scheduler):
    live = sorted(dask_scheduler.workers)
    return [
        (str(k), ts.state, sorted(ts.worker_restrictions or ()), live)
        for k, ts in dask_scheduler.tasks.items()
        if ts.state not in ("memory", "released", "forgotten")
    ][:20]


def _executing(dask_worker):
    return os.getpid(), [str(ts.key) for ts in dask_worker.state.executing], dask_worker.name


class Killer(threading.Thread):
    def __init__(self, client, deaths, seed):
        super().__init__(daemon=True)
        self.client = client
        self.rng = random.Random(seed)
        causes = [CAUSES[i % len(CAUSES)] for i in range(deaths)]
        self.rng.shuffle(causes)
        self.plan = causes
        self.kills: list[dict] = []
        self.hit: set[str] = set()
        self.stop = False
        self.error: BaseException | None = None

    def run(self):
        try:
            self._run()
        except BaseException as e:  # surfaced by the test
            self.error = e

    def _run(self):
        client = self.client
        deadline = time.monotonic() + 800
        while self.plan and not self.stop and time.monotonic() < deadline:
            time.sleep(self.rng.uniform(0.2, 0.8))
            try:
                running = client.run(_executing, on_error="ignore")
            except Exception:
                continue
            cause = self.plan[-1]
            candidates = [
                (addr, pid, keys[0])
                for addr, (pid, keys, name) in (
                    (a, v) for a, v in running.items() if isinstance(v, tuple)
                )
                if keys
                and keys[0] not in self.hit
                # A memory death on the largest worker means "no worker is big enough":
                # oomguard aborts at once (issue 7). Memory chaos hits the small worker.
                and (cause not in MEMORY or name == "small")
            ]
            if not candidates:
                continue
            addr, pid, shard = self.rng.choice(sorted(candidates))
            self.plan.pop()
            self.hit.add(shard)
            self.kills.append(
                {"worker": addr, "pid": pid, "cause": cause, "shard": shard, "time": time.time()}
            )
            if cause == "sigkill":
                os.kill(pid, signal.SIGKILL)
            elif cause == "sigterm":
                os.kill(pid, signal.SIGTERM)
            elif cause == "native_crash":
                client.run(_segfault, workers=[addr], wait=False)
            elif cause == "oom_kill":
                client.run(_map_past_limit, LIMIT, workers=[addr], wait=False)
            else:
                client.run(_creep_past_terminate, LIMIT, workers=[addr], wait=False)
            # The death is noticed before the next kill (the other worker may be hit
            # while this one restarts).
            until = time.monotonic() + 30
            while addr in client.scheduler_info()["workers"] and time.monotonic() < until:
                time.sleep(0.05)


@pytest.fixture
def cluster(tmp_path):
    ok, reason = _cgroup.can_create_child()
    require(ok, f"per-worker memory cgroups cannot be made here: {reason}")
    with dask.config.set(
        {
            "oomguard.worker.cgroup-limit": "true",
            "oomguard.worker.sample-interval": "100ms",
            "oomguard.scheduler.report-grace-timeout": "3s",
            "distributed.worker.memory.terminate": 0.95,
            # Only the nanny's termination acts on memory: no spilling or pausing.
            "distributed.worker.memory.target": False,
            "distributed.worker.memory.spill": False,
            "distributed.worker.memory.pause": False,
            # SpecCluster closes a nanny whose worker name is absent from the scheduler 15 s
            # after any removal of that name: with a worker killed every few seconds it
            # sometimes is (restarting), and Dask's deploy layer, not oomguard, would end it.
            "distributed.deploy.lost-worker-timeout": "1h",
        }
    ):
        spec = {
            name: {"cls": Nanny, "options": {"nthreads": 1, "memory_limit": limit}}
            for name, limit in (("small", LIMIT), ("big", 2 * LIMIT))
        }
        with (
            SpecCluster(
                workers=spec,
                scheduler={"cls": Scheduler, "options": {"dashboard_address": ":0"}},
            ) as cl,
            Client(cl) as client,
        ):
            oomguard.install(client, store=str(tmp_path / "chaos.sqlite3"))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                got = client.run(lambda dask_worker: "oomguard-worker" in dask_worker.plugins)
                if len(got) == 2 and all(got.values()):
                    break
                time.sleep(0.1)
            yield cl, client


def test_chaos(cluster, long_run, record_figures):
    cl, client = cluster
    shards, deaths = (500, 50) if long_run else (100, 10)
    killer = Killer(client, deaths, seed=int(os.environ.get("OOMGUARD_CHAOS_SEED", "8")))
    start = time.monotonic()
    with distributed.span("chaos"):
        futs = client.map(work, range(shards), key=[("chaos", i) for i in range(shards)])
        killer.start()
        results = {}
        # Like a pipeline writing each shard's output away: release results as they come,
        # so a death loses only what was executing.
        try:
            for fut in distributed.as_completed(futs, timeout=240 + shards * 2 * SHARD_SECONDS):
                results[fut.key[1]] = fut.result()
                fut.release()
        except TimeoutError:
            stuck = client.run_on_scheduler(_unfinished)
            record_figures("chaos", stuck=stuck, kills=killer.kills, done=len(results))
            pytest.fail(
                f"the pipeline hung after {len(killer.kills)} deaths; unfinished "
                f"shards (state, restrictions, live workers): {stuck}"
            )
        del futs
    killer.stop = True
    killer.join(timeout=60)
    assert killer.error is None, repr(killer.error)
    elapsed = time.monotonic() - start

    failures = oomguard.Failures(client)
    time.sleep(4.0)  # past the grace timeout: every death is decided
    events = failures.events(limit=100_000)
    by_worker = collections.defaultdict(list)
    for e in events:
        by_worker[e.worker].append(e)
    kills = killer.kills
    exact = [k for k in kills if len(by_worker[k["worker"]]) == 1]
    right_cause = [k for k in exact if _right(k["cause"], by_worker[k["worker"]][0])]
    right_shard = [k for k in exact if by_worker[k["worker"]][0].shard == k["shard"]]
    killed = {k["worker"] for k in kills}
    extra = [e for e in events if e.worker not in killed]
    status = failures.pipeline("chaos")
    stats = client.run_on_scheduler(
        lambda dask_scheduler: dask_scheduler.plugins["oomguard"].metrics_snapshot()
    )
    confusion = collections.Counter(
        (k["cause"], ",".join(e.cause for e in by_worker[k["worker"]]) or "none") for k in kills
    )
    figures = {
        "shards": shards,
        "deaths": len(kills),
        "deaths_planned": deaths,
        "deaths_by_cause": dict(collections.Counter(k["cause"] for k in kills)),
        "deaths_with_exactly_one_event": len(exact),
        "deaths_classified_right": len(right_cause),
        "deaths_blaming_the_executing_shard": len(right_shard),
        "reports_lost": sum(1 for k in kills if not by_worker[k["worker"]]),
        "duplicate_events": sum(max(0, len(by_worker[k["worker"]]) - 1) for k in kills),
        "events_for_no_death": len(extra),
        "false_aborts": stats["aborts"],
        "pipeline_status": status.status if status else None,
        "results_correct": results == {i: i * i for i in range(shards)},
        "seconds": round(elapsed, 1),
        "confusion": {f"{a}->{b}": n for (a, b), n in sorted(confusion.items())},
        "internal_errors": stats["internal_errors"],
        "shard_mismatches": [
            (k["cause"], k["shard"], [e.shard for e in by_worker[k["worker"]]])
            for k in kills
            if k not in right_shard
        ],
    }
    record_figures("chaos", **figures)
    assert len(kills) == deaths, figures
    assert results == {i: i * i for i in range(shards)}
    assert len(exact) == len(kills), figures
    assert len(right_cause) == len(kills), figures
    # The killer reads the executing shard, then acts (a memory death takes up to ~0.3 s):
    # rarely the shard finishes in between and the next one is the one executing at the
    # death. Allow that for 10% of deaths, and only for shards of this pipeline.
    assert len(right_shard) >= 0.9 * len(kills), figures
    assert all(e.shard.startswith("('chaos', ") for e in events), figures
    assert extra == [], [(e.worker, e.cause, e.shard) for e in extra]
    assert stats["aborts"] == 0 and status.status == "succeeded_after_infra_failures", figures
    assert stats["internal_errors"] == 0
