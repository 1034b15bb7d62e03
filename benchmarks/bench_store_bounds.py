"""Benchmark what the failure store's bounds cost (issue 28): the byte count of each queued
write in add(), and deleting the least recently seen signatures past max-signatures.

    .venv/bin/python benchmarks/bench_store_bounds.py                    # 100,000 signatures
    .venv/bin/python benchmarks/bench_store_bounds.py --signatures 20000 # quicker

Prints figures and ratios, no targets: add() per event, with the item's byte count and
without (the same encoding, `items.event_item` alone); a commit of 1,000 new signatures on
a store at its bound, against the same commit on an unbounded store. Both run on the
writer's thread, not the event loop, except add().
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import tempfile
import time

from oomguard._models import FailureEvent
from oomguard._store import FailureStore
from oomguard._store.items import event_item, item_size


def event(n: int, sig: str, pad: int = 0) -> FailureEvent:
    return FailureEvent(
        kind="infra",
        cause="oom_kill",
        shard=f"('load', {n})",
        pipeline="nightly",
        worker=f"tcp://10.0.0.{n % 250}:4000",
        host=f"10.0.0.{n % 250}",
        signature_id=sig,
        signature_title=f"MemoryError in {sig}",
        evidence={"n": n, "pad": "x" * pad},
        time=1_790_000_000.0 + n,
    )


def bench_add(n: int) -> None:
    events = [event(i, "sig", pad=2000) for i in range(n)]
    encode, size, add = [], [], []
    for _ in range(5):
        t = time.perf_counter()
        items = [event_item(e, 1, "") for e in events]
        encode.append(time.perf_counter() - t)
        t = time.perf_counter()
        for item in items:
            item_size(item)
        size.append(time.perf_counter() - t)
        store = FailureStore(":memory:", queue_size=n + 1, queue_bytes=2**40)  # not started
        t = time.perf_counter()
        for e in events:
            store.add(e)
        add.append(time.perf_counter() - t)
        store.close()
    us = 1e6 / n
    print(f"add(), 2 KiB evidence, best of 5 (us/event)       {min(add) * us:8.2f}")
    print(f"  of which encoding (event_item)                  {min(encode) * us:8.2f}")
    print(f"  of which the byte count (item_size)             {min(size) * us:8.2f}")


def bench_signatures(existing: int, batches: int) -> None:
    for limit, label in ((10**9, "unbounded"), (existing, "at max-signatures")):
        d = tempfile.mkdtemp(prefix="bench-store-bounds-")
        try:
            store = FailureStore(os.path.join(d, "f.sqlite3"), max_signatures=limit)
            for i in range(existing):
                store.add(event(i, f"s{i}"))
            store.start()
            assert store.flush(120)
            times = []
            for b in range(batches):
                for i in range(1000):
                    store.add(event(existing + b * 1000 + i, f"new{b}-{i}"))
                t = time.perf_counter()
                assert store.flush(120)
                times.append((time.perf_counter() - t) * 1000)
            store.close()
            conn = sqlite3.connect(store.path)
            rows = conn.execute("SELECT count(*) FROM signatures").fetchone()[0]
            conn.close()
            print(
                f"commit of 1,000 new signatures on {existing:,}, {label:17s}: "
                f"median {statistics.median(times):6.1f} ms ({rows:,} rows after)"
            )
        finally:
            shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--signatures", type=int, default=100_000)
    p.add_argument("--events", type=int, default=50_000, help="events for the add() figure")
    p.add_argument("--batches", type=int, default=10)
    args = p.parse_args()
    bench_add(args.events)
    bench_signatures(args.signatures, args.batches)


if __name__ == "__main__":
    main()
