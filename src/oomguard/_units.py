"""Bytes for people: the one way oomguard writes a size, and the size that means no limit."""

from __future__ import annotations

#: A memory limit this large or larger means none: cgroup v1 reports "no limit" as
#: PAGE_COUNTER_MAX * PAGE_SIZE (9223372036854771712 with 4 KiB pages; larger pages round
#: differently), v2 as "max".
NO_LIMIT = 2**62


def format_bytes(n: int | float) -> str:
    """Binary units, three significant digits, trailing zeros dropped: a limit reads as
    people write it (`4 GiB`) and a peak just over it still shows (`1.02 GiB`).

    >>> format_bytes(4 * 2**30), format_bytes(1.02 * 2**30), format_bytes(573.59 * 2**20)
    ('4 GiB', '1.02 GiB', '574 MiB')
    >>> format_bytes(1536), format_bytes(1023), format_bytes(-3 * 2**20), format_bytes(2**41)
    ('1.5 KiB', '1023 B', '-3 MiB', '2 TiB')
    """
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1023.5 or unit == "TiB":
            break
        n /= 1024
    if unit == "B":
        return f"{sign}{n:.0f} B"
    digits = 2 if n < 9.995 else 1 if n < 99.95 else 0
    text = f"{n:.{digits}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return f"{sign}{text} {unit}"
