"""Benchmark the PostgreSQL history the way schedulers feed it (issue 29).

Events are added from inside a running asyncio loop, as the scheduler plugin does, with
bench_store's generator (1,000 hosts, 200 signatures, 200,000 shards); the spool (SQLite)
commits them and the shipper sends them to a real PostgreSQL (Debian's, started here on a
loopback port as tests/pg_lab.py does, or --url).

1. One scheduler: events/s into the history (add -> in PostgreSQL), and the event loop's
   longest stall with the shipper beside the spool against the spool alone, interleaved.
2. Four schedulers at once (four processes, one spool each, one database): events/s.
3. Queries over the history the one scheduler wrote, each the median of 5.
4. The driver: one batch of rows sent by psycopg's COPY (what the shipper does), by
   psycopg's executemany, and by asyncpg's copy_records_to_table when it is installed.

    .venv/bin/python benchmarks/bench_history.py                 # 1,000,000 events
    .venv/bin/python benchmarks/bench_history.py --events 100000

Targets: >= 10,000 events/s into PostgreSQL from one scheduler and from four at once;
queries <= 100 ms; the loop's longest stall with the shipper within 1.5x of without (and
<= 50 ms). Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "tests")]

import bench_store  # noqa: E402

from oomguard._store import FailureStore  # noqa: E402
from oomguard._store.pg import PgReader, Shipper, pg_connect  # noqa: E402
from oomguard._urls import redact  # noqa: E402

TARGETS = {"events_per_s": 10_000, "query_ms": 100, "stall_ratio": 1.5, "stall_ms": 50}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--url", default=None, help="a database to use (default: start one)")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child of step 2
    return p.parse_args(argv)


def feed(path: str, url: str | None, events: int, cluster: str) -> dict:
    """One scheduler's ingest into a fresh spool (and the history at `url`, if any)."""
    args = bench_store.parse_args(["--events", str(events)])
    spool = FailureStore(path, max_events=max(events, 1))
    spool.start()
    shipper = None
    if url is not None:
        shipper = Shipper(spool, url, cluster)
        shipper.start()
    hosts, workers, sigs, titles, pipes, example = bench_store.pools(args)
    t0 = time.perf_counter()
    result = asyncio.run(
        bench_store.ingest(
            spool, args, hosts, workers, sigs, titles, pipes, example, psutil.Process(), cluster
        )
    )
    if shipper is not None:
        assert shipper.sync(3600), shipper.last_error
        result["sent_per_s"] = events / (time.perf_counter() - t0)
        result["sent"] = shipper.sent
        shipper.close()
    spool.close()
    return result


def interleaved(url: str, events: int, tmp: str) -> tuple[dict, list, list]:
    """Step 1: spool alone / with the shipper, alternately, twice each."""
    alone, shipped = [], []
    main = None
    for round_ in range(2):
        for with_history in (False, True):
            path = os.path.join(tmp, f"s{round_}{int(with_history)}.sqlite3")
            target = None
            if with_history:
                target = url if round_ == 0 else _new_database(url, f"again{round_}")
            r = feed(path, target, events, "one")
            (shipped if with_history else alone).append(r)
            if with_history and round_ == 0:
                main = r
    return main, alone, shipped


def four(url: str, events: int, tmp: str) -> float:
    """Step 2: four scheduler processes at once; events/s over all of them."""
    db = _new_database(url, "four")
    each = events // 4
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--one", "--events", str(each), "--url", db],
            env={**os.environ, "BENCH_SPOOL": os.path.join(tmp, f"four{i}.sqlite3")},
        )
        for i in range(4)
    ]
    assert all(p.wait() == 0 for p in procs)
    elapsed = time.perf_counter() - t0
    with pg_connect(db) as conn:
        (n,) = conn.execute("SELECT count(*) FROM events").fetchone()
    assert n == 4 * each, (n, 4 * each)
    return 4 * each / elapsed


def queries(url: str) -> dict[str, tuple[float, int]]:
    reader = PgReader(url)
    reader.start()
    probe = "('load-parquet', 31)"
    q = {
        "signatures(limit=20)": lambda: reader.signatures(limit=20),
        "signatures(cause=, limit=20)": lambda: reader.signatures(cause="native_crash", limit=20),
        "signatures(cluster=, limit=20)": lambda: reader.signatures(cluster="one", limit=20),
        "events(shard=)": lambda: reader.events(shard=probe),
        "events(limit=1000)": lambda: reader.events(limit=1000),
        "events(cause=, limit=100)": lambda: reader.events(cause="memory_error", limit=100),
        "events(cluster=, limit=100)": lambda: reader.events(cluster="one", limit=100),
        "pipelines()": lambda: reader.pipelines(),
        "known(pipeline)": lambda: reader.known("pipeline", "nightly-load-3"),
        "totals()": lambda: [reader.totals()],
    }
    out = {}
    try:
        for name, fn in q.items():
            runs = []
            for _ in range(5):
                t = time.perf_counter()
                rows = fn()
                runs.append((time.perf_counter() - t) * 1000)
            out[name] = (statistics.median(runs), len(rows))
    finally:
        reader.close()
    return out


def drivers(url: str, n: int = 50_000) -> dict[str, float]:
    """Step 4: rows/s of one batch by each way of sending it."""
    rows = [(i, "c", 1.0 + i, "infra", "oom_kill", f"s{i}", "p", "w", "h", "sig", "t", "{}")
            for i in range(n)]  # fmt: skip
    cols = "id, cluster, time, kind, cause, shard, pipeline, worker, host, sig, title, ev"
    ddl = ("CREATE TABLE IF NOT EXISTS public.drv (id bigint, cluster text, time float8, "
           "kind text, cause text, shard text, pipeline text, worker text, host text, "
           "sig text, title text, ev text)")  # fmt: skip
    out = {}
    with pg_connect(url) as conn:
        conn.execute(ddl)
        conn.commit()
        for name in ("psycopg COPY", "psycopg executemany"):
            conn.execute("TRUNCATE public.drv")
            t = time.perf_counter()
            with conn.cursor() as cur:
                if name == "psycopg COPY":
                    with cur.copy(f"COPY public.drv ({cols}) FROM STDIN") as copy:
                        for r in rows:
                            copy.write_row(r)
                else:
                    marks = ", ".join(["%s"] * 12)
                    cur.executemany(f"INSERT INTO public.drv VALUES ({marks})", rows)
            conn.commit()
            out[name] = n / (time.perf_counter() - t)
    try:
        import asyncpg
    except ImportError:
        out["asyncpg copy_records_to_table"] = float("nan")
        return out

    async def by_asyncpg() -> float:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("TRUNCATE public.drv")
            t = time.perf_counter()
            await conn.copy_records_to_table("drv", records=rows, schema_name="public")
            return n / (time.perf_counter() - t)
        finally:
            await conn.close()

    out["asyncpg copy_records_to_table"] = asyncio.run(by_asyncpg())
    return out


def _new_database(url: str, name: str) -> str:
    import urllib.parse

    with pg_connect(url) as conn:
        conn.autocommit = True
        conn.execute(f"DROP DATABASE IF EXISTS bench_{name}")
        conn.execute(f"CREATE DATABASE bench_{name}")
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path=f"/bench_{name}"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one:
        feed(os.environ["BENCH_SPOOL"], args.url, args.events, f"c{os.getpid()}")
        return 0
    lab = None
    url = args.url
    if url is None:
        from pg_lab import PostgresLab

        lab = PostgresLab(durable=True)  # fsync and synchronous commit, as in production
        lab.start()
        url = lab.create_database()
    tmp = tempfile.mkdtemp(prefix="bench-history-")
    try:
        main_run, alone, shipped = interleaved(url, args.events, tmp)
        per_s_four = four(url, args.events, tmp)
        timings = queries(url)
        by_driver = drivers(url, min(args.events, 50_000))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if lab is not None:
            lab.close()
    stall_alone = max(r["stall_ms"] for r in alone)
    stall_shipped = max(r["stall_ms"] for r in shipped)
    ratio = stall_shipped / max(stall_alone, 1.0)
    argv = [redact(a) if "://" in a else a for a in sys.argv]  # no password in the output
    print(f"# {' '.join([os.path.basename(sys.executable), *argv])}")
    print(f"# {args.events:,} events; python {sys.version.split()[0]}; {os.cpu_count()} cpus")
    rows = [
        ("events/s into PostgreSQL, one scheduler (add -> in the history)",
         f"{main_run['sent_per_s']:,.0f}", ">= 10,000",
         main_run["sent_per_s"] >= TARGETS["events_per_s"]),
        ("events/s into PostgreSQL, four schedulers at once", f"{per_s_four:,.0f}", ">= 10,000",
         per_s_four >= TARGETS["events_per_s"]),
        ("events/s into the spool alone / with the shipper",
         f"{alone[0]['events_per_s']:,.0f} / {shipped[0]['events_per_s']:,.0f}", "", None),
        ("longest loop stall, spool alone / with the shipper (ms)",
         f"{stall_alone:.1f} / {stall_shipped:.1f}", "<= 1.5x", ratio <= TARGETS["stall_ratio"]
         or stall_shipped <= TARGETS["stall_ms"]),
        ("p99 loop lateness, alone / with (ms)",
         f"{max(r['stall_p99_ms'] for r in alone):.1f} / "
         f"{max(r['stall_p99_ms'] for r in shipped):.1f}", "", None),
    ]  # fmt: skip
    for name, (median, n) in timings.items():
        rows.append((f"{name}: median (ms), rows={n}", f"{median:.1f}", "<= 100",
                     median <= TARGETS["query_ms"]))  # fmt: skip
    for name, per_s in by_driver.items():
        value = "not installed" if per_s != per_s else f"{per_s:,.0f}"
        rows.append((f"driver: {name}, rows/s", value, "", None))
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'value':>20}  {'target':>10}  ok")
    failed = False
    for name, value, target, ok in rows:
        failed |= ok is False
        mark = "" if ok is None else ("yes" if ok else "NO")
        print(f"{name:<{width}}  {value:>20}  {target:>10}  {mark}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
