"""What OomguardSchedulerPlugin costs the scheduler: a 20,000-task graph with and without it.

    .venv/bin/python benchmarks/bench_scheduler_overhead.py            # full run
    .venv/bin/python benchmarks/bench_scheduler_overhead.py --quick    # CI-sized

One LocalCluster (2 workers x 1 thread, nannies; the scheduler runs in this process).
`oomguard.install(client, store=...)` runs once, so the nanny and worker plugins stay on the
workers throughout (their cost is bench_worker_overhead.py's). Between rounds only the
scheduler plugin is taken off (its own `close()`, then `Scheduler.remove_plugin`; note that
`Client.unregister_scheduler_plugin` alone would not call `close()`) and put back with
`client.register_plugin(OomguardSchedulerPlugin(store=...))`, i.e. its real `start()`.
Rounds alternate A B B A ... Each round computes a fan-in graph: N leaf `inc` tasks with
tuple keys, summed 8 at a time up to one result (N = 17,500 gives 20,003 tasks).

Measured per round: wall time from submission to result, and the CPU time of the
scheduler's event-loop thread (/proc/self/task/<tid>/schedstat, ns), which is where every
plugin hook runs. The client is connected by address so that it runs on its own loop thread;
the in-process nannies share the scheduler's. The wall time on 2 shared cores is the noisier.
Then each hook is timed on its own (update_graph for the whole graph, transition per call)
to say how much of the scheduler's CPU per task is oomguard's.

Target (a goal, not a test; the script exits 0): wall-time ratio <= 1.02.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from types import SimpleNamespace

from distributed import Client, LocalCluster

import oomguard
from oomguard._decide import DecisionCore
from oomguard.scheduler_plugin import OomguardSchedulerPlugin

TARGET_RATIO = 1.02
FANIN = 8


def inc(x):
    return x + 1


def total(xs):
    return sum(xs)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CI-sized run")
    p.add_argument("--leaves", type=int, default=None, help="leaf tasks (default 17500)")
    p.add_argument("--rounds", type=int, default=None, help="rounds per mode (default 5)")
    a = p.parse_args(argv)
    a.leaves = a.leaves or (1750 if a.quick else 17_500)
    a.rounds = a.rounds or (2 if a.quick else 5)
    return a


def fan_in(leaves: int, tag: str) -> tuple[dict, tuple]:
    """A raw graph: `leaves` inc tasks summed FANIN at a time down to one key."""
    dsk: dict = {}
    level = [(f"inc-{tag}", i) for i in range(leaves)]
    for i, k in enumerate(level):
        dsk[k] = (inc, i)
    depth = 0
    while len(level) > 1:
        depth += 1
        nxt = []
        for j in range(0, len(level), FANIN):
            k = (f"total-{tag}-{depth}", j // FANIN)
            dsk[k] = (total, list(level[j : j + FANIN]))
            nxt.append(k)
        level = nxt
    return dsk, level[0]


# --- toggling the scheduler plugin --------------------------------------------------------


async def _take_off(dask_scheduler=None):
    plugin = dask_scheduler.plugins.get(OomguardSchedulerPlugin.name)
    if plugin is not None:
        await plugin.close()
        dask_scheduler.remove_plugin(OomguardSchedulerPlugin.name)
    return OomguardSchedulerPlugin.name in dask_scheduler.plugins


def _loop_tid(dask_scheduler=None):
    return threading.get_native_id()


def _schedstat_ns(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        return int(f.read().split()[0])


def run_rounds(args, store: str) -> tuple[dict, dict, int]:
    wall = {"without": [], "with": []}
    cpu = {"without": [], "with": []}
    # The client gets its own event-loop thread (Client(cluster) would share the cluster's),
    # so the loop thread measured runs the scheduler (and the two idle in-process nannies).
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster.scheduler_address) as client,
    ):
        client.wait_for_workers(2)
        oomguard.install(client, store=store)
        tid = client.run_on_scheduler(_loop_tid)
        state = {"with": True}

        def set_mode(mode: str) -> None:
            want = mode == "with"
            if state["with"] == want:
                return
            if want:
                client.register_plugin(OomguardSchedulerPlugin(store=store))
            else:
                assert not client.run_on_scheduler(_take_off)
            state["with"] = want

        def one(mode: str, tag: str, leaves: int) -> tuple[float, float]:
            set_mode(mode)
            dsk, out = fan_in(leaves, tag)
            n0, t0 = _schedstat_ns(tid), time.perf_counter()
            client.get(dsk, out)
            return time.perf_counter() - t0, (_schedstat_ns(tid) - n0) / 1e9

        for mode in ("with", "without"):  # warm-up, not counted
            one(mode, f"warm-{mode}", args.leaves // 4)
        for r in range(args.rounds):
            for mode in ("without", "with") if r % 2 == 0 else ("with", "without"):
                w, c = one(mode, f"{r}-{mode}", args.leaves)
                wall[mode].append(w)
                cpu[mode].append(c)
            print(
                f"  round {r + 1}/{args.rounds}: "
                + "  ".join(
                    f"{m} {wall[m][-1]:.2f}s wall, {cpu[m][-1]:.2f}s scheduler CPU"
                    for m in ("without", "with")
                ),
                flush=True,
            )
    return wall, cpu, len(fan_in(args.leaves, "n")[0])


# --- the hooks on their own ---------------------------------------------------------------


def hook_costs(leaves: int, passes: int = 3) -> list[tuple[str, str]]:
    """Each hook on its own, on a plugin with no scheduler: best of `passes` (GC included)."""
    # What the scheduler calls for each task: released->waiting, waiting->processing,
    # processing->memory, memory->released, released->forgotten.
    steps = (
        ("released", "waiting"),
        ("waiting", "processing"),
        ("processing", "memory"),
        ("memory", "released"),
        ("released", "forgotten"),
    )
    best: dict[str, float] = {}
    for i in range(passes):
        plugin = OomguardSchedulerPlugin()
        plugin.core = DecisionCore()
        dsk, out = fan_in(leaves, f"hook-{i}")
        keys = list(dsk)
        t = time.perf_counter()
        # A stand-in scheduler without tasks: update_graph reads `scheduler.tasks` to name
        # the pipeline; with None it raised (caught) and no key was tracked.
        plugin.update_graph(
            SimpleNamespace(tasks={}),
            client="c",
            keys={out},
            tasks=keys,
            annotations={},
            stimulus_id="s",
        )
        got = {"update_graph": (time.perf_counter() - t) / len(keys)}
        for start, finish in steps:
            t = time.perf_counter()
            for k in keys:
                plugin.transition(k, start, finish, stimulus_id="s")
            got[f"{start}->{finish}"] = (time.perf_counter() - t) / len(keys)
        best = {k: min(v, best.get(k, v)) for k, v in got.items()}
    n = len(keys)
    rows = [
        (
            f"update_graph, {n:,} tasks (ms; us per task)",
            f"{best['update_graph'] * n * 1e3:.1f}; {best['update_graph'] * 1e6:.2f}",
        )
    ]
    for name, v in best.items():
        if name != "update_graph":
            rows.append((f"transition {name} (us per call)", f"{v * 1e6:.2f}"))
    rows.append(("hooks per task, all (us)", f"{sum(best.values()) * 1e6:.2f}"))
    return rows


# --- report -------------------------------------------------------------------------------


def main(argv=None) -> int:
    args = parse_args(argv)
    cmd = " ".join([os.path.relpath(sys.executable), *sys.argv])
    print(f"# {cmd}")
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')}; python {sys.version.split()[0]}; "
        f"{os.cpu_count()} cpus; load average {os.getloadavg()[0]:.2f} at start; "
        f"{args.leaves:,} leaves, {args.rounds} rounds per mode",
        flush=True,
    )
    tmp = tempfile.mkdtemp(prefix="bench-sched-")
    try:
        wall, cpu, n_tasks = run_rounds(args, os.path.join(tmp, "store.sqlite3"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"# load average {os.getloadavg()[0]:.2f} after the rounds\n")
    print(
        f"{'measure (' + format(n_tasks, ',') + ' tasks)':<34} {'without':>20} {'with':>20} "
        f"{'ratio':>6} {'paired':>7} {'target':>7}  result"
    )
    for name, d, target in (
        ("wall time (s)", wall, TARGET_RATIO),
        ("scheduler loop thread CPU (s)", cpu, None),
    ):
        a, b = d["without"], d["with"]
        ratio = statistics.median(b) / statistics.median(a)
        paired = statistics.median(y / x for x, y in zip(a, b))
        verdict = "" if target is None else ("PASS" if ratio <= target else "MISS")
        tgt = "" if target is None else f"<= {target}"
        print(
            f"{name:<34} {_spread(a):>20} {_spread(b):>20} {ratio:>6.3f} {paired:>7.3f} "
            f"{tgt:>7}  {verdict}"
        )
    per_task = statistics.median(cpu["without"]) / n_tasks * 1e6
    print(
        f"scheduler loop CPU per task without oomguard: {per_task:.0f} us; "
        f"throughput {n_tasks / statistics.median(wall['without']):,.0f} tasks/s without, "
        f"{n_tasks / statistics.median(wall['with']):,.0f} with"
    )
    print(
        "(median [min-max] of the rounds; ratio = median with / median without; "
        "paired = median of the per-round ratios)\n"
    )
    rows = hook_costs(args.leaves)
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value:>14}")
    hooks_us = float(rows[-1][1])
    print(f"=> the hooks are {hooks_us / per_task * 100:.1f} % of the scheduler's CPU per task")
    return 0


def _spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]"


if __name__ == "__main__":
    sys.exit(main())
