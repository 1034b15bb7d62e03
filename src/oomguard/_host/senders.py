"""Who sent a signal: one slot of the native recorder turned into a bounded record.

The worker's native recorder (`sigrec`, `_sigrec.c`) writes each received signal's sender as
the kernel gives it (`si_pid`, `si_uid`, `si_code`) with the sender's /proc/PID/comm and
raw /proc/PID/cmdline, read in the handler while the sender still runs. A sender that has
exited by then is named by pid and uid alone. A pid of 0 is a sender outside the worker's
PID namespace, or the kernel: nothing to read.

The nanny reads the slots back (`flight.read_flight_record`) and builds records here:
everything bounded (a name at most `NAME_MAX` characters, a command line at most
`CMDLINE_MAX`), control characters stripped, so a hostile or broken process cannot put a
megabyte or an escape sequence into a report; and the command line kept as its program
name and a hash of the rest (`command_line`) unless `oomguard.worker.sender-cmdline` is
`full`, since a command line can hold a secret (docs/security.md).
"""

from __future__ import annotations

import hashlib
import math
import signal
from typing import Any

#: A command line is cut to this many characters (after NULs became spaces).
CMDLINE_MAX = 1024
#: /proc/PID/comm is at most 15 bytes; a little room for odd kernels, no more.
NAME_MAX = 64
#: The keys of one signal record, in the order they are documented.
KEYS = ("signal", "signo", "time", "code", "pid", "uid", "name", "cmdline")
#: How a sender's command line is kept (`oomguard.worker.sender-cmdline`).
CMDLINE_MODES = ("hashed", "full")


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


def command_line(raw: bytes, mode: str = "hashed") -> str | None:
    """A /proc/PID/cmdline as a report keeps it. ``hashed``: the program's name (argv[0]
    without its directory) and the SHA-256 of the other arguments as they were (NUL-joined),
    so two deaths can be told apart or matched against a command line one knows, while what
    the arguments say (a password, a token, a path) stays on the host; ``full``: the whole
    line, sanitized and cut at `CMDLINE_MAX`. None for an empty one (a kernel thread).

    >>> command_line(b"/usr/bin/python3\\x00-c\\x00pass\\x00")
    'python3 [2 arguments, sha256:f2ea8570803dc466]'
    >>> command_line(b"/usr/bin/python3\\x00-c\\x00pass\\x00", "full")
    '/usr/bin/python3 -c pass'
    >>> command_line(b"sleep\\x00"), command_line(b"")
    ('sleep', None)
    """
    if mode == "full":
        return sanitize(raw.decode("utf-8", "replace"), CMDLINE_MAX) or None
    args = raw[:-1].split(b"\0") if raw.endswith(b"\0") else raw.split(b"\0")
    program = sanitize(args[0].rsplit(b"/", 1)[-1].decode("utf-8", "replace"), NAME_MAX)
    rest = args[1:]
    if not rest:
        return program or None
    digest = hashlib.sha256(b"\0".join(rest)).hexdigest()[:16]
    n = len(rest)
    return f"{program or '?'} [{n} argument{'s' if n != 1 else ''}, sha256:{digest}]"


def signal_name(signo: int) -> str:
    """'SIGTERM' for 15; 'SIG<n>' for a number Python has no name for.

    >>> signal_name(15), signal_name(99)
    ('SIGTERM', 'SIG99')
    """
    try:
        return signal.Signals(signo).name
    except ValueError:
        return f"SIG{signo}"


def from_slot(
    signo: int,
    code: int,
    pid: int,
    uid: int,
    sec: int,
    nsec: int,
    comm: bytes,
    cmdline: bytes,
    mode: str = "hashed",
) -> dict[str, Any] | None:
    """One slot of the native recorder as a record (`KEYS`); None when it is not one.

    >>> r = from_slot(15, 0, 812, 0, 1700000000, 5 * 10**8, b"earlyoom\\n", b"earlyoom\\0-r\\0")
    >>> r["signal"], r["pid"], r["name"], r["time"]
    ('SIGTERM', 812, 'earlyoom', 1700000000.5)
    >>> from_slot(0, 0, 1, 0, 1, 0, b"", b"") is None
    True
    """
    if not 0 < signo < 128 or pid < 0 or not 0 <= nsec < 10**9 or sec < 0:
        return None
    at = sec + nsec / 1e9
    if not math.isfinite(at):
        return None
    name = sanitize(comm.decode("utf-8", "replace"), NAME_MAX) or None
    return {
        "signal": signal_name(signo),
        "signo": signo,
        "time": at,
        "code": code,
        "pid": pid,
        "uid": uid,
        "name": name,
        "cmdline": command_line(cmdline, mode) if cmdline else None,
    }
