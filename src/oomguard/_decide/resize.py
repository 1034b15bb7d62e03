"""The retry on a larger worker: which keys wait for one, and until when (pure).

A shard killed for memory alone on its worker runs again only on a worker with a larger
memory limit (`memory.resize`). A worker removed a moment ago still counts (a larger one
may be restarting): the shard then waits for it, up to RETURN_WINDOW, before its pipeline
is aborted for want of one. The decision core owns one `LargerRetry`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .._models import AbortDecision, FailureEvent
from . import memory
from .decisions import Decision, Restrict, Widen
from .policy import FailurePolicy
from .runs import RunLabel, Runs

#: How long a shard killed for memory waits for a larger worker that was just removed
#: (restarting, or replaced) before its pipeline is aborted for want of one.
RETURN_WINDOW = 60.0


@dataclass(frozen=True)
class Resized:
    """A key retried on larger workers: the memory limit it died under and, while no larger
    worker is here, until when it waits for one and the event to abort with."""

    limit: int
    until: float | None = None
    event: FailureEvent | None = None


class LargerRetry:
    """Keys retried on larger workers, and the workers removed a moment ago.

    Which workers a key may run on is Dask's restriction, widened one worker at a time
    (`Widen`); this keeps only what that needs.
    """

    def __init__(self, policy: FailurePolicy, runs: Runs) -> None:
        self.policy = policy
        self.runs = runs
        self.resized: dict[Any, Resized] = {}
        self._gone: dict[str, tuple[int | None, float]] = {}  # address -> (limit, removed)

    def retry(
        self,
        key: Any,
        run: RunLabel,
        event: FailureEvent,
        failed_limit: int | None,
        workers: Mapping[str, int | None],
        now: float,
    ) -> tuple[AbortDecision | None, list[Decision]]:
        """`key` of `run` died of `event` under `failed_limit` bytes; `workers`: those here
        (address -> memory limit). An abort when no worker is larger, or where it may run."""
        # Workers removed a moment ago count (a larger one may be restarting); the shard
        # then waits for it, up to RETURN_WINDOW, before "no larger worker" is concluded.
        recent = {a: lim for a, (lim, t) in self._gone.items() if now - t < RETURN_WINDOW}
        r = memory.resize(
            event.cause, failed_limit, {**recent, **workers}, evidence=event.evidence
        )
        if r is None:
            return None, []
        if r.abort:
            return self.policy.no_larger(run, event, r.limit), []
        here = frozenset(a for a in r.workers if a in workers)
        if here:
            self.resized[key] = Resized(r.limit)
        else:
            self.resized[key] = Resized(r.limit, now + RETURN_WINDOW, event)
        return None, [Restrict(key, here, r.limit)]

    def worker_added(
        self, address: str, memory_limit: int | None, stopped: Collection[Any]
    ) -> list[Decision]:
        self._gone.pop(address, None)
        # One decision naming the keys, not each key's whole new set of workers: a worker
        # added costs O(keys), not O(keys x workers), when thousands of workers come and go.
        widened = []
        for key, entry in list(self.resized.items()):
            if (not memory_limit or memory_limit > entry.limit) and key not in stopped:
                if entry.until is not None:
                    self.resized[key] = Resized(entry.limit)  # it waited for this one
                widened.append(key)
        return [Widen(tuple(widened), address)] if widened else []

    def worker_removed(self, address: str, memory_limit: int | None, now: float) -> None:
        """A worker with a memory limit left: a shard may wait for it (it may be restarting)."""
        self._gone.pop(address, None)  # re-inserted last: kept in time order
        self._gone[address] = (memory_limit, now)

    def timed_out(
        self, now: float, stopped: Collection[Any]
    ) -> Iterator[tuple[Any, AbortDecision]]:
        """(key, abort) for each key whose wait for a larger worker ran out. Lazy: `stopped`
        is read as the caller stops keys, so a key its sibling's abort stopped is skipped."""
        while self._gone and now - next(iter(self._gone.values()))[1] >= RETURN_WINDOW:
            self._gone.pop(next(iter(self._gone)))  # oldest first: insertion order
        for key, entry in list(self.resized.items()):
            if entry.until is not None and now >= entry.until and key not in stopped:
                # No larger worker came back in time: the shard needs more than there is.
                run = self.runs.of(key)
                label = run.label if run is not None else None  # None: the key stops alone
                d = self.policy.no_larger(label, entry.event, entry.limit)
                del self.resized[key]
                yield key, d

    def forget(self, key: Any) -> None:
        self.resized.pop(key, None)
