"""Tables for the terminal: rows that fit a width, and the keys users copy never cut.

A table has columns and a list of layouts from widest to narrowest; `lay_out` takes the
first whose rows fit. A layout keeps some columns in the row, moves others to lines of their
own under (or above) it, and may shorten only the columns it names. A key column (a shard,
a signature id, a pipeline name) is never cut or broken across lines. With no width (output
to a pipe or a file) nothing is shortened or moved.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import textwrap
from typing import Any, NamedTuple

from .._display import clip, one_line
from .terminal import printable


class Column(NamedTuple):
    header: str
    label: str = ""  # names the value on a line of its own: "shard ('load', 7)"
    right: bool = False
    key: bool = True  # never cut, never broken across lines; False: prose that may wrap


class Layout(NamedTuple):
    """Which columns stay in the row, which move to lines of their own, and which may be
    shortened (header -> fewest characters; never a key)."""

    row: tuple[str, ...]
    below: tuple[str, ...] = ()  # after the row, indented, each as "label value"
    above: tuple[str, ...] = ()  # before the row, which is indented under them
    shorten: dict[str, int] | None = None


#: Prose (summaries, evidence, abort paragraphs) wraps at the width, at most this wide:
#: longer lines are hard to read, and a pipe or a file gets the same.
PROSE_WIDTH = 100
#: A narrower terminal is laid out as if this wide (the terminal wraps the rest).
MIN_WIDTH = 60
#: A shard named in prose, e.g. ('load-0a1b', 17): wrapping keeps it on one line.
_KEY_IN_PROSE = re.compile(r"\(['\"][^()]*\)")
_HOLD = "\x00"  # a space that wrapping must not break at (textwrap splits on ASCII whitespace)


def output_width() -> int | None:
    """The columns to fit: COLUMNS when set, else the terminal's (`shutil.get_terminal_size`);
    None when stdout is no terminal (a pipe, a file): then nothing is cut or moved."""
    if not os.environ.get("COLUMNS", "").strip().isdigit():
        try:
            if not sys.stdout.isatty():
                return None
        except (AttributeError, ValueError):  # replaced, or closed
            return None
    return max(MIN_WIDTH, shutil.get_terminal_size((80, 24)).columns)


def _cell(value: Any) -> str:
    # Escaped before the widths are taken, so a key with ESC in it still lines up.
    return printable(one_line("" if value is None else value))


def table(
    headers: list[str],
    rows: list[list[Any]],
    *,
    right: frozenset[int] = frozenset(),
    width: int | None = None,
    shorten: dict[str, int] | None = None,
) -> list[str]:
    """Rows under headers, two spaces apart. Only the columns in `shorten` (header -> fewest
    characters) are shortened, with "…", to fit `width`; nothing else is ever cut.

    >>> table(["ID", "TITLE"], [["6d4c", "x" * 200]], width=20, shorten={"TITLE": 8})[1]
    '6d4c  xxxxxxxxxxxxx…'
    """
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    gaps = 2 * (len(headers) - 1)
    for i, h in enumerate(headers):
        if width is not None and shorten and h in shorten:
            room = width - gaps - (sum(widths) - widths[i])
            widths[i] = min(widths[i], max(shorten[h], len(h), room))
    lines = []
    for row in [headers] + cells:
        parts = []
        for i, text in enumerate(row):
            text = clip(text, widths[i])
            parts.append(text.rjust(widths[i]) if i in right else text.ljust(widths[i]))
        lines.append("  ".join(parts).rstrip())
    return lines


def wrap(text: str, width: int | None, indent: str, hold: tuple[str, ...] = ()) -> list[str]:
    """`text` wrapped at `width`, never breaking a word, a string in `hold` or a shard."""
    text = printable(one_line(text))
    for s in hold:
        s = printable(one_line(s))
        text = text.replace(s, s.replace(" ", _HOLD)) if s else text
    text = _KEY_IN_PROSE.sub(lambda m: m.group().replace(" ", _HOLD), text)
    lines = textwrap.wrap(
        text,
        min(width or PROSE_WIDTH, PROSE_WIDTH),
        initial_indent=indent,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [indent]
    return [line.replace(_HOLD, " ") for line in lines]


def key_line(prefix: str, key: str, width: int | None) -> list[str]:
    """`prefix key` on one line, or the key whole on the next when that is too wide."""
    key = printable(key)
    if width is None or len(prefix) + 1 + len(key) <= width:
        return [f"{prefix} {key}"]
    return [prefix, prefix[: len(prefix) - len(prefix.lstrip())] + key]


def _items(
    pairs: list[tuple[Column, Any]], width: int | None, indent: str, labelled: bool
) -> list[str]:
    """Moved values, each whole: keys side by side while they fit, prose wrapped."""
    lines: list[str] = []
    line = ""
    for col, value in pairs:
        text = _cell(value)
        if not text:
            continue
        item = f"{col.label} {text}" if labelled and col.label else text
        if not col.key:
            lines += [line] if line else []
            lines += wrap(item, width, indent)
            line = ""
        elif line and (width is None or len(line) + 2 + len(item) <= width):
            line += "  " + item
        else:
            lines += [line] if line else []
            line = indent + item  # alone on its line: whole even when wider than the width
    return lines + ([line] if line else [])


def lay_out(
    columns: list[Column], rows: list[list[Any]], layouts: list[Layout], width: int | None
) -> tuple[Layout, list[str], list[list[str]]]:
    """(layout, header lines, the lines of each row) for the first layout whose header and
    rows fit `width`, else the last. Moved values fit unless one alone is wider."""
    by = {c.header: i for i, c in enumerate(columns)}
    for layout in layouts:
        shown = [by[h] for h in layout.row]
        pad = "  " if layout.above else ""
        lines = table(
            [columns[i].header for i in shown],
            [[r[i] for i in shown] for r in rows],
            right=frozenset(j for j, i in enumerate(shown) if columns[i].right),
            width=None if width is None else width - len(pad),
            shorten=layout.shorten,
        )
        head = ["  ".join(layout.above)] if layout.above else []
        head.append(pad + lines[0])
        if width is None or all(len(ln) + len(pad) <= width for ln in lines):
            break
    blocks = []
    for r, line in zip(rows, lines[1:], strict=True):
        above = _items([(columns[by[h]], r[by[h]]) for h in layout.above], width, "", False)
        below = _items([(columns[by[h]], r[by[h]]) for h in layout.below], width, "    ", True)
        blocks.append(above + [pad + line] + below)
    return layout, head, blocks
