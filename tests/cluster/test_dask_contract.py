"""Dask's contract kept with oomguard loaded (issue 39, point 2), on real Dask.

- Every descriptor and thread oomguard opens for a scheduler, a nanny and a worker started
  and closed in-process is closed with them (a notebook that makes clusters again and
  again never runs out); before, each worker left its memory ledger and /proc/meminfo open,
  and the scheduler's store opened reader connections as threads came.
- `scheduler.allowed_failures` reads what the user set (it read one more before).
- A task that kills workers stops within Dask's own bound with a `KilledWorker` that says
  Dask's own sentence, and Dask's log line; a task only queued on the worker that died at
  that bound is not blamed (Dask alone errs it at once): oomguard decides with the death
  report in hand (`scheduler_plugin/_dask_bound.py`).
- The tasks of a worker removed without a report are held at most the report grace.

`PipelineAborted`'s class, fields and pickling: tests/unit/test_killed_worker.py. distributed's
own test suite with and without oomguard: docs/dask-parity.md.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time

import dask
import pytest
from distributed import Client, Event, KilledWorker, LocalCluster, Nanny, Scheduler, Worker
from distributed.utils_test import captured_logger

import oomguard

pytestmark = pytest.mark.timeout(300)

PRELOADS = {
    "distributed.scheduler.preload": ["oomguard.scheduler_plugin"],
    "distributed.nanny.preload": ["oomguard.worker_plugin"],
    "oomguard.worker.cgroup-limit": "false",
}


def _descriptors() -> dict[int, str]:
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return out


def _state() -> tuple[dict[int, str], list[str]]:
    return _descriptors(), sorted(t.name for t in threading.enumerate())


def _settled() -> tuple[dict[int, str], list[str]]:
    """`_state()` once the last cluster's leftovers are gone: the threads that watch a nanny's
    worker process end a moment after the cluster does (later on a loaded machine)."""
    deadline = time.monotonic() + 30
    state = _state()
    while any("watch process" in t for t in state[1]) and time.monotonic() < deadline:
        time.sleep(0.1)
        state = _state()
    return state


async def _a_cluster_comes_and_goes(directory: str) -> None:
    async with Scheduler(dashboard_address=":0", local_directory=directory) as s:
        async with (
            Nanny(s.address, nthreads=1, local_directory=directory),
            Worker(s.address, nthreads=1, local_directory=directory),
            Client(s.address, asynchronous=True) as c,
        ):
            await c.wait_for_workers(2)
            assert sum(await c.gather(c.map(abs, range(-4, 0)))) == 10


def test_descriptors_and_threads_are_back_where_they_were(tmp_path):
    # Once without oomguard: what Dask and multiprocessing open once per process for good
    # (the resource tracker's pipe, Dask's offload thread) is open before the count.
    asyncio.run(_a_cluster_comes_and_goes(str(tmp_path)))
    before = _settled()
    config = {**PRELOADS, "oomguard.scheduler.store": str(tmp_path / "s.sqlite3")}
    with dask.config.set(config):
        for _ in range(2):
            asyncio.run(_a_cluster_comes_and_goes(str(tmp_path)))
    deadline = time.monotonic() + 30
    while _state() != before and time.monotonic() < deadline:
        time.sleep(0.1)
    fds, threads = _state()
    assert {k: v for k, v in fds.items() if before[0].get(k) != v} == {}
    assert threads == before[1]


def test_allowed_failures_reads_what_the_user_set(tmp_path):
    async def scheduler_says(**kwargs) -> tuple[int, bool]:
        async with Scheduler(dashboard_address=":0", **kwargs) as s:
            return s.allowed_failures, s.plugins["oomguard"].core is not None

    config = {**PRELOADS, "oomguard.scheduler.store": str(tmp_path / "s.sqlite3")}
    with dask.config.set(config):
        assert asyncio.run(scheduler_says(allowed_failures=10)) == (10, True)
        with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
            assert asyncio.run(scheduler_says()) == (0, True)


def kill_once_the_bystander_is_here(bystander: str) -> None:
    """Kill this worker (SIGKILL) once the bystander task is queued on it too."""
    from distributed import get_worker

    worker = get_worker()
    deadline = time.monotonic() + 60
    while bystander not in worker.state.tasks and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGKILL)


def bystander() -> int:
    return 42


def test_dasks_bound_with_dasks_words_and_no_blame_for_the_queued(tmp_path):
    config = {
        **PRELOADS,
        "oomguard.scheduler.store": str(tmp_path / "s.sqlite3"),
        "distributed.scheduler.allowed-failures": 0,  # the first death is past the bound
        "distributed.scheduler.worker-saturation": "inf",  # both tasks go to the worker
    }
    with (
        dask.config.set(config),
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cl,
        Client(cl) as client,
        captured_logger("distributed.scheduler", level=logging.ERROR) as log,
    ):
        client.wait_for_workers(1, timeout=60)
        queued = client.submit(bystander, key="bystander", pure=False)
        killer = client.submit(kill_once_the_bystander_is_here, "bystander", key="killer")
        assert queued.result(timeout=120) == 42  # Dask alone errs it with KilledWorker
        with pytest.raises(KilledWorker) as e:
            killer.result(timeout=120)
        assert cl.scheduler.allowed_failures == 0
    assert str(e.value).startswith(
        "Attempted to run task 'killer' on 1 different workers, but all those workers died"
    )
    assert isinstance(e.value, oomguard.PipelineAborted) and e.value.task == "killer"
    assert "Task killer marked as failed because 1 workers died" in log.getvalue()


def test_a_removed_workers_tasks_are_held_at_most_the_report_grace(tmp_path):
    """Removed without a report (no nanny here): oomguard holds its tasks until the grace
    runs out, then lets them run elsewhere (docs/reading-a-report.md, "Held tasks")."""
    grace = 1.0

    async def held_for() -> float:
        async with (
            Scheduler(dashboard_address=":0") as s,
            Worker(s.address, nthreads=1) as a,
            Worker(s.address, nthreads=1) as b,
            Client(s.address, asynchronous=True) as c,
        ):
            ev = Event()
            fut = c.submit(lambda ev: ev.wait(), ev, workers=[a.address], allow_other_workers=True)
            while not a.state.executing:
                await asyncio.sleep(0.01)
            await s.remove_worker(a.address, stimulus_id="test", close=False)
            removed = time.monotonic()
            assert s.tasks[fut.key].state == "no-worker"  # held
            while s.tasks[fut.key].processing_on is not s.workers[b.address]:
                await asyncio.sleep(0.01)
            took = time.monotonic() - removed
            await ev.set()
            await fut
            return took

    config = {
        **PRELOADS,
        "oomguard.scheduler.store": str(tmp_path / "s.sqlite3"),
        "oomguard.scheduler.report-grace-timeout": f"{grace}s",
    }
    with dask.config.set(config):
        took = asyncio.run(held_for())
    assert grace <= took <= grace + 10, took
