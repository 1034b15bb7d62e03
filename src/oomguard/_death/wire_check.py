"""The checks a report's fields pass on arrival (`wire.validate` composes them): exact
types, caps, and a `ReportError` naming the field. Never anything else raised.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgpack

from .._exceptions import ReportError

INT_MIN, INT_MAX = -(2**63), 2**64 - 1  # what msgpack can carry
LIST_MAX = 64
NOTE_MAX = 512
_CONTAINERS = (dict, list, tuple, set, frozenset, Mapping)


def _fail_type(v: Any, field: str, expected: str) -> ReportError:
    if isinstance(v, (bytes, bytearray, memoryview)):
        if bytes(v[:1]) == b"\x80":  # pickle protocol >= 2 starts with the PROTO opcode
            return ReportError(field, "holds a pickle; reports are never unpickled", "pickled")
        return ReportError(field, f"must be {expected}, not bytes", "wrong_type")
    if isinstance(v, (msgpack.ExtType, msgpack.Timestamp)):
        return ReportError(field, "holds a msgpack extension type", "undecodable")
    if isinstance(v, _CONTAINERS) and "dict" not in expected and "list" not in expected:
        return ReportError(
            field, f"must be {expected}, not a nested {type(v).__name__}", "too_deep"
        )
    return ReportError(field, f"must be {expected}, not {type(v).__name__}", "wrong_type")


def _str(v: Any, field: str, cap: int, *, none: bool = False) -> str | None:
    if type(v) is str and len(v) <= cap and v.isascii():  # the common case, fast
        return v
    if v is None and none:
        return None
    if not isinstance(v, str):
        raise _fail_type(v, field, "str or None" if none else "str")
    if len(v) > cap:
        raise ReportError(field, f"is {len(v)} characters long, the cap is {cap}", "too_large")
    if not v.isascii():
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise ReportError(
                field, "is not valid Unicode (lone surrogate)", "bad_value"
            ) from None
    return str.__str__(v)


def _int(v: Any, field: str, *, none: bool = False, minimum: int = INT_MIN) -> int | None:
    if type(v) is int and minimum <= v <= INT_MAX:
        return v
    if v is None and none:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise _fail_type(v, field, "int or None" if none else "int")
    if not minimum <= v <= INT_MAX:
        raise ReportError(field, f"is out of range ({minimum} .. 2**64-1)", "bad_value")
    return int.__index__(v)


def _float(v: Any, field: str, *, none: bool = False) -> float | None:
    if v is None and none:
        return None
    if isinstance(v, int) and not isinstance(v, bool):
        if not INT_MIN <= v <= INT_MAX:
            raise ReportError(field, "is out of range", "bad_value")
        return float(int.__index__(v))
    if not isinstance(v, float):
        raise _fail_type(v, field, "float or None" if none else "float")
    if not math.isfinite(v):
        raise ReportError(field, f"must be finite, not {float.__repr__(v)}", "bad_value")
    return float.__float__(v)


def _seq(v: Any, field: str, cap: int, *, none: bool = False) -> list[Any] | None:
    if v is None and none:
        return None
    if isinstance(v, list):
        items = list.__iter__(v)
        n = list.__len__(v)
    elif isinstance(v, tuple):
        items = tuple.__iter__(v)
        n = tuple.__len__(v)
    else:
        raise _fail_type(v, field, "list or None" if none else "list")
    if n > cap:
        raise ReportError(field, f"has {n} items, the cap is {cap}", "too_large")
    return list(items)


def _map(
    v: Any,
    field: str,
    keys: tuple[str, ...] | None,
    *,
    none: bool = False,
    optional: tuple[str, ...] = (),
) -> Any:
    """The mapping's items after checking its keys; `keys` None means any str keys, and
    `optional` keys may be absent (read as None)."""
    if v is None and none:
        return None
    if not isinstance(v, dict):
        raise _fail_type(v, field, "dict or None" if none else "dict")
    items = dict(dict.items(v))
    for k in items:
        if not isinstance(k, str):
            raise ReportError(field, f"has a non-str key of type {type(k).__name__}", "wrong_type")
    if keys is not None:
        for k in items:
            if k not in keys:
                shown = k[:64] + ("..." if len(k) > 64 else "")
                where = f"{field}.{shown}" if field else shown
                raise ReportError(where, "is not a field of schema v1", "bad_value")
        for k in keys:
            if k not in items:
                if k in optional:
                    items[k] = None
                    continue
                where = f"{field}.{k}" if field else k
                raise ReportError(where, "is required (use None for unknown)", "missing_field")
    return items


def _notes(v: Any, field: str) -> list[str]:
    return [_str(s, f"{field}[{i}]", NOTE_MAX) for i, s in enumerate(_seq(v, field, LIST_MAX))]


#: The SLURM evidence keys (`slurm.KEYS`) and their types: ints, a float, the rest text.
_SLURM_INTS = ("slurm_mem_limit_bytes", "slurm_oom_kill_events")
_SLURM_LONG = ("slurm_output_line", "slurm_source")


def slurm_evidence(ev: dict[str, Any]) -> None:
    """The ``slurm_*`` evidence keys a nanny adds (`killer._slurm_facts`): known keys,
    their types and caps, and a job state SLURM has. A `ReportError` names the key."""
    from . import slurm

    for key, v in ev.items():
        if not key.startswith("slurm_") or v is None:
            continue
        field = f"evidence.{key}"
        if key == "slurm_query_seconds":
            if _float(v, field) < 0:
                raise ReportError(field, "must not be negative", "bad_value")
        elif key in _SLURM_INTS:
            _int(v, field, minimum=0)
        elif key in slurm.KEYS:
            _str(v, field, slurm.LINE_MAX if key in _SLURM_LONG else slurm.TEXT_MAX)
            if key == "slurm_state" and v not in slurm.STATES:
                raise ReportError(field, f"{v!r} is not a SLURM job state", "bad_value")
        else:
            raise ReportError(field, "is not a SLURM fact oomguard knows", "bad_value")
