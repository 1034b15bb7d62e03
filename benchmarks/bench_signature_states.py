"""Benchmark what signature states and versions cost (issue 40), on a SQLite store with a
fleet's history: `--deaths` deaths over the last 48 hours (a third of them in one hot
signature), on `--signatures` signatures, each with its event.

1. Per death written: deaths recorded in batches of 1,000 with the writer's state work
   (the batch's regression check) and without it (`states.regress` off), interleaved;
   half the signatures resolved, so the check finds regressions.
2. Per query: `signatures(limit=100)` (the report's and the dashboard's page), the hot
   signature alone (`signature(id)`: its rates counted over ~35,000 deaths), and the
   `signature=` filters of `deaths()` and `events()`, each with the states and the old
   ids' lookup and without (`states.attach` and `aliases.signature_ids` off), interleaved.
3. An alias fold: an old signature of 10,000 deaths into a new one (`aliases.record`).

    .venv/bin/python benchmarks/bench_signature_states.py
    .venv/bin/python benchmarks/bench_signature_states.py --deaths 20000   # quicker

Prints figures and ratios, no targets; each figure the median of `--rounds`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

from oomguard._death.record import Death, Role, Task
from oomguard._models import FailureEvent
from oomguard._store import FailureStore, batch, reads

HOT = "sig-hot"


def death(n: int, sig: str, t: float) -> tuple[Death, list[FailureEvent]]:
    d = Death(
        id=f"d{n}",
        cluster="bench",
        worker=f"tcp://10.0.{n % 250}.1:4000",
        host=f"host-{n % 250}",
        time=t,
        cause="oom_kill",
        tasks=(Task(key=f"('load', {n})", prefix="load", role=Role.CULPRIT, pipeline="etl"),),
        signature_id=sig,
        signature_title=f"oom_kill in {sig}",
    )
    event = FailureEvent(
        "infra", "oom_kill", f"('load', {n})", "etl", d.worker, d.host, sig, d.signature_title,
        {}, 1, t, cluster="bench", death=d.id,
    )  # fmt: skip
    return d, [event]


def fill(store: FailureStore, first: int, n: int, signatures: int, now: float) -> None:
    """`n` deaths from number `first`, over the last 48 h; a third in the hot signature."""
    for i in range(first, first + n):
        sig = HOT if i % 3 == 0 else f"sig-{i % signatures}"
        d, events = death(i, sig, now - 48 * 3600 * ((i * 7919) % n) / n)
        assert store.record(d, events), store.last_error
        if i % 5000 == 4999:
            assert store.flush(600)
    assert store.flush(600)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deaths", type=int, default=100_000)
    p.add_argument("--signatures", type=int, default=1_000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="oomguard-bench-states-")
    store = FailureStore(os.path.join(tmp, "s.sqlite3"), max_events=10_000_000)
    store.start()
    now = time.time()
    try:
        t = timed(lambda: fill(store, 0, args.deaths, args.signatures, now))
        print(f"history: {args.deaths} deaths on {args.signatures + 1} signatures in {t:.1f} s")
        for i in range(0, args.signatures, 2):
            store.resolve(f"sig-{i}", note="bench", by="bench", at=now - 3600)
        regress, attach, ids = batch._states.regress, reads.attach, reads.signature_ids
        off = {
            "regress": lambda *a: 0,
            "attach": lambda rows, *a, **k: list(rows),
            "ids": lambda run, m, value: value,
        }

        def switch(on: bool) -> None:
            batch._states.regress = regress if on else off["regress"]
            reads.attach = attach if on else off["attach"]
            reads.signature_ids = ids if on else off["ids"]

        # 1. Per death written, batches of 1,000.
        write = {True: [], False: []}
        n = args.deaths
        for _ in range(args.rounds):
            for on in (True, False):
                switch(on)
                start = n
                n += 1000
                write[on].append(timed(lambda s=start: fill(store, s, 1000, args.signatures, now)))
        switch(True)
        per = {on: median(v) / 1000 * 1e6 for on, v in write.items()}
        print(
            f"1. per death written: {per[True]:.1f} us with states, {per[False]:.1f} us "
            f"without ({per[True] / per[False]:.2f}x); regressions found: {store.regressions}"
        )
        # 2. Per query.
        cases = {
            "signatures(limit=100)": lambda: store.signatures(limit=100),
            "signature(hot)": lambda: store.signature(HOT),
            "deaths(signature=hot, limit=100)": lambda: store.deaths(signature=HOT, limit=100),
            "events(signature=hot, limit=100)": lambda: store.events(signature=HOT, limit=100),
        }
        hot = store.signature(HOT)
        print(
            f"2. per query (the hot signature: {hot.last_hour} in the last hour, "
            f"{hot.hourly:g} an hour before, {hot.state}):"
        )
        for name, fn in cases.items():
            got = {True: [], False: []}
            for _ in range(args.rounds):
                for on in (True, False):
                    switch(on)
                    got[on].append(timed(fn))
            switch(True)
            a, b = median(got[True]) * 1e3, median(got[False]) * 1e3
            print(f"   {name:34s} {a:8.2f} ms with states, {b:8.2f} ms without ({a / b:.2f}x)")
        # 3. One alias fold: an old signature of 10,000 deaths into a new one.
        for i in range(10_000):
            d, events = death(10_000_000 + i, "sig-old", now - 3600 - i)
            store.record(d, events)
        assert store.flush(600)
        t0 = time.perf_counter()
        store.record(
            *death(20_000_000, "sig-new", now), aliases=[("sig-old", 1)], grouping_version=2
        )
        assert store.flush(600)
        fold = time.perf_counter() - t0
        row = store.signature("sig-old")
        print(
            f"3. a fold of 10,000 deaths' signature into a new one: {fold * 1e3:.1f} ms "
            f"(the commit of one death with its alias); count now {row.count}, "
            f"old ids {row.aliases}"
        )
    finally:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
