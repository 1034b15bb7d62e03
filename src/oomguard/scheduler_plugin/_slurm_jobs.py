"""SLURM's verdict on a worker lost with its nanny: the job's state, asked of SLURM.

When slurmstepd ends a job (its time limit, `scancel`, preemption) it signals the batch
shell, and once that has exited it SIGKILLs every process left in the job's group, the
nanny with its worker (measured in tests/slurm: a Python SIGTERM handler there never
runs). No death report comes, and the death is decided `worker_lost` after the grace
timeout. Each worker plugin names its SLURM job in its HOST_TOPIC event (SLURM_JOB_ID,
SLURM_STEP_ID of its environment); for a lost worker with a job, `SlurmJobs.amend` asks
SLURM (`slurm_job.query`, off the event loop, bounded) and amends the stored death (by its
id) and its events with the job's state: killer `slurm`, known by `job state`, confirmed
where the state says SLURM ended the job (TIMEOUT, CANCELLED, PREEMPTED, ...). The job id is a label a
worker sends: a wrong one makes oomguard describe another job, never decide anything.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._causes import Confidence, Killer, Known
from .._death import slurm
from .._lookups.slurm_job import query, valid_job_id
from ._trust import Bounded
from ._verdict import with_verdict

if TYPE_CHECKING:
    from .._death.record import Death
    from .._guard import Guard
    from .._models import FailureEvent
    from .._store import FailureStore

JOBS_KEPT = 4096  # workers whose job is remembered (a worker's address, most recent)


class SlurmJobs:
    """Worker address -> its SLURM (job id, step id), from worker plugins' host events."""

    def __init__(self, accounting: bool = True) -> None:
        self._jobs = Bounded(JOBS_KEPT)
        self.accounting = accounting  # False: never run sacct (no slurmdbd)
        self.tasks: set[asyncio.Task] = set()

    def note(self, worker: str, msg: dict) -> None:
        job, step = msg.get("slurm_job_id"), msg.get("slurm_step_id")
        if valid_job_id(job):
            step = step if isinstance(step, str) and step.isalnum() and len(step) <= 32 else None
            self._jobs[worker] = (job, step)

    def job_of(self, worker: str) -> tuple[str, str | None] | None:
        return self._jobs.get(worker)

    def lost(
        self,
        store: FailureStore,
        guard: Guard,
        death: Death,
        events: Sequence[FailureEvent],
        grouping_version: int = 1,
    ) -> None:
        """A `worker_lost` death was stored: amend it with SLURM's verdict, in a task."""
        job = self.job_of(death.worker)
        if job is None:
            return
        amend = self.amend(store, guard, death, events, grouping_version, *job)
        task = asyncio.ensure_future(amend)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def amend(
        self,
        store: FailureStore,
        guard: Guard,
        death: Death,
        events: Sequence[FailureEvent],
        grouping_version: int,
        job: str,
        step: str | None,
    ) -> None:
        with guard("slurm_lookup"):
            facts = await asyncio.to_thread(query, job, step, accounting=self.accounting)
            if not facts.get("slurm_state"):
                return  # SLURM said nothing of it (no scontrol here, or forgotten)
            evidence = dict(facts)
            if slurm.ended_by_slurm(facts):
                evidence["summary"] = "no report from the nanny: SLURM ended its job"
            amended, amended_events = with_verdict(death, events, evidence, verdict(facts))
            store.record(amended, amended_events, grouping_version=grouping_version, amend=True)


def verdict(facts: dict) -> dict[str, str]:
    """The killer fields for a lost worker in a SLURM job in state `facts`.

    >>> verdict({"slurm_job_id": "7", "slurm_state": "TIMEOUT"})["killer_confidence"]
    'confirmed'
    """
    if slurm.ended_by_slurm(facts):
        return {
            "killer": Killer.SLURM.value,
            "killer_how": Known.JOB_STATE.value,
            "killer_confidence": Confidence.CONFIRMED.value,
            "killer_summary": (
                f"slurmstepd ended the job's processes, the nanny with its worker: "
                f"{slurm.describe(facts)}"
            ),
        }
    return {
        "killer": Killer.UNKNOWN.value,
        "killer_how": Known.INFERRED.value,
        "killer_confidence": Confidence.LIKELY.value,
        "killer_summary": f"lost with its nanny; {slurm.describe(facts)} (not ended by SLURM)",
    }
