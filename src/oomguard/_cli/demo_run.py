"""`oomguard demo`: a real OOM kill, a real segfault and a user error on a local cluster.

Two workers, 320 MiB and 480 MiB. The pipeline "demo" has `shards` shards: one needs
more memory than either worker has (oomguard retries it on the larger one, then aborts),
one segfaults on its first attempt, one raises a user error on its first attempt (and has
`retries=1`), the rest sleep briefly. oomguard classifies every failure, groups the two OOM
kills of the crasher into one signature, and aborts the pipeline.

The cluster is named `oomguard-demo` and keeps the default history (no `store` setting:
`oomguard._store.home`), so `oomguard report` reads it after the demo ends, and each demo
run adds to it; what the demo prints is this run's.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .._protocol import SCHEDULER_PLUGIN

#: The two workers' memory limits; the crasher needs 1 GiB, more than either.
SMALL, BIG = 320 * 2**20, 480 * 2**20
NEED = 2**30
CRASHER, SEGFAULTER, FLAKY = 7, 13, 21
#: The demo cluster's name in the failure history: one file for every demo run.
CLUSTER = "oomguard-demo"
#: How a shard of the demo ended, as the progress line counts them.
OUTCOMES = ("finished", "failed", "aborted")


def load_shard(i: int, need: int) -> int:
    """The crasher: reads a shard larger than any worker's memory."""
    time.sleep(0.6)  # the flight recorder samples this frame before the kill
    held = []
    for _ in range(8):
        held.append(bytearray(need // 8))
        time.sleep(0.02)
    time.sleep(2)  # without a cgroup limit: hold it until the nanny's monitor sees it
    return len(held)


def parse_shard(i: int, marker_dir: str) -> int:
    """Segfaults on its first attempt (a native bug triggered once), then succeeds."""
    marker = os.path.join(marker_dir, f"segfault-{i}")
    time.sleep(0.2)
    if not os.path.exists(marker):
        open(marker, "w").close()
        ctypes.string_at(0)
    return i


def flaky_shard(i: int, marker_dir: str) -> int:
    """Raises a user error on its first attempt; `retries=1` fixes it."""
    marker = os.path.join(marker_dir, f"flaky-{i}")
    time.sleep(0.2)
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise ConnectionResetError(f"object store dropped the connection for shard {i}")
    return i


def shard(i: int) -> int:
    time.sleep(0.3)
    return i


@dataclass
class DemoResult:
    memory_cause: str  # "oom_kill" (kernel, per-worker cgroup) or "memory_terminate"
    kernel_oom: bool
    aborted: Any = None  # the PipelineAborted raised on the client
    events: list = field(default_factory=list)
    signatures: list = field(default_factory=list)
    status: Any = None
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    store: str = ""  # the history file the run was recorded in


def run_demo(shards: int = 30, progress=None) -> DemoResult:
    import dask
    import distributed
    from distributed import Client, LocalCluster

    import oomguard

    from .._host import cgroup as _cgroup

    start = time.monotonic()
    # The abort is logged at ERROR on the scheduler; here it is printed with the report.
    logging.getLogger("oomguard").setLevel(logging.CRITICAL)
    kernel_oom, _reason = _cgroup.can_create_child()
    result = DemoResult(
        memory_cause="oom_kill" if kernel_oom else "memory_terminate", kernel_oom=kernel_oom
    )
    marker_dir = tempfile.mkdtemp(prefix="oomguard-demo-")
    since = time.time()
    config = {
        "oomguard.worker.cgroup-limit": "true" if kernel_oom else "false",
        "oomguard.worker.sample-interval": "200ms",
        # The default history, whatever this host's config names: `oomguard report` then
        # reads it with no flag (oomguard._cli.report_default).
        "oomguard.scheduler.store": None,
        "oomguard.scheduler.cluster-name": CLUSTER,
        # With a per-worker cgroup the kernel stops the crasher; without one, the nanny.
        "distributed.worker.memory.terminate": False if kernel_oom else 0.95,
        "distributed.worker.memory.pause": False,
        "distributed.worker.memory.spill": False,
        "distributed.worker.memory.target": False,
        "distributed.scheduler.worker-saturation": 1.0,
        "logging.distributed": "error",
    }
    with dask.config.set(config):
        with (
            LocalCluster(
                n_workers=1,
                threads_per_worker=1,
                processes=True,
                memory_limit=SMALL,
                dashboard_address=":0",
                silence_logs=50,
            ) as cluster,
            Client(cluster) as client,
        ):
            # A second, larger worker: oomguard retries a memory kill only on a larger one.
            spec = dict(cluster.new_spec)
            spec["options"] = {**spec["options"], "memory_limit": BIG}
            cluster.worker_spec["big"] = spec
            cluster.sync(cluster._correct_state)
            client.wait_for_workers(2, timeout=60)
            oomguard.install(client)
            with distributed.span("demo"):
                futures = []
                for i in range(shards):
                    key = ("demo", i)
                    if i == SEGFAULTER:
                        futures.append(client.submit(parse_shard, i, marker_dir, key=key))
                    elif i == FLAKY:
                        futures.append(
                            client.submit(flaky_shard, i, marker_dir, key=key, retries=1)
                        )
                    elif i != CRASHER:
                        futures.append(client.submit(shard, i, key=key))
                tally = dict.fromkeys(OUTCOMES, 0)
                pending = distributed.as_completed(futures)
                del futures
                for fut in pending:
                    try:
                        fut.result()
                        # Like a pipeline writing each shard's output away: a worker's
                        # death then loses only what it was running.
                        fut.release()
                        tally["finished"] += 1
                    except oomguard.PipelineAborted as e:
                        result.aborted = result.aborted or e
                        tally["aborted"] += 1
                    except Exception as e:  # pragma: no cover - reported as a problem
                        result.problems.append(f"shard {fut.key} raised {e!r}")
                        tally["failed"] += 1
                    if progress is not None:
                        progress(tally, shards)
                    if sum(tally.values()) == shards // 2:
                        # The crasher starts half way, on the small worker first, so the
                        # other failures are seen before the abort.
                        small = _worker_with_limit(client, SMALL)
                        pending.add(
                            client.submit(
                                load_shard,
                                CRASHER,
                                NEED,
                                key=("demo", CRASHER),
                                workers=small,
                                allow_other_workers=True,
                            )
                        )
            failures = oomguard.Failures(client)
            result.events = sorted(
                failures.events(pipeline="demo", since=since), key=lambda e: e.time
            )
            result.signatures = _this_run(failures.signatures(pipeline="demo"), result.events)
            result.status = failures.pipeline("demo")
            result.store = cluster.scheduler.plugins[SCHEDULER_PLUGIN].store.path
    result.seconds = time.monotonic() - start
    result.problems += _check(result)
    return result


def _this_run(signatures: list, events: list) -> list:
    """The signatures of this run's events, counted in this run: the history holds every
    demo run before it too."""
    counts = Counter(e.signature_id for e in events)
    workers: dict[str, set] = {}
    for e in events:
        workers.setdefault(e.signature_id, set()).add(e.worker)
    return [
        dataclasses.replace(s, count=counts[s.id], workers=sorted(workers[s.id]))
        for s in signatures
        if s.id in counts
    ]


def _worker_with_limit(client, limit: int) -> list[str]:
    """The address of the worker with this memory limit (it changes when one restarts)."""
    client.wait_for_workers(2, timeout=60)
    workers = client.scheduler_info()["workers"]
    return [addr for addr, w in workers.items() if w["memory_limit"] == limit]


def _check(r: DemoResult) -> list[str]:
    """What the demo promises; anything missing is a problem (exit 1)."""
    problems = []
    causes = [e.cause for e in r.events]
    if r.memory_cause not in causes:
        problems.append(f"no {r.memory_cause} event was recorded")
    if "native_crash" not in causes:
        problems.append("no native_crash event was recorded")
    if "exception" not in causes:
        problems.append("the user error was not recorded")
    if r.aborted is None:
        problems.append("the pipeline was not aborted")
    if r.status is None or r.status.status != "aborted":
        problems.append(f"pipeline status is {getattr(r.status, 'status', None)!r}, not 'aborted'")
    crasher = [e for e in r.events if e.shard == str(("demo", CRASHER))]
    if len({e.signature_id for e in crasher}) > 1:
        problems.append("the crasher's deaths did not share one signature")
    return problems


def progress_bar(tally: dict[str, int], total: int, stream=None) -> None:
    """How many shards ended, and how (`OUTCOMES`: finished, failed, aborted, each counted
    apart): a bar redrawn in place on a terminal; elsewhere (a log, a pipe) a plain line at
    each quarter, since \r would glue every redraw into one long line."""
    stream = sys.stderr if stream is None else stream
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):
        terminal = False
    done = sum(tally.values())
    how = ", ".join(f"{tally.get(o, 0)} {o}" for o in OUTCOMES)
    if terminal:
        width = 40
        filled = int(width * done / total)
        stream.write(f"\r  [{'#' * filled}{'.' * (width - filled)}] {done}/{total} shards: {how}")
        if done == total:
            stream.write("\n")
    elif done == total or done * 4 // total != (done - 1) * 4 // total:
        stream.write(f"  {done}/{total} shards ended: {how}\n")
    stream.flush()
