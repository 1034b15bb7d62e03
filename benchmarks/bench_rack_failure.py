"""A rack failure: thousands of workers removed at once, their reports in any order and delay.

    .venv/bin/python benchmarks/bench_rack_failure.py              # 3,000 workers, reports over 30 s
    .venv/bin/python benchmarks/bench_rack_failure.py --quick      # 300 workers, reports over 6 s

A real Scheduler (in this process) with the oomguard scheduler plugin installed the way
users do, and N simulated workers with nannies on 50 hosts (`_fake_workers`: they register
over the real protocol, in this process too), each running one task. The rack goes down:
the N workers' connections drop within 1 s, so Dask removes each one and publishes its
`remove-worker` event; then N death reports go through the plugin's own RPC handler, from
the nanny's host, at uniformly random times over the next `--spread` seconds (so most
arrive after the 5 s grace timeout and amend a `worker_lost` decision), 5 % of them twice.
A probe coroutine measures the event loop's lag every 10 ms, over the whole run (Dask's
own removals included) and over the reports alone.

Prints: events stored vs deaths (must be equal: each death decided once, with its real
cause), what was refused by reason, loop lag p50/p99/max, RSS growth. Target (a goal, not a
test): events == deaths, 0 worker_lost left, lag p99 <= 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

import psutil
from distributed import Client, LocalCluster

from oomguard._death.build import example_report
from oomguard._death.wire import encode
from oomguard.scheduler_plugin import OomguardSchedulerPlugin

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _fake_workers import Farm  # noqa: E402 (found through the path above)

HOSTS = 50  # the rack's hosts (the workers' loopback addresses 127.0.0.1-50)


def _never_run(i):
    """The task each worker holds; fake workers never run a task's code."""
    return i


async def main(n: int, spread: float, seed: int) -> None:
    rng = random.Random(seed)
    store = tempfile.mkdtemp(prefix="oomguard-rack-") + "/failures.sqlite3"
    async with (
        LocalCluster(
            n_workers=0, processes=False, asynchronous=True, dashboard_address=":0"
        ) as cl,
        Client(cl, asynchronous=True) as client,
    ):
        await client.register_plugin(OomguardSchedulerPlugin(store=store))
        plugin = cl.scheduler.plugins["oomguard"]
        # The rack: N workers with nannies on HOSTS hosts, registered over the real protocol,
        # each running one task that never ends by itself.
        farm = Farm(
            cl.scheduler.address,
            n,
            min(n, HOSTS),
            [],
            reports=False,
            seed=seed,
            duration=(3600.0, 3600.0),
        )
        await farm.start()
        futures = client.map(_never_run, range(n), key=[f"load-{i}" for i in range(n)])
        workers = list(farm.workers.values())
        deadline = time.monotonic() + 60
        while sum(w.executing is not None for w in workers) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        running = sum(w.executing is not None for w in workers)
        lags: list[float] = []
        probing = True

        async def probe():
            while probing:
                t = time.monotonic()
                await asyncio.sleep(0.01)
                lags.append(time.monotonic() - t - 0.01)

        probe_task = asyncio.create_task(probe())
        rss0 = psutil.Process().memory_info().rss
        t0 = time.time()
        # The rack goes down: N connections dropped within 1 s; Dask removes each worker
        # and publishes its remove-worker event (unexpected, with its processing task).
        for i, w in enumerate(workers):
            w.kill()
            if i % max(1, n // 100) == 0:
                await asyncio.sleep(1 / 100)
        template = example_report(exitcode=-9, time=t0)
        plan = [(rng.uniform(0, spread), w) for w in workers]
        plan += [(rng.uniform(0, spread), w) for w in rng.sample(workers, n // 20)]  # repeats
        plan.sort(key=lambda p: p[0])
        start = time.monotonic()
        removals = len(lags)  # the probes after this one saw the reports
        for at, w in plan:
            delay = start + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            report = dict(template, worker=w.address, nanny=w.nanny, name=w.name, pid=w.pid)
            # Through the plugin's own RPC handler, from the nanny's host.
            sender = SimpleNamespace(peer_address=f"{w.nanny.rsplit(':', 1)[0]}:50000")
            await plugin.report(comm=sender, report=encode(report))
        await asyncio.sleep(plugin.core.pairing.grace + 1.5)  # every decision taken
        probing = False
        await probe_task
        rss1 = psutil.Process().memory_info().rss
        await asyncio.to_thread(plugin.store.flush)
        events = await asyncio.to_thread(plugin.store.events, limit=None)
        stats = plugin.metrics_snapshot()
        await client.cancel(futures)
        await farm.close()
    causes: dict[str, int] = {}
    for e in events:
        causes[e.cause] = causes.get(e.cause, 0) + 1
    print(f"workers executing a task when the rack went down: {running} of {n}")
    print(f"deaths {n}, reports sent {len(plan)} ({len(plan) - n} repeats) over {spread:.0f} s")
    print(f"events stored {len(events)} (== deaths: {len(events) == n}); by cause {causes}")
    print(
        f"refused {stats['rejected']}, overflow {stats['overflow']}, "
        f"decided deaths {stats['deaths']}, internal errors {stats['internal_errors']}"
    )
    for label, xs in (("loop lag", lags), ("  over the reports alone", lags[removals:])):
        xs = sorted(xs)
        print(
            f"{label} p50 {statistics.median(xs) * 1e3:.1f} ms, "
            f"p99 {xs[int(len(xs) * 0.99)] * 1e3:.1f} ms, max {xs[-1] * 1e3:.1f} ms"
        )
    print(f"RSS growth {(rss1 - rss0) / 2**20:.1f} MiB")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workers", type=int)
    ap.add_argument("--spread", type=float)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    n = a.workers or (300 if a.quick else 3000)
    spread = a.spread or (6.0 if a.quick else 30.0)
    asyncio.run(main(n, spread, a.seed))
