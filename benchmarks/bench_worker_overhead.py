"""What the worker side of oomguard costs a worker: trivial tasks with and without it.

    .venv/bin/python benchmarks/bench_worker_overhead.py            # full run (~10 min)
    .venv/bin/python benchmarks/bench_worker_overhead.py --quick    # CI-sized (~1 min)

1. Throughput. One LocalCluster (2 workers x 1 thread, nannies) with the nanny preload
   `distributed.nanny.preload: ["oomguard.worker_plugin"]`, so every worker starts with the
   real nanny plugin (exit hook, per-worker cgroup) and worker plugin (faulthandler, flight
   recorder, sampler thread). Between rounds the *worker plugin* is removed from / added back
   to both workers (`Worker.plugin_remove` / `plugin_add`, i.e. its real teardown and setup):
   the same processes, cgroups and warm caches serve both modes, so the only difference is
   what runs per task (the `transition` hook) and beside it (the sampler). The nanny plugin
   has no per-task code. Rounds alternate A B B A ... ; each round runs `client.map(inc,
   range(N))` and an N/4-long chain of `inc`. `--mode clusters` instead keeps two clusters
   (plain, and with the preload) and alternates between them.
2. The sampler thread's CPU: the "oomguard-sampler" thread's run time from
   /proc/<pid>/task/<tid>/schedstat (ns) over a window, idle and with a task executing;
   and the worker process's CPU (psutil) over the same window with and without the plugin.
3. The transition hook per call, in this process, on a flight recorder in a temp dir; and
   with the run-alone gate (`worker_plugin/_alone.py`), which then opens and closes each
   task's flight slot around `Worker.execute` instead: the hook per call, and the gate per
   task over a bare `execute` coroutine (no hold in force, as on every task but a suspect).

Targets (goals, not tests; the script exits 0): throughput ratio <= 1.03.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from types import SimpleNamespace

import dask
import psutil
from distributed import Client, LocalCluster

from oomguard._host.flight import FlightRecorder
from oomguard.worker_plugin import OomguardWorkerPlugin
from oomguard.worker_plugin._alone import AloneGate

TARGET_RATIO = 1.03
PLUGIN = OomguardWorkerPlugin.name


def inc(x):
    return x + 1


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CI-sized run")
    p.add_argument("--tasks", type=int, default=None, help="tasks in the map (default 6000)")
    p.add_argument("--rounds", type=int, default=None, help="rounds per mode (default 9)")
    p.add_argument("--window", type=float, default=None, help="sampler CPU window, s (default 20)")
    p.add_argument("--mode", choices=("toggle", "clusters"), default="toggle")
    a = p.parse_args(argv)
    a.tasks = a.tasks or (1000 if a.quick else 6000)
    a.rounds = a.rounds or (3 if a.quick else 9)
    a.window = a.window or (3.0 if a.quick else 20.0)
    a.chain = max(a.tasks // 4, 10)
    return a


# --- worker-side helpers (run through client.run) ----------------------------------------


async def _remove_plugin(dask_worker):
    if PLUGIN in dask_worker.plugins:
        await dask_worker.plugin_remove(PLUGIN)
    return PLUGIN in dask_worker.plugins


async def _add_plugin(crash_dir, interval, dask_worker=None):
    await dask_worker.plugin_add(OomguardWorkerPlugin(crash_dir, interval), name=PLUGIN)
    return PLUGIN in dask_worker.plugins


def _sampler_tid(dask_worker):
    for t in threading.enumerate():
        if t.name == "oomguard-sampler" and t.is_alive():
            return t.native_id
    return None


def _time_sample_calls(n, dask_worker=None):
    plugin = dask_worker.plugins[PLUGIN]
    t = time.thread_time()
    for _ in range(n):
        plugin.sample()
    return (time.thread_time() - t) / n


def _deep_sleep(seconds, depth=30):
    # A task with a realistic stack under Dask's own frames, for the sampler to walk.
    if depth:
        return _deep_sleep(seconds, depth - 1)
    time.sleep(seconds)
    return seconds


# --- throughput --------------------------------------------------------------------------


def run_round(client: Client, n: int, chain: int, tag: str) -> dict[str, float]:
    t = time.perf_counter()
    futs = client.map(inc, range(n), key=[f"inc-{tag}-{i}" for i in range(n)])
    client.gather(futs)
    t_map = time.perf_counter() - t
    del futs
    dsk = {(f"chain-{tag}", 0): (inc, 0)}
    for i in range(1, chain):
        dsk[(f"chain-{tag}", i)] = (inc, (f"chain-{tag}", i - 1))
    t = time.perf_counter()
    client.get(dsk, (f"chain-{tag}", chain - 1))
    t_chain = time.perf_counter() - t
    return {"map": t_map, "chain": t_chain}


def throughput_toggle(args, crash_dir) -> dict[str, dict[str, list[float]]]:
    times = {m: {"map": [], "chain": []} for m in ("without", "with")}
    with _cluster(crash_dir, preload=True) as client:
        state = {"with": True}

        def set_mode(mode):
            want = mode == "with"
            if state["with"] != want:
                fn = _add_plugin if want else _remove_plugin
                extra = (crash_dir, 0.5) if want else ()
                got = client.run(fn, *extra)
                assert all(v == want for v in got.values()), got
                state["with"] = want

        _throughput_rounds(args, times, set_mode, lambda mode: client)
    return times


def throughput_clusters(args, crash_dir) -> dict[str, dict[str, list[float]]]:
    times = {m: {"map": [], "chain": []} for m in ("without", "with")}
    with _cluster(crash_dir, preload=False) as plain, _cluster(crash_dir, preload=True) as og:
        clients = {"without": plain, "with": og}
        _throughput_rounds(args, times, lambda mode: None, clients.__getitem__)
    return times


def _throughput_rounds(args, times, set_mode, client_for) -> None:
    for mode in ("with", "without"):  # warm-up, not counted
        set_mode(mode)
        run_round(client_for(mode), args.tasks // 4, args.chain // 4, f"warm-{mode}")
    for r in range(args.rounds):
        order = ("without", "with") if r % 2 == 0 else ("with", "without")
        for mode in order:
            set_mode(mode)
            res = run_round(client_for(mode), args.tasks, args.chain, f"{r}-{mode}")
            for k, v in res.items():
                times[mode][k].append(v)
        print(
            f"  round {r + 1}/{args.rounds}: "
            + "  ".join(
                f"{m} map {times[m]['map'][-1]:.2f}s chain {times[m]['chain'][-1]:.2f}s"
                for m in ("without", "with")
            ),
            flush=True,
        )


class _cluster:
    def __init__(self, crash_dir: str, preload: bool):
        cfg = {"oomguard.worker.crash-dir": crash_dir}
        if preload:
            cfg["distributed.nanny.preload"] = ["oomguard.worker_plugin"]
        self.cfg = dask.config.set(cfg)

    def __enter__(self) -> Client:
        with self.cfg:
            self.cluster = LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
            )
            self.client = Client(self.cluster)
        self.client.wait_for_workers(2)
        return self.client

    def __exit__(self, *exc) -> None:
        self.client.close()
        self.cluster.close()


# --- the sampler's CPU -------------------------------------------------------------------


def _schedstat_ns(pid: int, tid: int) -> int:
    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
        return int(f.read().split()[0])


def _proc_cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def sampler_cpu(args, crash_dir) -> list[tuple[str, str]]:
    rows = []
    with _cluster(crash_dir, preload=True) as client:
        pids = client.run(os.getpid)
        addr = sorted(pids)[0]
        pid = pids[addr]
        tid = client.run(_sampler_tid, workers=[addr])[addr]
        assert tid is not None, "no oomguard-sampler thread in the worker"
        for label, busy in (("idle", False), ("1 task executing (30-deep stack)", True)):
            fut = None
            if busy:
                fut = client.submit(_deep_sleep, args.window + 5, workers=[addr], pure=False)
                while not client.run(
                    lambda dask_worker: len(dask_worker.state.executing), workers=[addr]
                )[addr]:
                    time.sleep(0.05)
                time.sleep(0.6)
            ns0, w0 = _schedstat_ns(pid, tid), time.perf_counter()
            time.sleep(args.window)
            ns1, w1 = _schedstat_ns(pid, tid), time.perf_counter()
            per_call = client.run(_time_sample_calls, 200, workers=[addr])[addr]
            if fut is not None:
                client.cancel(fut)
            ms_per_s = (ns1 - ns0) / 1e6 / (w1 - w0)
            rows.append(
                (
                    f"sampler thread, {label}: CPU ms per s (% of one core)",
                    f"{ms_per_s:.3f} ({ms_per_s / 10:.3f} %)",
                )
            )
            rows.append((f"sample() per call, {label} (us CPU)", f"{per_call * 1e6:.0f}"))
        # Whole worker process, idle, with the plugin and without it: alternating windows,
        # since the idle process's own CPU (heartbeats, Dask's profiler) drifts.
        per_mode: dict[str, list[float]] = {"with": [], "without": []}
        for i in range(6):
            mode = ("without", "with")[i % 2]
            fn, extra = (_add_plugin, (crash_dir, 0.5)) if mode == "with" else (_remove_plugin, ())
            client.run(fn, *extra, workers=[addr])
            time.sleep(0.5)
            c0, w0 = _proc_cpu(pid), time.perf_counter()
            time.sleep(args.window / 3)
            c1, w1 = _proc_cpu(pid), time.perf_counter()
            per_mode[mode].append((c1 - c0) * 1000 / (w1 - w0))
        for mode in ("with", "without"):
            xs = per_mode[mode]
            rows.append(
                (
                    f"idle worker process, {mode} the worker plugin: CPU ms per s, "
                    f"median [min-max] of 3",
                    f"{statistics.median(xs):.1f} [{min(xs):.1f}-{max(xs):.1f}]",
                )
            )
    return rows


# --- the transition hook -----------------------------------------------------------------


class _Noop:
    def transition(self, key, start, finish, **kwargs):
        pass


def transition_cost(n: int) -> list[tuple[str, str]]:
    tmp = tempfile.mkdtemp(prefix="bench-transition-")
    try:
        plugin = OomguardWorkerPlugin(tmp, 0.5)
        plugin._recorder = FlightRecorder.create(os.path.join(tmp, "1.flight"))
        noop = _Noop()
        str_keys = [f"inc-5b1e0c2e8d7a4f5c9e3b2a1d0f9e8d7c-{i}" for i in range(n)]
        tup_keys = [("read-parquet-5b1e0c2e8d7a4f5c9e3b2a1d0f9e8d7c", i) for i in range(n)]

        def pair(target, keys):
            t = time.perf_counter()
            for k in keys:
                target.transition(k, "ready", "executing")
                target.transition(k, "executing", "memory")
            return (time.perf_counter() - t) / (2 * len(keys))

        def other(target, keys):
            t = time.perf_counter()
            for k in keys:
                target.transition(k, "waiting", "ready")
            return (time.perf_counter() - t) / len(keys)

        rows = []
        for _ in range(2):  # second pass is reported: caches and allocator warm
            base_pair, base_other = pair(noop, str_keys), other(noop, str_keys)
            res = {
                "into/out of executing, str key": pair(plugin, str_keys) - base_pair,
                "into/out of executing, tuple key": pair(plugin, tup_keys) - base_pair,
                "any other transition": other(plugin, str_keys) - base_other,
            }
        for name, v in res.items():
            rows.append((f"transition hook, {name} (us per call, over a no-op)", f"{v * 1e6:.2f}"))
        rows.append(("no-op plugin call itself (us)", f"{base_pair * 1e6:.2f}"))
        rows += gate_cost(plugin, str_keys, tup_keys, pair, noop)
        plugin._recorder.close()
        return rows
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def gate_cost(plugin, str_keys, tup_keys, pair, noop) -> list[tuple[str, str]]:
    """With the run-alone gate: the hook per call (it returns at once), and the gate's
    `execute` per task (annotation lookup, flight slot opened and closed) over a bare one."""
    worker = SimpleNamespace(state=SimpleNamespace(tasks={}))
    worker.state.tasks = {k: SimpleNamespace(annotations={}) for k in str_keys + tup_keys}

    async def execute(key, *, stimulus_id):  # Dask's, reduced to nothing
        return key

    worker.execute = execute
    gate = AloneGate(plugin._task_started, plugin._task_ended, lambda where: None)
    gate.install(worker)

    async def per_task(fn, keys) -> float:
        t = time.perf_counter()
        for k in keys:
            await fn(k, stimulus_id="s")
        return (time.perf_counter() - t) / len(keys)

    rows = []
    plugin._gate = gate
    try:
        for _ in range(2):  # the second pass is reported
            base = pair(noop, str_keys)
            hook = pair(plugin, str_keys) - base
            res = {
                "str key": asyncio.run(per_task(gate.execute, str_keys))
                - asyncio.run(per_task(execute, str_keys)),
                "tuple key": asyncio.run(per_task(gate.execute, tup_keys))
                - asyncio.run(per_task(execute, tup_keys)),
            }
    finally:
        plugin._gate = None
    rows.append(
        ("with the gate: transition hook into/out of executing (us per call)", f"{hook * 1e6:.2f}")
    )
    for name, v in res.items():
        rows.append(
            (f"with the gate: gate per task, {name} (us, over a bare execute)", f"{v * 1e6:.2f}")
        )
    return rows


# --- report ------------------------------------------------------------------------------


def main(argv=None) -> int:
    args = parse_args(argv)
    cmd = " ".join([os.path.relpath(sys.executable), *sys.argv])
    print(f"# {cmd}")
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')}; python {sys.version.split()[0]}; "
        f"{os.cpu_count()} cpus; load average {os.getloadavg()[0]:.2f} at start; "
        f"mode {args.mode}; map {args.tasks} tasks, chain {args.chain}, "
        f"{args.rounds} rounds per mode",
        flush=True,
    )
    crash_dir = tempfile.mkdtemp(prefix="bench-oomguard-crash-")
    try:
        fn = throughput_toggle if args.mode == "toggle" else throughput_clusters
        times = fn(args, crash_dir)
        load_after = os.getloadavg()[0]
        print()
        print(
            f"{'workload':<26} {'without (s)':>18} {'with (s)':>18} {'ratio':>6} "
            f"{'paired':>7} {'target':>7}  result"
        )
        for wl, n in (("map", args.tasks), ("chain", args.chain)):
            a, b = times["without"][wl], times["with"][wl]
            ratio = statistics.median(b) / statistics.median(a)
            paired = statistics.median(y / x for x, y in zip(a, b))
            ok = "PASS" if ratio <= TARGET_RATIO else "MISS"
            print(
                f"{wl + f' ({n} tasks)':<26} {_spread(a):>18} {_spread(b):>18} "
                f"{ratio:>6.3f} {paired:>7.3f} {'<= 1.03':>7}  {ok}"
            )
        for wl, n in (("map", args.tasks), ("chain", args.chain)):
            a, b = times["without"][wl], times["with"][wl]
            print(
                f"  {wl}: {n / statistics.median(a):,.0f} tasks/s without, "
                f"{n / statistics.median(b):,.0f} with"
            )
        print(
            "(times: median [min-max] of the rounds; ratio = median with / median without; "
            "paired = median of the per-round ratios)"
        )
        print(f"# load average {load_after:.2f} after the throughput rounds")
        print(flush=True)
        rows = sampler_cpu(args, crash_dir) + transition_cost(20_000 if not args.quick else 5_000)
        width = max(len(r[0]) for r in rows)
        for name, value in rows:
            print(f"{name:<{width}}  {value:>16}")
    finally:
        shutil.rmtree(crash_dir, ignore_errors=True)
    return 0


def _spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]"


if __name__ == "__main__":
    sys.exit(main())
