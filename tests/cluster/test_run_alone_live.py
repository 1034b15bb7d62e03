"""A suspect's retry runs alone, also when every thread of the cluster is busy (issue 38).

Two workers of two threads and 600 MiB, each in its own memory cgroup (real kernel OOM
kills). A healthy pipeline keeps every thread busy with one-second tasks for the whole test;
another pipeline holds one shard that needs 2 GiB, and that starts growing as soon as a task
of the healthy pipeline has just begun beside it (so its first death is shared). That death
proves no single task too big: each task that was executing is retried alone. The shard's
retry must then run with nothing else executing on its worker, die alone, and be judged on
that death at once (no larger worker: its pipeline aborted), at the second death. Without
the gate its retries ran beside healthy tasks, every death was shared again, and it killed
Dask's bound of workers (4) before anything was decided.

What ran beside what is read from the tasks' own timings (each writes when it starts and
ends, with its process id), never from what oomguard says.
"""

from __future__ import annotations

import mmap
import os
import time

import dask
import distributed
import pytest
from distributed import Client, LocalCluster

import oomguard
from _accounts import counted_once_everywhere
from cluster_helpers import require_worker_groups, wait_for, wait_installed
from oomguard._death.record import Role

pytestmark = pytest.mark.timeout(420)

MiB = 2**20
LIMIT = 600 * MiB
SHARD_NEEDS = 2048 * MiB
NAP = 1.0  # a healthy task's length
IN_FLIGHT = 12  # healthy tasks kept submitted and unfinished: 3 per thread


def _log(path: str, *fields) -> None:
    with open(path, "a") as f:  # one short append per line: lines never interleave
        f.write(" ".join(str(x) for x in fields) + "\n")


def nap(i: int, log: str) -> int:
    """A task of the healthy pipeline: one second, a little memory."""
    _log(log, "start", os.getpid(), i, time.time())
    time.sleep(NAP)
    _log(log, "end", os.getpid(), i, time.time())
    return i


def _neighbour_just_began(log: str, pid: int) -> bool:
    """A healthy task began in this process less than 0.2 s ago and has not ended."""
    began, ended = {}, set()
    with open(log) as f:
        for line in f:
            fields = line.split()
            if len(fields) != 4 or not line.endswith("\n"):
                continue  # a line being written
            what, p, i, t = fields
            if int(p) == pid:
                if what == "start":
                    began[i] = float(t)
                else:
                    ended.add(i)
    now = time.time()
    return any(now - t < 0.2 for i, t in began.items() if i not in ended)


def too_big(log: str, healthy: str, nbytes: int) -> int:
    """The shard: waits (up to 3 s) until a healthy task has just begun beside it, then
    takes `nbytes` as fast as it can (the worker's 600 MiB in well under a second, while
    that task still runs); it never fits."""
    _log(log, "shard", os.getpid(), 0, time.time())
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and not _neighbour_just_began(healthy, os.getpid()):
        time.sleep(0.01)
    ones, blocks = b"\1" * (20 * MiB), []
    for _ in range(nbytes // len(ones)):
        block = mmap.mmap(-1, len(ones))
        block[:] = ones  # every page written: resident now
        blocks.append(block)
    return len(blocks)


def _lines(path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def _running(log) -> int:
    started = {(p, i) for what, p, i, _ in _lines(log) if what == "start"}
    ended = {(p, i) for what, p, i, _ in _lines(log) if what == "end"}
    return len(started - ended)


def _beside(healthy_log, pid: str, since: float) -> list[tuple]:
    """Healthy tasks that executed in process `pid` while a shard attempt that began at
    `since` ran there: begun after it, or begun before and not ended by then (the process
    died during the shard: the shard never returns)."""
    spans: dict[str, list] = {}
    for what, p, i, t in _lines(healthy_log):
        if p == pid:
            spans.setdefault(i, [None, None])[0 if what == "start" else 1] = float(t)
    return [
        (i, start, end)
        for i, (start, end) in spans.items()
        if start is not None and (start >= since or end is None or end > since)
    ]


def _evidence(client) -> list:
    return [
        (e.cause, e.shard, e.evidence.get("executing_tasks"), e.evidence.get("summary"))
        for e in oomguard.Failures(client).events()
    ]


def _deaths(client) -> int:
    """Dask's own count: unexpected `remove-worker` events."""
    return sum(
        1
        for _, m in client.get_events("all")
        if isinstance(m, dict) and m.get("action") == "remove-worker" and not m.get("expected")
    )


@pytest.fixture
def busy_cluster(tmp_path):
    require_worker_groups()
    with dask.config.set(
        {
            "oomguard.worker.cgroup-limit": "true",  # the kernel kills, in the worker's group
            "oomguard.worker.sample-interval": "100ms",
            "oomguard.worker.admission.enabled": False,
            "oomguard.scheduler.report-grace-timeout": "3s",
            "distributed.worker.memory.terminate": False,
            "distributed.worker.memory.target": False,
            "distributed.worker.memory.spill": False,
            "distributed.worker.memory.pause": False,  # a paused worker starts nothing
            "distributed.deploy.lost-worker-timeout": "1h",
        }
    ):
        with (
            LocalCluster(
                n_workers=2,
                threads_per_worker=2,
                processes=True,
                memory_limit=LIMIT,
                dashboard_address=":0",
            ) as cl,
            Client(cl) as client,
        ):
            oomguard.install(client, store=str(tmp_path / "f.sqlite3"))
            wait_installed(client, 2)
            yield client


def test_a_too_big_shard_among_busy_threads_runs_alone_and_is_aborted_at_its_second_death(
    busy_cluster, tmp_path
):
    client = busy_cluster
    healthy_log, shard_log = tmp_path / "healthy", tmp_path / "shard"
    healthy: list = []

    def feed() -> None:  # every thread busy: IN_FLIGHT healthy tasks unfinished at all times
        n, missing = len(healthy), IN_FLIGHT - sum(not f.done() for f in healthy)
        if missing > 0:
            with distributed.span("healthy"):
                healthy.extend(
                    [
                        client.submit(nap, i, str(healthy_log), pure=False)
                        for i in range(n, n + missing)
                    ]
                )

    feed()
    wait_for(lambda: _running(healthy_log) >= 4, "the healthy tasks never filled 4 threads", 120)
    started = time.monotonic()
    with distributed.span("too-big"):
        big = client.submit(too_big, str(shard_log), str(healthy_log), SHARD_NEEDS, pure=False)
    while not big.done() and time.monotonic() - started < 300:
        feed()
        time.sleep(0.05)
    decided = time.monotonic() - started
    with pytest.raises(oomguard.PipelineAborted) as info:
        big.result(timeout=10)
    results = client.gather(healthy)
    attempts = [(p, float(t)) for what, p, _, t in _lines(shard_log) if what == "shard"]
    deaths = _deaths(client)
    print(
        f"\nrun alone: {len(attempts)} attempt(s) of the shard, {deaths} death(s), aborted "
        f"after {decided:.1f} s; {len(healthy)} healthy tasks"
    )

    # The shard's pipeline is aborted by the one-death-alone rule: no larger worker.
    assert "no worker has more than 600 MiB" in str(info.value), str(info.value)
    assert oomguard.Failures(client).pipeline("too-big").status == "aborted"
    # Its first death was shared with a healthy task (else this test proves nothing).
    first_pid, first_start = attempts[0]
    assert _beside(healthy_log, first_pid, first_start), "the first death was not shared"
    # 2 deaths: the shared one, then the shard alone (judged at once).
    assert len(attempts) == 2 and deaths <= 2, (attempts, deaths, _evidence(client))
    # No later attempt shared its worker with another executing task (their own timings).
    for pid, start in attempts[1:]:
        assert _beside(healthy_log, pid, start) == [], (pid, start)
    # The healthy pipeline finished, every result there.
    assert results == list(range(len(healthy)))
    # Each death counted once in the API, the signatures, /metrics and the dashboard, as
    # Dask counts it, with every thread busy. A healthy task beside the shard carries its
    # signature only as a suspect (the samples named no likely culprit); beside a culprit
    # it was displaced or queued, with no event.
    failures = oomguard.Failures(client)
    deaths = counted_once_everywhere(client)
    assert len(deaths) == len(attempts), (deaths, attempts)
    suspected = set()
    for death in deaths:
        roles = {t.role for t in death.tasks if t.pipeline == "healthy"}
        if any(t.role is Role.CULPRIT for t in death.tasks):
            assert roles <= {Role.DISPLACED, Role.QUEUED}, death
        elif Role.SUSPECT in roles:
            suspected.add(death.id)
    assert {e.death for e in failures.events(pipeline="healthy")} <= suspected
    print(f"deaths: {[(d.cause, sorted((t.key, t.role.value) for t in d.tasks)) for d in deaths]}")
    # Both workers back before the cluster closes (not one still restarting).
    client.wait_for_workers(2, timeout=120)
