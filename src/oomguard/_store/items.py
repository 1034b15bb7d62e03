"""The queued form of a write: a FailureEvent, a death with its events, or a PipelineStatus
checked and encoded on the caller's thread (a bad field is refused there, naming it), so the
writer thread only inserts tuples of atomics. Every text is made safe here, the store's one
door (`oomguard._safe_text`): names printable and bounded, prose and evidence without
control characters, so no row can break a batch of the spool or of the PostgreSQL history."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from .._death.record import Death
from .._models import FailureEvent, PipelineStatus
from .._safe_text import EXAMPLE_CHARS, safe_name, safe_text, safe_value

_TEXT_FIELDS = (
    "kind",
    "cause",
    "shard",
    "pipeline",
    "worker",
    "host",
    "signature_id",
    "signature_title",
)
#: After grouping_version, in the column order of batch._INSERT_EVENT: who ended the
#: worker (issue 26), the cluster (issue 29) and the death it is part of (issue 38).
_LATER_FIELDS = ("killer", "killer_how", "killer_confidence", "killer_summary", "cluster", "death")
#: Prose, not a name: kept with its lines, and longer.
_PROSE_FIELDS = frozenset({"killer_summary"})
#: An events row's length; an item with an example trace has one more.
ROW = 1 + len(_TEXT_FIELDS) + 3 + len(_LATER_FIELDS)
#: The index of the cluster, and of the death's id, in an events row.
CLUSTER = ROW - 2
DEATH = ROW - 1
_PIPELINE_INT_FIELDS = (
    "shards_done",
    "shards_failed",
    "shards_aborted",
    "infra_failures",
    "user_failures",
)


def event_item(e: FailureEvent, grouping_version: Any, example: Any) -> tuple:
    """The queued form of an event: the events row (`ROW` atomics, in the column order of
    batch._INSERT_EVENT), plus the example when there is one. Atomics only, so the GC
    stops tracking it."""
    if not isinstance(e, FailureEvent):
        raise TypeError(f"expected a FailureEvent, got {type(e).__name__}")
    t = e.time
    if type(t) is not float:
        if isinstance(t, bool) or not isinstance(t, (int, float)):
            raise TypeError(f"field 'time' must be seconds since the epoch, got {t!r}")
        t = float(t)
    if t != t:
        raise ValueError("field 'time' is NaN")
    texts = []
    for name in _TEXT_FIELDS + _LATER_FIELDS:
        value = getattr(e, name)
        if type(value) is not str:
            if not isinstance(value, str):
                raise TypeError(f"field {name!r} must be a str, got {type(value).__name__}")
            value = str.__str__(value)  # Cause.OOM_KILL -> "oom_kill", a plain str
        texts.append(safe_text(value) if name in _PROSE_FIELDS else safe_name(value))
    attempt = e.attempt
    if type(attempt) is not int:
        raise TypeError(f"field 'attempt' must be an int, got {attempt!r}")
    if type(grouping_version) is not int:
        raise TypeError(f"grouping_version must be an int, got {grouping_version!r}")
    if type(example) is not str:
        raise TypeError(f"example must be a str, got {type(example).__name__}")
    if type(e.evidence) is not dict:
        raise TypeError(f"field 'evidence' must be a dict, got {type(e.evidence).__name__}")
    try:
        # Encoded now: a snapshot, even if the caller mutates the dict afterwards.
        # Escaped, not cut: what a death's evidence may cost is bounded before (evidence.py).
        evidence = _encode_json(safe_value(e.evidence, None))
    except (TypeError, ValueError) as err:
        raise TypeError(f"field 'evidence' is not JSON-serialisable: {err}") from None
    n = len(_TEXT_FIELDS)
    row = (t, *texts[:n], evidence, attempt, grouping_version, *texts[n:])
    return (*row, safe_text(example, EXAMPLE_CHARS)) if example else row


_encode_json = json.JSONEncoder(separators=(",", ":")).encode
_encode_strict = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode

#: A death's row, in the column order of deaths.INSERT_DEATH.
DEATH_COLUMNS = (
    "id, cluster, time, worker, host, cause, killer, signature_id, signature_title, "
    "grouping_version, record, incident"
)
DEATH_ROW = DEATH_COLUMNS.count(",") + 1


def death_item(
    death: Death, events: Any, grouping_version: Any, example: Any, amend: Any
) -> tuple:
    """The queued form of a decided death and the events of the tasks it is blamed on:
    (the deaths row, the events rows, the example, amend). Each event must name the death
    (its `death` is the death's id, its cluster the death's)."""
    if not isinstance(death, Death):
        raise TypeError(f"expected a Death, got {type(death).__name__}")
    if type(amend) is not bool:
        raise TypeError(f"amend must be True or False, got {amend!r}")
    if not isinstance(events, list | tuple):
        raise TypeError(f"events must be a list of FailureEvent, got {type(events).__name__}")
    texts = []
    for name in ("id", "cluster", "worker", "host", "cause", "signature_id", "signature_title"):
        value = getattr(death, name)
        if not isinstance(value, str):
            raise TypeError(f"field 'death.{name}' must be a str, got {type(value).__name__}")
        texts.append(safe_name(str.__str__(value)))
    if not death.id:
        raise ValueError("field 'death.id' is empty: a death is stored by its id")
    t = death.time
    if isinstance(t, bool) or not isinstance(t, int | float) or t != t:
        raise TypeError(f"field 'death.time' must be seconds since the epoch, got {t!r}")
    killer = death.killer.name if death.killer is not None else ""
    if not isinstance(killer, str):
        raise TypeError(f"field 'death.killer.name' must be a str, got {killer!r}")
    rows = tuple(event_item(e, grouping_version, "") for e in events)
    for i, row in enumerate(rows):
        if row[DEATH] != death.id or row[CLUSTER] != texts[1]:
            raise ValueError(
                f"event {i} (field 'death' {row[DEATH]!r}, 'cluster' {row[CLUSTER]!r}) does "
                f"not name the death {death.id!r} of cluster {texts[1]!r}"
            )
    if type(grouping_version) is not int:
        raise TypeError(f"grouping_version must be an int, got {grouping_version!r}")
    if type(example) is not str:
        raise TypeError(f"example must be a str, got {type(example).__name__}")
    identity, cluster, worker, host, cause, sig, title = texts
    if not isinstance(death.incident, str):
        raise TypeError(f"field 'death.incident' must be a str, got {death.incident!r}")
    # A death no incident was given (stored by other code than the decision core) is one.
    incident = safe_name(death.incident) or identity
    death = dataclasses.replace(death, incident=incident)
    row = (identity, cluster, float(t), worker, host, cause, safe_name(killer), sig, title)
    return ((*row, grouping_version, _death_json(death), incident), rows, example, amend)


def _death_json(death: Death) -> str:
    """The death as stored: no crash text, no stacks (the trace stays with its signature),
    no field at its default; its tasks' names as their events keep them (`safe_name`), every
    other text safe. A value JSON cannot hold is refused, naming its field."""
    tasks = tuple(
        dataclasses.replace(
            t,
            stack=None,
            key=safe_name(t.key),
            prefix=safe_name(t.prefix),
            pipeline=safe_name(t.pipeline),
        )
        for t in death.tasks
    )
    crash = dataclasses.replace(death.crash, text="") if death.crash is not None else None
    d = dataclasses.replace(death, tasks=tasks, crash=crash).to_dict(compact=True)
    d = safe_value(d, None)
    try:
        return _encode_strict(d)
    except (TypeError, ValueError):
        for name, value in d.items():
            try:
                _encode_strict(value)
            except (TypeError, ValueError) as err:
                raise TypeError(f"field 'death.{name}' is not JSON-serialisable: {err}") from None
        raise


def pipeline_row(p: PipelineStatus, updated: float) -> tuple:
    if not isinstance(p, PipelineStatus):
        raise TypeError(f"expected a PipelineStatus, got {type(p).__name__}")
    texts = {}
    for name in ("name", "status", "summary", "abort_reason", "cluster"):
        value = getattr(p, name)
        if not isinstance(value, str):
            raise TypeError(f"field {name!r} must be a str, got {type(value).__name__}")
        value = str.__str__(value)
        texts[name] = safe_text(value) if name in ("summary", "abort_reason") else safe_name(value)
    for name in _PIPELINE_INT_FIELDS:
        value = getattr(p, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"field {name!r} must be an int, got {value!r}")
    started = p.started
    if isinstance(started, bool) or not isinstance(started, (int, float)):
        raise TypeError(f"field 'started' must be seconds since the epoch, got {started!r}")
    if started != started:
        raise ValueError("field 'started' is NaN")
    return (
        texts["name"],
        texts["status"],
        int(p.shards_done),
        int(p.shards_failed),
        int(p.shards_aborted),
        int(p.infra_failures),
        int(p.user_failures),
        texts["summary"],
        texts["abort_reason"],
        float(started),
        texts["cluster"],
        updated,
    )


#: What an item costs beyond its strings: the tuple, its floats and ints, the deque's slot.
ITEM_OVERHEAD = 256


def item_size(item: tuple) -> int:
    """The bytes a queued item holds, near enough: its strings' lengths (the evidence is
    ASCII JSON) plus ITEM_OVERHEAD. O(fields), no encoding."""
    n = ITEM_OVERHEAD
    for value in item:
        if type(value) is str:
            n += len(value)
        elif type(value) is tuple:
            n += item_size(value)
    return n


def describe_event(event: Any) -> str:
    try:
        return f"event of shard {event.shard!r} (signature {event.signature_id!r})"
    except Exception:
        return f"a {type(event).__name__}"
