"""Who sent a signal: the sender's name and command line, read from /proc, and bounds on them.

A worker that takes its signals with `sigtimedwait` learns the sender's pid and uid from the
kernel (`si_pid`, `si_uid`); the name and command line must be read from /proc at once, while
the sender still runs. A sender that has exited by then is named by pid and uid alone. A pid
of 0 is a sender outside the worker's PID namespace (or the kernel): nothing to read.

Everything here is bounded: a name at most `NAME_MAX` characters, a command line at most
`CMDLINE_MAX` characters, control characters stripped, so a hostile or broken process cannot
put a megabyte or an escape sequence into a report. `validate` is the reader's check of a
record that comes back out of a flight record.
"""

from __future__ import annotations

import signal
import time as _time
from typing import Any

#: A command line is cut to this many characters (after NULs became spaces).
CMDLINE_MAX = 1024
#: /proc/PID/comm is at most 15 bytes; a little room for odd kernels, no more.
NAME_MAX = 64
#: Bytes read from /proc/PID/cmdline at most: enough for CMDLINE_MAX characters of UTF-8.
_READ_MAX = 4 * CMDLINE_MAX + 4
#: The keys of one signal record, in the order they are documented.
KEYS = ("signal", "signo", "time", "code", "pid", "uid", "name", "cmdline")


def sanitize(text: str, limit: int) -> str:
    """NULs as spaces, control characters dropped, trailing spaces trimmed, cut at `limit`.

    >>> sanitize("python\\x00-c\\x00print(1)\\x00", 1024)
    'python -c print(1)'
    >>> sanitize("evil\\x1b[31mred\\n", 1024)
    'evil[31mred'
    >>> sanitize("x" * 2000, 1024) == "x" * 1024
    True
    """
    text = text.replace("\x00", " ")
    # C0 and C1 controls and DEL: what a terminal or a log line would interpret.
    text = "".join(c for c in text if c >= " " and not ("\x7f" <= c <= "\x9f"))
    return text.rstrip()[:limit]


def _read(path: str, limit: int) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:  # gone (exited), or not ours to read
        return None


def read_sender(pid: int, *, proc: str = "/proc") -> tuple[str | None, str | None]:
    """(name, cmdline) of process `pid` from /proc, None for what cannot be read.

    pid 0 (outside this PID namespace) and negative pids are never read.

    >>> import os
    >>> name, cmdline = read_sender(os.getpid())
    >>> bool(name) and bool(cmdline)
    True
    >>> read_sender(0)
    (None, None)
    """
    if not isinstance(pid, int) or pid <= 0:
        return None, None
    comm = _read(f"{proc}/{pid}/comm", NAME_MAX + 1)
    cmdline = _read(f"{proc}/{pid}/cmdline", _READ_MAX)
    name = sanitize(comm.decode("utf-8", "replace"), NAME_MAX) if comm is not None else None
    line = sanitize(cmdline.decode("utf-8", "replace"), CMDLINE_MAX) if cmdline else None
    # A kernel thread or a zombie has an empty cmdline: say nothing rather than "".
    return name or None, line or None


def signal_name(signo: int) -> str:
    """'SIGTERM' for 15; 'SIG<n>' for a number Python has no name for.

    >>> signal_name(15), signal_name(99)
    ('SIGTERM', 'SIG99')
    """
    try:
        return signal.Signals(signo).name
    except ValueError:
        return f"SIG{signo}"


def record(
    signo: int, code: int, pid: int, uid: int, *, at: float | None = None, proc: str = "/proc"
) -> dict[str, Any]:
    """One received signal as the flight record keeps it, the sender read from /proc now.

    >>> r = record(15, 0, 0, 0, at=1.5)
    >>> r["signal"], r["pid"], r["name"], r["cmdline"]
    ('SIGTERM', 0, None, None)
    """
    name, cmdline = read_sender(pid, proc=proc)
    return {
        "signal": signal_name(signo),
        "signo": int(signo),
        "time": float(_time.time() if at is None else at),
        "code": int(code),
        "pid": int(pid),
        "uid": int(uid),
        "name": name,
        "cmdline": cmdline,
    }


def validate(entry: Any) -> dict[str, Any] | None:
    """A record read back from a flight record, checked and bounded; None when it is not one.

    >>> validate(record(15, 0, 1, 0, at=2.0)) is not None
    True
    >>> validate({"signal": "SIGTERM"}) is None
    True
    """
    if not isinstance(entry, dict) or set(entry) != set(KEYS):
        return None
    ints = ("signo", "code", "pid", "uid")
    if any(type(entry[k]) is not int for k in ints):  # bool is not a number here
        return None
    if not 0 < entry["signo"] < 128 or entry["pid"] < 0 or entry["uid"] < 0:
        return None
    if not isinstance(entry["time"], (int, float)) or isinstance(entry["time"], bool):
        return None
    if not isinstance(entry["signal"], str) or not entry["signal"].startswith("SIG"):
        return None
    out = dict(entry)
    out["signal"] = sanitize(entry["signal"], 16)
    out["time"] = float(entry["time"])
    for key, limit in (("name", NAME_MAX), ("cmdline", CMDLINE_MAX)):
        value = entry[key]
        if value is not None and not isinstance(value, str):
            return None
        out[key] = sanitize(value, limit) or None if value is not None else None
    return {k: out[k] for k in KEYS}
