"""The cause vocabulary, used the same way in reports, events, metrics, docs and the API.

INFRA causes mean the process died (or memory ran out); USER means task code raised.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any


class Cause(StrEnum):
    OOM_KILL = "oom_kill"  # the kernel's OOM killer: a cgroup oom_kill counter moved
    MEMORY_TERMINATE = "memory_terminate"  # the nanny killed the worker for memory
    NATIVE_CRASH = "native_crash"  # SIGSEGV / SIGABRT / SIGBUS / SIGFPE / SIGILL
    SIGTERM = "sigterm"  # SIGTERM from outside the nanny (earlyoom, pod deletion)
    SIGKILL = "sigkill"  # SIGKILL with no kernel evidence of OOM
    EXIT = "exit"  # a non-zero exit status
    WORKER_LOST = "worker_lost"  # no report arrived: host or pod died with its nanny
    MEMORY_ERROR = "memory_error"  # task code raised MemoryError
    EXCEPTION = "exception"  # task code raised any other exception


class Kind(StrEnum):
    INFRA = "infra"
    USER = "user"


#: Causes that point at the shard itself: the same shard dying the same way on two
#: workers is a deterministic crasher. External causes (sigkill without kernel evidence,
#: sigterm, worker_lost, exit) look like preemption and never take this fast path.
SHARD_CAUSES = frozenset(
    {Cause.OOM_KILL, Cause.MEMORY_TERMINATE, Cause.NATIVE_CRASH, Cause.MEMORY_ERROR}
)

#: Causes that mean "needed more memory than it had".
MEMORY_CAUSES = frozenset({Cause.OOM_KILL, Cause.MEMORY_TERMINATE, Cause.MEMORY_ERROR})

#: Causes of worker deaths (everything but task-code exceptions).
DEATH_CAUSES = frozenset(
    {
        Cause.OOM_KILL,
        Cause.MEMORY_TERMINATE,
        Cause.NATIVE_CRASH,
        Cause.SIGTERM,
        Cause.SIGKILL,
        Cause.EXIT,
        Cause.WORKER_LOST,
    }
)


def kind_of(cause: Cause | str) -> Kind:
    """INFRA for everything but an exception raised by task code."""
    return Kind.USER if Cause(cause) is Cause.EXCEPTION else Kind.INFRA


class Killer(StrEnum):
    """Who ended a worker process: a fixed vocabulary, bounded for metric labels.

    The cause says *how* it died (SIGTERM, a counted OOM kill); the killer says *who*.
    """

    KERNEL = "kernel"  # the kernel's OOM killer, cgroup or global
    DASK_NANNY = "dask-nanny"  # the nanny's memory terminate (worker-restart-memory)
    EARLYOOM = "earlyoom"
    SYSTEMD_OOMD = "systemd-oomd"
    KUBELET = "kubelet"  # an eviction
    SLURM = "slurm"  # slurmstepd: time limit, scancel, preemption, the job's memory group
    PROCESS = "process"  # another process, named in the evidence
    TASK = "task"  # the worker's own code: os._exit, abort(), a segfault
    DASK = "dask"  # a requested stop (no death)
    UNKNOWN = "unknown"


class Known(StrEnum):
    """How the killer is known."""

    SIGNAL_SENDER = "signal sender"  # si_pid/si_uid of the signal, and /proc of that PID
    KERNEL_COUNTER = "kernel counter"  # a cgroup's oom_kill count moved
    KERNEL_LOG = "kernel log"  # the kernel log names the PID
    CGROUP_XATTR = "cgroup xattr"  # systemd-oomd's user.oomd_kill moved
    POD_STATUS = "pod status"  # the Kubernetes API's pod status
    JOB_STATE = "job state"  # SLURM's job state or environment
    NANNY_EVENT = "nanny event"  # the nanny's own worker-restart-memory event
    EXIT_STATUS = "exit status"  # the process's own exit (a crash signal, a status)
    INFERRED = "inferred"  # excluded what we could, the rest is likely


class Confidence(StrEnum):
    CONFIRMED = "confirmed"  # evidence that names the killer
    LIKELY = "likely"  # inferred: what was excluded and why this one remains


def memory_death(cause: Cause | str, evidence: Mapping[str, Any] | None = None) -> bool:
    """Whether a failure counts as "needed more memory than it had" for blame: a memory
    cause, or a SIGTERM/SIGKILL from a userspace OOM killer (earlyoom, systemd-oomd) whose
    victim was the host's largest process (the nanny's ``killer_memory``; see
    `oomguard._death.killer`).

    >>> memory_death("sigterm", {"killer_memory": True}), memory_death("sigterm", {})
    (True, False)
    """
    c = Cause(cause)
    if c in MEMORY_CAUSES:
        return True
    return c in (Cause.SIGTERM, Cause.SIGKILL) and (evidence or {}).get("killer_memory") is True


def shard_death(cause: Cause | str, evidence: Mapping[str, Any] | None = None) -> bool:
    """Whether a failure points at the shard itself (`SHARD_CAUSES`, or a memory death)."""
    return Cause(cause) in SHARD_CAUSES or memory_death(cause, evidence)
