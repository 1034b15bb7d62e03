"""Memory kills: no retry at the same size, and the decisions that stop a shard (pure).

A shard killed for memory alone on its worker runs again only on a worker with a larger
memory limit (`resize`); with none larger its pipeline is aborted at once. A memory kill of
a worker that was executing several tasks proves no single shard too big: the core then
retries those shards one at a time (see `DecisionCore._isolate`) before concluding anything.

Limits are Dask's `memory_limit` (0 or None: no limit). A worker without a limit counts as
larger than any limit; when the dead worker had no limit there is nothing larger to find.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from .._causes import Cause, memory_death
from .._models import FailureEvent
from .._words import no_larger_abort_message, no_larger_message, over_budget_message
from .policy import AbortDecision

__all__ = ["Resize", "abort_decision", "over_budget_decision", "resize"]


@dataclass(frozen=True)
class Resize:
    """Where a memory-killed shard may run again. No workers: abort with `message`."""

    workers: frozenset[str]
    limit: int  # the memory limit the shard died under, bytes
    message: str = ""

    @property
    def abort(self) -> bool:
        return not self.workers


def resize(
    cause: Cause | str,
    failed_limit: int | None,
    limits: Mapping[str, int | None],
    *,
    allowed: Collection[str] | None = None,
    evidence: Mapping[str, Any] | None = None,
) -> Resize | None:
    """The retry's workers for a shard that died of `cause` under `failed_limit` bytes.

    None when there is nothing to decide: not a memory cause, or the limit is unknown or
    unlimited. `allowed` narrows the choice to the task's own worker restrictions.

    >>> r = resize("oom_kill", 4 * 2**30, {"tcp://a:1": 4 * 2**30, "tcp://b:1": 16 * 2**30})
    >>> sorted(r.workers), r.abort
    (['tcp://b:1'], False)
    >>> resize("memory_terminate", 4 * 2**30, {"tcp://a:1": 4 * 2**30}).message
    'no worker has more than 4 GiB; the shard needed more'
    >>> resize("native_crash", 4 * 2**30, {}) is None
    True
    """
    try:
        if not memory_death(cause, evidence):
            return None
    except ValueError:
        return None
    if not failed_limit or isinstance(failed_limit, bool) or failed_limit < 0:
        return None
    larger = frozenset(addr for addr, lim in limits.items() if not lim or lim > failed_limit)
    if allowed is not None:
        larger &= frozenset(allowed)
    if larger:
        return Resize(larger, failed_limit)
    return Resize(frozenset(), failed_limit, no_larger_message(failed_limit))


def _decision(event: FailureEvent, count: int, message: str) -> AbortDecision:
    return AbortDecision(
        pipeline=event.pipeline,
        shard=event.shard,
        cause=str(event.cause),
        count=count,
        signature_id=event.signature_id,
        signature_title=event.signature_title,
        evidence=dict(event.evidence or {}),
        workers=(event.worker,) if event.worker else (),
        hosts=(event.host,) if event.host else (),
        message=message,
    )


def abort_decision(event: FailureEvent, limit: int, count: int) -> AbortDecision:
    """The AbortDecision for a memory-killed shard with no larger worker to retry on."""
    return _decision(event, count, no_larger_abort_message(event, limit))


def over_budget_decision(
    event: FailureEvent, key: Any, deaths: int, allowed: int, count: int
) -> AbortDecision:
    """The decision for task `key` that was on more dead workers than Dask allows
    (`distributed.scheduler.allowed-failures`), whatever the evidence said."""
    return _decision(event, count, over_budget_message(event, key, deaths, allowed))
