"""The signature gauges' refresh and one history query, at the store's full size (issue 28).

    .venv/bin/python benchmarks/bench_gauges.py                    # 1,000,000 events
    .venv/bin/python benchmarks/bench_gauges.py --events 100000    # a quicker run

The store holds --events events under --signatures signatures (each with a 2 KiB example),
the newest --big of them with 70 KiB of evidence each (issue 28's 1,280 events, an 89 MiB
reply). Measured:

- gauge refresh, as the scheduler's gauge loop runs it (`asyncio.to_thread(store.totals)`
  and two gauge sets): the event loop's thread CPU time per refresh (its cost to the loop),
  the longest lag of a 1 ms ticker meanwhile, and the SQL time in the thread; beside it the
  per-row count main used (every signature read with its example and members).
- a query for every event (`limit=None`), as the `oomguard_query` handler answers it: rows
  read under the reply cap, made dicts and packed with msgpack; peak traced memory
  (tracemalloc) and reply size; beside it the uncapped read of the --big events alone.

Targets: <= 5 ms of loop CPU per refresh; a capped reply's peak <= 8x QUERY_MAX_BYTES.
Exits 1 when one is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import tracemalloc

import msgpack

from oomguard._metrics import OomguardMetrics
from oomguard._models import FailureEvent
from oomguard._store import FailureStore
from oomguard.scheduler_plugin._query_bounds import QUERY_MAX_BYTES, bounded

LOOP_MS_TARGET = 5.0


def populate(store: FailureStore, n: int, sigs: int, big: int) -> None:
    example = "Traceback (most recent call last):\n" + '  File "decode.py", line 42\n' * 70
    blob = "x" * (70 * 1024)
    t0 = time.time() - n
    for i in range(n):
        is_big = i >= n - big
        event = FailureEvent(
            "infra",
            "oom_kill",
            f"('load', {i % 200_000})",
            "big" if is_big else f"p{i % 50}",
            f"tcp://10.0.{i % 1000 // 256}.{i % 256}:4000",
            f"10.0.{i % 1000 // 256}.{i % 256}",
            f"{i % sigs:016x}",
            f"MemoryError in parse_block_{i % sigs}",
            {"blob": blob} if is_big else {"oom_kill_delta": 1, "peak_bytes": i},
            time=t0 + i,
        )
        while not store.add(event, example=example if i < sigs else ""):
            store.flush(timeout=600)
        if i % 100_000 == 99_999:
            store.flush(timeout=600)
            print(f"  {i + 1:,} events stored", file=sys.stderr)
    assert store.flush(timeout=600), store.last_error


def old_totals(store: FailureStore) -> tuple[int, int]:
    """The gauge totals as main had it: every signature read as a row."""
    rows = store.signatures(limit=None)
    hosts = [
        store.distinct_counts(r.id)["hosts"] if len(r.hosts) >= store.member_cap else len(r.hosts)
        for r in rows
    ]
    return len(rows), max(hosts, default=0)


async def refresh_cost(store: FailureStore, repeat: int) -> dict[str, float]:
    metrics = OomguardMetrics()
    lags: list[float] = []
    stop = False

    async def ticker() -> None:
        while not stop:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - t - 0.001)

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    loop_cpu, sql = [], []
    for _ in range(repeat):
        lags.clear()
        c0 = time.thread_time()
        t0 = time.perf_counter()
        n, hosts = await asyncio.to_thread(store.totals)  # as gauge_loop does
        metrics.set_signatures(n)
        metrics.set_signature_max_hosts(hosts)
        sql.append(time.perf_counter() - t0)
        # The loop thread's CPU over the refresh, less the ticker's own wakeups.
        loop_cpu.append(time.thread_time() - c0)
        await asyncio.sleep(0.01)
    stop = True
    await tick
    return {
        "loop_cpu_ms": statistics.median(loop_cpu) * 1000,
        "loop_cpu_max_ms": max(loop_cpu) * 1000,
        "sql_ms": statistics.median(sql) * 1000,
        "lag_max_ms": max(lags, default=0.0) * 1000,
    }


def traced(fn):
    tracemalloc.start()
    try:
        t = time.perf_counter()
        out = fn()
        return out, tracemalloc.get_traced_memory()[1], time.perf_counter() - t
    finally:
        tracemalloc.stop()


def reply(store: FailureStore, **filters) -> bytes:
    rows = store.events(**filters)
    return msgpack.packb([r.to_dict() for r in rows])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--signatures", type=int, default=30_000)
    p.add_argument("--big", type=int, default=1_280)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--dir", default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-gauges-", dir=args.dir) as d:
        store = FailureStore(os.path.join(d, "s.sqlite3"), queue_size=200_000)
        store.start()
        t = time.perf_counter()
        populate(store, args.events, args.signatures, args.big)
        print(f"  stored in {time.perf_counter() - t:.0f} s", file=sys.stderr)
        totals = store.totals()
        t = time.perf_counter()
        old = old_totals(store)
        old_s = time.perf_counter() - t
        _, old_peak, _ = traced(lambda: old_totals(store))
        _, new_peak, _ = traced(store.totals)
        cost = asyncio.run(refresh_cost(store, args.repeat))
        capped, capped_peak, capped_s = traced(
            lambda: reply(store, **bounded("events", {"limit": None}))
        )
        big, big_peak, big_s = traced(lambda: reply(store, pipeline="big", limit=None))
        store.close()
    print(
        f"# python benchmarks/bench_gauges.py --events {args.events} "
        f"--signatures {args.signatures} --big {args.big}"
    )
    print(f"gauge totals {totals} (main's per-row count: {old})")
    print(
        f"gauge refresh: loop CPU {cost['loop_cpu_ms']:.2f} ms median, "
        f"{cost['loop_cpu_max_ms']:.2f} ms max; ticker lag max {cost['lag_max_ms']:.2f} ms; "
        f"SQL {cost['sql_ms']:.1f} ms (thread); peak {new_peak:,} bytes"
    )
    print(
        f"main's per-row count: {old_s * 1000:.0f} ms, peak {old_peak / 2**20:.1f} MiB "
        "(in a thread, but holding the GIL for most of it)"
    )
    print(
        f"query limit=None, capped: {len(capped) / 2**20:.1f} MiB reply, "
        f"peak {capped_peak / 2**20:.1f} MiB, {capped_s * 1000:.0f} ms "
        f"(cap {QUERY_MAX_BYTES / 2**20:.0f} MiB of text, 1,000 rows)"
    )
    print(
        f"uncapped read of the {args.big} big events: {len(big) / 2**20:.1f} MiB reply, "
        f"peak {big_peak / 2**20:.1f} MiB, {big_s * 1000:.0f} ms"
    )
    ok = cost["loop_cpu_ms"] <= LOOP_MS_TARGET and capped_peak <= 8 * QUERY_MAX_BYTES
    if not ok:
        print("target missed", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
