"""Normalisation rules: a pipeline of small pure functions over frame records and messages.

A frame record is a plain tuple `(filename, lineno, function, in_app)`, innermost frame LAST
(the order `traceback.extract_stack` uses). `normalise_frames` applies, in order:

- STACK_RULES_BEFORE over the raw stack (bounding the work),
- FRAME_RULES to each frame on its own, `(filename, function, in_app)` in and out; their
  composition is memoised per distinct raw frame, since the same files recur in every trace,
- STACK_RULES over the normalised stack (rules that look at neighbours).

`hashed_frames` then picks what the id is made of. MESSAGE_RULES do the same for messages,
UNPARSED_RULES for the text of input that is no trace. Plain tuples and memoised records
keep this cheap: it runs for every erred task.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from functools import lru_cache

from ._paths import is_in_app, normalise_path
from ._records import Frame

Rec = tuple[str, "int | None", str, bool]
One = tuple[str, str, bool]  # (filename, function, in_app): what a FRAME_RULE sees

MAX_FRAMES = 2000  # frames beyond this many from the crash site are dropped
MAX_PERIOD = 8  # longest run of frames recognised as one recursion cycle
MAX_MESSAGE = 500  # characters of a normalised message kept


# Only the innermost MAX_FRAMES frames count: the crash site is innermost, and it bounds work.
def cap_depth(recs: list) -> list:
    return recs[-MAX_FRAMES:] if len(recs) > MAX_FRAMES else recs


# In-app is decided on the raw path: stdlib and Dask/async plumbing are not the user's code.
def mark_in_app(frame: One) -> One:
    return frame[0], frame[1], is_in_app(frame[0])


# Absolute paths become module paths, the same wherever the code is installed.
def reduce_path(frame: One) -> One:
    return normalise_path(frame[0]), frame[1], frame[2]


# A function is named by its last dotted part: tracebacks print `f`, newer dumps `Cls.f`.
def short_function(frame: One) -> One:
    return frame[0], frame[1].rsplit(".", 1)[-1], frame[2]


# List, dict and set comprehensions have no frame of their own since Python 3.12 (PEP 709).
def drop_comprehensions(recs: list[Rec]) -> list[Rec]:
    return [r for r in recs if r[2] not in _COMPREHENSIONS]


_COMPREHENSIONS = frozenset({"<listcomp>", "<dictcomp>", "<setcomp>"})


# A repeated run of up to MAX_PERIOD frames (recursion, direct or mutual) counts once.
def collapse_recursion(recs: list[Rec]) -> list[Rec]:
    if len({(r[0], r[2]) for r in recs}) == len(recs):
        return recs  # no frame occurs twice: nothing can repeat
    out: list[Rec] = []
    keys: list[tuple[str, str]] = []
    last: dict[tuple[str, str], int] = {}
    for rec in recs:
        key = (rec[0], rec[2])
        prev = last.get(key)
        out.append(rec)
        keys.append(key)
        n = len(keys)
        last[key] = n - 1
        if prev is None:
            continue
        p = n - 1 - prev
        if p <= MAX_PERIOD and n >= 2 * p and keys[n - p :] == keys[n - 2 * p : n - p]:
            for k in keys[n - p :]:
                last[k] -= p
            del out[n - p :], keys[n - p :]
    return out


STACK_RULES_BEFORE: tuple[Callable[[list], list], ...] = (cap_depth,)
FRAME_RULES: tuple[Callable[[One], One], ...] = (mark_in_app, reduce_path, short_function)
STACK_RULES: tuple[Callable[[list[Rec]], list[Rec]], ...] = (
    drop_comprehensions,
    collapse_recursion,
)


@lru_cache(maxsize=16384)
def normalise_frame(filename: str, function: str) -> One:
    """FRAME_RULES applied to one raw frame: (filename, function, in_app)."""
    frame: One = (filename, function, False)
    for rule in FRAME_RULES:
        frame = rule(frame)
    return frame


def normalise_frames(raw: Iterable[tuple[str, int | None, str]]) -> list[Rec]:
    """The whole pipeline over raw `(filename, lineno, function)` records, innermost last."""
    stack = raw if isinstance(raw, list) else list(raw)
    for before in STACK_RULES_BEFORE:
        stack = before(stack)
    recs = [(f, n, fn, a) for f0, n, fn0 in stack for f, fn, a in (normalise_frame(f0, fn0),)]
    for rule in STACK_RULES:
        recs = rule(recs)
    return recs


# The id is made of the in-app frames, or of every frame when none is in-app.
def hashed_frames(recs: list[Rec]) -> tuple[Frame, ...]:
    chosen = [r for r in recs if r[3]] or recs
    return tuple([_frame(f, fn, n, a) for f, n, fn, a in chosen])


# The innermost frame, in-app or not: where a native crash left Python (`Signature.top`).
def innermost(recs: list[Rec]) -> Frame | None:
    if not recs:
        return None
    f, n, fn, a = recs[-1]
    return _frame(f, fn, n, a)


# Frames are immutable and recur across traces of the same code: share the instances.
_frame = lru_cache(maxsize=16384)(Frame)


_URL = re.compile(r"\b[a-zA-Z][\w+.-]*://[^\s'\"<>]+")
_UUID = re.compile(
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
)
_PATH = re.compile(
    r"(?<![\w.~:/])(?:[A-Za-z]:)?[/\\][^\s\"'<>:;,()\[\]{}/\\]+(?:[/\\][^\s\"'<>:;,()\[\]{}/\\]+)+[/\\]?"
)
_HEX = re.compile(r"\b0[xX][0-9a-fA-F]+\b")
_TOKEN = re.compile(r"\b(?=[a-f]*\d)(?=\d*[a-f])[0-9a-f]{8,}\b")
_QUOTED = re.compile(r"(?<!\w)'[^'\n]*'(?!\w)|(?<!\w)\"[^\"\n]*\"(?!\w)")
_NUMBER = re.compile(r"(?<![\w.<])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w>])")
_DIGIT = re.compile(r"\d")


# URLs carry hosts, ports and query values: one placeholder.
def _urls(s: str) -> str:
    return _URL.sub("<url>", s) if "://" in s else s


# UUIDs (and Dask keys built from them) differ per task.
def _uuids(s: str) -> str:
    return _UUID.sub("<uuid>", s) if s.count("-") >= 4 else s


# Absolute paths differ per host, user and shard file.
def _paths(s: str) -> str:
    return _PATH.sub("<path>", s) if "/" in s or "\\" in s else s


# 0x… values are addresses or ids.
def _hex(s: str) -> str:
    return _HEX.sub("<hex>", s) if "0x" in s or "0X" in s else s


# Bare lowercase hex tokens of 8+ characters are hashes (Dask tokens, git shas).
def _tokens(s: str) -> str:
    return _TOKEN.sub("<hex>", s) if _DIGIT.search(s) else s


# Quoted strings are values (a key, a column name), not the error's kind.
def _quoted(s: str) -> str:
    return _QUOTED.sub("<str>", s) if "'" in s or '"' in s else s


# Numbers are values: "key 17 not found" and "key 99 not found" read alike.
def _numbers(s: str) -> str:
    return _NUMBER.sub("<n>", s) if _DIGIT.search(s) else s


# One line of single spaces, capped: messages are for display and storage.
def _squash(s: str) -> str:
    return " ".join(s.split())[:MAX_MESSAGE]


MESSAGE_RULES: tuple[Callable[[str], str], ...] = (
    _urls,
    _uuids,
    _paths,
    _hex,
    _tokens,
    _quoted,
    _numbers,
    _squash,
)


def normalise_message(message: str) -> str:
    """Replace the values in an exception message by placeholders.

    >>> normalise_message("key 17 not found in '/data/x.csv' at 0x7f3a")
    'key <n> not found in <str> at <hex>'
    """
    # Bound the work: a message past a few KB is data, not an error text.
    s = message[: MAX_MESSAGE * 8]
    for rule in MESSAGE_RULES:
        s = rule(s)
    return s


_ADDRESS = re.compile(r"\b0[xX][0-9a-fA-F]{6,}\b")
_PID = re.compile(r"\[\d{1,10}\]:")


# Addresses and thread ids differ in every run of the same crash.
def _addresses(s: str) -> str:
    return _ADDRESS.sub("0x<hex>", s) if "0x" in s or "0X" in s else s


# "python3[4242]:" names a process by its pid: another one in every run.
def _pids(s: str) -> str:
    return _PID.sub("[<pid>]:", s) if "]:" in s else s


# Whitespace runs are layout, not text.
def _one_space(s: str) -> str:
    return " ".join(s.split())


# Unparsed text keeps numbers, paths and words: one of them may be all that tells two crashes
# apart (a line, a signal, an exit code, a library); only what differs in every run goes.
UNPARSED_RULES: tuple[Callable[[str], str], ...] = (_uuids, _addresses, _tokens, _pids, _one_space)


def normalise_text(text: str) -> str:
    """The text of input that is no trace, as its signature hashes it.

    >>> normalise_text("python3[4242]: segfault at 11 ip 00007efe055d3c1a  error 4 in libffi.so.6")
    'python3[<pid>]: segfault at 11 ip <hex> error 4 in libffi.so.6'
    """
    for rule in UNPARSED_RULES:
        text = rule(text)
    return text
