"""Every worker death gives exactly one report with the right cause (issue 3).

Real LocalCluster with nannies loaded through ``distributed.nanny.preload``, real signals,
a real ctypes segfault, a real kernel OOM kill in a per-worker memory cgroup. The scheduler
side here is a plain handler that decodes and validates the reports the nannies send.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time

import dask
import pytest
from distributed import Client, LocalCluster

from cluster_helpers import require_worker_groups, wait_for
from oomguard._death import wire as _wire
from oomguard.worker_plugin import CLEAN_EXIT_HANDLER, REPORT_HANDLER

pytestmark = pytest.mark.timeout(240)

LIMIT = 400 * 2**20  # each worker's memory limit, and its cgroup's


def sleepy_task(seconds):
    time.sleep(seconds)
    return seconds


def segfault_task(x):
    time.sleep(0.3)
    ctypes.string_at(0)


def abort_task(x):
    time.sleep(0.3)
    os.abort()


def exit_task(x):
    time.sleep(0.3)
    os._exit(3)


def oom_task(limit):
    # Sleep first so the sampler records this frame; then allocate past the cgroup
    # limit in one go, faster than the nanny's 100 ms memory monitor.
    time.sleep(0.6)
    chunks = []
    for _ in range(4):
        chunks.append(bytearray(limit // 2))
    return len(chunks)


def creep_task(limit):
    # Grow slowly to ~97% of the limit and stay there: the nanny's monitor (95%) sees it
    # long before the kernel would (100%).
    import psutil

    time.sleep(0.3)
    held = []
    while psutil.Process().memory_info().rss < 0.97 * limit:
        held.append(bytearray(8 * 2**20))
        time.sleep(0.01)
    time.sleep(30)


@pytest.fixture(scope="module")
def cluster():
    require_worker_groups()
    with dask.config.set(
        {
            "distributed.nanny.preload": ["oomguard.worker_plugin"],
            "oomguard.worker.cgroup-limit": "true",
            "oomguard.worker.sample-interval": "100ms",
            "oomguard.worker.signal-senders": True,  # the SIGTERM test names its sender
            "distributed.scheduler.allowed-failures": 100,
            # The kernel, not the nanny, must stop the OOM task; the nanny's own memory
            # kill has its own cluster below.
            "distributed.worker.memory.terminate": False,
        }
    ):
        with _cluster(n_workers=2) as c:
            yield c


@contextlib.contextmanager
def _cluster(n_workers):
    # LocalCluster arms a timer (distributed.deploy.lost-worker-timeout, 15 s) at every
    # worker removal and closes that worker's nanny for good if, when it fires, no worker
    # of that name is connected. Each test here kills worker "0" or "1"; on a slow machine
    # a timer armed at an earlier kill fires while a later kill's (or client.restart()'s)
    # new worker is still starting, the nanny is closed and the test waits for a worker
    # that never comes. Nothing here needs that clean-up: turn it off.
    with (
        dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"}),
        LocalCluster(
            n_workers=n_workers,
            threads_per_worker=1,
            processes=True,
            memory_limit=LIMIT,
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        reports = _Received()

        def receive(report: bytes) -> None:
            reports.append(_wire.to_wire(_wire.decode(report)))

        def clean_exit(worker: str, requested: bool = False, pid: int | None = None) -> dict:
            reports.clean_exits.append((worker, requested))
            return {"status": "ok"}

        cluster.scheduler.handlers[REPORT_HANDLER] = receive
        cluster.scheduler.handlers[CLEAN_EXIT_HANDLER] = clean_exit
        yield cluster, client, reports


class _Received(list):
    """The death reports the nannies sent; `clean_exits`: (worker, requested) of each exit
    that their nanny declared requested or clean (no report for those)."""

    def __init__(self):
        super().__init__()
        self.clean_exits: list[str] = []


def _kill_via(cluster, client, reports, fn, *args, send=None, settle=1.0):
    """Run fn on the first worker; optionally send it a signal 0.8 s later; return the
    worker's pid, the task's key and the reports that arrived."""
    client.wait_for_workers(len(cluster.workers), timeout=60)
    addr = sorted(client.scheduler_info()["workers"])[0]
    pid = client.run(os.getpid, workers=[addr])[addr]
    before = len(reports)
    fut = client.submit(fn, *args, workers=[addr], allow_other_workers=False, pure=False)
    if send is not None:
        time.sleep(0.8)
        os.kill(pid, send)
    wait_for(lambda: len(reports) > before, "no death report arrived", timeout=30.0)
    time.sleep(settle)  # a second report for the same death would arrive by now
    fut.cancel()
    new = reports[before:]
    return pid, fut.key, new


def _the_report(new, pid):
    assert len(new) == 1, [(r["cause"], r["pid"]) for r in new]
    report = new[0]
    assert report["pid"] == pid
    assert report["schema"] == _wire.SCHEMA_VERSION
    return report


def _executing_entry(report, key):
    entries = [e for e in report["executing"] if e["key"] == str(key)]
    assert entries, report["executing"]
    return entries[0]


def _stack_functions(entry):
    return [frame[2] for frame in entry["stack"] or []]


def test_sigkill_from_outside(cluster):
    cl, client, reports = cluster
    pid, key, new = _kill_via(cl, client, reports, sleepy_task, 30, send=signal.SIGKILL)
    report = _the_report(new, pid)
    assert report["cause"] == "sigkill"
    assert report["exitcode"] == -9
    # Nothing names the sender of a SIGKILL: what was excluded, with the host's memory.
    killer = report["killer"]
    assert (killer["name"], killer["how"], killer["confidence"]) == (
        "unknown",
        "inferred",
        "likely",
    ), killer
    assert killer["summary"].startswith("SIGKILL from an unknown sender: not the kernel")
    assert "MemAvailable" in killer["summary"]
    assert report["evidence"]["memavailable_bytes"] > 0
    entry = _executing_entry(report, key)
    assert "sleepy_task" in _stack_functions(entry)


def test_external_sigterm(cluster):
    cl, client, reports = cluster
    pid, key, new = _kill_via(cl, client, reports, sleepy_task, 30, send=signal.SIGTERM)
    report = _the_report(new, pid)
    assert report["cause"] == "sigterm"
    _executing_entry(report, key)
    # faulthandler is registered for SIGTERM: the dump names the task function.
    assert "sleepy_task" in (report["crash"] or {}).get("text", "")
    assert report["evidence"].get("host_available_bytes") is not None
    # The sender is this test, which runs the LocalCluster's nannies in its own process.
    assert (
        report["killer"]["name"] == "process" and report["evidence"]["sender_pid"] == os.getpid()
    )
    assert report["killer"]["summary"].startswith("SIGTERM from the nanny's own process")


def test_segfault(cluster):
    cl, client, reports = cluster
    pid, key, new = _kill_via(cl, client, reports, segfault_task, 1)
    report = _the_report(new, pid)
    assert report["cause"] == "native_crash"
    assert report["crash"]["signal"] == "SIGSEGV"
    assert "Segmentation fault" in report["crash"]["text"]
    assert "segfault_task" in report["crash"]["text"]
    _executing_entry(report, key)
    assert (report["killer"]["name"], report["killer"]["how"]) == ("task", "exit status")


def test_abort(cluster):
    cl, client, reports = cluster
    pid, key, new = _kill_via(cl, client, reports, abort_task, 1)
    report = _the_report(new, pid)
    assert report["cause"] == "native_crash"
    assert report["crash"]["signal"] == "SIGABRT"
    assert "abort_task" in report["crash"]["text"]
    assert report["killer"]["name"] == "task"


def test_exit_status(cluster):
    cl, client, reports = cluster
    pid, key, new = _kill_via(cl, client, reports, exit_task, 1)
    report = _the_report(new, pid)
    assert report["cause"] == "exit"
    assert report["exitcode"] == 3
    assert report["killer"]["summary"] == "the worker's own code: it exited with status 3"
    _executing_entry(report, key)


def test_kernel_oom_kill_in_per_worker_cgroup(cluster):
    cl, client, reports = cluster
    pid, key, new = _kill_via(cl, client, reports, oom_task, LIMIT)
    report = _the_report(new, pid)
    assert report["cause"] == "oom_kill", report["evidence"]
    assert report["killer"]["name"] == "kernel" and report["killer"]["confidence"] == "confirmed"
    before, after = report["cgroup"]["before"], report["cgroup"]["after"]
    assert after["oom_kill"] == before["oom_kill"] + 1
    assert report["cgroup"]["path"].rstrip("/").endswith(f"oomguard-worker-{pid}")
    assert after["limit"] == LIMIT
    assert report["evidence"]["peak_bytes"] >= 0.9 * LIMIT
    entry = _executing_entry(report, key)
    assert "oom_task" in _stack_functions(entry)
    # The per-worker group is gone with its worker.
    assert not os.path.exists(report["cgroup"]["path"])


def oom_in_subprocess(limit):
    # A child of the worker in the worker's own group, larger than the worker: the kernel
    # OOM-kills the child and the task goes on.
    import subprocess
    import sys

    code = f"x = bytearray({limit}); x[::4096] = b'1' * len(x[::4096])"
    return subprocess.run([sys.executable, "-S", "-c", code]).returncode


def test_an_earlier_oom_kill_in_the_group_does_not_make_a_later_sigkill_an_oom_kill(cluster):
    """The group's counter moved long before (a task subprocess was OOM-killed); a plain
    SIGKILL of the worker later is `sigkill`. Judged against the worker's start, it was
    `oom_kill` (issue 13)."""
    cl, client, reports = cluster
    client.wait_for_workers(len(cl.workers), timeout=60)
    addr = sorted(client.scheduler_info()["workers"])[0]
    rc = client.submit(
        oom_in_subprocess, 2 * LIMIT, workers=[addr], allow_other_workers=False, pure=False
    ).result(timeout=60)
    assert rc == -signal.SIGKILL
    time.sleep(0.5)  # several readings of the group (sample interval 100 ms)
    pid, key, new = _kill_via(cl, client, reports, sleepy_task, 30, send=signal.SIGKILL)
    report = _the_report(new, pid)
    ev = report["evidence"]
    assert report["cause"] == "sigkill", ev
    assert (ev["oom_kill_delta"], ev["oom_kill_since_reading"]) == (1, 0), ev
    assert ev["last_reading_age_seconds"] < 5
    assert ev["rule"].startswith("R8")


def test_nanny_memory_termination():
    with dask.config.set(
        {
            "distributed.nanny.preload": ["oomguard.worker_plugin"],
            "oomguard.worker.cgroup-limit": "false",
            "oomguard.worker.sample-interval": "100ms",
            # The module's cluster fixture, still open, turned this off.
            "distributed.worker.memory.terminate": 0.95,
        }
    ):
        with _cluster(n_workers=1) as (cl, client, reports):
            pid, key, new = _kill_via(cl, client, reports, creep_task, LIMIT)
    report = _the_report(new, pid)
    assert report["cause"] == "memory_terminate", report["evidence"]
    assert report["exitcode"] == -signal.SIGTERM
    assert report["evidence"]["nanny_memory_kill"] is True
    killer = report["killer"]
    assert (killer["name"], killer["how"], killer["memory"]) == ("dask-nanny", "nanny event", True)
    assert killer["summary"].startswith("SIGTERM from Dask's nanny: memory terminate at RSS")
    assert report["evidence"]["rss_sampled_bytes"] > 0.5 * LIMIT
    entry = _executing_entry(report, key)
    assert "creep_task" in _stack_functions(entry)


def test_clean_close_and_retirement_send_nothing(cluster):
    cl, client, reports = cluster
    client.wait_for_workers(2, timeout=60)
    before = len(reports)
    workers = client.scheduler_info()["workers"]
    addr, other = sorted(workers)[:2]
    nanny = cl.workers[workers[addr]["name"]]
    client.retire_workers([addr], close_workers=True)
    # Each nanny decides "report or clean exit" when its worker process is gone: wait for
    # those decisions, not a fixed time (a sleep can end first on a slow machine and see
    # nothing). The retired nanny closes after its worker process stopped.
    wait_for(
        lambda: nanny.status.name == "closed",
        lambda: f"the retired nanny did not close: {nanny.status}",
        60,
    )
    wait_for(
        lambda: (addr, True) in reports.clean_exits,
        lambda: f"no clean exit of {addr}: {reports.clean_exits}",
        60,
    )
    client.restart()  # a requested restart of every worker is not a failure either
    # A restart's kill has no teardown: this clean exit is the nanny's decision itself.
    wait_for(
        lambda: (other, True) in reports.clean_exits,
        lambda: f"no clean exit of {other}: {reports.clean_exits}",
        60,
    )
    assert reports[before:] == []
