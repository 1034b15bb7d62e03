"""The records a worker's death is made of, declared once: what the nanny observes, what
travels to the scheduler (`wire`), and what is decided and stored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MemoryCounters:
    """One reading of a memory cgroup's OOM counters and sizes (bytes).

    `failcnt` is v1 `memory.failcnt` (times usage hit the limit) and, on v2, the `max` line
    of `memory.events` (times usage was about to exceed `memory.max`): the nearest v2 count.
    `oom` and `oom_group_kill` exist only on v2 (v1 `under_oom` is a state, not a count).

    >>> MemoryCounters(1, "/g", 0, None, None, 0, 10, None, 5, ()).to_dict()["usage"]
    5
    """

    version: int
    path: str
    oom_kill: int | None
    oom: int | None
    oom_group_kill: int | None
    failcnt: int | None
    peak: int | None
    limit: int | None
    usage: int | None
    missing: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["missing"] = list(self.missing)
        return d
