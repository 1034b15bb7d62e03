"""The SLURM lab itself (tests/slurm/slurm_lab.py): a batch job runs and finishes, and a
job over its `--mem` is killed in its memory cgroup by the kernel, which SLURM reports as
the job's state and in the job's output, as on a production node."""

from __future__ import annotations

import re

from slurm_fixtures import slurm_fixture  # noqa: F401  (the `slurm` fixture)


def test_a_batch_job_runs_and_finishes(slurm):
    job = slurm.sbatch("--wrap", "hostname; cat /proc/self/cgroup")
    assert slurm.wait_state(job, "COMPLETED", "FAILED") == "COMPLETED", slurm.output(job)
    out = slurm.output(job)
    assert out.splitlines()[0] == slurm.node, out
    # task/cgroup put the batch step in its own memory group.
    assert re.search(rf"memory:/.*job_{job}/step_batch", out), out


def test_a_job_over_its_mem_is_out_of_memory(slurm):
    job = slurm.sbatch("--mem=100M", "--wrap", "python3 -c 'b = bytearray(2**29); print(len(b))'")
    assert slurm.wait_state(job, "OUT_OF_MEMORY", "COMPLETED", "FAILED") == "OUT_OF_MEMORY"
    # One kill or more: python3 and, at times, the batch shell too (2 in one run here).
    found = re.search(
        rf"Detected (\d+) oom-kill event\(s\) in StepId={job}\.batch", slurm.output(job)
    )
    assert found and int(found.group(1)) >= 1, slurm.output(job)
