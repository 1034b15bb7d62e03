"""The filters of a history query, checked in one place for `oomguard.Failures` and
`oomguard report`: which kinds and causes exist, what a time or a limit may be.

Each check returns the value the store expects, or raises ValueError with one sentence that
names the argument, the bad value and what is expected, e.g.
``cause='oom' is not a cause; expected one of oom_kill, ... (did you mean 'oom_kill'?)``.
Given ``name=None`` the sentence starts with the value alone, as argparse wants it after
its own ``argument --cause:`` (see `for_argparse`).
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import math
import numbers
import re
from collections.abc import Callable
from typing import Any, TypeVar

from .._causes import Cause, Killer, Kind
from .._safe_text import safe_name

T = TypeVar("T")

KINDS: tuple[str, ...] = tuple(k.value for k in Kind)
CAUSES: tuple[str, ...] = tuple(c.value for c in Cause)
KILLERS: tuple[str, ...] = tuple(k.value for k in Killer)

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d|w)$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_TIME_FORMS = (
    "an ISO time (2026-05-01T14:00, local unless it has an offset) nor a span "
    "back from now (90s, 30m, 1h, 2d, 1w)"
)


def _subject(name: str | None, value: Any) -> str:
    return f"{name}={value!r}" if name else repr(value)


def _choice(value: Any, choices: tuple[str, ...], what: str, name: str | None) -> str | None:
    if value is None:
        return None
    if isinstance(value, str) and value in choices:
        return str.__str__(value)  # Cause.OOM_KILL -> "oom_kill"
    hint = ""
    if isinstance(value, str):
        close = difflib.get_close_matches(value.lower(), choices, n=1, cutoff=0.5)
        close = close or [c for c in choices if c.startswith(value.lower()) and value]
        if close:
            hint = f" (did you mean {close[0]!r}?)"
    return _fail(
        f"{_subject(name, value)} is not {what}; expected one of {', '.join(choices)}{hint}"
    )


def _fail(message: str) -> Any:
    raise ValueError(message)


def kind(value: Any, name: str | None = "kind") -> str | None:
    """A failure kind: "infra" or "user" (None: no filter).

    >>> kind("system")
    Traceback (most recent call last):
    ValueError: kind='system' is not a kind; expected one of infra, user
    """
    return _choice(value, KINDS, "a kind", name)


def cause(value: Any, name: str | None = "cause") -> str | None:
    """A cause of `oomguard.Cause`, as its string (None: no filter).

    >>> cause("oom")
    Traceback (most recent call last):
    ValueError: cause='oom' is not a cause; expected one of oom_kill, memory_terminate, \
native_crash, sigterm, sigkill, exit, worker_lost, memory_error, exception \
(did you mean 'oom_kill'?)
    """
    return _choice(value, CAUSES, "a cause", name)


def killer(value: Any, name: str | None = "killer") -> str | None:
    """A killer of `oomguard.Killer`, as its string (None: no filter).

    >>> killer("earlyom")
    Traceback (most recent call last):
    ValueError: killer='earlyom' is not a killer; expected one of kernel, dask-nanny, \
earlyoom, systemd-oomd, kubelet, slurm, process, task, dask, unknown (did you mean 'earlyoom'?)
    """
    return _choice(value, KILLERS, "a killer", name)


def limit(value: Any, name: str | None = "limit", *, allow_none: bool = True) -> int | None:
    """Rows to return at most: a positive whole number, or None for every row.

    >>> limit(-5)
    Traceback (most recent call last):
    ValueError: limit=-5 is not a positive whole number; expected 1, 2, ... or None for no limit
    """
    if value is None and allow_none:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1:
        return int(value)
    also = " or None for no limit" if allow_none else ""
    return _fail(
        f"{_subject(name, value)} is not a positive whole number; expected 1, 2, ...{also}"
    )


def since(value: Any, name: str | None = "since", *, now: float | None = None) -> float | None:
    """Seconds since the epoch from: an ISO time or a span back from now ("90m", "1h", as
    `oomguard report --since` takes them), seconds since the epoch, a datetime (naive: local
    time) or a timedelta back from now.

    >>> since("90m", now=10_000.0)
    4600.0
    >>> since("2026-05-01T12:00:00+00:00")
    1777636800.0
    >>> since("soon")
    Traceback (most recent call last):
    ValueError: since='soon' is neither an ISO time (2026-05-01T14:00, local unless it has an \
offset) nor a span back from now (90s, 30m, 1h, 2d, 1w)
    """
    if value is None:
        return None
    if isinstance(value, str):
        s = value.strip()
        m = _RELATIVE.match(s.lower())
        if m:
            return _now(now) - float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        try:
            return datetime.datetime.fromisoformat(s).timestamp()  # naive: local time
        except (ValueError, OverflowError, OSError):
            return _fail(f"{_subject(name, value)} is neither {_TIME_FORMS}")
    if isinstance(value, datetime.datetime):
        return value.timestamp()
    if isinstance(value, datetime.date):  # a day: from its local midnight
        return datetime.datetime.combine(value, datetime.time()).timestamp()
    if isinstance(value, datetime.timedelta):
        if value < datetime.timedelta(0):
            return _fail(
                f"{_subject(name, value)} is a negative span; expected a span back "
                "from now, e.g. timedelta(hours=1)"
            )
        return _now(now) - value.total_seconds()
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        t = float(value)
        if not math.isfinite(t):
            return _fail(
                f"{_subject(name, value)} is not a time; expected seconds since the "
                "epoch (time.time() - 3600), a datetime, a timedelta or '1h'"
            )
        if t < 0:
            return _fail(
                f"{_subject(name, value)} is before 1970; for a span back from now "
                "give '1h' or timedelta(hours=1), or seconds since the epoch "
                "(time.time() - 3600)"
            )
        try:
            datetime.datetime.fromtimestamp(t)
        except (OverflowError, OSError, ValueError):
            return _fail(
                f"{_subject(name, value)} is past the year 9999; expected seconds, "
                "not milliseconds, since the epoch"
            )
        return t
    return _fail(
        f"{_subject(name, value)} is not a time; expected seconds since the epoch, a "
        "datetime, a timedelta, an ISO time or a span back from now ('1h')"
    )


def text(value: Any, name: str, what: str = "a name", *, required: bool = False) -> str | None:
    """A pipeline name or signature id: any str (one the history does not have gives []
    with a warning, `unknown_name`); None: no filter, unless `required`."""
    if value is None and not required:
        return None
    if isinstance(value, str):
        return safe_name(value)  # as the store keeps names (`_safe_text`)
    return _fail(f"{_subject(name, value)} is not {what}; expected a str")


def timeout(value: Any, name: str | None = "timeout") -> float | None:
    """Seconds to wait for the scheduler's answer: a positive number, or None (no bound).

    >>> timeout(-1)
    Traceback (most recent call last):
    ValueError: timeout=-1 is not a positive number of seconds; expected e.g. 60, or None to wait without a bound
    """
    if value is None:
        return None
    if (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    ):
        return float(value)
    return _fail(
        f"{_subject(name, value)} is not a positive number of seconds; expected e.g. 60, "
        "or None to wait without a bound"
    )


def client(value: Any) -> Any:
    """A `distributed.Client` (TypeError naming what was given instead).

    >>> client("tcp://10.0.0.5:8786")
    Traceback (most recent call last):
    TypeError: client='tcp://10.0.0.5:8786' is not a distributed.Client; connect first \
and pass the client: Client('tcp://10.0.0.5:8786')
    """
    from distributed import Client

    if isinstance(value, Client):
        return value
    example = repr(value) if isinstance(value, str) else "'tcp://scheduler:8786'"
    raise TypeError(
        f"client={value!r} is not a distributed.Client; connect first and pass the "
        f"client: Client({example})"
    )


def unknown_name(
    name: str | None, value: str, what: str, known: list[str], shown: int = 10
) -> str:
    """Why a filter on a name matched nothing: the name is in no event, run or signature.
    One sentence with the names there are (most recent first) and the closest one.

    >>> unknown_name("pipeline", "etll", "pipeline", ["backfill", "etl"])
    "pipeline='etll' names no pipeline in the history; known pipelines, most recent \
first: 'backfill', 'etl' (did you mean 'etl'?)"
    """
    if not known:
        return f"{_subject(name, value)} names no {what} in the history; it has none yet"
    listed = ", ".join(repr(n) for n in known[:shown])
    if len(known) > shown:
        listed += f" and {len(known) - shown} more"
    close = closest(value, known)
    hint = f" (did you mean {close!r}?)" if close else ""
    return (
        f"{_subject(name, value)} names no {what} in the history; known {what}s, most "
        f"recent first: {listed}{hint}"
    )


def closest(value: str, known: list[str]) -> str | None:
    """The known name `value` most resembles, if any: "segV" -> "segv" or "segv-etl"."""
    close = difflib.get_close_matches(value, known, n=1, cutoff=0.6)
    if not close:  # a case-blind match, or a part of the name
        low = value.lower()
        close = [n for n in known if n.lower() == low]
        close = close or [n for n in known if low and (low in n.lower() or n.lower() in low)]
    return close[0] if close else None


def shard(value: Any) -> str | None:
    """A shard as the store keeps it: the task key as `str(key)`, so ``("load", 7)`` and
    ``"('load', 7)"`` name the same shard (None: no filter); made safe as the store makes
    the shards it keeps (`_safe_text.safe_name`)."""
    return None if value is None else safe_name(value)


def _now(now: float | None) -> float:
    return datetime.datetime.now().timestamp() if now is None else now


def for_argparse(
    check: Callable[..., T], parse: Callable[[str], Any] | None = None, **options: Any
) -> Callable[[str], T]:
    """An argparse `type=` from a check: the text, through `parse` when it parses, goes to
    the check, whose ValueError becomes argparse's one-line error
    (``argument --limit: -5 is not a positive whole number; ...``).

    >>> for_argparse(limit, int, allow_none=False)("-5")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: -5 is not a positive whole number; expected 1, 2, ...
    """

    def convert(text: str) -> T:
        value: Any = text
        if parse is not None:
            try:
                value = parse(text)
            except ValueError:
                pass  # the check names the text as it was given
        try:
            return check(value, None, **options)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = check.__name__
    return convert


def user_name() -> str:
    """Who resolves, by default: this process's user name, "" where the system has none
    (a container's UID with no passwd entry and no USER: `getpass` raises there)."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""
