"""A rack failure: thousands of workers removed at once, their reports in any order and delay.

    .venv/bin/python benchmarks/bench_rack_failure.py              # 3,000 workers, reports over 30 s
    .venv/bin/python benchmarks/bench_rack_failure.py --quick      # 300 workers, reports over 6 s

A real Scheduler (in this process, no workers) with the oomguard scheduler plugin installed
the way users do. Its hooks are fed what Dask gives them when a rack goes down: N
`remove-worker` events within 1 s (each worker was running one task), then N death reports
through the plugin's own RPC handler at uniformly random times over the next `--spread`
seconds (so most arrive after the 5 s grace timeout and amend a `worker_lost` decision), 5 %
of them twice. A probe coroutine measures the event loop's lag every 10 ms.

Prints: events stored vs deaths (must be equal: each death decided once, with its real
cause), what was refused by reason, loop lag p50/p99/max, RSS growth. Target (a goal, not a
test): events == deaths, 0 worker_lost left, lag p99 <= 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from types import SimpleNamespace

import psutil
from distributed import Client, LocalCluster

from oomguard._death.build import example_report
from oomguard._death.wire import encode
from oomguard.scheduler_plugin import OomguardSchedulerPlugin


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
        lags: list[float] = []
        running = True

        async def probe():
            while running:
                t = time.monotonic()
                await asyncio.sleep(0.01)
                lags.append(time.monotonic() - t - 0.01)

        probe_task = asyncio.create_task(probe())
        rss0 = psutil.Process().memory_info().rss
        workers = [f"tcp://127.0.0.{1 + i // 60000}:{1024 + i % 60000}" for i in range(n)]
        t0 = time.time()
        for i, w in enumerate(workers):  # the rack: N removals within 1 s
            plugin.log_event(
                "all",
                {
                    "action": "remove-worker",
                    "worker": w,
                    "expected": False,
                    "processing-tasks": [f"('load-{i}', {i})"],
                },
            )
            if i % max(1, n // 100) == 0:
                await asyncio.sleep(1 / 100)
        template = example_report(**{"time": t0})
        sender = SimpleNamespace(peer_address="tcp://127.0.0.1:50000")
        plan = [(rng.uniform(0, spread), w) for w in workers]
        plan += [(rng.uniform(0, spread), w) for w in rng.sample(workers, n // 20)]  # repeats
        plan.sort()
        start = time.monotonic()
        for at, w in plan:
            delay = start + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            report = dict(
                template,
                worker=w,
                executing=[
                    {
                        **template["executing"][0],
                        "key": f"('load-{workers.index(w)}', {workers.index(w)})",
                    }
                ]
                if template["executing"]
                else [],
            )
            await plugin.report(comm=sender, report=encode(report))
        await asyncio.sleep(plugin.core.pairing.grace + 1.5)  # every decision taken
        running = False
        await probe_task
        rss1 = psutil.Process().memory_info().rss
        await asyncio.to_thread(plugin.store.flush)
        events = await asyncio.to_thread(plugin.store.events, limit=None)
        stats = plugin.metrics_snapshot()
    causes: dict[str, int] = {}
    for e in events:
        causes[e.cause] = causes.get(e.cause, 0) + 1
    lags.sort()
    print(f"deaths {n}, reports sent {len(plan)} ({len(plan) - n} repeats) over {spread:.0f} s")
    print(f"events stored {len(events)} (== deaths: {len(events) == n}); by cause {causes}")
    print(
        f"refused {stats['rejected']}, overflow {stats['overflow']}, "
        f"decided deaths {stats['deaths']}, internal errors {stats['internal_errors']}"
    )
    print(
        f"loop lag p50 {statistics.median(lags) * 1e3:.1f} ms, "
        f"p99 {lags[int(len(lags) * 0.99)] * 1e3:.1f} ms, max {lags[-1] * 1e3:.1f} ms"
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
