"""A `Death` on the wire: what a nanny sends the scheduler when its worker dies.

Plain msgpack-able data, size-capped. The nanny encodes its `Death` (`encode`); the
scheduler decodes and validates the bytes back into one (`decode`, `validate`) and never
unpickles anything: a report is data, not code.

The schema is the record's declaration (`record.Death` and the records it holds), read
once per class: each field's type, and the caps in its metadata (`record.spec`). Every key
is required (None where a value is unknown) but those added within schema 1 (`optional`,
absent from older nannies' reports and read as their default). Unknown keys are rejected,
not dropped, so a typo or a newer sender shows up as an error naming the field. Types are
checked exactly (``True`` is not an int; an int is accepted for a float and becomes a
float; str/int/float subclasses such as enums become the plain type; tuples and lists are
both taken). Floats must be finite. Strings and lists longer than their caps are rejected
("too_large"). A record's tasks travel as ``executing`` (schema 1's name), a frame of a
stack as ``[filename, lineno, function]``, and the scheduler's fields (`wire=False`) never.
Evidence is flat: at most `EVIDENCE_MAX` keys (each a str of at most 128 characters) of
str (at most 1,024), int, float, bool or None; its ``slurm_*`` keys are those of
`slurm.KEYS`, typed, with a job state SLURM has (`wire_check.slurm_evidence`). A mapping of
str to str (an environment's labels and packages) has at most ``cap`` keys of at most
``keys`` characters and values of at most ``items``. The texts of an environment, which
its worker's settings and environment variables name, are made one printable line on
arrival (`_safe_text.safe_name`), not refused: they are labels, and a worker may set any.

The whole report, msgpack-encoded, must fit in ``max_bytes`` (at least `MIN_REPORT_BYTES`).
`ReportError.reason` is one of `REASONS`, usable as a Prometheus label.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

import msgpack

from .._exceptions import ReportError
from .._protocol import VALIDATION_REASONS
from .._safe_text import safe_name
from . import record
from .record import (
    EVIDENCE_KEY_MAX,
    FRAME_CAPS,
    SCHEMA_VERSION,
    WIRE_NAMES,
    Death,
    Environment,
)
from .wire_check import (
    INT_MAX,
    INT_MIN,
    _fail_type,
    _float,
    _int,
    _map,
    _seq,
    _str,
    slurm_evidence,
)

__all__ = [
    "MAX_REPORT_BYTES",
    "MIN_REPORT_BYTES",
    "REASONS",
    "SCHEMA_VERSION",
    "decode",
    "encode",
    "environment",
    "to_wire",
    "validate",
]

MAX_REPORT_BYTES = record.REPORT_MAX
#: Smaller caps are raised to this: the fixed fields of a report must always fit.
MIN_REPORT_BYTES = 16 * 1024

REASONS = VALIDATION_REASONS

_Check = Callable[[Any, str], Any]


# --------------------------------------------------------------------------- the schema
#
# Each record type's check and encoder are compiled once from its declaration. A check
# takes the value and where it sits (the field's name for the error, built only when one
# is raised for list items: stacks are most of a report).


@functools.cache
def _wire_fields(cls: type) -> tuple[tuple[str, str, dataclasses.Field, Any], ...]:
    """(attribute, wire name, field, type) of a record's fields that travel."""
    hints = typing.get_type_hints(cls, vars(record))
    return tuple(
        (f.name, WIRE_NAMES.get(f.name, f.name), f, hints[f.name])
        for f in dataclasses.fields(cls)
        if f.metadata.get("wire", True)
    )


@functools.cache
def _record_check(cls: type, none: bool = False) -> _Check:
    """The check of one record type (`none`: a wrong type's error says None is taken)."""
    fields = [(name, wire, _check(tp, f.metadata)) for name, wire, f, tp in _wire_fields(cls)]
    keys = tuple(wire for _, wire, _ in fields)
    optional = tuple(wire for _, wire, f, _ in _wire_fields(cls) if f.metadata.get("optional"))
    keyset = frozenset(keys)

    def check(v: Any, where: str) -> Any:
        if type(v) is dict and len(v) == len(keys) and keyset.issuperset(v):
            d = v  # the usual shape: every key, no other
        else:
            d = _map(v, where, keys, optional=optional, none=none)
        out = {}  # the scheduler's fields (and optional ones absent) take their defaults
        for name, wire, check_one in fields:
            value = d[wire]
            if value is None and wire in optional and wire not in v:
                continue
            out[name] = check_one(value, f"{where}.{wire}" if where else wire)
        return cls(**out)

    return check


def _check(tp: Any, meta: Mapping[str, Any], none: bool = False) -> _Check:
    """The check of one field's value, from its type and metadata (`none`: None is
    taken too, and errors say so)."""
    args = typing.get_args(tp)
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        inner = [a for a in args if a is not type(None)]
        assert len(inner) == 1 and len(args) == 2, f"only X | None is supported, not {tp}"
        one = _check(inner[0], meta, none=True)
        return lambda v, where: None if v is None else one(v, where)
    if dataclasses.is_dataclass(tp):
        return _record_check(tp, none)
    if tp == record.Frame:
        return lambda v, where: _frame(v, where, None)
    origin = typing.get_origin(tp)
    if origin is tuple:
        assert args[-1] is Ellipsis, f"only tuple[X, ...] is supported, not {tp}"
        return _tuple(args[0], meta, none)
    if origin is Mapping:
        return _labels(meta) if args == (str, str) else _evidence
    return _scalar(tp, meta, none)


def _scalar(tp: Any, meta: Mapping[str, Any], none: bool) -> _Check:
    choices, cap, least = meta.get("choices"), meta.get("cap"), meta.get("min")
    if tp is str:
        cap = cap if cap is not None else INT_MAX
        safe = meta.get("safe", False)

        def check(v: Any, where: str) -> Any:
            if type(v) is not str or len(v) > cap or not v.isascii():
                v = _str(v, where, cap, none=none)
            if choices is not None and v not in choices:
                raise ReportError(where, f"{v!r} is not one of {sorted(choices)}", "bad_value")
            return safe_name(v, cap) if safe else v

    elif tp is int:
        lowest = least if least is not None else INT_MIN

        def check(v: Any, where: str) -> Any:
            if type(v) is not int or not lowest <= v <= INT_MAX:
                v = _int(v, where, minimum=lowest, none=none)
            if choices is not None and v not in choices:
                raise ReportError(where, f"must be one of {sorted(choices)}, not {v}", "bad_value")
            return v

    elif tp is float:

        def check(v: Any, where: str) -> Any:
            if type(v) is float and math.isfinite(v):
                return v
            return _float(v, where, none=none)

    elif tp is bool:
        expected = "bool or None" if none else "bool"

        def check(v: Any, where: str) -> Any:
            if type(v) is bool:
                return v
            raise _fail_type(v, where, expected)

    else:  # pragma: no cover - a declaration this module does not know
        raise TypeError(f"no wire check for {tp!r}")
    return check


def _tuple(item: Any, meta: Mapping[str, Any], none: bool) -> _Check:
    cap = meta.get("cap") or record.LIST_MAX
    if item == record.Frame:

        def frames(v: Any, where: str) -> tuple:
            items = _seq(v, where, cap, none=none)
            return tuple([_frame(x, where, i) for i, x in enumerate(items)])

        return frames
    one = _check(item, {"cap": meta.get("items")})

    def check(v: Any, where: str) -> tuple:
        items = _seq(v, where, cap, none=none)
        return tuple([one(x, f"{where}[{i}]") for i, x in enumerate(items)])

    return check


def _frame(v: Any, parent: str, i: int | None) -> tuple:
    # The usual shape is checked without building field names.
    fn_cap, _, func_cap = FRAME_CAPS
    if type(v) in (list, tuple) and len(v) == 3:
        fn, ln, func = v
        if (
            type(fn) is str
            and len(fn) <= fn_cap
            and fn.isascii()
            and (ln is None or (type(ln) is int and 0 <= ln <= INT_MAX))
            and type(func) is str
            and len(func) <= func_cap
            and func.isascii()
        ):
            return (fn, ln, func)
    where = parent if i is None else f"{parent}[{i}]"
    items = _seq(v, where, 3)
    if len(items) != 3:
        raise ReportError(where, "must be [filename, lineno, function]", "bad_value")
    return (
        _str(items[0], f"{where}[0]", fn_cap),
        _int(items[1], f"{where}[1]", none=True, minimum=0),
        _str(items[2], f"{where}[2]", func_cap),
    )


def _labels(meta: Mapping[str, Any]) -> _Check:
    """A mapping of str to str: its size, each key's and value's, each made safe."""
    cap, key_cap, value_cap = meta["cap"], meta["keys"], meta["items"]

    def check(v: Any, where: str) -> dict[str, str]:
        d = _map(v, where, None)
        if len(d) > cap:
            raise ReportError(where, f"has {len(d)} keys, the cap is {cap}", "too_large")
        out = {}
        for k, value in d.items():
            if len(k) > key_cap:
                message = f"has a key of {len(k)} characters, the cap is {key_cap}"
                raise ReportError(where, message, "too_large")
            value = _str(value, f"{where}.{safe_name(k, 64)}", value_cap)
            out[safe_name(k, key_cap)] = safe_name(value, value_cap)
        return out

    return check


def _evidence(v: Any, where: str) -> dict[str, Any]:
    ev = _map(v, where, None)
    if len(ev) > record.EVIDENCE_MAX:
        raise ReportError(
            where, f"has {len(ev)} keys, the cap is {record.EVIDENCE_MAX}", "too_large"
        )
    out = {_str(k, where, EVIDENCE_KEY_MAX): _evidence_value(val, k) for k, val in ev.items()}
    slurm_evidence(out)
    return out


def _evidence_value(v: Any, key: str) -> Any:
    t = type(v)
    if v is None or t is bool or (t is int and INT_MIN <= v <= INT_MAX):
        return v
    if t is str and len(v) <= record.EVIDENCE_STR_MAX and v.isascii():
        return v
    field = f"evidence.{key[:64]}"
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, int):
        return _int(v, field)
    if isinstance(v, float):
        return _float(v, field)
    if isinstance(v, str):
        return _str(v, field, record.EVIDENCE_STR_MAX)
    raise _fail_type(v, field, "str, int, float, bool or None")


# --------------------------------------------------------------------------- validation


def _validate(report: Any, max_bytes: int) -> Death:
    if not isinstance(report, dict):
        raise ReportError(
            "report", f"must be a dict, not {type(report).__name__}", "not_a_mapping"
        )
    if "schema" not in report:
        raise ReportError("schema", "is required", "missing_field")
    schema = report["schema"]
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise _fail_type(schema, "schema", "int")
    if schema != SCHEMA_VERSION:
        message = f"version {schema} is not supported (only {SCHEMA_VERSION})"
        raise ReportError("schema", message, "schema_version")
    death = _record_check(Death)(report, "")
    size = len(msgpack.packb(report, use_bin_type=True))  # as sent; checked, so it packs
    if size > max_bytes:
        raise ReportError(
            "report", f"is {size} bytes encoded, the cap is {max_bytes}", "too_large"
        )
    return death


def validate(report: object, max_bytes: int = MAX_REPORT_BYTES) -> Death:
    """The `Death` a schema-1 report (a decoded mapping) describes, or `ReportError`
    naming the bad field. Never raises anything else, whatever `report` holds.

    >>> validate({"schema": 2})
    Traceback (most recent call last):
    oomguard.ReportError: schema: version 2 is not supported (only 1)
    """
    max_bytes = max(int(max_bytes), MIN_REPORT_BYTES)
    try:
        return _validate(report, max_bytes)
    except ReportError:
        raise
    except Exception as exc:  # a bug or a hostile object: still a rejected report, not a crash
        message = f"could not be validated ({type(exc).__name__})"
        raise ReportError("report", message, "bad_value") from exc


def environment(value: object) -> Environment:
    """The `Environment` a worker's host event says (its ``environment``), checked as a
    report's is, or `ReportError` naming the bad field. Never raises anything else.

    >>> wired = to_wire(Environment(python="3.11.9", labels={"NODE_POOL": "spot"}))
    >>> environment(wired).labels
    {'NODE_POOL': 'spot'}
    >>> environment({**wired, "labels": {"NODE_POOL": 7}})
    Traceback (most recent call last):
    oomguard.ReportError: environment.labels.NODE_POOL: must be str, not int
    """
    try:
        return _record_check(Environment)(value, "environment")
    except ReportError:
        raise
    except Exception as exc:
        message = f"could not be validated ({type(exc).__name__})"
        raise ReportError("environment", message, "bad_value") from exc


# --------------------------------------------------------------------------- wire format


def to_wire(value: Any) -> Any:
    """A record as the plain data that travels: dicts of its wire fields, lists for tuples
    (a stack frame a 3-list), plain str for enums."""
    if dataclasses.is_dataclass(value):
        return _encoder(type(value))(value)
    if isinstance(value, tuple | list):
        return [to_wire(v) for v in value]
    if isinstance(value, Mapping):
        return {k: to_wire(v) for k, v in value.items()}
    if isinstance(value, str) and type(value) is not str:
        return str.__str__(value)
    return value


@functools.cache
def _encoder(cls: type) -> Callable[[Any], dict]:
    """One record type's encoder, by the kind of each field: plain values as they are,
    stacks as lists of 3-lists, the rest through `to_wire`."""
    plain = (str, int, float, bool, str | None, int | None, float | None, bool | None)
    stack = (tuple[record.Frame, ...], tuple[record.Frame, ...] | None)
    fields = [
        (name, wire, "plain" if tp in plain else "stack" if tp in stack else "")
        for name, wire, _, tp in _wire_fields(cls)
    ]

    def encode_one(value: Any) -> dict:
        out = {}
        for name, wire, kind in fields:
            v = getattr(value, name)
            if kind == "plain" and type(v) in _PLAIN:
                out[wire] = v
            elif kind == "stack":
                out[wire] = None if v is None else [list(f) for f in v]
            else:
                out[wire] = to_wire(v)
        return out

    return encode_one


_PLAIN = frozenset({str, int, float, bool, type(None)})


def encode(death: Death) -> bytes:
    """The death as msgpack bytes (str as str, bytes as bin).

    >>> from oomguard._death.build import EXAMPLE, build
    >>> decode(encode(build(EXAMPLE))).cause
    'sigkill'
    """
    return msgpack.packb(to_wire(death), use_bin_type=True)


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ReportError("report", f"holds msgpack extension type {code}", "undecodable")


def decode(data: bytes, max_bytes: int = MAX_REPORT_BYTES) -> Death:
    """Decode and `validate` report bytes; `ReportError` for anything else, pickles included.

    >>> import pickle
    >>> decode(pickle.dumps({"schema": 1}))
    Traceback (most recent call last):
    oomguard.ReportError: report: is a pickle; reports are never unpickled
    """
    max_bytes = max(int(max_bytes), MIN_REPORT_BYTES)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ReportError("report", f"must be bytes, not {type(data).__name__}", "undecodable")
    data = bytes(data)
    if len(data) > max_bytes:
        raise ReportError("report", f"is {len(data)} bytes, the cap is {max_bytes}", "too_large")
    # Pickle protocols >= 2 begin with PROTO (0x80); to msgpack that is an empty map followed
    # by junk, so it would only fail as "extra data". Name it for what it is, and never load it.
    if data[:1] == b"\x80" and len(data) > 1:
        raise ReportError("report", "is a pickle; reports are never unpickled", "pickled")
    try:
        obj = msgpack.unpackb(
            data,
            raw=False,  # str must be valid UTF-8
            use_list=True,
            strict_map_key=True,
            ext_hook=_refuse_ext,
            max_str_len=max_bytes,
            max_bin_len=max_bytes,
            max_ext_len=max_bytes,
            max_array_len=1024,  # schema lists cap at 64: room to name the field, no bombs
            max_map_len=1024,
        )
    except ReportError:
        raise
    except msgpack.StackError:
        raise ReportError("report", "is nested too deeply to decode", "too_deep") from None
    except UnicodeDecodeError:
        message = "holds a string that is not valid UTF-8"
        raise ReportError("report", message, "undecodable") from None
    except Exception as exc:
        if "exceeds max_" in str(exc):
            raise ReportError("report", f"holds an over-long item ({exc})", "too_large") from None
        message = f"is not valid msgpack ({type(exc).__name__})"
        raise ReportError("report", message, "undecodable") from None
    return validate(obj, max_bytes)
