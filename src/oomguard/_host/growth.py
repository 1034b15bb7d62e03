"""Which executing task made its worker grow (pure, plus one /proc reader).

One process, one heap: the kernel counts memory per process, not per thread. What it does
count per thread is system time, and faulting in new pages (the kernel zeroing them) is
system time of the thread that touches them, whatever the page size. So between two samples
the worker's RSS growth is split among the executing tasks by the system time each one's
thread used meanwhile. A task that only sleeps or only computes gets (almost) nothing; two
tasks allocating alike split it evenly. Page faults per thread would be the direct count,
but one fault maps a whole huge page (numpy asks for them), so they undercount big arrays.

The figure is an estimate and is labelled so: growth before a task's first sample, growth
in the last interval before a SIGKILL, and system time spent on other things (I/O) blur it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def thread_system_time(native_id: int) -> float | None:
    """Seconds of system time the thread `native_id` of this process has used (Linux)."""
    try:
        with open(f"/proc/self/task/{native_id}/stat", "rb") as f:
            data = f.read()
        # Fields after the command name (which may hold spaces): state is field 3, stime 15.
        return int(data[data.rindex(b")") + 2 :].split()[12]) / _TICKS
    except (OSError, ValueError, IndexError):
        return None


class GrowthSplit:
    """RSS growth attributed to executing tasks, sample by sample.

    `update(rss, running)` takes the process RSS and, per executing task key, its thread's
    (native id, cumulative system time); it returns each executing task's estimated growth
    in bytes since it started. Tasks no longer running are forgotten.

    >>> g = GrowthSplit()
    >>> g.update(100, {"a": (1, 0.0), "b": (2, 0.0)})
    {'a': 0, 'b': 0}
    >>> g.update(1100, {"a": (1, 0.9), "b": (2, 0.1)})   # a's thread faulted 9x more
    {'a': 900, 'b': 100}
    >>> g.update(600, {"b": (2, 0.1)})                   # shrinking blames nobody
    {'b': 100}
    """

    def __init__(self) -> None:
        self._rss: int | None = None
        self._thread_time: dict[int, float] = {}  # native id -> system time at last sample
        self._grew: dict[Any, float] = {}

    def update(self, rss: int, running: Mapping[Any, tuple[int, float | None]]) -> dict[Any, int]:
        weights: dict[Any, float] = {}
        seen: dict[int, float] = {}
        for key, (tid, stime) in running.items():
            if stime is None:
                continue
            # A thread first seen now: its system time since it was made (an executor
            # thread is made for tasks; what it did between samples counts here).
            weights[key] = max(0.0, stime - self._thread_time.get(tid, 0.0))
            seen[tid] = stime
        grown = rss - self._rss if self._rss is not None else 0
        total = sum(weights.values())
        grew = {key: self._grew.get(key, 0.0) for key in running}
        if grown > 0 and total > 0:
            for key, w in weights.items():
                grew[key] += grown * w / total
        self._rss = rss
        # Threads idle now keep their last reading (a later task on them is measured from
        # there); only executor threads ever get here, so this stays small.
        if len(self._thread_time) > 4096:
            self._thread_time.clear()
        self._thread_time.update(seen)
        self._grew = grew
        return {key: int(v) for key, v in grew.items()}
