"""Text for people: local clock times, values cut to fit one line, escaped HTML tables.

Shortening rule: a value too long for its place is cut in the middle, keeping its start and
more of its end, with "…" between. A shard's start names its layer (``('read-parquet-…``) and
its end tells the shards of one layer apart: the index of a tuple key (``…', 17)``), the
token of a ``client.map`` key (``process_shard-…9abcdef``); cutting the end instead would
print many different shards alike. The whole value is always on the object (`.shard`), in
`to_pandas()`, and in the HTML cell's tooltip.
"""

from __future__ import annotations

import datetime
import html
from collections.abc import Sequence
from typing import Any

ELLIPSIS = "…"
TOOLTIP_CHARS = 4000  # a tooltip longer than a screen helps no one


def one_line(value: Any) -> str:
    """Whitespace runs, newlines included, as one space."""
    return " ".join(str(value).split())


def shorten(value: Any, width: int) -> str:
    """`value` on one line in at most `width` characters, cut in the middle.

    >>> shorten("('read-parquet-fused-9f8e7d6c5b4a39281706f5e4d3c2b1a0', 17)", 40)
    "('read-parquet-…281706f5e4d3c2b1a0', 17)"
    """
    text = one_line(value)
    if len(text) <= width:
        return text
    keep = max(width - 1, 2)
    head = keep * 2 // 5
    return text[:head] + ELLIPSIS + text[len(text) - (keep - head) :]


def clock(t: float | None, unknown: str = "?") -> str:
    """Seconds since the epoch as local time, to the second; `unknown` for 0 or None.

    >>> clock(0.0)
    '?'
    """
    if not t:
        return unknown
    try:
        return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError, TypeError):
        return str(t)


def utc_offset() -> str:
    """This machine's offset from UTC now, e.g. "UTC+01:00"."""
    offset = datetime.datetime.now().astimezone().strftime("%z")
    return f"UTC{offset[:3]}:{offset[3:]}" if offset else "local"


def quantity(n: int, noun: str) -> str:
    """`n` and the noun, plural unless one.

    >>> quantity(1, "event"), quantity(3, "event")
    ('1 event', '3 events')
    """
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


# --------------------------------------------------------------------------- HTML

_STYLE = (
    "<style>table.oomguard td, table.oomguard th {text-align: left; "
    "vertical-align: top; white-space: nowrap} table.oomguard .num "
    "{text-align: right} table.oomguard td.prose {white-space: normal; min-width: 24em} "
    "table.oomguard caption {text-align: left}</style>"
)


def clip(value: Any, width: int) -> str:
    """Prose on one line in at most `width` characters, cut at the end.

    >>> clip("the kernel OOM-killed the worker twice", 20)
    'the kernel OOM-kill…'
    """
    text = one_line(value)
    return text if len(text) <= width else text[: max(width - 1, 1)] + ELLIPSIS


def cell(
    value: Any, width: int | None = None, *, numeric: bool = False, prose: bool = False
) -> str:
    """One escaped <td>; a value cut to `width` keeps the whole of it in its tooltip.
    Names and keys are cut in the middle and never wrap; prose is cut at its end, and wraps."""
    full = one_line("" if value is None else value)
    shown = full if width is None else (clip if prose else shorten)(full, width)
    attrs = ' class="num"' if numeric else ' class="prose"' if prose else ""
    if shown != full:
        tip = full if len(full) <= TOOLTIP_CHARS else shorten(full, TOOLTIP_CHARS)
        attrs += f' title="{html.escape(tip, quote=True)}"'
    return f"<td{attrs}>{html.escape(shown, quote=True)}</td>"


def html_table(
    caption: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    more: int = 0,
    empty: str = "none",
    numeric: Sequence[int] = (),
) -> str:
    """A table of `rows` (each a sequence of `cell()` strings) under `headers` (those at the
    indices in `numeric` aligned right); `more` rows left out are counted in a last row."""
    right = ' class="num"'
    head = "".join(
        f"<th{right if i in numeric else ''}>{html.escape(h, quote=True)}</th>"
        for i, h in enumerate(headers)
    )
    body = ["<tr>" + "".join(r) + "</tr>" for r in rows]
    if not rows:
        body.append(f'<tr><td colspan="{len(headers)}">{html.escape(empty)}</td></tr>')
    if more:
        body.append(
            f'<tr><td colspan="{len(headers)}">… {more} more (every row: '
            "indexing, iteration or to_pandas())</td></tr>"
        )
    return (
        f'{_STYLE}<table class="oomguard"><caption>{html.escape(caption, quote=True)}'
        f"</caption><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )
