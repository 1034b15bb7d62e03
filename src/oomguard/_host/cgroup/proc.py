"""Readers of /proc for one process (is it still running, its RSS) and for the host
(total and available memory)."""

from __future__ import annotations

from .files import join_root, read_text

_PF_EXITING = 0x4  # include/linux/sched.h: the task is in do_exit()
_SIGKILL_BIT = 1 << 8  # a pending-signal mask has bit (signal - 1)


def process_running(pid: int, root: str = "/") -> bool:
    """Whether `pid` exists and is not on its way out: no zombie (state Z/X), not exiting
    (PF_EXITING in its flags) and no SIGKILL pending. One read of /proc/PID/stat.

    The OOM killer counts a kill in the victim's cgroup right before it sends the SIGKILL,
    so a counter read while its victim still runs by this test predates the kill. A fatal
    signal sent to a process is queued on each of its threads too (kernel/signal.c
    complete_signal), so the main thread's pending mask, stat field 31, shows it.

    >>> process_running(1, root="/nonexistent")
    False
    """
    try:
        with open(join_root(root, f"proc/{int(pid)}/stat"), "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat_running(stat)


def stat_running(stat: bytes) -> bool:
    """`process_running` on the text of /proc/PID/stat (the nanny reads it through an
    open file: see worker_plugin/_life.py)."""
    fields = stat.rpartition(b")")[2].split()  # the comm may hold ")" and spaces
    # fields[0] is field 3 (state), fields[6] field 9 (flags), fields[28] field 31 (signal).
    if len(fields) < 29 or fields[0] in (b"Z", b"X"):
        return False
    try:
        return not (int(fields[6]) & _PF_EXITING or int(fields[28]) & _SIGKILL_BIT)
    except ValueError:
        return False


def host_memory(root: str = "/") -> dict[str, int | None]:
    """Total and available host memory in bytes from /proc/meminfo (None where missing).

    MemAvailable appeared in Linux 3.14.

    >>> sorted(host_memory("/nonexistent"))
    ['available', 'total']
    """
    fields = {"MemTotal": "total", "MemAvailable": "available"}
    out: dict[str, int | None] = {"total": None, "available": None}
    text, _ = read_text(join_root(root, "proc/meminfo"))
    for line in (text or "").splitlines():
        key, _, rest = line.partition(":")
        if key in fields:
            parts = rest.split()
            if parts and parts[0].isdigit():
                scale = 1024 if parts[1:2] == ["kB"] else 1
                out[fields[key]] = int(parts[0]) * scale
    return out


def process_rss(pid: int, root: str = "/") -> int | None:
    """A process's resident set size in bytes (`VmRSS` of /proc/<pid>/status); None when it
    is gone, a zombie (no VmRSS line) or unreadable.

    >>> process_rss(1, root="/nonexistent") is None
    True
    """
    text, _ = read_text(join_root(root, f"proc/{int(pid)}/status"))
    for line in (text or "").splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * (1024 if parts[2:3] == ["kB"] else 1)
    return None
