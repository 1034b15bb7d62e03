"""Whether a nanny gives each worker a memory group of its own (`per_worker_choice`), from
`oomguard.worker.cgroup-limit` and where the nanny runs. Pure: the caller reads the setting,
SLURM_JOB_ID and its own group (`detect().path`); the nanny and `oomguard doctor` both ask.

`auto` makes none inside a SLURM job whose memory group is SLURM's (task/cgroup): that group
already bounds the worker at the job's --mem, and slurmstepd, which SIGKILLs the whole job at
a time limit, scancel or preemption, does not remove a group with a child it did not make,
so a group of ours would leave the job's cgroup tree on the node (SLURM 22.05 on cgroup v1,
tests/slurm).
"""

from __future__ import annotations

from typing import Literal

Choice = Literal["required", "if-possible", "off"]

#: Why `auto` makes no per-worker group inside a SLURM job (the nanny's log, doctor).
IN_SLURM_JOB = (
    "inside SLURM job {job}: SLURM's job group already bounds the worker at the job's --mem, "
    "and a group of ours would outlive a job SLURM kills (slurmstepd does not remove a group "
    "it did not make); set oomguard.worker.cgroup-limit: true to make them anyway"
)


def slurm_job_group(path: str | None, job_id: str | None) -> bool:
    """Is the memory group at `path` SLURM's group of job `job_id`, or inside it?

    >>> slurm_job_group("/sys/fs/cgroup/memory/slurm/uid_0/job_12/step_batch/task_0", "12")
    True
    >>> slurm_job_group("/sys/fs/cgroup/system.slice/slurmstepd.scope/job_12/step_0", "12")
    True
    >>> slurm_job_group("/sys/fs/cgroup/memory/slurm/uid_0/job_12/step_batch", "7")
    False
    """
    if not path or not job_id:
        return False
    parts = path.strip("/").split("/")
    name = f"job_{job_id}"
    if name not in parts:
        return False
    # v1: slurm/ or slurm_<node>/ (a node of several slurmd); v2: slurmstepd.scope/.
    return any(p.startswith("slurm") for p in parts[: parts.index(name)])


def per_worker_choice(setting: str, job_id: str | None, group: str | None) -> tuple[Choice, str]:
    """(what the nanny does, why none when "off").

    `setting` is `oomguard.worker.cgroup-limit` (auto, true, false); `job_id` the nanny's
    SLURM_JOB_ID; `group` its own memory group's directory. "required": make them or fail;
    "if-possible": make them where a probe group can be made.

    >>> per_worker_choice("auto", None, "/sys/fs/cgroup/memory/docker/abc")
    ('if-possible', '')
    >>> per_worker_choice("true", "12", "/sys/fs/cgroup/memory/slurm/uid_0/job_12/step_batch")
    ('required', '')
    """
    if setting == "false":
        return "off", "oomguard.worker.cgroup-limit is false"
    if setting == "true":
        return "required", ""
    if slurm_job_group(group, job_id):
        return "off", IN_SLURM_JOB.format(job=job_id)
    return "if-possible", ""
