"""What one refresh of oomguard's dashboard page costs, and the store-derived metric gauges.

    .venv/bin/python benchmarks/bench_dashboard.py [--events 100000] [--signatures 1000]

Each event is a worker death's (one task each), stored as the scheduler stores it.

The page reads the store in a thread (`read_store`) only when something was written or
every 30 s, then shapes the rows on the event loop (`failure_columns`, `signature_columns`).
`FailureStore.totals` feeds oomguard_signatures / oomguard_signature_max_hosts.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time

from oomguard._death.record import Death, Role, Task
from oomguard._models import FailureEvent
from oomguard._store import FailureStore
from oomguard.scheduler_plugin._dashboard_data import (
    failure_columns,
    read_store,
    signature_columns,
)


def timed(fn, repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--signatures", type=int, default=1000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        store = FailureStore(os.path.join(d, "s.sqlite3"))
        store.start()
        now = time.time()
        rng = random.Random(0)
        for i in range(args.events):
            sig = f"sig{i % args.signatures}"
            when = now - rng.random() * 86400
            death = Death(
                id=f"d{i}",
                worker=f"tcp://w{i % 50}",
                host=f"h{i % 20}",
                cause="oom_kill",
                time=when,
                tasks=(Task(f"('k', {i})", role=Role.CULPRIT, pipeline="p"),),
                evidence={"oom_kill_delta": 1},
                signature_id=sig,
                signature_title=f"title {sig}",
            )
            event = FailureEvent(
                "infra",
                "oom_kill",
                f"('k', {i})",
                "p",
                death.worker,
                death.host,
                sig,
                f"title {sig}",
                {"oom_kill_delta": 1},
                time=when,
                death=death.id,
            )
            store.record(death, [event], example="trace line\n" * 20)
        store.flush(timeout=120)
        snap = read_store(store, time.time())
        rows = [
            ("read_store (thread)", timed(lambda: read_store(store, time.time()))),
            (
                "shape rows (event loop)",
                timed(
                    lambda: (
                        failure_columns(snap.failures(), time.time()),
                        signature_columns(snap.signatures),
                    )
                ),
            ),
            ("store.totals (thread)", timed(store.totals)),
        ]
        store.close()
    print(
        f"# python benchmarks/bench_dashboard.py --events {args.events} "
        f"--signatures {args.signatures}"
    )
    print(f"{'step':28s} {'median ms':>10s}")
    for name, ms in rows:
        print(f"{name:28s} {ms:10.1f}")


if __name__ == "__main__":
    main()
