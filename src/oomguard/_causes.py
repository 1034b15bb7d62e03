"""The cause vocabulary, used the same way in reports, events, metrics, docs and the API.

INFRA causes mean the process died (or memory ran out); USER means task code raised.
"""

from __future__ import annotations

from enum import StrEnum


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
