"""Which crash signature a death or a task's exception gets, and the trace kept with it.

A death's signature comes from its crash dump, else the culprit's sampled stack, else the
task's function; a task's exception from its traceback, parsed once per bug (pure).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from dask.utils import key_split

from .._causes import Cause
from .._death.record import Death, Task
from .._signature import fingerprint, fingerprint_dask, fingerprint_stack, scrub
from .._words import sampled_stack

__all__ = [
    "death_signature",
    "signed",
    "exception_class",
    "suspects_signature",
    "task_signature",
    "trace_example",
]


def death_signature(cause: Cause, report: Death | None, entry: Task | None, shard: str):
    """The signature of a death of `cause`: `entry` is the report's task of `shard`."""
    crash = report.crash if report is not None else None
    if cause == Cause.NATIVE_CRASH and crash is not None and crash.text:
        return fingerprint(crash.text)
    if entry is not None and entry.stack:
        sig = fingerprint_stack(str(cause), list(entry.stack))
        if any(f.in_app for f in sig.frames):
            return sig
    # No sample, or one taken before the task's own code ran (only Dask's frames):
    # the task's function (its key prefix) stands in for the stack.
    prefix = entry.prefix if entry else (key_split(shard) if shard else "")
    return _prefix_signature(str(cause), prefix or "<no task>")


def signed(
    cause: Cause, report: Death | None, entry: Task | None, shard: str, suspects: tuple = ()
) -> tuple[Any, str]:
    """A death's signature and the trace kept with it: of its crash or `shard`'s task
    (`entry`, the report's), or of its `suspects` (no report, several tasks there)."""
    if suspects:
        return suspects_signature(cause, suspects), ""
    return death_signature(cause, report, entry, shard), trace_example(report, entry, shard)


def suspects_signature(cause: Cause, shards: Iterable[str]):
    """The signature of a death that names no shard, only suspects (no report, several tasks
    there): their task function when they share one, as a named shard's death would be
    signed; else the functions together ("worker_lost in one of load, nap"), so no single
    function is made its culprit."""
    prefixes = sorted({key_split(s) for s in shards})
    if len(prefixes) == 1:
        return _prefix_signature(str(cause), prefixes[0])
    shown = ", ".join(prefixes[:_PREFIXES_SHOWN])
    more = " ..." if len(prefixes) > _PREFIXES_SHOWN else ""
    return _prefix_signature(str(cause), f"one of {shown}{more}")


_PREFIXES_SHOWN = 3


def exception_class(exception_text: str) -> str:
    """`KeyError` of "KeyError(17)": what a signature keeps of the exception."""
    head = exception_text[:200]
    for i, c in enumerate(head):
        if not (c.isalnum() or c in "_."):
            return head[:i]
    return head


_DASK_SIGNATURES: OrderedDict[tuple[str, str], Any] = OrderedDict()


def task_signature(exception_class: str, traceback_text: str, exception_text: str):
    """fingerprint_dask, once per (exception class, traceback): on the event loop, per
    erred task, a thousand tasks failing with one bug are one parse, not a thousand (a
    signature keeps the class and the frames, never the message)."""
    # A traceback with no frame leaves the message as what tells errors apart.
    key = (exception_class if "File " in traceback_text else exception_text, traceback_text)
    sig = _DASK_SIGNATURES.get(key)
    if sig is None:
        sig = _DASK_SIGNATURES[key] = fingerprint_dask(exception_text, traceback_text)
        if len(_DASK_SIGNATURES) > 1024:
            _DASK_SIGNATURES.popitem(last=False)
    else:
        _DASK_SIGNATURES.move_to_end(key)
    return sig


@functools.lru_cache(maxsize=4096)
def _prefix_signature(cause: str, prefix: str):
    return fingerprint_stack(cause, [("<task>", None, prefix)])


def trace_example(report: Death | None, entry: Task | None, shard: str) -> str:
    """The trace kept with a signature: the crash dump, else the last sampled stack."""
    if report is None:
        return ""
    if report.crash is not None and report.crash.text:
        return scrub(report.crash.text)
    if entry is not None and entry.stack:
        age = None
        if entry.stack_time:
            age = max(0.0, report.time - entry.stack_time)
        return scrub(sampled_stack(shard, entry.stack, age))
    return ""
