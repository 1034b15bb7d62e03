"""dask-jobqueue's `SLURMCluster` on the real SLURM lab, with oomguard's recipe of
docs/deploying.md (`--preload-nanny oomguard.worker_plugin` in the job script, the
scheduler preload `oomguard.scheduler_plugin`), and SLURM's verdicts in the death reports.

Each cluster is one job with one worker (`cores=1, processes=1`):

- `jobs` (walltime 10 min), the recipe as it is: a healthy task completes; a task past the
  job's `--mem` (`job_mem` 600 MiB, below `memory` 2 GiB) is OOM-killed by the kernel in
  SLURM's own task group: inside a SLURM job's group the nanny makes no per-worker group
  (`oomguard.worker.cgroup-limit: auto`) and logs why; the kill is counted in the group it
  shares with the batch shell, and the report carries the job's id, state and `--mem` as
  scontrol tells them. Then the job is `scancel`ed while a task runs, and slurmstepd
  removes the job's whole cgroup tree.
- `own`: the same kill with `cgroup-limit: true` exported by the job script's prologue:
  the worker's own group (its limit the job's `--mem`, Dask's cap) counts it; after a
  `scancel` that group and the job's tree are left on the node (documented), and the test
  removes them.
- `timed` (walltime 1 min): submitted when the module starts, so its minute runs while the
  other scenarios do; slurmctld checks time limits every 30 s, so the job is ended 60-90 s
  after it started, while a task runs. No group of the job is left after.
- `low` (partition `low`, preemptable): once the others are done, a job of the whole node
  in partition `high` preempts it (PreemptMode=CANCEL) while a task runs. No group of the
  job is left after.
"""

from __future__ import annotations

import glob
import os
import sys
import time

import dask
import pytest
from distributed import Client
from slurm_fixtures import slurm_fixture  # noqa: F401  (the `slurm` fixture)

import oomguard
from capabilities import require
from cluster_helpers import wait_for, wait_installed

try:
    from dask_jobqueue import SLURMCluster
except ImportError:  # not installed: the tests are skipped through require() below
    SLURMCluster = None

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MiB = 2**20
JOB_MEM = 600 * MiB


def allocate(nbytes):
    time.sleep(0.6)  # let the sampler record this frame
    block = bytearray(b"x") * nbytes  # touches every page
    return len(block)


def sleep_long(seconds):
    time.sleep(seconds)
    return seconds


def _env(slurm, tmp) -> dict[str, str]:
    """What the jobs inherit (sbatch exports the submitting environment): the lab's
    slurm.conf, this module on the path (tasks unpickle by module), worker-side settings
    as DASK_* variables, as on a batch node."""
    return {
        "SLURM_CONF": slurm.conf,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "DASK_OOMGUARD__WORKER__SAMPLE_INTERVAL": "100ms",
        "DASK_OOMGUARD__WORKER__CRASH_DIR": str(tmp / "crash"),
        "DASK_DISTRIBUTED__WORKER__MEMORY__TERMINATE": "False",
    }


def _cluster(tmp, name: str, queue: str = "lab", **kwargs):
    return SLURMCluster(
        cores=1,
        processes=1,
        python=sys.executable,
        queue=queue,
        job_name=name,
        log_directory=str(tmp / "logs"),
        worker_extra_args=["--preload-nanny", "oomguard.worker_plugin"],
        scheduler_options={
            "preload": ["oomguard.scheduler_plugin"],
            "dashboard_address": ":0",
            "host": "127.0.0.1",
        },
        **kwargs,
    )


@pytest.fixture(scope="module")
def env(slurm, tmp_path_factory):
    require(SLURMCluster is not None, "dask-jobqueue is not installed (it is in the `test` extra)")
    tmp = tmp_path_factory.mktemp("slurm-jobqueue")
    mp = pytest.MonkeyPatch()
    dask.config.refresh()  # dask_jobqueue's defaults, before the DASK_* variables exist
    for k, v in _env(slurm, tmp).items():
        mp.setenv(k, v)
    config = dask.config.set(
        {
            "oomguard.scheduler.store": str(tmp / "failures.sqlite3"),
            "oomguard.scheduler.report-grace-timeout": "5s",
        }
    )
    config.__enter__()
    yield tmp
    config.__exit__(None, None, None)
    mp.undo()


@pytest.fixture(scope="module")
def timed(env):
    """The job with a 1 minute limit, submitted first, and a long task running in it: its
    minute runs while the other scenarios do, however long they take."""
    with _cluster(env, "timed", memory="1GiB", walltime="00:01:00") as cluster:
        submitted = time.monotonic()
        cluster.scale(jobs=1)
        with Client(cluster) as client:
            client.wait_for_workers(1, timeout=120)
            fut = client.submit(sleep_long, 600, pure=False)
            yield cluster, client, fut, submitted


def _job_id(cluster) -> str:
    (job,) = [j.job_id for j in cluster.workers.values()]
    return str(job)


def _job_log(tmp, job: str) -> str:
    """The job's stderr file (dask-jobqueue's `<log_directory>/<name>-<job>.err`)."""
    text = ""
    for path in glob.glob(str(tmp / "logs" / f"*-{job}.err")):
        with open(path, errors="replace") as f:
            text += f.read()
    return text


def _no_group_left(slurm, job: str) -> None:
    """slurmstepd removed every group of the ended job: no `oomguard-worker-*` group kept
    its tree on the node. Checked before the lab's own cleanup, which would hide it."""
    left = slurm.groups_left(job)
    assert not [g for g in left if "oomguard-worker-" in g], left
    assert left == [], left


def _event(client, cause: str, killer: str | None = None):
    """The one stored event of `cause` (with `killer`, once amended), waited for."""

    def found():
        events = [e for e in oomguard.Failures(client).events() if e.cause == cause]
        if killer is not None:
            events = [e for e in events if e.killer == killer]
        return events

    (event,) = wait_for(
        found, lambda: f"no {cause} event: {oomguard.Failures(client).events()}", 60
    )
    print(
        f"\n{cause}: killer={event.killer} how={event.killer_how} "
        f"confidence={event.killer_confidence}\n  {event.killer_summary}\n  "
        + "\n  ".join(f"{k}={v!r}" for k, v in sorted(event.evidence.items()))
    )
    return event


def test_healthy_task_oom_and_scancel(slurm, env, timed):
    with (
        _cluster(env, "jobs", memory="2GiB", job_mem="600M", walltime="00:10:00") as cluster,
        Client(cluster) as client,
    ):
        script = cluster.job_script()
        assert "#SBATCH --mem=600M" in script, script
        assert script.strip().endswith(" --preload-nanny oomguard.worker_plugin"), script
        cluster.scale(jobs=1)
        client.wait_for_workers(1, timeout=120)
        wait_installed(client, 1)
        job = _job_id(cluster)
        assert slurm.state(job) == "RUNNING"
        assert client.submit(sum, [1, 2, 3]).result(timeout=60) == 6

        # Inside SLURM's job group the nanny makes no group of its own, and says why.
        assert "no per-worker memory cgroups (inside SLURM job " + job in _job_log(env, job)

        # Past the job's --mem: the kernel kills the worker in SLURM's task group, at the
        # job's --mem; the nanny lives on, reports it, and asks SLURM about its job.
        fut = client.submit(allocate, 900 * MiB, pure=False)
        # The only worker is this size: oomguard aborts at the first OOM kill.
        with pytest.raises(oomguard.PipelineAborted) as aborted:
            fut.result(timeout=120)
        assert aborted.value.cause == "oom_kill", str(aborted.value)
        oom = _event(client, "oom_kill")
        # Counted in SLURM's task group, shared with the nanny and the batch shell (root
        # here: the kernel log names the victim too).
        assert (oom.killer, oom.killer_confidence) == ("kernel", "confirmed")
        assert oom.killer_how in ("kernel counter", "kernel log")
        assert oom.evidence["oom_kill_delta"] == 1, oom.evidence
        assert oom.evidence["peak_scope"] == "shared"  # SLURM's task group, not the worker's
        assert JOB_MEM * 0.9 < oom.evidence["peak_bytes"] <= JOB_MEM * 1.01
        assert oom.shard == str(fut.key)
        assert oom.evidence["slurm_job_id"] == job
        assert oom.evidence["slurm_state"] == "RUNNING"  # the job goes on: a new worker
        assert oom.evidence["slurm_mem_limit_bytes"] == JOB_MEM
        assert oom.evidence["slurm_source"] == "scontrol show job"

        # scancel while a task runs: slurmstepd ends the batch shell, then SIGKILLs the
        # rest of the job's group, nanny and worker at once: no report, a lost worker,
        # and SLURM's state of the job says who.
        client.wait_for_workers(1, timeout=120)
        fut = client.submit(sleep_long, 600, pure=False)
        wait_for(lambda: any(client.processing().values()), "the task never started")
        slurm.run(["scancel", job])
        assert slurm.wait_state(job, "CANCELLED") == "CANCELLED"
        lost = _event(client, "worker_lost", "slurm")
        assert lost.shard == str(fut.key)
        assert (lost.killer_how, lost.killer_confidence) == ("job state", "confirmed")
        assert lost.evidence["slurm_job_id"] == job
        assert lost.evidence["slurm_state"] == "CANCELLED"
        assert f"*** JOB {job} ON {slurm.node} CANCELLED AT " in lost.evidence["slurm_output_line"]
        # No slurmdbd here: who cancelled is known only to sacct (its "CANCELLED by UID").
        assert "slurm_cancelled_by" not in lost.evidence
        _no_group_left(slurm, job)


def test_explicit_cgroup_limit_true_keeps_a_group_per_worker(slurm, env):
    """`oomguard.worker.cgroup-limit: true` (exported by the job script's prologue, which
    SLURM runs in a shell): the worker's own group inside the job's counts the kill at the
    job's --mem; once SLURM kills the job, that group and the job's tree stay on the node
    (docs/deploying.md says so), and the test removes them."""
    prologue = ["export DASK_OOMGUARD__WORKER__CGROUP_LIMIT=true"]
    with (
        _cluster(
            env, "own", memory="2GiB", job_mem="600M", walltime="00:10:00",
            job_script_prologue=prologue,
        ) as cluster,
        Client(cluster) as client,
    ):  # fmt: skip
        assert prologue[0] in cluster.job_script()
        cluster.scale(jobs=1)
        client.wait_for_workers(1, timeout=120)
        wait_installed(client, 1)
        job = _job_id(cluster)
        fut = client.submit(allocate, 900 * MiB, pure=False)
        with pytest.raises(oomguard.PipelineAborted):
            fut.result(timeout=120)
        oom = _event(client, "oom_kill")
        assert oom.killer == "kernel" and oom.killer_how in ("kernel counter", "kernel log")
        assert oom.shard == str(fut.key)
        assert oom.evidence["oom_kill_delta"] == 1, oom.evidence
        assert oom.evidence["peak_scope"] == "worker"  # its own group
        assert oom.evidence["limit_bytes"] == JOB_MEM  # Dask's cap: the job's limit
        assert oom.evidence["slurm_job_id"] == job
        assert oom.evidence["slurm_mem_limit_bytes"] == JOB_MEM

        # scancel with the restarted worker up: slurmstepd SIGKILLs the nanny, whose group
        # for that worker then stays in the job's.
        client.wait_for_workers(1, timeout=120)
        slurm.run(["scancel", job])
        assert slurm.wait_state(job, "CANCELLED") == "CANCELLED"
        left = slurm.groups_left(job, timeout=10)
        assert [g for g in left if "/oomguard-worker-" in g], left  # the documented leftover
        assert slurm.remove_job_groups(job) == []
        assert slurm.job_groups(job) == []


def test_time_limit(slurm, timed):
    cluster, client, fut, submitted = timed
    job = _job_id(cluster)
    assert fut.status == "pending"  # the task runs on, until SLURM ends the job
    # The 1 minute limit, checked by slurmctld every 30 s: ended 60-90 s after its start.
    assert slurm.wait_state(job, "TIMEOUT", timeout=150) == "TIMEOUT"
    lost = _event(client, "worker_lost", "slurm")
    print(f"  the job ended {time.monotonic() - submitted:.0f} s after its submission")
    assert lost.shard == str(fut.key)
    assert (lost.killer_how, lost.killer_confidence) == ("job state", "confirmed")
    assert lost.evidence["slurm_job_id"] == job
    assert lost.evidence["slurm_state"] == "TIMEOUT"
    assert lost.evidence["slurm_reason"] == "TimeLimit"
    assert lost.evidence["slurm_time_limit"] == "00:01:00"
    assert "DUE TO TIME LIMIT ***" in lost.evidence["slurm_output_line"]
    _no_group_left(slurm, job)


def test_preemption(slurm, env):
    with (
        _cluster(env, "low", queue="low", memory="1GiB", walltime="00:10:00") as cluster,
        Client(cluster) as client,
    ):
        cluster.scale(jobs=1)
        client.wait_for_workers(1, timeout=120)
        job = _job_id(cluster)
        fut = client.submit(sleep_long, 600, pure=False)
        wait_for(lambda: any(client.processing().values()), "the task never started")
        # The whole node, in a partition of a higher tier: only the low job can make room.
        high = slurm.sbatch("-p", "high", "-c", str(_cpus(slurm)), "--wrap", "sleep 1")
        assert slurm.wait_state(job, "PREEMPTED", timeout=120) == "PREEMPTED"
        lost = _event(client, "worker_lost", "slurm")
        assert lost.shard == str(fut.key)
        assert (lost.killer_how, lost.killer_confidence) == ("job state", "confirmed")
        assert lost.evidence["slurm_job_id"] == job
        assert lost.evidence["slurm_state"] == "PREEMPTED"
        assert "DUE TO PREEMPTION ***" in lost.evidence["slurm_output_line"]
        _no_group_left(slurm, job)
        slurm.wait_state(high, "COMPLETED")


def _cpus(slurm) -> int:
    return int(slurm.run(["sinfo", "-h", "-N", "-p", "high", "-o", "%c"]).stdout.split()[0])
