"""dask-jobqueue (issue 15, build 3): the recipe of docs/deploying.md, run for real.

dask-jobqueue's own `LocalCluster` (`dask_jobqueue.local`) builds each job's script with the
same `Job` machinery as `SLURMCluster` and runs it as a local process instead of handing it
to a batch system. One job with one worker (`cores=1, processes=1`), the preloads passed
as the recipe passes them (`worker_extra_args`, `scheduler_options`), a task allocating
past the job's `memory`: the kernel OOM-kills the worker in the per-worker memory cgroup
its nanny made, and the scheduler records `oom_kill` for that task's key.
"""

from __future__ import annotations

import os
import sys
import time

import dask
import distributed
import pytest
from distributed import Client

import oomguard
from capabilities import require
from cluster_helpers import require_worker_groups, wait_for, wait_installed
from oomguard._host import cgroup as _cgroup

try:
    from dask_jobqueue.local import LocalCluster as JobQueueLocalCluster
except ImportError:  # not installed: the test is skipped through require() below
    JobQueueLocalCluster = None

pytestmark = pytest.mark.timeout(240)

MiB = 2**20
LIMIT = 400 * MiB  # the job's `memory`, its one worker's --memory-limit and cgroup limit


def allocate(nbytes):
    time.sleep(0.6)  # let the sampler record this frame
    block = bytearray(b"x") * nbytes  # touches every page, faster than any monitor
    return len(block)


def _gone(pid: int) -> bool:
    """True once `pid` has exited (a zombie counts: LocalJob never reaps its job)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_jobqueue_worker_oom_killed_and_classified(tmp_path, monkeypatch):
    require(
        JobQueueLocalCluster is not None,
        "dask-jobqueue is not installed (it is in the `test` extra)",
    )
    require_worker_groups()

    # The job's process inherits this environment (dask_jobqueue.local runs the job
    # script's words with tornado's Subprocess): this module on its path, so the worker
    # can unpickle `allocate`, and worker-side settings, read by the job's nanny from
    # DASK_* variables as on a batch node. cgroup-limit "true" makes a missing per-worker
    # group a startup error instead of a silent fallback; the nanny's own 95 % kill is off
    # so that the kernel, not the nanny, stops the task.
    # distributed.utils_test's cleanup (tests/cluster/test_dask_test_utils.py) restores a
    # config snapshot taken before dask_jobqueue added its defaults: read them again, before
    # the DASK_* variables below exist in this process.
    dask.config.refresh()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(sys.path))
    monkeypatch.setenv("DASK_OOMGUARD__WORKER__CGROUP_LIMIT", "true")
    monkeypatch.setenv("DASK_OOMGUARD__WORKER__SAMPLE_INTERVAL", "100ms")
    monkeypatch.setenv("DASK_OOMGUARD__WORKER__CRASH_DIR", str(tmp_path / "crash"))
    monkeypatch.setenv("DASK_DISTRIBUTED__WORKER__MEMORY__TERMINATE", "False")

    # The scheduler runs in this process (JobQueueCluster is a SpecCluster): its settings
    # come from this process's config.
    with dask.config.set(
        {
            "oomguard.scheduler.store": str(tmp_path / "failures.sqlite3"),
            "oomguard.scheduler.report-grace-timeout": "5s",
        }
    ):
        cluster = JobQueueLocalCluster(
            cores=1,
            processes=1,
            memory="400MiB",
            python=sys.executable,  # the job runs `<python> -m distributed.cli.dask_worker`
            worker_extra_args=["--preload-nanny", "oomguard.worker_plugin"],
            scheduler_options={
                "preload": ["oomguard.scheduler_plugin"],
                "dashboard_address": ":0",
            },
        )
        with cluster, Client(cluster) as client:
            # The job script as dask-jobqueue 0.9.0 writes it: the worker is the module
            # run by `python` (no `dask-worker` script, which distributed 2026.6+ lacks),
            # with the job's memory as its limit and the recipe's preload.
            script = cluster.job_script()
            command = script.strip().splitlines()[-1]
            assert command.startswith(f"{sys.executable} -m distributed.cli.dask_worker "), script
            assert " --nthreads 1 --memory-limit 400.00MiB --nanny " in command, script
            assert command.endswith(" --preload-nanny oomguard.worker_plugin"), script

            cluster.scale(jobs=1)
            client.wait_for_workers(1, timeout=120)
            wait_installed(client, 1)
            ((addr, info),) = client.scheduler_info()["workers"].items()
            assert info["memory_limit"] == LIMIT
            # The job's id is its nanny's PID. Hold no Job object: SpecCluster's close
            # asserts that every live one is closed, and a dask-jobqueue Job never says so.
            (job_pid,) = [int(job.job_id) for job in cluster.workers.values()]
            # The job's worker process is in its own memory group, made by its nanny.
            pid = client.run(os.getpid)[addr]
            group = _cgroup.detect(pid).path
            assert os.path.basename(group) == f"oomguard-worker-{pid}", group

            with distributed.span("jobqueue-oom"):
                fut = client.submit(allocate, LIMIT + 200 * MiB, pure=False)
            # The only worker is this size: oomguard aborts at the first OOM kill rather
            # than retry where the shard cannot fit (memory-retry-larger-only).
            with pytest.raises(oomguard.PipelineAborted) as aborted:
                fut.result(timeout=120)
            assert aborted.value.cause == "oom_kill", str(aborted.value)

            events = oomguard.Failures(client).events()
            assert [e.cause for e in events] == ["oom_kill"], events
            event = events[0]
            assert event.shard == str(fut.key)
            assert event.pipeline == "jobqueue-oom"
            assert event.kind == "infra"
            assert event.worker == addr
            assert event.evidence.get("oom_kill_delta") == 1, event.evidence
            assert event.evidence.get("limit_bytes") == LIMIT, event.evidence

            # Close the job's worker and nanny the way the scheduler does, so the nanny
            # removes its worker's group: LocalJob ends a job with SIGKILL to the nanny,
            # which would leave the (empty) group behind.
            client.wait_for_workers(1, timeout=120)  # the nanny's new worker
            (new_pid,) = client.run(os.getpid).values()
            new_group = _cgroup.detect(new_pid).path
            assert new_group == os.path.join(
                os.path.dirname(group), f"oomguard-worker-{new_pid}"
            ), new_group
            client.retire_workers(close_workers=True)
            wait_for(
                lambda: _gone(job_pid), "the job's nanny did not exit", timeout=60, interval=0.1
            )
            assert not os.path.exists(group) and not os.path.exists(new_group)
