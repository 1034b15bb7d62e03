"""Memory kills: no retry at the same size, and the words for stopping a shard (pure).

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

from .._causes import MEMORY_CAUSES, Cause
from .._units import format_bytes
from .._models import FailureEvent
from .policy import AbortDecision, _shell_arg, describe_cause

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


def no_larger_message(limit: int) -> str:
    """The reason to abort when no worker is larger than `limit` bytes.

    >>> no_larger_message(4 * 2**30)
    'no worker has more than 4 GiB; the shard needed more'
    """
    return f"no worker has more than {format_bytes(limit)}; the shard needed more"


def resize(
    cause: Cause | str,
    failed_limit: int | None,
    limits: Mapping[str, int | None],
    *,
    allowed: Collection[str] | None = None,
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
        if Cause(cause) not in MEMORY_CAUSES:
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


def _what(event: FailureEvent) -> str:
    evidence = event.evidence or {}
    subject = "it" if event.cause == Cause.MEMORY_ERROR else "its worker"
    what = f"{subject} {describe_cause(event.cause, evidence)}"
    summary = evidence.get("summary")
    if isinstance(summary, str) and summary:
        what += f" ({summary})"
    return what


def _shard(shard: str) -> str:
    return shard if shard.startswith(("(", "[")) else repr(shard)


def abort_decision(event: FailureEvent, limit: int, count: int) -> AbortDecision:
    """The AbortDecision for a memory-killed shard with no larger worker to retry on."""
    message = (
        f"oomguard aborted pipeline {event.pipeline!r} at once because shard "
        f"{_shard(event.shard)} ran out of memory on {event.worker or 'a worker'} (memory "
        f"limit {format_bytes(limit)}), running alone there: {_what(event)}. oomguard "
        f"retries such a shard only on a worker with a larger memory limit, but "
        f"{no_larger_message(limit)}; retrying it on a worker of the same size would only "
        "kill another worker. Next: add workers with a larger memory limit, or split the "
        "shard's input so it needs less, then resubmit; `oomguard report --shard "
        f"{_shell_arg(event.shard)}` shows the evidence."
    )
    return _decision(event, count, message)


def over_budget_decision(event: FailureEvent, deaths: int, allowed: int, count: int) -> AbortDecision:
    """The decision for a task that was on more dead workers than Dask allows
    (`distributed.scheduler.allowed-failures`), whatever the evidence said."""
    where = f"pipeline {event.pipeline!r}" if event.pipeline else "its task"
    message = (
        f"oomguard stopped {where} because shard {_shard(event.shard)} was on {deaths} "
        f"workers that died, more than Dask's allowed-failures ({allowed}) permits; the "
        f"last one, {event.worker or 'a worker'}: {_what(event)}. Dask alone would raise "
        "KilledWorker here. Next: `oomguard report --shard "
        f"{_shell_arg(event.shard)}` shows each death with its evidence."
    )
    return _decision(event, count, message)
