"""What killed a worker, in the words people use, and the small words every message shares."""

from __future__ import annotations

import shlex
import signal
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .._causes import Cause, Kind, kind_of

if TYPE_CHECKING:
    pass


_LIST_CAP = 5


# --------------------------------------------------------------------------- small words


def _signal_name(evidence: dict[str, Any]) -> str:
    sig = evidence.get("signal")
    if isinstance(sig, str) and sig:
        return sig if sig.upper().startswith("SIG") else f"SIG{sig.upper()}"
    code = sig if isinstance(sig, int) else None
    if code is None:
        for k in ("exitcode", "exit_code"):
            v = evidence.get(k)
            # A negative exit status is the signal number (subprocess's convention).
            if isinstance(v, int) and not isinstance(v, bool) and v < 0:
                code = v
                break
    if code is None:
        return ""
    try:
        return signal.Signals(abs(code)).name
    except ValueError:
        return f"signal {abs(code)}"


def _exit_status(evidence: dict[str, Any]) -> int | None:
    for k in ("exitcode", "exit_code"):
        v = evidence.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


#: A killer in a sentence ("a SIGTERM from ..."); the others read as their names.
_KILLER_WORDS = {
    "process": "another process",
    "task": "the worker itself",
    "dask-nanny": "Dask's nanny",
    "kernel": "the kernel",
    "slurm": "SLURM",
    "dask": "Dask",
}


def describe_cause(
    cause: Cause | str,
    evidence: dict[str, Any] | None = None,
    killer: str = "",
    confidence: str = "",
) -> str:
    """What happened, in the words people use, as a predicate for "the worker ...";
    `killer` and its `confidence` as a death's (`oomguard.Killer`, "confirmed" or "likely").

    `memory_error` and `exception` read with the shard as subject ("it raised MemoryError").

    >>> describe_cause("oom_kill")
    'was OOM-killed by the kernel'
    >>> describe_cause("native_crash", {"signal": "SIGABRT"})
    'crashed (SIGABRT)'
    """
    ev = evidence or {}
    c = Cause(cause)
    if c is Cause.OOM_KILL:
        return "was OOM-killed by the kernel"
    if c is Cause.MEMORY_TERMINATE:
        return "was killed by the nanny for exceeding its memory limit"
    if c is Cause.NATIVE_CRASH:
        name = _signal_name(ev)
        return f"crashed ({name})" if name else "crashed in native code"
    named = killer not in ("", "unknown")
    if c is Cause.SIGTERM:
        if named and confidence == "confirmed":
            return f"was stopped by a SIGTERM from {_KILLER_WORDS.get(killer, killer)}"
        return "was stopped by a SIGTERM from outside the nanny"
    if c is Cause.SIGKILL:
        if named:
            likely = "" if confidence == "confirmed" else "likely "
            return f"was killed by SIGKILL, {likely}from {_KILLER_WORDS.get(killer, killer)}"
        return "was killed by SIGKILL with no kernel OOM evidence"
    if c is Cause.EXIT:
        status = _exit_status(ev)
        return "exited with an error status" if status is None else f"exited with status {status}"
    if c is Cause.WORKER_LOST:
        return "was lost without a death report (its host or pod went away)"
    if c is Cause.MEMORY_ERROR:
        return "raised MemoryError"
    return "raised an exception"


def subject(cause: str) -> str:
    """Who `describe_cause` speaks of: the shard ("it") or its worker.

    >>> subject("memory_error"), subject("oom_kill")
    ('it', 'its worker')
    """
    return "it" if kind_of(cause) is Kind.USER or cause == Cause.MEMORY_ERROR else "its worker"


def plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else (plural or word + 's')}"


def times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def was(n: int) -> str:
    return "was" if n == 1 else "were"


def seconds(t: float) -> str:
    return f"{t:.1f} s" if t < 10 else f"{t:.0f} s"


def shard_name(shard: str) -> str:
    """A shard as a sentence names it.

    >>> shard_name("('load', 7)"), shard_name("load-7")
    ("('load', 7)", "'load-7'")
    """
    # Tuple keys already read as themselves; bare names get quotes so they stand out.
    return shard if shard.startswith(("(", "[")) else repr(shard)


def shell_arg(s: str) -> str:
    # Double quotes keep a tuple key readable; shlex.quote only where they would not be safe.
    if shlex.quote(s) == s:
        return s
    if not any(ch in s for ch in '"$`\\!'):
        return f'"{s}"'
    return shlex.quote(s)


def listing(items: Iterable[str]) -> str:
    items = list(items)
    if len(items) <= _LIST_CAP:
        return ", ".join(items)
    return ", ".join(items[:_LIST_CAP]) + f" and {len(items) - _LIST_CAP} more"


def breakdown(counts: Counter[str]) -> str:
    return ", ".join(f"{n} {cause}" for cause, n in counts.most_common())


def exception_name(evidence: dict[str, Any], title: str) -> str:
    """The exception a shard raised, for "raised ValueError past its retries".

    >>> exception_name({"exception_type": "builtins.ValueError"}, "")
    'ValueError'
    """
    for k in ("exception_type", "exception"):
        v = evidence.get(k)
        if isinstance(v, str) and v:
            return v.rsplit(".", 1)[-1]
    head = title.split(":", 1)[0].split(" ", 1)[0].strip()
    if head.isidentifier() and head[:1].isupper():
        return head
    return f"an exception ({title})" if title else "an exception"
