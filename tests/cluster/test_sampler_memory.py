"""The flight recorder's sampler must not keep a finished task's memory alive.

It reads every thread's frame with `sys._current_frames()`. That dict also holds the
sampler's own frame, which holds the dict: a reference cycle. Until Python's cycle collector
happened to run, it kept the sampled task frames, and every local in them, alive after the
task returned and its memory lease was released (issue 16: a worker at 609 MiB holding one
320 MiB lease, OOM-killed). Here the worker's cycle collector is off, so only reference
counting frees the task's buffer, as it does without oomguard.
"""

from __future__ import annotations

import gc
import time
import weakref

import dask
import pytest
from distributed import Client, LocalCluster

import oomguard

pytestmark = pytest.mark.timeout(180)

_REFS: list[weakref.ref] = []  # in the worker process


class Buffer:
    def __init__(self, nbytes: int):
        self.data = bytearray(nbytes)


def hold(nbytes: int, seconds: float) -> int:
    buffer = Buffer(nbytes)  # a local of this frame: sampled while it sleeps
    _REFS.append(weakref.ref(buffer))
    time.sleep(seconds)
    return len(buffer.data)


def freed() -> list[bool]:
    return [ref() is None for ref in _REFS]


def test_a_finished_tasks_locals_are_freed_while_the_sampler_runs(tmp_path):
    config = {
        "oomguard.worker.sample-interval": "20ms",
        "distributed.nanny.preload": ["oomguard.worker_plugin"],
    }
    with (
        dask.config.set(config),
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        oomguard.install(client, store=str(tmp_path / "s.sqlite3"))
        assert all(client.run(lambda: gc.disable() or not gc.isenabled()).values())
        for _ in range(3):
            # 1 s at a 20 ms interval: ~50 samples of the task's frame each.
            assert client.submit(hold, 64 << 20, 1.0, pure=False).result(timeout=60) == 64 << 20
        time.sleep(0.2)  # a few more samples after the last task ended
        [states] = client.run(freed).values()
        client.run(gc.enable)
    assert states == [True, True, True]
