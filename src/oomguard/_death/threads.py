"""Which executing task crashed the worker: the thread a faulthandler dump marks "Current
thread", matched with the thread each task ran on in the flight record (pure).

faulthandler prints `threading.get_ident()` of each thread (pthread_self), the value Dask
keys `Worker.active_threads` by and the flight record keeps per task. Only the five fatal
signals faulthandler handles say which thread crashed; a dump for SIGTERM is written on the
thread that took the signal, which says nothing of who caused it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .._signature._parse import crashing_thread
from .cause import NATIVE_SIGNALS
from .record import Task


@dataclass
class CrashThread:
    """What the dump and the flight record say together: `task` is the index of the crashed
    task in `executing` (None: no single task ran on that thread), `evidence` the keys for
    the report's evidence, `missing` a note when the match failed."""

    task: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)


def match_crash(signal: str | None, text: str | None, executing: Sequence[Task]) -> CrashThread:
    """Find the executing task whose thread crashed.

    >>> tasks = [Task("calm", thread=11), Task("crash", thread=10)]
    >>> t = match_crash("SIGSEGV", "Current thread 0x0000000a (most recent call first):\\n",
    ...                 tasks)
    >>> t.task, t.evidence["crash_task"]
    (1, 'crash')
    >>> t = match_crash("SIGSEGV", "Current thread 0x0000000c (most recent call first):\\n",
    ...                 tasks)
    >>> t.task, t.evidence["crash_thread_match"][:48]
    (None, "the dump's crashing thread 0xc ran none of the 2")
    """
    out = CrashThread()
    if signal not in NATIVE_SIGNALS or not text or not executing:
        return out
    ident = crashing_thread(text)
    n = len(executing)
    if ident is None:
        return _fallback(out, "the dump marks no crashing thread (a truncated dump)")
    out.evidence["crash_thread"] = hex(ident)
    on_it = [i for i, t in enumerate(executing) if t.thread == ident]
    if len(on_it) == 1:
        out.task = on_it[0]
        out.evidence["crash_task"] = executing[out.task].key
        return out
    known = sum(1 for t in executing if t.thread)
    why = "ran none" if not on_it else f"ran {len(on_it)}"
    return _fallback(
        out,
        f"the dump's crashing thread {hex(ident)} {why} of the {n} executing tasks "
        f"(threads known for {known})",
    )


def _fallback(out: CrashThread, why: str) -> CrashThread:
    """No single task matched: say so, in the evidence and the report's notes."""
    note = f"{why}; every executing task is blamed"
    out.evidence["crash_thread_match"] = note
    out.missing.append(f"crash thread: {note}")
    return out


def mark_crashed(
    signal: str | None, text: str | None, executing: list[Task]
) -> tuple[list[Task], dict[str, Any], list[str]]:
    """Each task's ``crashed`` set (the one whose thread crashed, or none), that one first
    (the one the death is signed by, and the last cut to fit); the evidence to add, and a
    note when none matched."""
    hit = match_crash(signal, text, executing)
    marked = [dataclasses.replace(t, crashed=i == hit.task) for i, t in enumerate(executing)]
    marked.sort(key=lambda t: not t.crashed)
    return marked, hit.evidence, hit.missing
