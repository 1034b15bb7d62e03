"""Text from outside made safe at the door: printable, bounded, never a NUL.

Anyone who can submit a task names things oomguard keeps: a span or annotation names a
pipeline, a key names a shard, an exception's text becomes a signature's title and example.
Stored as they come, such texts break what reads them: PostgreSQL's `text` holds no NUL
and its indexes no row past ~2.7 KB, SQLite refuses a lone surrogate (a whole batch with
it), and a newline or an ESC sequence in a log line or a terminal forges what follows.
Each door (a run's name, a stored row, a query's filter, a line logged from a message)
passes its texts through one of these pure functions:

- `safe_name`: one printable line of at most `NAME_BYTES` bytes of UTF-8. Every character
  that is not printable (controls, NUL, DEL, lone surrogates, bidirectional overrides, line
  separators) is written as its escape (``\\x1b``, ``\\ud800``); a longer name keeps a
  readable prefix and a hash of the whole, so two long names stay two names.
- `safe_text`: the same for prose and traces, whose newlines and tabs are kept; at most
  `limit` characters, cut at the end with the count of what was cut.
- `safe_value`: `safe_text` for the strings of a JSON-able value (evidence), keys as names.

Each is the identity on text that is already safe (the common case costs one C-level
scan), and idempotent: a filter made safe finds the row stored from the same text.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

#: A name's UTF-8 bytes at most: far below PostgreSQL's btree row limit (2,704 bytes) even
#: in a composite index (shard, time), and the cap a death report already puts on a key.
NAME_BYTES = 1024
#: Characters of prose kept by default (a summary, an abort reason, an evidence value).
TEXT_CHARS = 16 * 1024
#: Characters of a signature's example trace kept.
EXAMPLE_CHARS = 64 * 1024
#: Hex digits of the hash a shortened name ends with.
HASH_DIGITS = 16
ELLIPSIS = "…"

# What prose may not hold: C0 controls but tab and newline, DEL, C1 controls, lone
# surrogates, the bidirectional marks, overrides and isolates, and the line separators.
_TEXT_BAD = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


# The same for ASCII text, as bytes: `bytes.translate` deletes them at C speed, several
# times faster than `str.isprintable` or a regex scan (16 KiB: ~8 us against 25-45 us).
_ASCII_CONTROLS = bytes([*range(0x20), 0x7F])
_ASCII_PROSE_BAD = bytes([*range(0x09), *range(0x0B, 0x20), 0x7F])  # tab, newline kept


def _clean_ascii(text: str, bad: bytes) -> bool:
    """Whether ASCII `text` holds none of the bytes `bad`."""
    raw = text.encode()
    return len(raw.translate(None, bad)) == len(raw)


def _escape(c: str) -> str:
    n = ord(c)
    if n < 0x100:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def safe_name(value: Any, limit: int = NAME_BYTES) -> str:
    """`value` as one printable line of at most `limit` bytes of UTF-8.

    >>> safe_name("etl")
    'etl'
    >>> safe_name("a\\x00b\\nc\\x1b[2J")
    'a\\\\x00b\\\\x0ac\\\\x1b[2J'
    >>> long = safe_name("x" * 4000, 40)
    >>> long, len(long.encode())
    ('xxxxxxxxxxxxxxxxxxxxx…91c9568c40c8d8d1', 40)
    """
    text = value if type(value) is str else str(value)
    long_ascii = len(text) > 64 and text.isascii()  # short: isprintable is quicker
    if not (_clean_ascii(text, _ASCII_CONTROLS) if long_ascii else text.isprintable()):
        text = "".join(c if c.isprintable() else _escape(c) for c in text)
    if len(text) * 4 <= limit or len(text.encode()) <= limit:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:HASH_DIGITS]
    room = limit - len(ELLIPSIS.encode()) - HASH_DIGITS
    head = text.encode()[: max(room, 0)].decode(errors="ignore")  # whole characters only
    return f"{head}{ELLIPSIS}{digest}"


def safe_text(value: Any, limit: int | None = TEXT_CHARS) -> str:
    """`value` with its lines (newline, tab) kept, every other control character escaped,
    at most `limit` characters (plus a note of what was cut; None: uncut).

    >>> safe_text("Traceback:\\n  File \\"x\\x00.py\\"\\r")
    'Traceback:\\n  File "x\\\\x00.py"\\\\x0d'
    >>> safe_text("abcdef", 3)
    'abc… (3 more characters)'
    """
    text = value if type(value) is str else str(value)
    if text.isascii():
        unsafe = not _clean_ascii(text, _ASCII_PROSE_BAD)
    else:
        unsafe = not text.isprintable() and _TEXT_BAD.search(text) is not None
    if unsafe:
        text = _TEXT_BAD.sub(lambda m: _escape(m.group()), text)
    if limit is None or len(text) <= limit:
        return text
    return f"{text[:limit]}{ELLIPSIS} ({len(text) - limit} more characters)"


def safe_value(value: Any, limit: int | None = TEXT_CHARS, depth: int = 8) -> Any:
    """A JSON-able value (an event's evidence) with every string made safe: values with
    `safe_text` (cut at `limit`), keys with `safe_name`. Past `depth` levels a value is
    left as it is (JSON escapes its control characters when it is stored).

    >>> safe_value({"cmd\\x00": ["kill\\x00 -9", 3], "n": 1.5})
    {'cmd\\\\x00': ['kill\\\\x00 -9', 3], 'n': 1.5}
    """
    if type(value) is str:
        return safe_text(value, limit)
    if depth <= 0:
        return value
    if isinstance(value, dict):
        return {safe_name(k, 256): safe_value(v, limit, depth - 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [safe_value(v, limit, depth - 1) for v in value]
    if isinstance(value, str):  # a str subclass (an enum): its plain text
        return safe_text(str.__str__(value), limit)
    return value
