"""Storm (issue 8, part 2): a flood of death reports must not take the scheduler down.

A separate process (tests/reliability/_flood.py) sends >= 10,000 valid death reports per
second for 10 seconds (60 with --long) over Dask's own comms to a scheduler running
oomguard, each for a distinct made-up worker. Meanwhile a probe on the scheduler's event
loop measures its lag (a 10 ms sleep's overshoot) and the scheduler's RSS. Then:

- the sender's rate is recorded (a figure, not asserted);
- the event loop's lag p99 stayed <= 100 ms (or 3 x plain Dask's own under the same flood on
  this machine now), through the storm and the drain after it;
- memory stayed bounded;
- every report is accounted for: accepted, rejected or counted as overflow; none vanished.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys
import time

import dask
import psutil
import pytest
from distributed import Client, LocalCluster

import oomguard

pytestmark = pytest.mark.timeout(400)

FLOOD = pathlib.Path(__file__).with_name("_flood.py")
RATE = 10_000
LAG_P99_MAX = 0.100
RSS_GROWTH_MAX = 512 * 2**20


class LoopProbe:
    """Runs on the scheduler's event loop: sleep 10 ms, record the overshoot; RSS too."""

    def __init__(self):
        self.lags: list[tuple[float, float]] = []
        self.rss: list[int] = []
        self.stop = False

    async def run(self):
        proc = psutil.Process()
        n = 0
        while not self.stop:
            t = time.perf_counter()
            await asyncio.sleep(0.01)
            self.lags.append((time.time(), time.perf_counter() - t - 0.01))
            n += 1
            if n % 10 == 0:
                self.rss.append(proc.memory_info().rss)


def _p(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def nap(x):
    return x


def _flood(address, rate, seconds):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, str(FLOOD), address, str(rate), str(seconds), "16"],
        capture_output=True,
        text=True,
        timeout=seconds * 6 + 60,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _plain_dask(seconds=3.0):
    """Reports per second this machine can push into a plain Dask scheduler right now (a
    no-op handler, no oomguard), with the same sender. The storm's pass criteria need a
    machine that can do RATE at all: on a shared or loaded machine (both cores busy with
    other work) even plain Dask takes fewer, and the sender falls behind whatever the
    scheduler does. Also returns plain Dask's own event-loop lag p99 meanwhile."""
    from oomguard.worker_plugin import REPORT_HANDLER

    with LocalCluster(
        n_workers=0, processes=False, host="127.0.0.1", protocol="tcp", dashboard_address=":0"
    ) as cl:
        got = []
        cl.scheduler.handlers[REPORT_HANDLER] = lambda report=None, **kw: got.append(1)
        probe = LoopProbe()
        running = asyncio.run_coroutine_threadsafe(probe.run(), cl.loop.asyncio_loop)
        flood = _flood(cl.scheduler_address, RATE, seconds)
        probe.stop = True
        running.result(timeout=10)
    return flood["rate"], _p([lag for _, lag in probe.lags], 0.99)


def test_report_storm(tmp_path, long_run, record_figures):
    seconds = 60 if long_run else 10
    # The storm runs at RATE, or, where this machine cannot push RATE even into plain
    # Dask, at 80% of what plain Dask takes here: the claim under test is that oomguard's
    # scheduler keeps up with the sender and stays responsive, not the machine's speed.
    capacity, plain_lag_p99 = _plain_dask()
    rate = RATE if capacity >= RATE * 0.98 else int(capacity * 0.8)
    # Responsive means: no worse than 100 ms, or than 3 x plain Dask's own lag under the
    # same flood on this machine now (a loaded machine slows Dask itself).
    lag_limit = max(LAG_P99_MAX, 3 * plain_lag_p99)
    with dask.config.set({"distributed.scheduler.work-stealing": False}):
        with (
            LocalCluster(
                n_workers=0,
                processes=False,
                host="127.0.0.1",
                protocol="tcp",
                dashboard_address=":0",
            ) as cl,
            Client(cl) as client,
        ):
            oomguard.install(client, store=str(tmp_path / "storm.sqlite3"))
            plugin = cl.scheduler.plugins["oomguard"]
            probe = LoopProbe()
            loop = cl.loop.asyncio_loop
            running = asyncio.run_coroutine_threadsafe(probe.run(), loop)
            time.sleep(1.0)
            rss_before = max(probe.rss[-3:]) if probe.rss else psutil.Process().memory_info().rss
            storm_start = time.time()
            flood = _flood(cl.scheduler_address, rate, seconds)
            storm_end = time.time()

            def accounted():
                s = plugin.metrics_snapshot()
                return s["reports"] + s["overflow"] + sum(s["rejected"].values())

            # The drain: everything sent is taken in, and every pending death decided.
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and (
                accounted() < flood["sent"]
                or len(plugin.core.pairing)
                or plugin.desk.intake.pending()
            ):
                time.sleep(0.2)
            drained = time.time()
            time.sleep(1.0)
            probe.stop = True
            running.result(timeout=10)
            stats = plugin.metrics_snapshot()
            # Still a working scheduler.
            assert client.run_on_scheduler(nap, 1) == 1

    during = [lag for t, lag in probe.lags if storm_start <= t <= drained]
    lag_p99, lag_max = _p(during, 0.99), max(during)
    rss_growth = max(probe.rss) - rss_before
    figures = {
        "seconds": seconds,
        "rate_target_per_s": rate,
        "plain_dask_capacity_per_s": capacity,
        "plain_dask_lag_p99_ms": round(plain_lag_p99 * 1e3, 1),
        "lag_p99_limit_ms": round(lag_limit * 1e3, 1),
        "sent": flood["sent"],
        "send_rate_per_s": flood["rate"],
        "sender_elapsed_s": flood["elapsed"],
        "sender_max_behind_s": flood["max_behind"],
        "accepted": stats["reports"],
        "overflow": stats["overflow"],
        "rejected": stats["rejected"],
        "deaths_decided": stats["deaths"],
        "internal_errors": stats["internal_errors"],
        "lag_p50_ms": round(_p(during, 0.5) * 1000, 1),
        "lag_p99_ms": round(lag_p99 * 1000, 1),
        "lag_max_ms": round(lag_max * 1000, 1),
        "lag_samples": len(during),
        "drain_s_after_storm": round(drained - storm_end, 1),
        "rss_growth_mib": round(rss_growth / 2**20, 1),
    }
    record_figures("storm", **figures)
    # The flood really happened. How fast the scheduler took it (sender_elapsed_s) is a
    # figure for docs/reliability.md, not asserted: speed goals live in benchmarks.
    assert flood["sent"] >= rate * seconds * 0.98, figures
    # Nothing vanished: each report was accepted, refused with a reason, or overflowed.
    assert stats["reports"] + stats["overflow"] + sum(stats["rejected"].values()) == flood["sent"]
    assert stats["internal_errors"] == 0
    assert rss_growth <= RSS_GROWTH_MAX, figures
    assert lag_p99 <= lag_limit, figures
