"""No retry at the same size: a shard killed for memory runs again only on a larger worker.

`resize` is pure: given the cause, the memory limit of the worker the shard died on and the
memory limits of the workers there are now, it returns the workers the retry may use, or
an abort message ("no worker has more than 4 GiB; the shard needed more"). Retrying on a
worker of the same size would only kill another worker.

`retry_larger` is the scheduler side (called from `OomguardSchedulerPlugin._decide`): it
restricts the task to those workers (strict restrictions; a task already handed to a
smaller worker is pulled back) or returns the `AbortDecision` for the existing abort path.

Limits are Dask's `memory_limit` (0 or None: no limit). A worker without a limit counts as
larger than any limit; when the dead worker had no limit there is nothing larger to find
and no resize is attempted. Workers joining after the decision are not added to the set.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._causes import MEMORY_CAUSES, Cause
from .._ledger import format_bytes
from .._policy import AbortDecision, _shell_arg, describe_cause

if TYPE_CHECKING:
    from distributed import Scheduler

    from .._models import FailureEvent
    from .._policy import FailurePolicy

__all__ = ["Resize", "resize", "retry_larger"]

logger = logging.getLogger("oomguard.scheduler")


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
    """>>> no_larger_message(4 * 2**30)
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
    larger = frozenset(
        addr for addr, lim in limits.items() if not lim or lim > failed_limit
    )
    if allowed is not None:
        larger &= frozenset(allowed)
    if larger:
        return Resize(larger, failed_limit)
    return Resize(frozenset(), failed_limit, no_larger_message(failed_limit))


def abort_decision(event: FailureEvent, limit: int, count: int) -> AbortDecision:
    """The AbortDecision for a memory-killed shard with no larger worker to retry on."""
    evidence = dict(event.evidence or {})
    subject = "it" if event.cause == Cause.MEMORY_ERROR else "its worker"
    what = f"{subject} {describe_cause(event.cause, evidence)}"
    summary = evidence.get("summary")
    if isinstance(summary, str) and summary:
        what += f" ({summary})"
    shard = event.shard if event.shard.startswith(("(", "[")) else repr(event.shard)
    message = (
        f"oomguard aborted pipeline {event.pipeline!r} at once because shard {shard} ran "
        f"out of memory on {event.worker or 'a worker'} (memory limit "
        f"{format_bytes(limit)}): {what}. oomguard retries such a shard only on a worker "
        f"with a larger memory limit, but {no_larger_message(limit)}; retrying it on a "
        "worker of the same size would only kill another worker. "
        "Next: add workers with a larger memory limit, or split the shard's input so it "
        f"needs less, then resubmit; `oomguard report --shard {_shell_arg(event.shard)}` shows the "
        "evidence."
    )
    return AbortDecision(
        pipeline=event.pipeline,
        shard=event.shard,
        cause=str(event.cause),
        count=count,
        signature_id=event.signature_id,
        signature_title=event.signature_title,
        evidence=evidence,
        workers=(event.worker,) if event.worker else (),
        hosts=(event.host,) if event.host else (),
        message=message,
    )


def retry_larger(
    scheduler: Scheduler,
    key: Any,
    event: FailureEvent,
    failed_limit: int | None,
    policy: FailurePolicy | None = None,
) -> AbortDecision | None:
    """Restrict `key`'s retry to larger workers; the AbortDecision when there are none.

    Called from the scheduler plugin's death decision, on the event loop; never raises.
    """
    try:
        return _retry_larger(scheduler, key, event, failed_limit, policy)
    except Exception:
        logger.exception("oomguard: could not restrict the retry of %s to larger workers", key)
        return None


def _retry_larger(scheduler, key, event, failed_limit, policy) -> AbortDecision | None:
    ts = scheduler.tasks.get(key)
    if ts is None:
        return None
    limits = {addr: ws.memory_limit for addr, ws in scheduler.workers.items()}
    # A resize narrows earlier restrictions (the user's, or an earlier resize).
    allowed = ts.worker_restrictions if ts.worker_restrictions and not ts.loose_restrictions else None
    r = resize(event.cause, failed_limit, limits, allowed=allowed)
    if r is None:
        return None
    if r.abort:
        decision = abort_decision(event, r.limit, policy.attempt(event.shard) - 1 if policy else 1)
        _adopt(policy, decision)
        scheduler.log_event("oomguard", {"action": "retry-resize", "shard": event.shard,
                                         "limit": r.limit, "workers": [], "abort": True})
        return decision
    ts.worker_restrictions = set(r.workers)
    ts.loose_restrictions = False
    scheduler.log_event("oomguard", {"action": "retry-resize", "shard": event.shard,
                                     "limit": r.limit, "workers": sorted(r.workers)})
    on = ts.processing_on.address if ts.processing_on is not None else None
    if ts.state in ("queued", "no-worker") or (ts.state == "processing" and on not in r.workers):
        # Already handed to a worker of the old size (or queued, where restrictions are
        # not consulted): release it, so it is scheduled again under the restrictions.
        stimulus_id = f"oomguard-resize-{time.time()}"
        scheduler.transitions({key: "released"}, stimulus_id=stimulus_id)
    return None


def _adopt(policy: FailurePolicy | None, decision: AbortDecision) -> None:
    # The policy reports a pipeline "aborted" only for its own decisions; record ours there
    # too until FailurePolicy grows a public way to take an outside decision.
    pipelines = getattr(policy, "_pipelines", None)
    if pipelines is not None and decision.pipeline in pipelines:
        p = pipelines[decision.pipeline]
        if getattr(p, "decision", None) is None:
            p.decision = decision
