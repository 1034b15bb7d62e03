"""What incidents and related signatures cost (issue 40): grouping per death in the decision
core, the store's work per batch (crash sites and links), and the reads per query.

    .venv/bin/python benchmarks/bench_incidents.py [--deaths 100000] [--signatures 10000]

1. Grouping: `Incidents.assign` alone, per death (a stream of deaths on 50 hosts, a third
   of them in bursts of three); then the decision core deciding a death (a removal and its
   report) with the incident named and without (`named` replaced by the identity), in
   alternation (A B B A ...): the ratio is what naming the incident adds to deciding.
2. Writes: `record()` of deaths that carry crash sites and incidents of three, and of the
   same deaths with neither, committed in batches of 500, in alternation: deaths/s each,
   first of mostly new signatures in incidents of three different ones (the worst case:
   every death makes links), then of the same signatures again, one per incident.
3. Reads, on a store of `--deaths` deaths (in incidents of one to three) under
   `--signatures` signatures (each at one of 500 crash sites, so most have related ones):
   `incidents()` of 100 and 1,000, `signatures()` of 100 and one `signature()` (each with
   its related ones), beside `deaths()` of 100 as a yardstick; medians of 7.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import statistics
import tempfile
import time

from oomguard._death.record import Attribution, Death, Role, Task
from oomguard._decide import DecisionCore, Removal
from oomguard._decide.incidents import Incidents
from oomguard._models import FailureEvent
from oomguard._store import FailureStore, query
from oomguard._store.links import SQLITE_RELATED
from oomguard._store.reads import _SELECT_SIGNATURE, SQLITE

UNKNOWN = Attribution("unknown", "inferred", "likely", "SIGKILL from an unknown sender")
T0 = 1_790_000_000.0


def median_ms(fn, repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def stream(n: int, rng: random.Random) -> list[Death]:
    """`n` deaths on 50 hosts over time, a third of them in bursts of three on one host."""
    out, t = [], T0
    while len(out) < n:
        t += rng.expovariate(1.0)
        host = f"h{rng.randrange(50)}"
        for j in range(3 if rng.random() < 0.1 else 1):
            i = len(out)
            out.append(Death(id=f"d{i}", worker=f"tcp://w{i}", host=host, cause="sigkill",
                             time=t + j / 10, killer=UNKNOWN))  # fmt: skip
    return out[:n]


def grouping(n: int) -> None:
    deaths = stream(n, random.Random(0))
    inc = Incidents()
    t = time.perf_counter()
    for d in deaths:
        inc.assign(d, now=d.time)
    per = (time.perf_counter() - t) / n * 1e6
    print(f"  Incidents.assign: {per:.2f} µs per death ({n:,} deaths, {len(inc)} left open)")


def core_rounds(n: int, named: bool) -> float:
    """Seconds to decide `n` deaths (removal, then its report) in a fresh core."""
    c = DecisionCore(allowed_failures=10**9, grace=5.0, max_shard_infra_failures=10**9)
    if not named:
        c.incidents.named = lambda record, now: record
    keys = [f"load-{i}" for i in range(n)]
    c.submitted(keys, keys, {}, now=0.0)
    start = time.perf_counter()
    for i, key in enumerate(keys):
        worker, at = f"tcp://10.0.0.{i % 50}:{4000 + i}", T0 + i / 3
        c.removed(Removal(worker, f"h{i % 50}", at, {key: key}, pid=i + 1), now=at)
        report = Death(worker=worker, host=f"h{i % 50}", pid=i + 1, cause="sigkill", time=at,
                       killer=UNKNOWN, tasks=(Task(key, "load"),))  # fmt: skip
        c.reported(report, now=at)
    return time.perf_counter() - start


def deciding(n: int) -> None:
    arms: dict[bool, list[float]] = {True: [], False: []}
    for named in (True, False, False, True, True, False):
        arms[named].append(core_rounds(n, named) / n * 1e6)
    w, wo = statistics.median(arms[True]), statistics.median(arms[False])
    print(
        f"  decide a death, incident named: {w:.1f} µs, without: {wo:.1f} µs, "
        f"ratio {w / wo:.3f} ({n:,} deaths per round, medians of 3)"
    )


def death(i: int, rng: random.Random, signatures: int, linked: bool, mixed: bool) -> tuple:
    """Death `i`, in incidents of three (`linked`: with its crash sites and incident, else
    neither); `mixed`: each death of an incident its own random signature (the worst case
    for links), else one signature per incident (the usual case: one cause, one crash)."""
    sig = rng.randrange(signatures) if mixed else (i // 3 * 7919) % signatures
    d = Death(
        id=f"d{i}",
        cluster="c",
        worker=f"tcp://w{i % 200}:{4000 + i}",
        host=f"h{i % 50}",
        cause="native_crash",
        time=T0 + i,
        killer=UNKNOWN,
        signature_id=f"sig{sig:05d}",
        signature_title=f"SIGSEGV in app.f{sig}",
        incident=f"d{i - i % 3}" if linked else "",
        sites=(f"SIGSEGV in lib.site{sig % 500}", f"SIGSEGV in app.f{sig}") if linked else (),
        tasks=(Task(f"('k', {i})", "k", role=Role.CULPRIT, pipeline="p"),),
    )
    event = FailureEvent(
        "infra", d.cause, f"('k', {i})", "p", d.worker, d.host, d.signature_id,
        d.signature_title, {}, 1, d.time, killer="unknown", cluster="c", death=d.id,
    )  # fmt: skip
    return d, [event]


def fill(
    store: FailureStore, n: int, signatures: int, linked: bool, mixed: bool, first: int = 0
) -> float:
    """Deaths/s of `n` deaths recorded in batches of 500."""
    rng = random.Random(first)
    start = time.perf_counter()
    for i in range(first, first + n):
        assert store.record(*death(i, rng, signatures, linked, mixed)), store.last_error
        if i % 500 == 499:
            assert store.flush(), store.last_error
    assert store.flush(), store.last_error
    return n / (time.perf_counter() - start)


def writes(d: str, n: int, signatures: int) -> None:
    """Two passes per store: `n` deaths whose signatures are mostly new, in mixed incidents;
    then `n` more of the same signatures, one per incident (what a fleet mostly sees)."""
    rates: dict[tuple[bool, str], list[float]] = {}
    for k, linked in enumerate((True, False, False, True)):
        store = FailureStore(os.path.join(d, f"w{k}.sqlite3"), batch_interval=0.01)
        store.start()
        try:
            first = fill(store, n, signatures, linked, mixed=True)
            again = fill(store, n, signatures, linked, mixed=False, first=n)
        finally:
            store.close()
        rates.setdefault((linked, "new"), []).append(first)
        rates.setdefault((linked, "recurring"), []).append(again)
    for phase in ("new", "recurring"):
        w = statistics.median(rates[(True, phase)])
        wo = statistics.median(rates[(False, phase)])
        print(
            f"  record(), {phase} signatures: {w:,.0f} deaths/s with sites and incidents, "
            f"{wo:,.0f} without, ratio {w / wo:.3f} ({n:,} deaths, {signatures:,} signatures)"
        )


def reads(d: str, n: int, signatures: int) -> None:
    store = FailureStore(os.path.join(d, "r.sqlite3"), batch_interval=0.01)
    store.start()
    try:
        fill(store, n, signatures, True, mixed=True)
        top = store.signatures(limit=1)[0].id
        linked = sum(1 for s in store.signatures(limit=None) if s.related)
        print(f"  store: {n:,} deaths, {signatures:,} signatures, {linked:,} with related ones")
        # The signatures' query as it was before related ones: the same rows, one column less.
        conn = sqlite3.connect(store.file)
        plain = _SELECT_SIGNATURE.replace(f", {SQLITE_RELATED}", "")
        sql, params = query.signatures(SQLITE, plain, cause=None, pipeline=None, cluster=None,
                                       since=None, cap=1000, limit=100, offset=0)  # fmt: skip
        for name, fn in (
            ("incidents(limit=100)", lambda: store.incidents(limit=100)),
            ("incidents(limit=1000)", lambda: store.incidents(limit=1000)),
            ("signatures(limit=100), with related", lambda: store.signatures(limit=100)),
            ("  its SQL without related", lambda: conn.execute(sql, params).fetchall()),
            ("signature(id), with related", lambda: store.signature(top)),
            ("deaths(limit=100), the yardstick", lambda: store.deaths(limit=100)),
        ):
            print(f"  {name:<38} {median_ms(fn):8.2f} ms")
        conn.close()
    finally:
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--deaths", type=int, default=100_000)
    ap.add_argument("--signatures", type=int, default=10_000)
    args = ap.parse_args()
    print(f"bench_incidents.py --deaths {args.deaths} --signatures {args.signatures}")
    print("grouping (the decision core):")
    grouping(args.deaths)
    deciding(min(args.deaths, 20_000))
    with tempfile.TemporaryDirectory() as d:
        print("writes (the store's writer thread):")
        writes(d, min(args.deaths, 20_000), args.signatures)
        print("reads:")
        reads(d, args.deaths, args.signatures)


if __name__ == "__main__":
    main()
