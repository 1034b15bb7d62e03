"""The kernel log: reading /dev/kmsg without blocking, and finding the OOM killer's victims
in its text (raw kmsg records, `dmesg` or journal lines)."""

from __future__ import annotations

import os
import re
import time
from typing import Any

from .files import join_root

KMSG_RECORD = 8192  # /dev/kmsg returns EINVAL when the buffer is smaller than one record.

_KILLED = re.compile(
    r"(?:(?P<scope>Memory cgroup out of memory|Out of memory(?: \([^)]*\))?): )?"
    r"Killed process (?P<pid>\d+) \((?P<comm>.{0,16}?)\)(?= total-vm|,|\s*$)(?P<rest>.*)"
)
# Older kernels name the victim first ("... Kill process N (comm) score S or sacrifice child")
# and print a bare "Killed process" line after it.
_KILL = re.compile(
    r"(?P<scope>Memory cgroup out of memory|Out of memory)[^:]*: Kill process (?P<pid>\d+)"
)
# Linux 4.19+ prints
# "oom-kill:constraint=CONSTRAINT_MEMCG,...,task_memcg=/x,task=comm,pid=N,uid=0".
_OOM_KILL = re.compile(r"oom-kill:constraint=(?P<constraint>\w+)(?P<rest>.*?),pid=(?P<pid>\d+)")
_ANON = re.compile(r"anon-rss:(\d+)kB")
_MEMCG = re.compile(r"task_memcg=([^,]*)")


def kernel_oom_victims(text: str) -> dict[int, dict[str, Any]]:
    """Processes the kernel OOM killer killed, by pid, from kernel log text.

    Values: `comm`, `anon_rss` (bytes, None if not printed), `constraint` ("memcg" or
    "global") and `memcg` (the victim's cgroup when the kernel printed it, else None).
    Works on raw /dev/kmsg records, `dmesg` and journal lines (prefixes are ignored).

    >>> kernel_oom_victims("[ 9.1] Memory cgroup out of memory: Killed process 42 (python) "
    ...                    "total-vm:300000kB, anon-rss:65000kB, file-rss:0kB")[42]["anon_rss"]
    66560000
    """
    hint: dict[int, tuple[str, str | None]] = {}
    out: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        m = _OOM_KILL.search(line)
        if m:
            cg = _MEMCG.search(m.group("rest"))
            scope = "memcg" if m.group("constraint") == "CONSTRAINT_MEMCG" else "global"
            hint[int(m.group("pid"))] = (scope, cg.group(1) if cg else None)
            continue
        m = _KILL.search(line)
        if m:
            scope = "memcg" if m.group("scope").startswith("Memory cgroup") else "global"
            hint.setdefault(int(m.group("pid")), (scope, None))
            continue
        m = _KILLED.search(line)
        if not m:
            continue
        pid = int(m.group("pid"))
        scope, memcg = hint.pop(pid, ("global", None))
        if m.group("scope"):
            scope = "memcg" if m.group("scope").startswith("Memory cgroup") else "global"
        anon = _ANON.search(m.group("rest"))
        out[pid] = {
            "comm": m.group("comm"),
            "anon_rss": int(anon.group(1)) * 1024 if anon else None,
            "constraint": scope,
            "memcg": memcg,
        }
    return out


def read_kernel_log(
    since_monotonic: float | None = None, timeout: float = 0.2, root: str = "/"
) -> str:
    """Kernel log records from /dev/kmsg as `[seconds] message` lines; "" when unavailable.

    Non-blocking: stops at the end of the buffer (EAGAIN) or after `timeout` seconds.
    `since_monotonic` drops older records; kmsg stamps are the kernel's local_clock(), which
    tracks `time.monotonic()` to within milliseconds on Linux, so leave a small margin.
    Reading needs CAP_SYSLOG unless kernel.dmesg_restrict=0. Never raises.

    >>> read_kernel_log(root="/nonexistent")
    ''
    """
    try:
        fd = os.open(join_root(root, "dev/kmsg"), os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return ""
    lines = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                record = os.read(fd, KMSG_RECORD)
            except BrokenPipeError:
                continue  # records were overwritten under us; the next read resumes
            except OSError:
                break  # EAGAIN: end of buffer; EINVAL/EPERM: nothing more to get
            if not record:
                break
            head, _, body = record.decode("utf-8", "replace").partition(";")
            fields = head.split(",")
            try:
                stamp = int(fields[2]) / 1e6
            except (IndexError, ValueError):
                continue
            if since_monotonic is not None and stamp < since_monotonic:
                continue
            # Continuation lines (" SUBSYSTEM=...") carry metadata, not message text.
            message = body.split("\n", 1)[0]
            lines.append(f"[{stamp:12.6f}] {message}")
    finally:
        os.close(fd)
    return "\n".join(lines)
