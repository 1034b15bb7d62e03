"""Finding the crash in a text: Python tracebacks, faulthandler dumps, Dask erred tasks.

Every parser is a bounded, line-anchored scan: no regex here can backtrack across lines, so
the work is linear in the input, and the input itself is capped at MAX_INPUT characters.
A text whose marker lines do not start as Python writes them first loses its transport
decorations (journald, kubectl, ...: see _transport).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from functools import lru_cache

from . import _records as R
from . import _transport
from ._records import Frame, Signature
from ._rules import (
    hashed_frames,
    innermost,
    normalise_frames,
    normalise_message,
    normalise_text,
)

MAX_INPUT = 1 << 20  # only the last 1 MiB of a larger input is read (plus its first 4 KiB)
_HEAD = 4096

_PY_HEADER = "Traceback (most recent call last):"
_GROUP_HEADER = ("  + Exception Group ", "  | Exception Group ", "  + ", "  | ")
# Line patterns start with a literal "\n" (parse_any prefixes one to the text): `re` then
# scans for it at C speed instead of trying `^` at every position.
_PY_FRAME = re.compile(r'\n  File "([^\n]*)", line (\d{1,9})(?:, in ([^\n]*))?$', re.M)
_NOT_INDENTED = re.compile(r"\n(?=\S)")  # a literal first char lets `re` scan fast
_EXC_LINE = re.compile(r"([A-Za-z_][\w.]*)(?::[ \t]?(.*))?$")
_GROUP_PREFIX = re.compile(r"^  [+|] ?", re.M)

_FATAL = re.compile(r"\nFatal Python error: ([^\n]*)$", re.M)
_WINDOWS_FATAL = re.compile(r"\nWindows fatal exception: ([^\n]*)$", re.M)
_TIMEOUT = re.compile(r"\nTimeout \([0-9:.]+\)!$", re.M)
_CURRENT = re.compile(
    r"\nCurrent thread 0x[0-9a-fA-F]+[^\n]*\(most recent call first\):[ \t]*$", re.M
)
_STACK = re.compile(r"\nStack \(most recent call first\):[ \t]*$", re.M)
_THREAD = re.compile(r"\nThread 0x[0-9a-fA-F]+[^\n]*\(most recent call first\):[ \t]*$", re.M)
_FH_FRAME = re.compile(r'\n  File "([^\n]*)", line (\d{1,9}|\?+) in ([^\n]*)$', re.M)
_ANY_THREAD = re.compile(
    r"\n(?:Current thread|Thread) 0x[0-9a-fA-F]+[^\n]*\(most recent call first\):[ \t]*$", re.M
)
_BLOCK_END = re.compile(r"\n(?!  )")

_DASK_EXC = re.compile(r"\nException: ([^\n]*)$", re.M)
_DASK_TB = re.compile(r"\nTraceback: ([^\n]*)$", re.M)
_REPR = re.compile(r"([A-Za-z_][\w.]*)\((.*)\)", re.S)
_JSON = re.compile(r"\s*\{")
# What starts the lines of a dump and of a Dask record: one scan tells which parsers to try.
_KINDS = re.compile(
    r"\n(?:Fatal Python error: |Current thread 0x|Thread 0x|Stack \(most|Traceback: )"
)

# faulthandler's words for the fatal signals it handles, as signal names.
SIGNALS = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Floating-point exception": "SIGFPE",
    "Floating point exception": "SIGFPE",
    "Bus error": "SIGBUS",
    "Illegal instruction": "SIGILL",
}

NO_CURRENT = (
    "no thread marked as crashing (a truncated dump, or a timeout dump of several threads)"
)
CUT_OFF = "the crashing thread's stack is cut off (a truncated dump)"
NO_TRACE = "no Python traceback, faulthandler dump or Dask task traceback found"
TRUNCATED = "truncated traceback: nothing after its header"


def _bounded(text: str) -> str:
    # Keep the head (a dump's "Fatal Python error" line) and the tail (where the crash ends).
    if len(text) <= MAX_INPUT:
        return text
    return text[:_HEAD] + "\n" + text[-MAX_INPUT:]


#: The hashed frames, their `frames_material`, and the innermost frame (in-app or not).
Stack = tuple[tuple[Frame, ...], str, "Frame | None"]


def _parse_stack(region: str, faulthandler: bool) -> Stack:
    if faulthandler:
        # innermost first; "line ???" when faulthandler has no line number
        found = _FH_FRAME.findall(region)
        raw = [(f, None if n[0] == "?" else int(n), fn) for f, n, fn in reversed(found)]
    else:
        raw = [(f, int(n), fn) for f, n, fn in _PY_FRAME.findall(region)]
    recs = normalise_frames(raw)
    frames = hashed_frames(recs)
    return frames, R.frames_material(frames), innermost(recs)


_cached_stack = lru_cache(maxsize=512)(_parse_stack)
_CACHED_STACK = 8192  # characters; a longer stack is parsed each time rather than kept


def _stack(region: str, faulthandler: bool = False) -> Stack:
    """The hashed frames of the frame lines in `region` (which starts with a newline). A stack
    recurs (one bug, many tasks, the same lines): one that is not too long is parsed once."""
    if len(region) > _CACHED_STACK:
        return _parse_stack(region, faulthandler)
    return _cached_stack(region, faulthandler)


def _signature(kind: str, error: str, message: str, stack: Stack) -> Signature:
    frames, material, top = stack
    # With no frame, the message is all that tells apart two errors of one type.
    extra = "" if frames else message
    return R.make_signature(kind, error, message, frames, "", extra, material, top)


def _last_header(text: str) -> tuple[int, bool] | None:
    """(end of the last traceback header line, is it an exception group's) or None."""
    end = len(text)
    while True:
        i = text.rfind(_PY_HEADER, 0, end)
        if i < 0:
            return None
        line_start = text.rfind("\n", 0, i) + 1
        prefix = text[line_start:i]
        if prefix in ("", "Exception Group ") or prefix in _GROUP_HEADER:
            return i + len(_PY_HEADER), prefix.startswith("  ")
        end = i


def parse_python(text: str) -> Signature | None:
    """The last exception of the last traceback in `text`; None when there is none."""
    found = _last_header(text)
    if found is None:
        return None
    start, group = found
    body = text[start:]
    if group:
        # An exception group: read its own frames and type, not its sub-exceptions.
        cut = body.find("\n  +-")
        body = _GROUP_PREFIX.sub("", body if cut < 0 else body[:cut])
    end = _NOT_INDENTED.search(body)
    stop = end.end() if end else len(body)
    stack = _stack(body[:stop])
    error = message = ""
    if end:
        eol = body.find("\n", stop)
        m = _EXC_LINE.match(body, stop, eol if eol >= 0 else len(body))
        if m:
            error, message = m[1], normalise_message(m[2] or "")
    if not stack[0] and not error:
        return R.unparsed(TRUNCATED)
    return _signature(R.PYTHON, error, message, stack)


def _last(pattern: re.Pattern[str], text: str, stop: int) -> re.Match[str] | None:
    found = None
    for found in pattern.finditer(text, 0, stop):  # noqa: B007 (the last match)
        pass
    return found


def _fatal_error(text: str, stop: int) -> tuple[str, str]:
    # The header that belongs to this dump is the last one before its crashing thread.
    m = _last(_FATAL, text, stop)
    if m:
        what = m[1].strip()
        if what in SIGNALS:
            return SIGNALS[what], ""
        # Other fatal errors name the C function that gave up: keep it, the rest is message.
        fn, _, rest = what.partition(":")
        error = f"FATAL:{fn}" if re.fullmatch(r"\w{1,80}", fn) else "FATAL"
        return error, normalise_message(rest or what)
    m = _last(_WINDOWS_FATAL, text, stop)
    if m:
        return "EXCEPTION_" + re.sub(r"\W+", "_", m[1].strip()).upper()[:60], ""
    if _last(_TIMEOUT, text, stop):
        return "TIMEOUT", ""
    # faulthandler.register(signal) and dump_traceback() write no header.
    return "DUMP", ""


def parse_faulthandler(text: str) -> Signature | None:
    """The crashing thread of a faulthandler dump; None when `text` is no dump."""
    header = _last(_CURRENT, text, len(text)) or _last(_STACK, text, len(text))
    if header is None:
        threads = list(_THREAD.finditer(text))
        if len(threads) == 1:
            header = threads[0]  # only one thread was running: it is the crashing one
        elif not threads and not _FATAL.search(text):
            return None
    error, message = _fatal_error(text, header.start() if header else len(text))
    if header is None:
        # Truncated before the crashing thread, or other threads only: the signal still counts,
        # and the other threads' stacks tell this dump from another one.
        return R.make_signature(R.FAULTHANDLER, error, message, (), NO_CURRENT, _threads(text))
    start = header.end()
    end = _BLOCK_END.search(text, start)
    stop = end.start() if end else len(text)
    stack = _stack(text[start : stop + 1], True)
    if not stack[0] and text.find("<no Python frame>", start, stop) < 0:
        return R.make_signature(R.FAULTHANDLER, error, message, (), CUT_OFF, _threads(text))
    return _signature(R.FAULTHANDLER, error, message, stack)


_CURRENT_IDENT = re.compile(
    r"\nCurrent thread (0x[0-9a-fA-F]{1,16})[^\n]*\(most recent call first\):", re.M
)


def crashing_thread(text: str) -> int | None:
    """The ident of the thread a faulthandler dump marks "Current thread" (the last dump's,
    as `parse_faulthandler` reads it); None when no thread is so marked. faulthandler prints
    `threading.get_ident()` of the thread, in hex.

    >>> crashing_thread("Fatal Python error: Aborted\\n\\nThread 0x00007f01 (most recent "
    ...                 "call first):\\n\\nCurrent thread 0x00007f02 (most recent call first):\\n")
    32514
    """
    text = "\n" + _bounded(text)
    found = _last(_CURRENT_IDENT, text, len(text))
    return int(found[1], 16) if found else None


def _threads(text: str) -> str:
    """Each thread's hashed stack, deduplicated and sorted (idle threads come and go)."""
    stacks = set()
    for header in _ANY_THREAD.finditer(text):
        end = _BLOCK_END.search(text, header.end())
        region = text[header.end() : (end.start() if end else len(text)) + 1]
        stacks.add(_stack(region, True)[1])
    return "\x1d".join(sorted(stacks))


def _parse_exception_text(exception_text: str) -> tuple[str, str]:
    text = exception_text.strip()[: 16 * 1024]
    m = _REPR.fullmatch(text)
    if m:
        args = m[2]
        try:
            value = ast.literal_eval(args) if len(args) < 4096 else args
        except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
            value = args
        # str(exc) of a one-string exception is that string; KeyError alone shows its repr.
        plain = isinstance(value, str) and m[1].rsplit(".", 1)[-1] != "KeyError"
        return m[1], normalise_message(value if plain else args)
    m = _EXC_LINE.match(text.split("\n", 1)[0])
    if m:
        return m[1], normalise_message(m[2] or "")
    return "", normalise_message(text)


def parse_dask(exception_text: str, traceback_text: str) -> Signature:
    if not exception_text.strip() and not traceback_text.strip():
        return R.unparsed("empty input")
    error, message = _parse_exception_text(exception_text)
    return _signature(R.DASK, error, message, _stack("\n" + _bounded(traceback_text)))


def _unrepr(s: str) -> str:
    try:
        value = ast.literal_eval(s) if len(s) < MAX_INPUT else s
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return s
    return value if isinstance(value, str) else s


def parse_dask_record(text: str) -> Signature | None:
    """A JSON object with exception_text/traceback_text, or a worker's "Compute Failed" log."""
    stripped = text.strip()
    if stripped.startswith("{") and "exception_text" in stripped:
        try:
            obj = json.loads(stripped)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and isinstance(obj.get("exception_text"), str):
            tb = obj.get("traceback_text")
            return parse_dask(obj["exception_text"], tb if isinstance(tb, str) else "")
    tbs = list(_DASK_TB.finditer(text))
    if not tbs or tbs[-1][1][:1] not in ("'", '"'):
        return None
    exc = None
    for exc in _DASK_EXC.finditer(text, 0, tbs[-1].start()):  # noqa: B007 (the last one)
        pass
    return parse_dask(_unrepr(exc[1]) if exc else "", _unrepr(tbs[-1][1]))


def _decode(data: str | bytes) -> str | None:
    if isinstance(data, (bytes, bytearray, memoryview)):
        if len(data) > MAX_INPUT:
            data = bytes(data[:_HEAD]) + b"\n" + bytes(data[-MAX_INPUT:])
        return bytes(data).decode("utf-8", "replace")
    if isinstance(data, str):
        return _bounded(data)
    return None


def parse_any(data: str | bytes) -> Signature:
    text = _decode(data)
    if text is None:
        return R.unparsed(f"not text: {type(data).__name__}")
    if not text or text.isspace():
        return R.unparsed("empty input", "")
    text = "\n" + text  # every line, the first too, now starts after a "\n"
    kinds = _kinds(text)
    stripped = not _transport.plain(text, kinds[0])
    if stripped:
        text = _transport.strip(text)
        kinds = _kinds(text)
    sig = _parse_text(text, *kinds)
    if sig.input_kind != R.UNPARSED and (sig.error or sig.frames):
        return sig
    # No trace, or nothing of one: the text itself (without its decorations) is the signature.
    reason = sig.reason if sig.input_kind == R.UNPARSED else NO_TRACE
    return R.unparsed(reason, normalise_text(text if stripped else _transport.strip(text)))


def _kinds(text: str) -> tuple[bool, bool]:
    """Whether a line of `text` starts as a faulthandler dump's, as a Dask record's."""
    found = _KINDS.findall(text)
    records = found.count("\nTraceback: ")
    return len(found) > records, records > 0


def _parse_text(text: str, dump: bool, record: bool) -> Signature:
    # A fatal error is the death itself, whatever Python tracebacks were logged before it.
    if dump:
        sig = parse_faulthandler(text)
        if sig is not None:
            return sig
    if record or _JSON.match(text):
        sig = parse_dask_record(text)
        if sig is not None:
            return sig
    sig = parse_python(text)
    if sig is not None:
        return sig
    if '  File "' in text:
        # format_tb output without its header (what Dask keeps as traceback_text).
        return parse_dask("", text)
    sample = text[:_HEAD]
    if "\x00" in sample or sample.count("\ufffd") * 10 > len(sample):
        return R.unparsed("binary input, not a text trace")
    return R.unparsed(NO_TRACE)


def stack_signature(error: str, frames: Sequence[tuple[str, int | None, str]]) -> Signature:
    raw = []
    for i, fr in enumerate(frames):
        ok = isinstance(fr, (tuple, list)) and len(fr) == 3
        if not (ok and isinstance(fr[0], str) and isinstance(fr[2], str)):
            return R.unparsed(
                f"invalid stack frame at index {i}: want (filename, lineno, function)"
            )
        lineno = fr[1] if isinstance(fr[1], int) and not isinstance(fr[1], bool) else None
        raw.append((fr[0], lineno, fr[2]))
    recs = normalise_frames(raw)
    frames = hashed_frames(recs)
    return R.make_signature(R.STACK, str(error or "unknown"), "", frames, top=innermost(recs))
