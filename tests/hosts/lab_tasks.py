"""Tasks the lab's scenarios run on its workers (importable there: the lab puts tests/hosts
on every process's PYTHONPATH, so these pickle by reference and keep stable frames)."""

from __future__ import annotations

import ctypes
import time


def oom_task(shard, limit):
    # Sleep first so the flight recorder samples this frame; then allocate past the
    # worker's cgroup limit in one go, faster than anything but the kernel can react.
    time.sleep(1.5)
    chunks = []
    for _ in range(4):
        chunks.append(bytearray(limit // 2))
    return len(chunks)


def crasher(shard):
    """Segfaults every time it runs, wherever: a deterministic crasher."""
    time.sleep(0.5)
    ctypes.string_at(0)


def sleepy(shard, seconds):
    time.sleep(seconds)
    return shard


def inc(x):
    time.sleep(0.05)
    return x + 1


def segfault_once(shard, marker):
    """Segfaults the first time it runs (on whichever host), then succeeds: one death per
    shard, and its retry finishes."""
    import os

    if not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(1.0)
        ctypes.string_at(0)
    return shard


def hold_until(shard, flag, timeout=300):
    """Runs until the file `flag` exists (the test makes it once the scenario is over), so
    it is executing whenever the test strikes, and a rerun after that is quick."""
    import os

    deadline = time.monotonic() + timeout
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.1)
    return shard
