"""A pipeline run in one sentence: what finished, what died, what was retried."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from .._causes import Cause, Kind
from .causes import breakdown, listing, plural, seconds, shard_name, times, was

if TYPE_CHECKING:
    from .._models import PipelineCounts, ShardRecord


# --------------------------------------------------------------------------- summaries


def _infra_clause(p: PipelineCounts, retried: str) -> str:
    parts = []
    n_deaths = sum(p.deaths.values())
    if n_deaths:
        named = set(p.killers) - {"unknown"}  # all unknown: nothing worth saying
        by = ", ".join(k if n == 1 else f"{k} x{n}" for k, n in p.killers.most_common())
        killed = f"; killed by {by}" if named else ""
        parts.append(
            f"{plural(n_deaths, 'worker death')} ({breakdown(p.deaths)}{killed}) {retried}"
        )
    if p.memory_errors:
        parts.append(f"{plural(p.memory_errors, 'MemoryError')} in task code")
    return ", and ".join(parts)


def crash_displaced(n: int) -> str:
    """
    >>> crash_displaced(1)
    "1 shard was displaced by a neighbour's crash (a task on another thread of the same worker crashed): retried without counting against it"
    """
    them = "it" if n == 1 else "them"
    return (
        f"{plural(n, 'shard')} {was(n)} displaced by a neighbour's crash (a task on another"
        f" thread of the same worker crashed): retried without counting against {them}"
    )


def lost_work(lost_to: Counter[str]) -> str:
    """Executing shards whose work another pipeline's death took (its culprit's), counted
    per death.

    >>> lost_work(Counter({"big": 1}))
    "a shard lost its work to a worker death of pipeline 'big' (retried without counting against it)"
    >>> lost_work(Counter({"big": 2, "huge": 1}))
    "shards lost their work 3 times to worker deaths of pipelines 'big', 'huge' (retried without counting against them)"
    """
    n = sum(lost_to.values())
    names = listing([repr(name) for name, _ in lost_to.most_common()])
    of = f"pipeline {names}" if len(lost_to) == 1 else f"pipelines {names}"
    if n == 1:
        return (
            f"a shard lost its work to a worker death of {of} (retried without counting "
            "against it)"
        )
    return (
        f"shards lost their work {times(n)} to worker deaths of {of} (retried without "
        "counting against them)"
    )


def _shard_story(shard: str, rec: ShardRecord) -> str:
    name = shard_name(shard)
    if len(rec.causes) == 1:
        (cause,) = rec.causes
        if cause == Cause.MEMORY_ERROR:
            return f"shard {name} raised MemoryError {times(rec.infra)}"
        return f"a worker {rec.last_words} at shard {name} {times(rec.infra)}"
    return f"shard {name} failed {times(rec.infra)} ({breakdown(rec.causes)})"


def pipeline_summary(
    status: str, p: PipelineCounts, shard: str = "", rec: ShardRecord | None = None
) -> str:
    """Where a run stands in one sentence, naming the layer that failed. `shard` and its
    record `rec`: the shard the story is about (the one that decided an abort, or the
    culprit of a failed run; `rec` None when it has none)."""
    text = _story(status, p, shard, rec)
    if p.lost_to:
        text = f"{text.rstrip('.')}; {lost_work(p.lost_to)}."
    if p.crash_displaced:
        text = f"{text.rstrip('.')}; {crash_displaced(p.crash_displaced)}."
    if p.memory_waits:
        text = (
            f"{text.rstrip('.')}; {plural(p.memory_waits, 'task')} waited "
            f"{seconds(p.memory_waited)} in total for memory."
        )
    return text


def _story(status: str, p: PipelineCounts, shard: str, rec: ShardRecord | None) -> str:
    finished = f"{plural(p.done, 'shard')} finished"
    if status == "aborted":
        d = p.decision
        assert d is not None
        if rec is not None and rec.infra:
            story = _shard_story(shard, rec)
        else:
            story = f"shard {shard_name(d.shard)} failed {times(d.count)}"
        tally = [f"{plural(p.done, 'shard')} had finished"]
        if p.erred:
            tally.append(f"{p.erred} erred")
        left = p.unfinished()
        if p.aborted or not left:
            tally.append(f"{p.aborted} {was(p.aborted)} aborted")
        if left:
            still = "still " if p.aborted else ""
            tally.append(f"{left} {'is' if left == 1 else 'are'} {still}being aborted")
        return f"{story}; the pipeline was aborted; {', '.join(tally)}."

    if status == "running":
        s = f"{p.done} of {plural(p.submitted, 'shard')} finished so far"
        if p.erred:
            s += f", {p.erred} erred"
        infra = _infra_clause(p, "that oomguard retried")
        if infra:
            s += f", after {infra}"
        if p.isolated:
            s += f"; {plural(p.isolated, 'shard')} retried alone after a shared memory kill"
        return s + "."

    if status == "failed":
        if rec is not None:
            if rec.last_kind == Kind.USER:
                story = (
                    f"shard {shard_name(shard)} raised {rec.last_user or 'an exception'}"
                    " past its retries"
                )
            else:
                story = f"{_shard_story(shard, rec)} until Dask gave up on it"
        else:
            story = f"shard {shard_name(shard)} erred"
        others = p.erred - 1
        tail = f"; {finished}"
        if others > 0:
            tail += f", {others} more erred"
        return f"{story}{tail}."

    # Succeeded, possibly after failures: never read as plain success when shards died.
    if p.submitted == 0 and p.done == 0:
        s = "no shards were submitted"
    elif p.forgotten:
        s = (
            f"{p.done} of {plural(p.submitted, 'shard')} finished and {p.forgotten} "
            f"{was(p.forgotten)} released or cancelled without a result"
        )
    else:
        s = "the 1 shard finished" if p.done == 1 else f"all {p.done} shards finished"
    infra = _infra_clause(p, "that oomguard retried without using task retries")
    if infra:
        s += f", after {infra}"
    if p.user:
        s += f"; task retries absorbed {plural(p.user, 'exception')}"
    if p.isolated:
        s += (
            f"; {plural(p.isolated, 'shard')} {was(p.isolated)} retried alone after a "
            "memory kill of a worker running several"
        )
    if p.displaced - p.crash_displaced:  # crash displacements are told in pipeline_summary
        s += f"; {_moved(p)}"
    return s + "."


def _moved(p: PipelineCounts) -> str:
    """Shards moved off workers that died or stopped, each as it was there: executing,
    queued, or (nothing said) neither named."""
    n = p.displaced - p.crash_displaced
    running, queued = p.displaced_executing, p.displaced_queued
    them = "it" if n == 1 else "them"
    if queued == n:
        what, detail = plural(n, "queued shard"), ""
    else:
        what = plural(n, "shard")
        parts = [f"{running} executing"] if running else []
        parts += [f"{queued} queued"] if queued else []
        if parts and n - running - queued:
            parts.append(f"{n - running - queued} not known")
        detail = f" ({', '.join(parts)})" if parts else ""
    return (
        f"{what} {was(n)} moved off workers that died or stopped, without counting "
        f"against {them}{detail}"
    )
