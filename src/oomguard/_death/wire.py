"""The death report on the wire: what a nanny sends the scheduler when its worker dies.

One report per death, plain msgpack-able data, size-capped. The nanny builds it
(`build.build_report`), encodes it (`encode`); the scheduler decodes and validates it
(`decode`, `validate`) and never unpickles anything: a report is data, not code.

Schema version 1. Every key is required (use None where a value is unknown); unknown keys
are rejected, not dropped, so a typo or a newer sender shows up as an error naming the field.
Types are checked exactly (``True`` is not an int; an int is accepted for a float and becomes
a float; str/int/float subclasses such as enums become the plain type; tuples become lists).
Floats must be finite. Strings and lists longer than their caps are rejected ("too_large").

==============  ============================================  ================================
field           type                                          meaning
==============  ============================================  ================================
schema          int, == 1                                     `SCHEMA_VERSION`
worker          str (<= 256)                                  the dead worker's address
nanny           str (<= 256)                                  its nanny's address
name            str (<= 256)                                  the worker's name, as str
host            str (<= 256)                                  host name
pid             int >= 1 | None                               the worker process ID
exitcode        int | None                                    exit status (-N: signal N)
cause           str                                           a `Cause` in DEATH_CAUSES but
                                                              worker_lost (see classify)
time            float                                         when the nanny saw the death
started         float | None                                  when the worker process started
memory_limit    int >= 0 | None                               Dask's memory_limit, bytes
executing       list (<= 64) of task dicts                    tasks executing at the death
  .key          str (<= 1024)                                 the task key, as str(key)
  .prefix       str (<= 256)                                  the task prefix
  .start        float                                         when it started executing
  .thread       int >= 0                                      executor thread ident
  .stack        list (<= 64) of [filename: str (<= 1024),     its last sampled stack,
                lineno: int >= 0 | None, function: str        innermost frame last
                (<= 256)] | None
  .stack_time   float | None                                  when that stack was sampled
  .grew         int >= 0 | None (may be absent)               its estimated share of the
                                                              worker's RSS growth since it
                                                              started, bytes (growth.py)
  .crashed      bool | None (may be absent)                   a native crash's dump named
                                                              this task's thread (threads.py)
crash           {signal: str (<= 32) | None, text: str} |     the faulthandler crash file;
                None                                          text <= max_bytes characters
evidence        dict (<= 96 keys, each str <= 128) of         flat; see facts.evidence
                str (<= 1024) | int | float | bool | None     (``slurm_*`` keys: only those
                                                              of slurm.KEYS, typed, a
                                                              state SLURM has; wire_check)
cgroup          {version: 1 | 2, path: str (<= 1024),         the worker's memory cgroup
                before: counters | None, after: counters |    counters at worker start and
                None} | None                                  after its death
  counters      {version: int | None, path: str | None,       MemoryCounters.to_dict()
                oom_kill, oom, oom_group_kill, failcnt,
                peak, limit, usage: int >= 0 | None,
                missing: list (<= 64) of str (<= 512)}
rss_sampled     int >= 0 | None                               last sampled RSS, bytes
rss_time        float | None                                  when it was sampled
host_memory     {total, available: int >= 0 | None} | None    host memory after the death
killer          {name: a Killer, how: a Known, confidence:    who ended the worker (absent
                a Confidence, summary: str (<= 512),          from older nannies: read as
                memory: bool} | None                          None); see killer.attribute
missing         list (<= 64) of str (<= 512)                  what could not be read/kept
truncated       list (<= 64) of str (<= 512)                  what was shortened to fit
==============  ============================================  ================================

The whole report, msgpack-encoded, must fit in ``max_bytes`` (at least `MIN_REPORT_BYTES`).
`ReportError.reason` is one of `REASONS`, usable as a Prometheus label.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack

from .._causes import DEATH_CAUSES, Cause, Confidence, Killer, Known
from .._exceptions import ReportError
from .._protocol import VALIDATION_REASONS
from .record import MemoryCounters
from .wire_check import (
    INT_MAX,
    INT_MIN,
    _fail_type,
    _float,
    _int,
    _map,
    _notes,
    _seq,
    _str,
    slurm_evidence,
)
from .wire_check import LIST_MAX as LIST_MAX  # the schema's caps, re-exported
from .wire_check import NOTE_MAX as NOTE_MAX

SCHEMA_VERSION = 1
MAX_REPORT_BYTES = 256 * 1024
#: Smaller caps are raised to this: the fixed fields of a report must always fit.
MIN_REPORT_BYTES = 16 * 1024

REASONS = VALIDATION_REASONS

REPORT_CAUSES = frozenset(c.value for c in DEATH_CAUSES - {Cause.WORKER_LOST})

IDENT_MAX = 256
KEY_MAX = 1024
FILENAME_MAX = 1024
FUNCTION_MAX = 256
SIGNAL_MAX = 32
PATH_MAX = 1024
EVIDENCE_KEY_MAX = 128
EVIDENCE_STR_MAX = 1024
EVIDENCE_MAX = 96  # keys; 64 before issue 26 added the killer's facts
SUMMARY_MAX = 512

# A counters dict is `MemoryCounters.to_dict()`: its keys are the dataclass's fields, in order,
# and its counts and sizes are the `int | None` ones. Schema v1 fixes both (a unit test).
COUNTER_KEYS = tuple(f.name for f in dataclasses.fields(MemoryCounters))
COUNTER_INTS = tuple(
    f.name for f in dataclasses.fields(MemoryCounters) if str(f.type) == "int | None"
)
_TASK_KEYS = ("key", "prefix", "start", "thread", "stack", "stack_time", "grew", "crashed")
_TASK_OPTIONAL = ("grew", "crashed")  # added within schema v1: older nannies' reports lack them
_FIELDS = (
    "schema",
    "worker",
    "nanny",
    "name",
    "host",
    "pid",
    "exitcode",
    "cause",
    "time",
    "started",
    "memory_limit",
    "executing",
    "crash",
    "evidence",
    "cgroup",
    "rss_sampled",
    "rss_time",
    "host_memory",
    "killer",
    "missing",
    "truncated",
)
_OPTIONAL = ("killer",)  # added within schema v1: reports from older nannies lack it
_KILLER_KEYS = ("name", "how", "confidence", "summary", "memory")
KILLERS = frozenset(k.value for k in Killer)
KNOWN = frozenset(k.value for k in Known)
CONFIDENCES = frozenset(c.value for c in Confidence)


# --------------------------------------------------------------------------- validation


def _frame(v: Any, parent: str, i: int) -> list[Any]:
    # Stacks are most of a report: check the usual shape without building field names.
    if type(v) is list and len(v) == 3:
        fn, ln, func = v
        if (
            type(fn) is str
            and len(fn) <= FILENAME_MAX
            and fn.isascii()
            and (ln is None or (type(ln) is int and 0 <= ln <= INT_MAX))
            and type(func) is str
            and len(func) <= FUNCTION_MAX
            and func.isascii()
        ):
            return [fn, ln, func]
    field = f"{parent}[{i}]"
    items = _seq(v, field, 3)
    if len(items) != 3:
        raise ReportError(field, "must be [filename, lineno, function]", "bad_value")
    return [
        _str(items[0], f"{field}[0]", FILENAME_MAX),
        _int(items[1], f"{field}[1]", none=True, minimum=0),
        _str(items[2], f"{field}[2]", FUNCTION_MAX),
    ]


def _task(v: Any, field: str) -> dict[str, Any]:
    d = _map(v, field, _TASK_KEYS, optional=_TASK_OPTIONAL)
    where = f"{field}.stack"
    stack = _seq(d["stack"], where, LIST_MAX, none=True)
    return {
        "key": _str(d["key"], f"{field}.key", KEY_MAX),
        "prefix": _str(d["prefix"], f"{field}.prefix", IDENT_MAX),
        "start": _float(d["start"], f"{field}.start"),
        "thread": _int(d["thread"], f"{field}.thread", minimum=0),
        "stack": None if stack is None else [_frame(f, where, i) for i, f in enumerate(stack)],
        "stack_time": _float(d["stack_time"], f"{field}.stack_time", none=True),
        "grew": _int(d["grew"], f"{field}.grew", minimum=0, none=True),
        "crashed": _bool(d["crashed"], f"{field}.crashed"),
    }


def _bool(v: Any, field: str) -> bool | None:
    if v is None or type(v) is bool:
        return v
    raise _fail_type(v, field, "bool or None")


def _evidence_value(v: Any, key: str) -> Any:
    t = type(v)
    if v is None or t is bool or (t is int and INT_MIN <= v <= INT_MAX):
        return v
    if t is str and len(v) <= EVIDENCE_STR_MAX and v.isascii():
        return v
    field = f"evidence.{key[:64]}"
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, int):
        return _int(v, field)
    if isinstance(v, float):
        return _float(v, field)
    if isinstance(v, str):
        return _str(v, field, EVIDENCE_STR_MAX)
    raise _fail_type(v, field, "str, int, float, bool or None")


def _counters(v: Any, field: str) -> dict[str, Any] | None:
    d = _map(v, field, COUNTER_KEYS, none=True)
    if d is None:
        return None
    out: dict[str, Any] = {
        "version": _int(d["version"], f"{field}.version", none=True),
        "path": _str(d["path"], f"{field}.path", PATH_MAX, none=True),
    }
    for k in COUNTER_INTS:
        out[k] = _int(d[k], f"{field}.{k}", none=True, minimum=0)
    out["missing"] = _notes(d["missing"], f"{field}.missing")
    return out


def _killer(v: Any) -> dict[str, Any] | None:
    k = _map(v, "killer", _KILLER_KEYS, none=True)
    if k is None:
        return None
    out = {}
    for key, allowed in (("name", KILLERS), ("how", KNOWN), ("confidence", CONFIDENCES)):
        value = _str(k[key], f"killer.{key}", 32)
        if value not in allowed:
            raise ReportError(
                f"killer.{key}", f"{value!r} is not one of {sorted(allowed)}", "bad_value"
            )
        out[key] = value
    out["summary"] = _str(k["summary"], "killer.summary", SUMMARY_MAX)
    if type(k["memory"]) is not bool:
        raise _fail_type(k["memory"], "killer.memory", "bool")
    out["memory"] = k["memory"]
    return out


def _validate(report: Any, max_bytes: int) -> dict[str, Any]:
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
    d = _map(report, "", _FIELDS, optional=_OPTIONAL)
    cause = _str(d["cause"], "cause", 32)
    if cause not in REPORT_CAUSES:
        raise ReportError("cause", f"{cause!r} is not one of {sorted(REPORT_CAUSES)}", "bad_value")
    out: dict[str, Any] = {"schema": SCHEMA_VERSION}
    for k in ("worker", "nanny", "name", "host"):
        out[k] = _str(d[k], k, IDENT_MAX)
    out["pid"] = _int(d["pid"], "pid", none=True, minimum=1)
    out["exitcode"] = _int(d["exitcode"], "exitcode", none=True)
    out["cause"] = cause
    out["time"] = _float(d["time"], "time")
    out["started"] = _float(d["started"], "started", none=True)
    out["memory_limit"] = _int(d["memory_limit"], "memory_limit", none=True, minimum=0)
    executing = _seq(d["executing"], "executing", LIST_MAX)
    out["executing"] = [_task(t, f"executing[{i}]") for i, t in enumerate(executing)]
    crash = _map(d["crash"], "crash", ("signal", "text"), none=True)
    out["crash"] = (
        None
        if crash is None
        else {
            "signal": _str(crash["signal"], "crash.signal", SIGNAL_MAX, none=True),
            "text": _str(crash["text"], "crash.text", max_bytes),
        }
    )
    ev = _map(d["evidence"], "evidence", None)
    if len(ev) > EVIDENCE_MAX:
        raise ReportError(
            "evidence", f"has {len(ev)} keys, the cap is {EVIDENCE_MAX}", "too_large"
        )
    out["evidence"] = {
        _str(k, "evidence", EVIDENCE_KEY_MAX): _evidence_value(v, k) for k, v in ev.items()
    }
    slurm_evidence(out["evidence"])
    cg = _map(d["cgroup"], "cgroup", ("version", "path", "before", "after"), none=True)
    if cg is not None:
        version = _int(cg["version"], "cgroup.version")
        if version not in (1, 2):
            raise ReportError("cgroup.version", f"must be 1 or 2, not {version}", "bad_value")
        cg = {
            "version": version,
            "path": _str(cg["path"], "cgroup.path", PATH_MAX),
            "before": _counters(cg["before"], "cgroup.before"),
            "after": _counters(cg["after"], "cgroup.after"),
        }
    out["cgroup"] = cg
    out["rss_sampled"] = _int(d["rss_sampled"], "rss_sampled", none=True, minimum=0)
    out["rss_time"] = _float(d["rss_time"], "rss_time", none=True)
    host = _map(d["host_memory"], "host_memory", ("total", "available"), none=True)
    out["host_memory"] = (
        None
        if host is None
        else {
            k: _int(host[k], f"host_memory.{k}", none=True, minimum=0)
            for k in ("total", "available")
        }
    )
    out["killer"] = _killer(d["killer"])
    out["missing"] = _notes(d["missing"], "missing")
    out["truncated"] = _notes(d["truncated"], "truncated")
    size = len(encode(out))
    if size > max_bytes:
        raise ReportError(
            "report", f"is {size} bytes encoded, the cap is {max_bytes}", "too_large"
        )
    return out


def validate(report: object, max_bytes: int = MAX_REPORT_BYTES) -> dict[str, Any]:
    """A cleaned copy of a schema-v1 report, or `ReportError` naming the bad field.

    Never raises anything else, whatever `report` holds.

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


# --------------------------------------------------------------------------- wire format


def encode(report: dict[str, Any]) -> bytes:
    """The report as msgpack bytes (str as str, bytes as bin).

    >>> from oomguard._death.build import EXAMPLE_ARGS, build_report
    >>> decode(encode(build_report(**EXAMPLE_ARGS)))["cause"]
    'sigkill'
    """
    return msgpack.packb(report, use_bin_type=True)


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ReportError("report", f"holds msgpack extension type {code}", "undecodable")


def decode(data: bytes, max_bytes: int = MAX_REPORT_BYTES) -> dict[str, Any]:
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
