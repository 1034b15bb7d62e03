"""Scale run of the scheduler side: 2,000 workers, 200,000 tasks in 500 pipelines, 300 deaths.

    .venv/bin/python benchmarks/bench_scale.py            # 2,000 workers; rounds A B B A
    .venv/bin/python benchmarks/bench_scale.py --quick    # 200 workers, 20,000 tasks, A B

What is real: the scheduler. Each round starts a fresh `dask scheduler` process (the CLI,
TCP on 127.0.0.1, no dashboard) with, in the "with" arm, `--preload
oomguard.scheduler_plugin` as users load it, and in both arms `_loop_probe.py` (loop lag
every 10 ms, CPU per thread, GC pauses, RSS; in the "with" arm also the CPU spent inside
oomguard's hooks). A real `distributed.Client` submits the graphs; every message between
scheduler, client and workers goes over real TCP comms through Dask's own serialisation,
batched streams, queuing, work stealing and heartbeats. Death reports are built by
oomguard's `build_report`, msgpack-encoded and sent to the plugin's `oomguard_death_report`
RPC over TCP, as a nanny sends them.

What is simulated: the workers and nannies (`_fake_workers.py`), all in this process, each
worker with its own TCP stream to the scheduler. They register, take tasks, "run" each for
a while (`--task-ms`, a sleep), answer `task-finished`, heartbeat, die (the connection is
aborted, as when a process is killed) and restart ~1 s later under a new port and pid, as
a nanny restarts them; they never run task code nor move data. Real `distributed.Worker`
objects were not used: each brings a system monitor, periodic callbacks, a thread pool and
a listener, and 2,000 of them on this 2-core machine would measure the workers, not the
scheduler.

The workload: `--pipelines` pipelines, each submitted under its own `distributed.span`
(oomguard names the pipeline from the span), each a fan-in graph of library functions:
leaf `load` tasks summed 8 at a time down to one output. A tenth of the workers have twice
the memory limit of the others. `--deaths` deaths at evenly spaced points of the
workload's progress, death i on host i % `--hosts` (the report's `host` field; each host
also has its own loopback address, so Dask sees `--hosts` hosts); one in five is a kernel
OOM kill of a task with the same sampled stack (one signature across many hosts; the shard
is then retried on the larger workers), the rest SIGKILLs. No shard dies twice, so nothing
is aborted and the workload is the same with and without oomguard; without it the same
deaths happen, only no report is sent.

Rounds alternate A B B A (`--rounds` pairs). Per round, from the first submission to the
last output: wall time; the scheduler process's CPU time (all its threads, oomguard's
intake and store threads too), also net of its idle rate (heartbeats, measured for
`--idle` seconds before) times the wall time; its loop thread's CPU; GC time; loop lag,
raw and net of the time the loop's thread waited for a CPU (the machine is shared); RSS.
Each "with" round then checks the invariant (a failure exits 1): one stored event per
death, each dead worker exactly once, with its cause, its shard, its pipeline and its host;
the OOM kills under one signature whose hosts are theirs.

Targets (goals; printed PASS/MISS, exit 0): scheduler CPU and wall-time ratio (median with
/ median without) <= 1.05; loop lag p99 <= 100 ms in every "with" round.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import operator
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import distributed
from distributed import Client

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _fake_workers import Farm  # noqa: E402 (found through the path above)
from _loop_probe import HANDLER as PROBE  # noqa: E402

TARGET_RATIO = 1.05
TARGET_LAG_P99 = 0.100
FANIN = 8


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CI-sized run")
    p.add_argument("--workers", type=int, help="default 2000 (--quick 200)")
    p.add_argument("--tasks", type=int, help="about this many tasks (default 200000)")
    p.add_argument("--pipelines", type=int, help="default 500 (--quick 50)")
    p.add_argument("--deaths", type=int, help="default 300 (--quick 30)")
    p.add_argument("--hosts", type=int, default=50)
    p.add_argument(
        "--task-ms",
        type=int,
        nargs=2,
        metavar=("MIN", "MAX"),
        help="simulated task duration, uniform (default 1000 3000; --quick 200 600)",
    )
    p.add_argument("--rounds", type=int, default=None, help="A B pairs (default 2: A B B A)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--idle",
        type=float,
        help="seconds idle before each workload, to measure "
        "the scheduler's idle CPU (default 10; --quick 3)",
    )
    p.add_argument("--json", help="write the rounds' figures to this file")
    p.add_argument("--keep", metavar="DIR", help="keep each round's scheduler log and store here")
    a = p.parse_args(argv)
    a.workers = a.workers or (200 if a.quick else 2000)
    a.tasks = a.tasks or (20_000 if a.quick else 200_000)
    a.pipelines = a.pipelines or (50 if a.quick else 500)
    a.deaths = a.deaths if a.deaths is not None else (30 if a.quick else 300)
    a.rounds = a.rounds or (1 if a.quick else 2)
    a.idle = a.idle if a.idle is not None else (3.0 if a.quick else 10.0)
    a.task_ms = a.task_ms or ((200, 600) if a.quick else (1000, 3000))
    return a


# --- the workload -------------------------------------------------------------------------


def pipeline_graph(p: int, per_pipeline: int, seed: int) -> tuple[dict, tuple]:
    """A fan-in graph of about `per_pipeline` tasks: leaves summed FANIN at a time."""
    leaves = per_pipeline
    while _size(leaves) > per_pipeline:
        leaves -= 1
    token = hashlib.md5(f"{seed}-{p}".encode()).hexdigest()
    level = [(f"load-{token}", i) for i in range(leaves)]
    # Library functions (pickled by reference, as in dask.array/dataframe graphs): the
    # scheduler's cost of shipping each run_spec stays what it usually is.
    dsk: dict = {k: (operator.add, k[1], 1) for k in level}
    depth = 0
    while len(level) > 1:
        depth += 1
        nxt = []
        for j in range(0, len(level), FANIN):
            k = (f"total-{token}", depth, j // FANIN)
            dsk[k] = (sum, list(level[j : j + FANIN]))
            nxt.append(k)
        level = nxt
    return dsk, level[0]


def _size(leaves: int) -> int:
    n, level = leaves, leaves
    while level > 1:
        level = -(-level // FANIN)
        n += level
    return n


# --- one round ----------------------------------------------------------------------------


def start_scheduler(tmp: str, with_oomguard: bool) -> tuple[subprocess.Popen, str]:
    """`dask scheduler` in its own process, logging to tmp/scheduler.log; its address."""
    sched_file = os.path.join(tmp, "scheduler.json")
    cmd = [
        sys.executable,
        "-m",
        "distributed.cli.dask_scheduler",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--no-dashboard",
        "--scheduler-file",
        sched_file,
        "--preload",
        str(HERE / "_loop_probe.py"),
    ]
    if with_oomguard:
        cmd += ["--preload", "oomguard.scheduler_plugin"]
    env = dict(os.environ, DASK_OOMGUARD__SCHEDULER__STORE=os.path.join(tmp, "store.sqlite3"))
    with open(os.path.join(tmp, "scheduler.log"), "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, cwd=tmp)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if os.path.exists(sched_file):
            try:
                with open(sched_file) as f:
                    return proc, json.load(f)["address"]
            except (ValueError, KeyError):
                pass
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the scheduler did not start; see its log in {tmp}")


async def one_round(args, arm: str, graphs: list, tmp: str) -> dict:
    with_oomguard = arm == "with"
    proc, address = start_scheduler(tmp, with_oomguard)
    n_tasks = sum(len(d) for d, _ in graphs)
    kill_at = [int(n_tasks * (0.03 + 0.87 * i / max(1, args.deaths))) for i in range(args.deaths)]
    farm = Farm(
        address,
        args.workers,
        args.hosts,
        kill_at,
        reports=with_oomguard,
        seed=args.seed,
        duration=(args.task_ms[0] / 1e3, args.task_ms[1] / 1e3),
    )
    out: dict = {"arm": arm}
    try:
        t = time.perf_counter()
        await farm.start()
        out["register_s"] = time.perf_counter() - t
        async with Client(address, asynchronous=True) as client:
            probe = getattr(client.scheduler, PROBE)
            await asyncio.sleep(1.0)  # registrations settle
            # The scheduler's CPU while idle (heartbeats of every worker): it grows with the
            # wall time, not with the workload.
            idle0 = await probe()
            await asyncio.sleep(args.idle)
            before = await probe(reset=True)
            out["idle_rate"] = (before["cpu"] - idle0["cpu"]) / (before["now"] - idle0["now"])
            t0, c0 = time.perf_counter(), time.process_time()
            futures = []
            for p, (dsk, key) in enumerate(graphs):
                with distributed.span(f"pipeline-{p:03d}"):
                    futures.append(client.get(dsk, key, sync=False))
            await distributed.wait(futures)
            wall = time.perf_counter() - t0
            out["driver_cpu"] = time.process_time() - c0
            after = await probe()
            out.update(
                wall=wall,
                cpu=after["cpu"] - before["cpu"],
                loop_cpu=after["loop_cpu"] - before["loop_cpu"],
                rss_before=before["rss"],
                rss_after=after["rss"],
                peak_rss=after["peak_rss"],
                threads={
                    k: v - before["threads"].get(k, 0.0) for k, v in after["threads"].items()
                },
                hooks={
                    k: [
                        v[0] - before["oomguard_cpu"].get(k, [0, 0])[0],
                        v[1] - before["oomguard_cpu"].get(k, [0, 0])[1],
                    ]
                    for k, v in after["oomguard_cpu"].items()
                },
                lags=_lag_stats(after["lags"]),
                steady=_lag_stats([x for x in after["lags"] if x[0] > after["last_graph"]]),
                submit_s=after["last_graph"] - before["now"],
                gc=_gc_stats(after["gc"]),
                graphs=after["graphs"],
                deaths=len(farm.deaths),
                finished=farm.finished,
                erred=sum(f.status != "finished" for f in futures),
                other_ops=dict(farm.other_ops),
                tasks=n_tasks,
            )
            if with_oomguard:
                out["check"] = await check(client, farm)
    finally:
        await farm.close()
        proc.send_signal(signal.SIGKILL)  # everything is read; a clean close only adds time
        proc.wait()
    return out


async def check(client, farm: Farm) -> dict:
    """The invariant: every death decided once, with its cause, pipeline and host."""
    query = client.scheduler.oomguard_query
    for _ in range(100):  # a report's decision is milliseconds behind its RPC's answer
        stats = await query(what="stats")
        if (
            stats["pending_deaths"] == 0
            and stats["held"] == 0
            and stats["deaths"] >= len(farm.deaths)
        ):
            break
        await asyncio.sleep(0.2)
    events, cursor = [], {}  # page by page: one reply is capped in rows and bytes
    while page := await query(what="events", limit=None, **cursor):
        events += page
        cursor = {"before": [page[-1]["time"], page[-1]["id"]]}
    problems = []
    by_worker: dict[str, list] = {}
    for e in events:
        by_worker.setdefault(e["worker"], []).append(e)
    for d in farm.deaths:
        got = by_worker.pop(d["worker"], [])
        if len(got) != 1:
            problems.append(f"{d['worker']}: {len(got)} events")
            continue
        e = got[0]
        want = (d["cause"], d["key"], d["host"])
        if (e["cause"], e["shard"], e["host"]) != want or not e["pipeline"].startswith(
            "pipeline-"
        ):
            problems.append(
                f"{d['worker']}: {(e['cause'], e['shard'], e['host'], e['pipeline'])} != {want}"
            )
    problems += [f"{w}: event for no death" for w in by_worker]
    oom = [d for d in farm.deaths if d["cause"] == "oom_kill"]
    sigs = await query(what="signatures", cause="oom_kill", limit=20)
    if oom:
        if len(sigs) != 1 or sigs[0]["count"] != len(oom):
            problems.append(
                f"OOM kills: {[(s['title'], s['count']) for s in sigs]} for {len(oom)}"
            )
        elif sorted(sigs[0]["hosts"]) != sorted({d["host"] for d in oom}):
            problems.append(f"OOM signature hosts {sigs[0]['hosts']}")
    causes: dict[str, int] = {}
    for e in events:
        causes[e["cause"]] = causes.get(e["cause"], 0) + 1
    return {
        "events": len(events),
        "deaths": len(farm.deaths),
        "decided": stats["deaths"],
        "aborts": stats["aborts"],
        "displaced": stats["displaced"],
        "causes": causes,
        "refused": stats["rejected"],
        "overflow": stats["overflow"],
        "internal_errors": stats["internal_errors"],
        "reports": dict(farm.report_status),
        "hosts": len({e["host"] for e in events}),
        "oom_signature": {"count": sigs[0]["count"], "hosts": len(sigs[0]["hosts"])}
        if sigs
        else None,
        "problems": problems,
    }


def _lag_stats(samples: list) -> dict:
    """Lag percentiles, raw and net of the time the loop's thread waited for a CPU."""
    lags = sorted(x for _, x, _ in samples) or [0.0]
    net = sorted(max(0.0, x - w) for _, x, w in samples) or [0.0]
    return {
        "n": len(lags),
        "p50": statistics.median(lags),
        "p99": _p99(lags),
        "max": lags[-1],
        "net_p50": statistics.median(net),
        "net_p99": _p99(net),
        "net_max": net[-1],
        "cpu_wait": sum(w for *_, w in samples),
    }


def _p99(xs: list[float]) -> float:
    return xs[min(len(xs) - 1, int(len(xs) * 0.99))]


def _gc_stats(pauses: list) -> dict:
    return {
        "collections": len(pauses),
        "gen2": sum(g == 2 for _, g, _, _ in pauses),
        "total": sum(w for _, _, w, _ in pauses),
        "cpu": sum(c for *_, c in pauses),
        "max": max((w for _, _, w, _ in pauses), default=0.0),
        "max_cpu": max((c for *_, c in pauses), default=0.0),
    }


# --- report -------------------------------------------------------------------------------


def main(argv=None) -> int:
    args = parse_args(argv)
    # A killed worker's stream may be mid-write: Dask logs that at INFO with a traceback.
    logging.getLogger("distributed.batched").setLevel(logging.WARNING)
    cmd = " ".join([os.path.relpath(sys.executable), *sys.argv])
    print(f"# {cmd}")
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')}; python {sys.version.split()[0]}; distributed "
        f"{distributed.__version__}; {os.cpu_count()} cpus; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at start",
        flush=True,
    )
    per = args.tasks // args.pipelines
    graphs = [pipeline_graph(p, per, args.seed) for p in range(args.pipelines)]
    n_tasks = sum(len(d) for d, _ in graphs)
    print(
        f"# {args.workers:,} workers on {args.hosts} hosts, {n_tasks:,} tasks in "
        f"{args.pipelines} pipelines, {args.deaths} deaths; {args.rounds} A/B pairs",
        flush=True,
    )
    started = time.perf_counter()
    rounds: list[dict] = []
    tmp = args.keep or tempfile.mkdtemp(prefix="bench-scale-")
    try:
        for r in range(args.rounds):
            for arm in ("without", "with") if r % 2 == 0 else ("with", "without"):
                here = os.path.join(tmp, f"{len(rounds) + 1}-{arm}")
                os.makedirs(here, exist_ok=True)
                res = asyncio.run(one_round(args, arm, graphs, here))
                res["load"] = os.getloadavg()[0]
                rounds.append(res)
                _print_round(len(rounds), res)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    duration = time.perf_counter() - started
    ok = _summary(rounds)
    print(
        f"# run took {duration / 60:.1f} min; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end"
    )
    if args.json:
        pathlib.Path(args.json).write_text(
            json.dumps(
                {"command": cmd, "duration_s": duration, "rounds": rounds}, indent=2, default=str
            )
        )
    return 0 if ok else 1


OOMGUARD_THREADS = ("oomguard-store", "oomguard-intake")


def oomguard_cpu(r: dict) -> float:
    """CPU inside oomguard: its code on the loop thread, and its own threads."""
    return sum(cpu for cpu, _ in r["hooks"].values()) + sum(
        r["threads"].get(t, 0.0) for t in OOMGUARD_THREADS
    )


def workload_cpu(r: dict) -> float:
    """Scheduler CPU minus what it spends idle (heartbeats) over the same wall time."""
    return r["cpu"] - r["idle_rate"] * r["wall"]


def _print_round(i: int, r: dict) -> None:
    lag, steady, gc = r["lags"], r["steady"], r["gc"]
    print(
        f"  round {i} {r['arm']:>7}: {r['wall']:.1f} s wall, scheduler CPU {r['cpu']:.1f} s "
        f"(loop thread {r['loop_cpu']:.1f} s; idle rate {r['idle_rate'] * 100:.0f} % of a "
        f"core), fake workers + client {r['driver_cpu']:.1f} s; {r['deaths']} deaths, "
        f"{r['erred']} outputs not finished; registration {r['register_s']:.1f} s; load "
        f"{r['load']:.2f}" + (f"; fake workers: {r['other_ops']}" if r["other_ops"] else ""),
        flush=True,
    )
    print(
        f"      loop lag p50/p99/max {_ms(lag)} ms, net of waiting for a CPU "
        f"{_ms(lag, 'net_')} ms (waited {lag['cpu_wait']:.1f} s); after the submissions "
        f"({r['submit_s']:.1f} s) {_ms(steady)}, net {_ms(steady, 'net_')} ms; GC "
        f"{gc['cpu']:.1f} s CPU, longest pause {gc['max'] * 1e3:.0f} ms ({gc['max_cpu'] * 1e3:.0f}"
        f" ms CPU), {gc['gen2']} full; RSS {r['rss_before'] / 2**20:.0f} MiB -> peak "
        f"{r['peak_rss'] / 2**20:.0f} MiB",
        flush=True,
    )
    if r["arm"] == "with":
        threads = ", ".join(f"{t} {r['threads'].get(t, 0.0):.2f} s" for t in OOMGUARD_THREADS)
        hooks = ", ".join(
            f"{k} {cpu:.2f} s/{n:,}"
            for k, (cpu, n) in sorted(r["hooks"].items(), key=lambda kv: -kv[1][0])
            if n
        )
        print(f"      inside oomguard (CPU s/calls): {hooks}; threads: {threads}", flush=True)
    if "check" in r:
        c = r["check"]
        print(
            f"      events {c['events']} / deaths {c['deaths']} (decided {c['decided']}), "
            f"causes {c['causes']}, {c['hosts']} hosts, OOM signature {c['oom_signature']}, "
            f"aborts {c['aborts']}, displaced {c['displaced']}, refused {c['refused']}, "
            f"overflow {c['overflow']}, internal errors {c['internal_errors']}, "
            f"report answers {c['reports']}",
            flush=True,
        )
        for p in c["problems"][:10]:
            print(f"      PROBLEM {p}")


def _ms(lag: dict, net: str = "") -> str:
    return (
        f"{lag[net + 'p50'] * 1e3:.1f}/{lag[net + 'p99'] * 1e3:.0f}/{lag[net + 'max'] * 1e3:.0f}"
    )


def _summary(rounds: list[dict]) -> bool:
    arms = {a: [r for r in rounds if r["arm"] == a] for a in ("without", "with")}
    pairs = list(zip(arms["without"], arms["with"]))
    print(
        f"\n{'measure':<36} {'without':>22} {'with':>22} {'ratio':>6} {'paired':>7} "
        f"{'target':>8}  result"
    )

    def row(name, get, target=None, digits=2, lower_is_ratio=True):
        a = [get(r) for r in arms["without"]]
        b = [get(r) for r in arms["with"]]
        ratio = statistics.median(b) / statistics.median(a) if statistics.median(a) else 0.0
        paired = statistics.median(get(y) / get(x) if get(x) else 0.0 for x, y in pairs)
        verdict = tgt = ""
        if target is not None:
            verdict, tgt = ("PASS" if ratio <= target else "MISS"), f"<= {target}"
        print(
            f"{name:<36} {_spread(a, digits):>22} {_spread(b, digits):>22} {ratio:>6.3f} "
            f"{paired:>7.3f} {tgt:>8}  {verdict}"
        )

    row("scheduler CPU, all threads (s)", lambda r: r["cpu"], TARGET_RATIO, 1)
    row("  minus idle rate x wall (s)", workload_cpu, TARGET_RATIO, 1)
    row("wall time (s)", lambda r: r["wall"], TARGET_RATIO, 1)
    row("scheduler loop thread CPU (s)", lambda r: r["loop_cpu"], None, 1)
    row("GC CPU (s)", lambda r: r["gc"]["cpu"], None, 1)
    row("fake workers + client CPU (s)", lambda r: r["driver_cpu"], None, 1)
    row("loop thread's wait for a CPU (s)", lambda r: r["lags"]["cpu_wait"], None, 1)
    for name, field, net in (
        ("loop lag p99 (ms)", "lags", ""),
        ("  net of waiting for a CPU", "lags", "net_"),
        ("  after the submissions", "steady", ""),
        ("  after the submissions, net", "steady", "net_"),
    ):
        p99 = {a: [r[field][net + "p99"] * 1e3 for r in arms[a]] for a in arms}
        ratio = statistics.median(p99["with"]) / max(1e-9, statistics.median(p99["without"]))
        verdict = "PASS" if max(p99["with"]) <= TARGET_LAG_P99 * 1e3 else "MISS"
        print(
            f"{name:<36} {_spread(p99['without'], 1):>22} {_spread(p99['with'], 1):>22} "
            f"{ratio:>6.2f} {'':>7} {'<= ' + format(TARGET_LAG_P99 * 1e3, '.0f'):>8}  "
            f"{verdict} (worst with-round)"
        )
    row("loop lag max (ms)", lambda r: r["lags"]["max"] * 1e3, None, 0)
    row("longest GC pause (ms)", lambda r: r["gc"]["max"] * 1e3, None, 0)
    row("scheduler peak RSS (MiB)", lambda r: r["peak_rss"] / 2**20, None, 0)
    row(
        "RSS growth over the workload (MiB)",
        lambda r: (r["rss_after"] - r["rss_before"]) / 2**20,
        None,
        0,
    )
    inside = [oomguard_cpu(r) for r in arms["with"]]
    base = statistics.median(r["cpu"] for r in arms["without"])
    print(
        f"inside oomguard (loop thread + its threads), s: {_spread(inside)} = "
        f"{statistics.median(inside) / base * 100:.1f} % of the scheduler's CPU without it"
    )
    ok = all(
        not r["check"]["problems"] and r["check"]["events"] == r["check"]["deaths"]
        for r in arms["with"]
    )
    print(
        f"invariant (events stored == deaths, each death once, right cause/pipeline/host): "
        f"{'held in every round' if ok else 'BROKEN'}"
    )
    print(
        "(median [min-max] of the rounds; ratio = median with / median without; "
        "paired = median of the per-pair ratios)"
    )
    return ok


def _spread(xs: list[float], digits: int = 2) -> str:
    return f"{statistics.median(xs):.{digits}f} [{min(xs):.{digits}f}-{max(xs):.{digits}f}]"


if __name__ == "__main__":
    sys.exit(main())
