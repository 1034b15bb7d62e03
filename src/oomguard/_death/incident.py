"""What puts two worker deaths in one incident: the place one cause could end several
workers at once, and the cause and killer it would give each (pure: no Dask, no I/O).

The grouping itself, in time and as deaths are decided, is the scheduler's
(`oomguard._decide.incidents`); the store reads an incident's place from its first death
with `place` to say where it happened.

- **Where.** The SLURM job the death's evidence names (a job ending, its time limit, a
  preemption ends all its workers on every node), else the Kubernetes node it names (a
  pod lookup's verdict), else the worker's host.
- **What.** The same cause and the same killer. A kernel OOM kill also needs the same
  memory group: workers in one shared group (a container, a job's group, no group of their
  own) killed together are one incident; workers each in a group of its own, each over its
  own limit, are not.
- **Never grouped.** A death its own worker brought on (killer `task`: a segfault, an
  abort, an exit) or its own nanny decided (killer `dask-nanny`: that worker's memory
  limit) is its own incident: nothing outside the worker ended it.
"""

from __future__ import annotations

from .._causes import Cause, Killer
from .._models import evidence_map
from .killer import for_cause
from .record import Death

#: Killers that end one worker on their own account: each such death is its own incident.
ALONE = frozenset({Killer.TASK.value, Killer.DASK_NANNY.value})


def place(death: Death) -> str:
    """Where `death` happened, as an incident names it ("" when not known).

    >>> place(Death(host="node-3")), place(Death(host="n", evidence={"slurm_job_id": "7"}))
    ('host node-3', 'SLURM job 7')
    """
    evidence = evidence_map(death.evidence)
    job = evidence.get("slurm_job_id")
    if isinstance(job, str) and job:
        return f"SLURM job {job}"
    node = evidence.get("node")
    if isinstance(node, str) and node:
        return f"node {node}"
    return f"host {death.host}" if death.host else ""


def killer_of(death: Death) -> str:
    """Its killer's name: the one it names, else the one its cause implies."""
    return death.killer.name if death.killer is not None else for_cause(death.cause).name


def incident_key(death: Death) -> tuple[str, str, str, str] | None:
    """(place, cause, killer, memory group) that deaths of one incident share; None for a
    death that is always its own incident (see the module docstring).

    >>> incident_key(Death(host="node-3", cause="sigkill"))
    ('host node-3', 'sigkill', 'unknown', '')
    >>> incident_key(Death(host="node-3", cause="native_crash")) is None
    True
    """
    killer = killer_of(death)
    where = place(death)
    if killer in ALONE or not where:
        return None
    group = ""
    if death.cause == Cause.OOM_KILL and death.cgroup is not None:
        group = death.cgroup.path
    return (where, death.cause, killer, group)
