"""What the failure policy counts: a pipeline run's counters and a failed shard's record.

Plain mutable records, no logic beyond `unfinished`: `FailurePolicy` keeps one
`PipelineCounts` per run and one `ShardRecord` per shard that failed at least once; the
words a person reads about them come from `oomguard._words`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .runs import RunLabel, ShardKey

if TYPE_CHECKING:
    from .policy import AbortDecision

__all__ = ["PipelineCounts", "ShardFailure", "ShardRecord"]


@dataclass(slots=True)
class ShardFailure:
    """One infra failure of a shard, as its record keeps it."""

    cause: str
    worker: str
    host: str
    signature_id: str
    conclusive: bool = True  # False: a memory kill shared with other tasks, no evidence
    shard_cause: bool = False  # points at the shard itself (_causes.shard_death)


@dataclass(slots=True)
class ShardRecord:
    """What the policy keeps of a shard that failed at least once."""

    pipeline: RunLabel
    infra: int = 0
    shared: int = 0  # infra failures that were memory kills shared with other tasks
    user: int = 0
    failures: list[ShardFailure] = field(default_factory=list)  # infra only, capped
    causes: Counter[str] = field(default_factory=Counter)  # infra causes
    last_kind: str = ""
    last_user: str = ""  # the exception's name, for "raised ValueError past its retries"
    last_words: str = ""  # describe_cause of the last infra failure, with its evidence
    ended: str = ""  # "" | "done" | "erred" | "aborted" | "forgotten"


@dataclass(slots=True)
class PipelineCounts:
    """A pipeline run's counters (the policy keeps one per run)."""

    name: str = ""  # the pipeline's name; the policy's own key is the run's label
    started: float = 0.0
    submitted: int = 0
    done: int = 0
    erred: int = 0
    aborted: int = 0
    forgotten: int = 0
    displaced: int = 0  # shards moved off workers that died or stopped, never counted
    displaced_executing: int = 0  # of them, known to have been executing there
    displaced_queued: int = 0  # known to have been only queued there
    crash_displaced: int = 0  # of displaced: executing beside the task whose thread crashed
    isolated: int = 0  # shards retried alone after a memory kill of a worker running several
    infra: int = 0
    user: int = 0
    memory_errors: int = 0
    memory_waits: int = 0  # tasks that waited for host memory (admission) before running
    memory_waited: float = 0.0  # seconds, all those waits together
    deaths: Counter[str] = field(default_factory=Counter)  # by cause, one per worker death
    killers: Counter[str] = field(default_factory=Counter)  # by killer, one per worker death
    # worker -> time of its last death: one death that took several shards counts once.
    last_death: dict[str, float] = field(default_factory=dict)
    failed: dict[ShardKey, None] = field(default_factory=dict)  # ordered set of failed shards
    erred_shards: list[ShardKey] = field(default_factory=list)  # first few: the culprit
    decision: AbortDecision | None = None

    def unfinished(self) -> int:
        return max(0, self.submitted - self.done - self.erred - self.aborted - self.forgotten)
