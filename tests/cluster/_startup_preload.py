"""Worker preload for tests/cluster/test_startup_stampede.py: a start-up memory spike.

A worker that reloads what it needs when it starts (a model, a lookup table, a cache):
it reads SPIKE bytes in 10 parts over ~FILL_S seconds, builds from them for HOLD_S
seconds, and drops them before it registers with the scheduler, leaving a small steady
state. Dask runs ``dask_setup`` inside ``Worker.start``, before the worker is up, so the
spike falls inside the nanny's start of the worker process.

Loaded as a module (``distributed.worker.preload: ["_startup_preload"]``), not as a file:
Dask executes a preload *file* twice per process, a module is imported once. Each worker
keeps what it did as ``worker._startup_spike`` (begin, end, bytes, VmHWM after).
"""

from __future__ import annotations

import time

MiB = 2**20
SPIKE = 256 * MiB
FILL_S = 0.5
HOLD_S = 0.5


def _vm_hwm() -> int | None:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def dask_setup(worker) -> None:
    import numpy as np

    # The scheduler, client and nannies share the group in the test's child process: the
    # kernel must pick a worker. A process may always raise its own oom_score_adj (lowering
    # the others' needs a capability this sandbox lacks), so the workers volunteer. Here,
    # not at import: the test imports this module for SPIKE.
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
    began = time.time()
    a = np.empty(SPIKE // 8)
    step = len(a) // 10
    for j in range(10):
        a[j * step : (j + 1) * step] = 1.0
        time.sleep(FILL_S / 10)
    a[10 * step :] = 1.0
    time.sleep(HOLD_S)
    del a
    worker._startup_spike = (began, time.time(), SPIKE, _vm_hwm())
