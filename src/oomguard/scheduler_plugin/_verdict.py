"""A lookup's verdict on a worker lost with its nanny (the pod's status, the SLURM job's
state), as the decided death it amends: the same death (its id), what the lookup found
in its evidence, its killer, and its cause where the lookup names one; its events alike."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from .._death.record import Attribution, Death
from .._models import FailureEvent

#: A verdict's killer, as event fields (`FailureEvent.killer`, ...).
KILLER_FIELDS = ("killer", "killer_how", "killer_confidence", "killer_summary")


def with_verdict(
    death: Death,
    events: Sequence[FailureEvent],
    evidence: Mapping[str, Any],
    killer: Mapping[str, str],
    cause: str | None = None,
) -> tuple[Death, list[FailureEvent]]:
    """`death` and its `events` with the lookup's `evidence` added, its `killer` (event
    fields: KILLER_FIELDS) and `cause` (None: unchanged), to store with `amend=True`.

    >>> d, _ = with_verdict(Death(id="d1", cause="worker_lost"), [], {"reason": "Evicted"},
    ...                     {"killer": "kubelet", "killer_how": "pod status"}, "sigterm")
    >>> d.cause, d.killer.name, d.evidence["reason"]
    ('sigterm', 'kubelet', 'Evicted')
    """
    was = death.killer
    attribution = Attribution(
        name=killer.get("killer", was.name if was else "unknown"),
        how=killer.get("killer_how", was.how if was else "inferred"),
        confidence=killer.get("killer_confidence", was.confidence if was else "likely"),
        summary=killer.get("killer_summary", was.summary if was else ""),
        memory=was.memory if was else False,
    )
    extra = dict(evidence)
    if attribution.summary:
        extra["killer_summary"] = attribution.summary
    cause = cause if cause is not None else death.cause
    amended = dataclasses.replace(
        death, cause=cause, evidence={**death.evidence, **extra}, killer=attribution
    )
    fields = {k: v for k, v in killer.items() if k in KILLER_FIELDS}
    return amended, [
        dataclasses.replace(e, cause=cause, evidence={**e.evidence, **extra}, **fields)
        for e in events
    ]
