"""Text for a terminal: control characters shown escaped, never sent raw.

Keys, pipeline names, titles, paths and error messages come from the failure history or
the file system, and anyone who can run a task chooses a task key: an ESC sequence in one
would change the terminal's title, clear the screen or rewrite lines (and a bidi override
reorders what is shown). Every text line the CLI prints goes through `printable`; --json
output does not (JSON escapes control characters itself).
"""

from __future__ import annotations

import re
import sys
from typing import Any, TextIO

# C0 controls but tab and newline (the CLI's own layout), DEL, C1 controls (\x9b is a CSI
# on some terminals), and the bidirectional overrides and isolates.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(text: Any) -> str:
    """`text` with each control character written as its escape (tab and newline kept).

    >>> printable("key\\x1b]0;pwned\\x07\\x1b[2J")
    'key\\\\x1b]0;pwned\\\\x07\\\\x1b[2J'
    """
    return _CONTROL.sub(_escape, str(text))


def echo(text: Any = "", file: TextIO | None = None) -> None:
    """`print(printable(text))`, to stdout or `file`."""
    print(printable(text), file=sys.stdout if file is None else file)
