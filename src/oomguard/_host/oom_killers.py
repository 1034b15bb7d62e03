"""The userspace killers running on this host, found by process name in /proc, and the
memory thresholds they act at where their command line says (earlyoom).

`find_killers(total_bytes)` never raises: an unreadable /proc gives an empty list, an
unreadable command line an empty string. Under `hidepid=` another user's processes are
invisible; `oomguard doctor` says so.
"""

from __future__ import annotations

import os
from typing import Any

from .cgroup.files import join_root

KILLER_NAMES = ("earlyoom", "systemd-oomd", "nohang", "oomd", "kubelet", "slurmd")
CMDLINE_MAX = 1024
_SCAN_MAX = 65536  # processes looked at, at most (a bound on one scan's cost)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

# earlyoom 1.7 (Debian 12's), main.c: its getopt_long option string and long options.
_EARLYOOM_SHORT = "m:s:M:S:kingN:dvr:ph"
_EARLYOOM_LONG = {"prefer": True, "avoid": True, "dryrun": False, "help": False}
_EARLYOOM_TERM, _EARLYOOM_KILL = 10.0, 5.0  # its defaults, in percent, memory and swap


def clean_cmdline(data: bytes) -> str:
    """A /proc/PID/cmdline as one line: NULs as spaces, control characters dropped, cut
    at 1 KiB.

    >>> clean_cmdline(b"earlyoom\\0-r\\0\\x1b[1m9\\0")
    'earlyoom -r [1m9'
    """
    text = data.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
    return "".join(c for c in text if c.isprintable())[:CMDLINE_MAX]


def _tuple(arg: str, upper: float) -> tuple[float, float] | None:
    """earlyoom's parse_term_kill_tuple (msg.c): "TERM[,KILL]", KILL defaulting to TERM/2,
    TERM raised to KILL when below it; None where earlyoom would refuse to start."""
    term_s, comma, kill_s = arg.partition(",")
    try:
        term = float(term_s)
        kill = float(kill_s) if comma else term / 2
    except ValueError:
        return None
    if not (0 <= term <= upper and 0 <= kill <= upper) or (term == 0 and kill == 0):
        return None
    return max(term, kill), kill


def _getopt(argv: list[str]) -> list[tuple[str, str | None]] | None:
    """GNU getopt_long over earlyoom's options: [(option, argument)], None on an error."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        i += 1
        if a == "--":
            break
        if a.startswith("--"):
            name, eq, value = a[2:].partition("=")
            names = [n for n in _EARLYOOM_LONG if n.startswith(name)] if name else []
            if name in _EARLYOOM_LONG:
                names = [name]
            if len(names) != 1:
                return None
            if _EARLYOOM_LONG[names[0]]:
                if not eq:
                    if i >= len(argv):
                        return None
                    value, i = argv[i], i + 1
                out.append((names[0], value))
            else:
                out.append((names[0], None))
        elif a.startswith("-") and len(a) > 1:
            j = 1
            while j < len(a):
                c = a[j]
                k = _EARLYOOM_SHORT.find(c)
                if c == ":" or k < 0:
                    return None
                if _EARLYOOM_SHORT[k + 1 : k + 2] == ":":
                    if j + 1 < len(a):
                        value = a[j + 1 :]
                    elif i < len(argv):
                        value, i = argv[i], i + 1
                    else:
                        return None
                    out.append((c, value))
                    break
                out.append((c, None))
                j += 1
        # A non-option argument is permuted past by getopt (and refused after it).
    return out


def earlyoom_thresholds(argv: list[str], total_bytes: int | None) -> dict[str, Any]:
    """The memory thresholds an earlyoom 1.7 started with `argv` (without argv[0]) acts
    at, as its main.c computes them: -m PERCENT[,KILL], -M KiB[,KILL KiB] turned into a
    percent of MemTotal, the lower of the two when both are given; defaults 10 % and 5 %.

    >>> t = earlyoom_thresholds(["-M", "1048576,524288"], 8 * 2**30)
    >>> t["term_percent"], t["kill_percent"], t["term_bytes"], t["kill_bytes"]
    (12.5, 6.25, 1073741824, 536870912)
    """
    out: dict[str, Any] = {
        "term_bytes": None,
        "kill_bytes": None,
        "term_percent": None,
        "kill_percent": None,
        "swap_term_percent": None,
        "swap_kill_percent": None,
        "dryrun": False,
    }
    opts = _getopt(argv)
    if opts is None:
        return out
    total_kib = total_bytes // 1024 if isinstance(total_bytes, int) and total_bytes > 0 else 0
    mem = swap = (_EARLYOOM_TERM, _EARLYOOM_KILL)
    mem_kib = None
    swap_m = swap_kib = None
    for opt, value in opts:
        if opt == "m":
            mem = _tuple(value or "", 99) or mem
        elif opt == "M" and total_kib:
            mem_kib = _tuple(value or "", total_kib * 100 // 99) or mem_kib
        elif opt == "s":
            swap_m = _tuple(value or "", 100) or swap_m
        elif opt == "S":
            swap_kib = value  # a percent of SwapTotal, which the nanny does not read
        elif opt == "dryrun":
            out["dryrun"] = True
    if mem_kib is not None and total_kib:
        from_kib = (100 * mem_kib[0] / total_kib, 100 * mem_kib[1] / total_kib)
        if any(o == "m" for o, _ in opts):
            mem = (min(mem[0], from_kib[0]), min(mem[1], from_kib[1]))
        else:
            mem = from_kib
    if swap_m is not None:
        swap = swap_m
    if swap_kib is None:
        out["swap_term_percent"], out["swap_kill_percent"] = swap
    out["term_percent"], out["kill_percent"] = round(mem[0], 4), round(mem[1], 4)
    if total_kib:
        out["term_bytes"] = int(mem[0] * total_kib / 100) * 1024
        out["kill_bytes"] = int(mem[1] * total_kib / 100) * 1024
    return out


def _read(path: str, size: int) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(size)
    except OSError:
        return None


def find_killers(total_bytes: int | None, root: str = "/") -> list[dict[str, Any]]:
    """Each process named as a userspace killer (/proc/PID/comm), oldest pid first:
    {"name", "pid", "cmdline"}, and for earlyoom its thresholds (`earlyoom_thresholds`).
    systemd-oomd's limits live in unit files and oomd.conf: present, no thresholds.
    """
    proc = join_root(root, "proc")
    try:
        entries = [e for e in os.listdir(proc) if e.isdigit()][:_SCAN_MAX]
    except OSError:
        return []
    found: list[dict[str, Any]] = []
    for entry in sorted(entries, key=int):
        comm = _read(os.path.join(proc, entry, "comm"), 64)
        name = (comm or b"").strip().decode("utf-8", "replace")
        if name not in KILLER_NAMES:
            continue
        raw = _read(os.path.join(proc, entry, "cmdline"), 16 * CMDLINE_MAX) or b""
        killer: dict[str, Any] = {"name": name, "pid": int(entry), "cmdline": clean_cmdline(raw)}
        if name in ("earlyoom", "systemd-oomd", "nohang", "oomd"):
            killer.update(term_bytes=None, kill_bytes=None, term_percent=None, kill_percent=None)
        if name == "earlyoom" and raw:  # unreadable: its thresholds stay unknown
            argv = [a.decode("utf-8", "replace") for a in raw.split(b"\0")]
            if argv and argv[-1] == "":
                argv.pop()
            killer.update(earlyoom_thresholds(argv[1:], total_bytes))
        found.append(killer)
        if len(found) >= 16:
            break
    return found


def largest_process(exclude: int, root: str = "/") -> dict[str, Any] | None:
    """The host's process with the largest RSS other than `exclude` (the dead worker):
    {"pid", "name", "rss"} (bytes); None when /proc cannot be read. A userspace OOM killer
    picks the largest process (earlyoom by oom_score, mostly RSS): the worker's last
    sampled RSS beside this says whether it was the one picked. One pass over
    /proc/PID/statm, bounded like `find_killers`."""
    proc = join_root(root, "proc")
    try:
        entries = [e for e in os.listdir(proc) if e.isdigit() and int(e) != exclude]
    except OSError:
        return None
    best: tuple[int, int] | None = None
    for entry in entries[:_SCAN_MAX]:
        statm = _read(os.path.join(proc, entry, "statm"), 64)
        try:
            rss = int((statm or b"").split()[1]) * _PAGE
        except (IndexError, ValueError):
            continue
        if best is None or rss > best[1]:
            best = (int(entry), rss)
    if best is None:
        return None
    comm = _read(os.path.join(proc, str(best[0]), "comm"), 64) or b""
    return {"pid": best[0], "name": clean_cmdline(comm.strip()), "rss": best[1]}


def memory_killer(killer: dict) -> bool:
    """Whether a found killer acts on host memory (earlyoom, systemd-oomd, nohang, oomd)."""
    return "term_bytes" in killer


def merge_killers(older: list[dict] | None, newer: list[dict] | None) -> list[dict] | None:
    """The killers of a scan at a death, with those of the last periodic scan that are
    gone since (an earlyoom stopped right after its kill still explains it)."""
    if older is None and newer is None:
        return None
    out = list(newer or [])
    seen = {(k.get("name"), k.get("pid")) for k in out}
    out.extend(k for k in older or [] if (k.get("name"), k.get("pid")) not in seen)
    return out[:16]
