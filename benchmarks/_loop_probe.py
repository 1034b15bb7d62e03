"""A scheduler preload for benchmarks: loop lag, CPU time (whose), GC and RSS, over an RPC.

    dask scheduler --preload benchmarks/_loop_probe.py ...

A coroutine sleeps 10 ms at a time on the scheduler's event loop and keeps each sleep's
overshoot (the loop's lag) with how long the loop's thread waited for a CPU meanwhile
(schedstat run_delay: on a shared machine, time the scheduler did not cause). The RPC
``bench_probe(reset=False)`` returns, since the last reset: those lags, the garbage
collector's pauses (wall and CPU time), when the last graph was taken in (a no-op
`update_graph` hook); and now: the process's CPU time, each thread's (by Python thread
name), the loop thread's, RSS and peak RSS (VmHWM; a reset also resets the peak through
/proc/self/clear_refs).

Where the oomguard scheduler plugin runs, the first reset also wraps its hooks, its RPC
handlers and its tick work (on the plugin instance, not the class) to add up the loop
thread's CPU time spent inside oomguard: two `thread_time()` calls (~1 us) per call, counted
once when hooks nest. With and without oomguard alike, so the probe's own cost is in both
arms; the wrappers' only in the "with" arm.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import threading
import time

from distributed.diagnostics.plugin import SchedulerPlugin

HANDLER = "bench_probe"
INTERVAL = 0.010


def _run_delay(path: str) -> float:
    """Seconds the thread spent runnable but waiting for a CPU (schedstat field 2)."""
    try:
        with open(path) as f:
            return int(f.read().split()[1]) / 1e9
    except OSError:
        return 0.0


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak_rss() -> None:
    try:  # "5" resets the peak RSS (VmHWM) to the current RSS (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of each live Python thread, by name (numbers stripped: one pool, one name)."""
    out: dict[str, float] = {}
    for t in threading.enumerate():
        try:
            with open(f"/proc/self/task/{t.native_id}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, TypeError):
            continue
        name = t.name.rstrip("0123456789_-") or t.name
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / 100  # ticks
    return out


class LoopProbe:
    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler
        self.lags: list[tuple[float, float, float]] = []  # (when, lag, waited for a CPU)
        self.gc: list[tuple[float, int, float, float]] = []  # (when, generation, wall, CPU)
        self._gc_start = (0.0, 0.0)
        self.graphs = 0
        self.last_graph = 0.0
        self.oomguard_cpu: dict[str, list] = {}  # hook -> [loop-thread CPU in it, calls]
        self._depth = 0
        self._wrapped = False
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = (time.perf_counter(), time.thread_time())
        else:
            wall, cpu = self._gc_start
            self.gc.append(
                (
                    time.monotonic(),
                    info["generation"],
                    time.perf_counter() - wall,
                    time.thread_time() - cpu,
                )
            )

    async def run(self) -> None:
        stat = f"/proc/self/task/{threading.get_native_id()}/schedstat"
        waited = _run_delay(stat)
        while True:
            t = time.monotonic()
            await asyncio.sleep(INTERVAL)
            now = time.monotonic()
            before, waited = waited, _run_delay(stat)
            self.lags.append((now, now - t - INTERVAL, waited - before))

    async def handler(self, comm=None, reset: bool = False) -> dict:
        if reset:
            self.lags, self.gc = [], []
            if not self._wrapped:
                self._wrap_oomguard()
            _reset_peak_rss()
        return {
            "lags": list(self.lags),
            "gc": list(self.gc),
            "now": time.monotonic(),
            "graphs": self.graphs,
            "last_graph": self.last_graph,
            "cpu": time.process_time(),
            "loop_cpu": time.thread_time(),  # handlers run on the loop thread
            "threads": _thread_cpu(),
            "oomguard_cpu": {k: list(v) for k, v in self.oomguard_cpu.items()},
            "rss": _status_kib("VmRSS") * 1024,
            "peak_rss": _status_kib("VmHWM") * 1024,
        }

    # --- oomguard's share of the loop thread ----------------------------------------------

    def _wrap_oomguard(self) -> None:
        self._wrapped = True
        plugin = self.scheduler.plugins.get("oomguard")
        if plugin is None:
            return
        for obj, names in (
            (
                plugin,
                (
                    "update_graph",
                    "transition",
                    "add_worker",
                    "log_event",
                    "_apply_guarded",
                    "persist_pipelines",
                ),
            ),
            (plugin.core, ("tick",)),
            (plugin.desk.intake, ("on_batch",)),
        ):
            for name in names:
                setattr(obj, name, self._timed(getattr(obj, name), name))
        handlers = self.scheduler.handlers
        for name, fn in list(handlers.items()):
            if name.startswith("oomguard_") and asyncio.iscoroutinefunction(fn):
                handlers[name] = self._timed_async(fn, name)

    def _timed(self, fn, name: str):
        tt = time.thread_time
        acc = self.oomguard_cpu.setdefault(name, [0.0, 0])

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if self._depth:
                return fn(*args, **kwargs)
            self._depth = 1
            t = tt()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[0] += tt() - t
                acc[1] += 1
                self._depth = 0

        return timed

    def _timed_async(self, fn, name: str):
        # oomguard's RPC handlers only queue or answer (the report handler has no await):
        # the time around the await is theirs.
        acc = self.oomguard_cpu.setdefault(name, [0.0, 0])

        @functools.wraps(fn)
        async def timed(*args, **kwargs):
            t = time.thread_time()
            try:
                return await fn(*args, **kwargs)
            finally:
                acc[0] += time.thread_time() - t
                acc[1] += 1

        return timed


class GraphClock(SchedulerPlugin):
    """Notes when the last graph submission was taken in (the submission phase's end)."""

    name = "bench-graph-clock"

    def __init__(self, probe: LoopProbe) -> None:
        self.probe = probe

    def update_graph(self, scheduler, **kw) -> None:
        self.probe.graphs += 1
        self.probe.last_graph = time.monotonic()


def dask_setup(scheduler) -> None:
    probe = LoopProbe(scheduler)
    scheduler.add_plugin(GraphClock(probe))
    scheduler.handlers[HANDLER] = probe.handler
    scheduler._bench_probe_task = asyncio.get_running_loop().create_task(probe.run())
