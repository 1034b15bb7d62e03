"""The types of `oomguard report`'s arguments: each checks one value and names what is
wrong with it (argparse prints that with the usage, exit 2)."""

from __future__ import annotations

import argparse
import ast
from typing import Any

from .._client import filters as _filters
from .._config import CLUSTER_NAME_MAX
from .._safe_text import safe_name


def parse_since(text: str, now: float | None = None) -> float:
    """Seconds since the epoch for `--since`: an ISO time, or a span back from now, checked
    as `oomguard.Failures` checks `since` (`oomguard._client.filters`).

    >>> parse_since("90m", now=10_000.0)
    4600.0
    >>> parse_since("2026-05-01T12:00:00+00:00")
    1777636800.0
    """
    return _filters.for_argparse(_filters.since, now=now)(text)


def _is_key(value: Any) -> bool:
    # Dask's definition (dask.core.iskey): a str, int or float, or a tuple of keys.
    if type(value) is tuple:
        return all(_is_key(part) for part in value)
    return type(value) in (str, int, float)


def parse_shard(text: str) -> str:
    """`--shard`: a task key as `str(key)` writes it; a tuple written another way (other
    quotes or spacing) is written back as `str(key)` does, so it finds the stored events.

    >>> parse_shard('("load-0a1b",17)')
    "('load-0a1b', 17)"
    >>> parse_shard("load-0a1b")
    'load-0a1b'
    """
    s = text.strip()
    if not s:
        why = "it is empty"
    elif any(ord(c) < 32 or ord(c) == 127 for c in s):
        why = "it holds a control character"
    elif s.startswith(("(", "[")):
        # str() of a tuple key; a str key that begins so is never made by Dask's naming.
        try:
            key = ast.literal_eval(s)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            key = None
        if type(key) is tuple and _is_key(key):
            return safe_name(str(key))  # as the store keeps it
        why = "it begins like a tuple but is not a tuple of strings and numbers"
    elif s.count("(") != s.count(")") or s.count("[") != s.count("]"):
        why = "its brackets do not pair up, as in a key copied in part"
    else:
        return safe_name(s)
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a task key: {why}; give the key as str(key) writes it, e.g. "
        "\"('load-0a1b', 17)\" or load-0a1b"
    )


def positive_seconds(text: str) -> float:
    try:
        s = float(text)
    except ValueError:
        s = 0.0
    if not s > 0 or s == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return s


def cluster_name(text: str) -> str:
    """`--cluster`: a name as oomguard.scheduler.cluster-name takes it."""
    name = text.strip()
    if not name or len(name) > CLUSTER_NAME_MAX or not name.isprintable():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a cluster name: printable text of 1 to {CLUSTER_NAME_MAX} "
            "characters, as oomguard.scheduler.cluster-name sets it"
        )
    return name


def store_place(text: str) -> str:
    """`--store`: a path, or a URL of a scheme oomguard reads (never a file named "mysql:")."""
    from .._urls import check

    try:
        return check(text, "it")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
