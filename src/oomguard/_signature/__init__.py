"""Crash signatures: one stable id for every occurrence of the same crash.

Three inputs are understood (`fingerprint` tells them apart): a Python traceback as
`traceback.format_exc()` prints it, a faulthandler dump, and the text Dask keeps for an
erred task (`exception_text` + `traceback_text`, as a JSON object or a worker's
"Compute Failed" log block). `fingerprint_stack` signs a death that left no trace of its own
(an OOM kill) from a stack recorded before it.

Each may arrive as a log delivers it: `fingerprint` first takes off what a log pipeline adds
to each line (journald and syslog headers, the RFC 3339 time of `kubectl logs --timestamps`,
a CRI log file or Loki, Dask's own "time - logger - LEVEL - " prefix, ANSI colours, CRLF) and
gives frames back the indentation a web page's copy loses, so the same crash has one id
however it was delivered. A trace as Python wrote it skips that step (see `_transport`).

What is hashed (with GROUPING_VERSION, so a rule change never silently regroups history;
`_versions.py` says when to bump it, and how the old ids stay reachable):
- the error: the exception's class name, or the fatal signal (SIGSEGV, SIGABRT, ...), or the
  cause given to `fingerprint_stack`;
- the normalised (module path, function) of each in-app frame, innermost last; all frames
  when none is in-app. Line numbers are shown, never hashed.

Not hashed, by decision:
- the message, for Python exceptions as for dumps: values are normalised for display
  ("key <n> not found"), but the id is type + frames, so the same bug with other data is
  one signature, and a message rewording in a library does not split it. Only an error
  with no frame at all hashes its normalised message: nothing else tells two apart;
- the cause chain of a Python traceback: only the last exception counts, because that is
  all Dask keeps for an erred task, so a worker's log and the scheduler's record agree;
- the input kind, for the same reason;
- every thread but the crashing one ("Current thread") of a faulthandler dump. A dump with
  no thread marked as crashing (or with that thread's stack cut off) hashes every thread's
  stack instead (deduplicated and sorted), so two such dumps are not one signature.

Input that is no trace, or holds nothing to tell it by, is signed by its own text without
its decorations, with addresses, hex tokens, UUIDs and pids replaced (numbers, paths and
words stay: one may be all that tells two crashes apart). Two different inputs never share
an id because neither could be parsed; over-grouping is the worst failure of a deduplicator.

Input is capped: the last 1 MiB (plus the first 4 KiB) and the innermost 2,000 frames;
every scan is line-anchored and linear in the input.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._paths import normalise_path
from ._records import GROUPING_VERSION, Frame, Signature, unparsed
from ._scrub import scrub
from ._sites import crash_sites

__all__ = [
    "GROUPING_VERSION",
    "Frame",
    "Signature",
    "crash_sites",
    "fingerprint",
    "fingerprint_dask",
    "fingerprint_stack",
    "normalise_path",
    "scrub",
]


def fingerprint(text: str | bytes) -> Signature:
    """The signature of a trace; never raises. Input that is no trace gets input_kind
    "unparsed", a `reason`, and an id made of its own normalised text.

    >>> fingerprint(b"Fatal Python error: Aborted\\n\\nCurrent thread 0x7f (most recent call first):\\n"
    ...             b'  File "/srv/shardapp/core.py", line 9 in abort_record\\n').title
    'SIGABRT in shardapp.core.abort_record'
    """
    from ._versions import sign

    try:
        return sign("fingerprint", text)
    except Exception as exc:  # a hook must never be taken down by a strange trace
        return _parser_error(text, exc)


def _parser_error(data: object, exc: Exception) -> Signature:
    # Still the input's own id, never one shared by every input that hit the same bug.
    reason = f"parser error: {type(exc).__name__}"
    try:
        from ._parse import _decode
        from ._rules import normalise_text

        text = _decode(data)  # type: ignore[arg-type]
        return unparsed(reason, None if text is None else normalise_text(text))
    except Exception:
        return unparsed(reason)


def fingerprint_dask(exception_text: str, traceback_text: str) -> Signature:
    """The signature of an erred Dask task from the scheduler's `TaskState.exception_text`
    (the exception's repr) and `traceback_text` (`format_tb` output); never raises.

    >>> fingerprint_dask("KeyError(17)", '  File "<dynamic-code>", line 8, in lookup\\n').title
    'KeyError in lookup'
    """
    from ._versions import sign

    try:
        if not isinstance(exception_text, str) or not isinstance(traceback_text, str):
            return unparsed("exception_text and traceback_text must be str")
        return sign("fingerprint_dask", exception_text, traceback_text)
    except Exception as exc:
        return unparsed(f"parser error: {type(exc).__name__}")


def fingerprint_stack(error: str, frames: Sequence[tuple[str, int | None, str]]) -> Signature:
    """The signature of a death with no trace of its own, from a recorded stack.

    `frames` are `(filename, lineno, function)`, innermost LAST (as `traceback.extract_stack`
    gives them); `error` is the cause, e.g. "oom_kill". Never raises.

    >>> fingerprint_stack("oom_kill", [("/srv/shardapp/core.py", 30, "process_shard"),
    ...                                ("/srv/shardapp/core.py", 12, "explode")]).title
    'oom_kill in shardapp.core.explode ← process_shard'
    """
    from ._versions import sign

    try:
        return sign("fingerprint_stack", error, frames)
    except Exception as exc:
        return unparsed(f"parser error: {type(exc).__name__}")
