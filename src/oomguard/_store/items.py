"""The queued form of a write: a FailureEvent or a PipelineStatus checked and encoded on
the caller's thread (a bad field is refused there, naming it), so the writer thread only
inserts tuples of atomics. Every text is made safe here, the store's one door
(`oomguard._safe_text`): names printable and bounded, prose and evidence without control
characters, so no row can break a batch of the spool or of the PostgreSQL history."""

from __future__ import annotations

import json
from typing import Any

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
#: worker (issue 26), the cluster (issue 29; last, so CLUSTER is the row's last index).
_LATER_FIELDS = ("killer", "killer_how", "killer_confidence", "killer_summary", "cluster")
#: Prose, not a name: kept with its lines, and longer.
_PROSE_FIELDS = frozenset({"killer_summary"})
#: An events row's length; an item with an example trace has one more.
ROW = 1 + len(_TEXT_FIELDS) + 3 + len(_LATER_FIELDS)
#: The index of the cluster in an events row.
CLUSTER = ROW - 1
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
