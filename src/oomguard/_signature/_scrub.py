"""Making a trace safe to store and show: no home directories, user names or addresses."""

from __future__ import annotations

import re
from collections.abc import Iterable

from ._paths import normalise_path

_FILE_LINE = re.compile(r'^(\s*(?:[+|]\s*)*File ")([^"\n]*)(")', re.M)
_ABS_PATH = re.compile(
    r"(?<![\w.~:/\\])(?:[A-Za-z]:)?[/\\][^\s\"'<>:;,()\[\]{}/\\]+(?:[/\\][^\s\"'<>:;,()\[\]{}/\\]+)+"
)
# A bare home directory (a path below one is reduced like any other path).
_HOME = re.compile(
    r"(?:/home|/Users)/[^/\s\"']+/?(?=[\s\"',;:)]|$)|/root/?(?=[\s\"',;:)]|$)", re.M
)
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{6,}\b")


def _reduce(match: re.Match[str]) -> str:
    return normalise_path(match[0])


def scrub(text: str, *, users: Iterable[str] = ()) -> str:
    """A copy of `text` safe to store or show: absolute paths reduced to module paths,
    home directories and the given user names removed, addresses and thread ids zeroed.

    >>> scrub('  File "/home/alice/proj/src/shardapp/core.py", line 3 in f\\n'
    ...       'Current thread 0x00007f30a37e6b80 (most recent call first):')
    '  File "shardapp/core.py", line 3 in f\\nCurrent thread 0x0000000000000000 (most recent call first):'
    """
    text = _FILE_LINE.sub(lambda m: m[1] + normalise_path(m[2]) + m[3], text)
    text = _HOME.sub("~", text)
    text = _ABS_PATH.sub(_reduce, text)
    for user in users:
        if user and len(user) > 1:
            text = re.sub(rf"\b{re.escape(user)}\b", "<user>", text)
    return _ADDRESS.sub(lambda m: "0x" + "0" * (len(m[0]) - 2), text)
