"""Every read of /proc and /sys that oomguard does lives here.

The filesystem root is a parameter (`root="/"`) so tests point it at a fixture tree, the way
psutil's `_pslinux.py` takes `PROCFS_PATH`. Which cgroup version holds the memory
controller is decided once, by `detect()`; everything after that takes the `CgroupInfo`
(or a cgroup directory plus its version), so nothing re-detects per read.

Missing files are not errors: readers return what is there and list what was missing in
`MemoryCounters.missing` ("memory.peak: not found"). Only `ChildGroup.create` and
`ChildGroup.add_pid` raise (`oomguard.CgroupError`), because the caller asked for a group.

Interface files and where they come from (Documentation/admin-guide/cgroup-v1/memory.rst,
Documentation/admin-guide/cgroup-v2.rst):

- v1 `memory.oom_control` has had `oom_kill_disable`/`under_oom` since 2.6.34; its
  `oom_kill` count appeared in Linux 4.13.
- v2 `memory.events` came with cgroup v2 in 4.5 (`low high max oom`); `oom_kill` was added
  in 4.13 and `oom_group_kill` in 5.17. It counts events in the whole subtree unless the
  hierarchy is mounted with `memory_localevents` (5.2).
- v2 `memory.peak` appeared in 5.19; v2 `memory.swap.max` in 4.8.
- Charges stay where they were made: a process that joins a group brings along only what
  it charges from then on. v1 `memory.move_charge_at_immigrate` moved earlier charges with
  it; Linux 6.2 deprecated that (a warning) and 6.13 removed it (a non-zero write fails with
  EINVAL). v2 never moves charges. So the per-worker group's peak counts only what the
  worker charged after it joined: the nanny moves it in right after the spawn, and says
  how large it already was (`process_rss`).

Example (this machine, cgroup v1):

    >>> info = detect()
    >>> info.version, info.path                              # doctest: +SKIP
    (1, '/sys/fs/cgroup/memory/process_api/e4e5bf...')
    >>> read_memory_counters(info.path, info.version).oom_kill  # doctest: +SKIP
    0
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import os
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._exceptions import CgroupError

# v1 reports "no limit" as PAGE_COUNTER_MAX * PAGE_SIZE (9223372036854771712 with 4 KiB pages;
# larger pages round differently), so anything this big means unlimited.
V1_UNLIMITED = 2**62
KMSG_RECORD = 8192  # /dev/kmsg returns EINVAL when the buffer is smaller than one record.


@dataclass(frozen=True)
class MemoryCounters:
    """One reading of a memory cgroup's OOM counters and sizes (bytes).

    `failcnt` is v1 `memory.failcnt` (times usage hit the limit) and, on v2, the `max` line
    of `memory.events` (times usage was about to exceed `memory.max`): the nearest v2 count.
    `oom` and `oom_group_kill` exist only on v2 (v1 `under_oom` is a state, not a count).

    >>> MemoryCounters(1, "/g", 0, None, None, 0, 10, None, 5, ()).to_dict()["usage"]
    5
    """

    version: int
    path: str
    oom_kill: int | None
    oom: int | None
    oom_group_kill: int | None
    failcnt: int | None
    peak: int | None
    limit: int | None
    usage: int | None
    missing: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["missing"] = list(self.missing)
        return d


@dataclass(frozen=True)
class CgroupInfo:
    """Where this process's memory cgroup is. `reason` says why, when it is not available.

    >>> CgroupInfo(None, None, None, "no memory controller").version is None
    True
    """

    version: int | None
    memory_root: str | None
    path: str | None
    reason: str = ""


# ---------------------------------------------------------------- small file helpers


def join_root(root: str, path: str) -> str:
    """`path` (absolute or not) inside the filesystem root `root`."""
    return os.path.join(root, path.lstrip("/"))


def read_text(path: str) -> tuple[str | None, str]:
    """(text, "") or (None, short reason)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(), ""
    except FileNotFoundError:
        return None, "not found"
    except PermissionError:
        return None, "permission denied"
    except OSError as e:
        return None, f"unreadable ({errno.errorcode.get(e.errno or 0, e.errno)})"


def _write(path: str, value: str) -> None:
    # One write() per value: cgroup files take one value per write call.
    with open(path, "w") as f:
        f.write(value)


def _short(text: str) -> str:
    text = text.strip()
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _int_file(directory: str, name: str, missing: list[str]) -> int | None:
    text, why = read_text(os.path.join(directory, name))
    if text is None:
        missing.append(f"{name}: {why}")
        return None
    try:
        return int(text.strip())
    except ValueError:
        missing.append(f"{name}: garbled {_short(text)}")
        return None


def _keyed_file(directory: str, name: str, missing: list[str]) -> dict[str, int] | None:
    """`key value` lines (memory.events, memory.oom_control); garbled lines are skipped."""
    text, why = read_text(os.path.join(directory, name))
    if text is None:
        missing.append(f"{name}: {why}")
        return None
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                pass
    return out


def _field(d: dict[str, int] | None, name: str, key: str, since: str, missing: list[str]):
    if d is None:
        return None
    if key not in d:
        missing.append(f"{name} {key}: absent or garbled" + (f" ({since})" if since else ""))
        return None
    return d[key]


# ---------------------------------------------------------------- counters


def read_memory_counters(path: str, version: int) -> MemoryCounters:
    """Read a memory cgroup directory's counters; never raises for missing or bad files.

    >>> c = read_memory_counters("/nonexistent", 2)
    >>> c.usage is None and "memory.current: not found" in c.missing
    True
    """
    missing: list[str] = []
    if version == 1:
        oc = _keyed_file(path, "memory.oom_control", missing)
        oom_kill = _field(oc, "memory.oom_control", "oom_kill", "Linux < 4.13?", missing)
        failcnt = _int_file(path, "memory.failcnt", missing)
        peak = _int_file(path, "memory.max_usage_in_bytes", missing)
        limit = _int_file(path, "memory.limit_in_bytes", missing)
        return MemoryCounters(
            version=1,
            path=path,
            oom_kill=oom_kill,
            oom=None,  # under_oom is a state (0/1), not a count
            oom_group_kill=None,  # v2 only (memory.oom.group)
            failcnt=failcnt,
            peak=peak,
            limit=None if limit is None or limit >= V1_UNLIMITED else limit,
            usage=_int_file(path, "memory.usage_in_bytes", missing),
            missing=tuple(missing),
        )
    ev = _keyed_file(path, "memory.events", missing)
    limit = None
    text, why = read_text(os.path.join(path, "memory.max"))
    if text is None:
        missing.append(f"memory.max: {why}")
    elif text.strip() != "max":
        try:
            limit = int(text.strip())
        except ValueError:
            missing.append(f"memory.max: garbled {_short(text)}")
    return MemoryCounters(
        version=2,
        path=path,
        oom_kill=_field(ev, "memory.events", "oom_kill", "Linux < 4.13?", missing),
        oom=_field(ev, "memory.events", "oom", "", missing),
        oom_group_kill=_field(ev, "memory.events", "oom_group_kill", "Linux < 5.17?", missing),
        failcnt=_field(ev, "memory.events", "max", "", missing),
        peak=_int_file(path, "memory.peak", missing),  # Linux 5.19+
        limit=limit,
        usage=_int_file(path, "memory.current", missing),
        missing=tuple(missing),
    )


def read_oom_kill(path: str, version: int) -> int | None:
    """Just the group's ``oom_kill`` count (None when unreadable): the nanny's cheap
    periodic reading, so a death is compared with a reading a moment old, not with the
    worker's start.

    On v2 a group holding processes is always a leaf (no internal processes), so its
    ``memory.events`` and ``memory.events.local`` agree; the former exists on more kernels.

    >>> read_oom_kill("/nonexistent", 2) is None
    True
    """
    name = "memory.oom_control" if version == 1 else "memory.events"
    text, _ = read_text(os.path.join(path, name))
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "oom_kill" and parts[1].isdigit():
            return int(parts[1])
    return None


def group_pids(path: str) -> list[int]:
    """The processes in a cgroup (``cgroup.procs``); [] when unreadable.

    >>> group_pids("/nonexistent")
    []
    """
    return _procs(path)


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


# ---------------------------------------------------------------- detection

_OCTAL = re.compile(r"\\([0-7]{3})")


def unescape_mount(field: str) -> str:
    """A mountinfo or /proc/mounts field, its escapes undone."""
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def _mounts(proc: str) -> list[tuple[str, str, str, list[str]]]:
    """(mount root, mount point, fstype, super options) from mountinfo, else /proc/mounts."""
    out = []
    text, _ = read_text(os.path.join(proc, "mountinfo"))
    if text is not None:
        for line in text.splitlines():
            left, sep, right = line.partition(" - ")
            lf, rf = left.split(), right.split()
            if sep and len(lf) >= 5 and len(rf) >= 3:
                out.append((unescape_mount(lf[3]), unescape_mount(lf[4]), rf[0], rf[2].split(",")))
        return out
    # /proc/mounts has no mount-root column: assume the whole hierarchy is mounted.
    text, _ = read_text(os.path.join(os.path.dirname(proc), "mounts"))
    for line in (text or "").splitlines():
        f = line.split()
        if len(f) >= 4:
            out.append(("/", unescape_mount(f[1]), f[2], f[3].split(",")))
    return out


def _relative(cg_path: str, mount_root: str) -> str | None:
    """The cgroup path below a mount whose root is `mount_root`, or None if outside it."""
    if mount_root == "/":
        return cg_path
    if cg_path == mount_root or cg_path.startswith(mount_root.rstrip("/") + "/"):
        return cg_path[len(mount_root.rstrip("/")) :] or "/"
    return None


def detect(pid: int | str = "self", root: str = "/") -> CgroupInfo:
    """Find the memory cgroup of `pid`: version, mount point and directory on disk.

    A v1 line naming `memory` in /proc/<pid>/cgroup wins over the `0::` line (hybrid
    systems have both). The mount point comes from mountinfo, never assumed. Under a cgroup
    namespace the path is `/` and the mount root is `/`, so the group is the mount point.

    >>> detect(root="/nonexistent").reason
    '/proc/self/cgroup: not found'
    """
    proc = join_root(root, f"proc/{pid}")
    text, why = read_text(os.path.join(proc, "cgroup"))
    if text is None:
        return CgroupInfo(None, None, None, f"/proc/{pid}/cgroup: {why}")
    v1_path = v2_path = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "memory" in parts[1].split(","):
            v1_path = parts[2]
        elif parts[0] == "0" and parts[1] == "":
            v2_path = parts[2]
    if v1_path is not None:
        version, cg_path = 1, v1_path
        want = lambda fstype, opts: fstype == "cgroup" and "memory" in opts  # noqa: E731
    elif v2_path is not None:
        version, cg_path = 2, v2_path
        want = lambda fstype, opts: fstype == "cgroup2"  # noqa: E731
    else:
        return CgroupInfo(None, None, None, f"no memory controller in /proc/{pid}/cgroup")
    if "/.." in cg_path or cg_path.startswith(".."):
        # The process sits outside our cgroup namespace; its group is not visible here.
        return CgroupInfo(version, None, None, f"cgroup {cg_path!r} is outside this namespace")
    candidates = [m for m in _mounts(proc) if want(m[2], m[3])]
    if not candidates:
        kind = "cgroup v1 memory" if version == 1 else "cgroup2"
        return CgroupInfo(version, None, None, f"no {kind} mount in /proc/{pid}/mountinfo")
    for mount_root, mount_point, _, _ in candidates:
        rel = _relative(cg_path, mount_root)
        if rel is not None:
            break
    else:
        return CgroupInfo(version, None, None, f"cgroup {cg_path!r} is not below any mount")
    memory_root = join_root(root, mount_point)
    path = os.path.normpath(join_root(memory_root, rel))
    if version == 2:
        ctl, _ = read_text(os.path.join(memory_root, "cgroup.controllers"))
        if ctl is not None and "memory" not in ctl.split():
            return CgroupInfo(2, memory_root, path, "cgroup v2 without the memory controller")
    if not os.path.isdir(path):
        return CgroupInfo(version, memory_root, None, f"cgroup directory {path} not found")
    return CgroupInfo(version, memory_root, path, "")


@functools.lru_cache(maxsize=1)
def _self_info() -> CgroupInfo:
    # Detected once per process; pass `info=` explicitly to use another.
    return detect()


# ---------------------------------------------------------------- kernel log

_KILLED = re.compile(
    r"(?:(?P<scope>Memory cgroup out of memory|Out of memory(?: \([^)]*\))?): )?"
    r"Killed process (?P<pid>\d+) \((?P<comm>.{0,16}?)\)(?= total-vm|,|\s*$)(?P<rest>.*)"
)
# Older kernels name the victim first ("... Kill process N (comm) score S or sacrifice child")
# and print a bare "Killed process" line after it.
_KILL = re.compile(
    r"(?P<scope>Memory cgroup out of memory|Out of memory)[^:]*: Kill process (?P<pid>\d+)"
)
# Linux 4.19+ prints "oom-kill:constraint=CONSTRAINT_MEMCG,...,task_memcg=/x,task=comm,pid=N,uid=0".
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


# ---------------------------------------------------------------- per-worker child groups


def _procs(path: str) -> list[int]:
    text, _ = read_text(os.path.join(path, "cgroup.procs"))
    return [int(x) for x in (text or "").split() if x.isdigit()]


def _child_parent(info: CgroupInfo) -> tuple[str | None, str]:
    """Directory under which per-worker groups go, or (None, why not).

    v1: our own group. v2: our own group if it can enable `+memory` for children; v2's "no
    internal processes" rule forbids that while it holds processes (except the real root),
    so then a *leaf sibling* under our parent is used when the parent is delegated to us,
    memory-enabled and writable, e.g. the nanny runs in `/nanny` inside a cgroup namespace.
    """
    if info.version is None or info.path is None:
        return None, info.reason or "no memory cgroup"
    own = info.path
    if info.version == 1:
        return own, ""
    sc, why = read_text(os.path.join(own, "cgroup.subtree_control"))
    if sc is None:
        return None, f"{own}/cgroup.subtree_control: {why}"
    if "memory" in sc.split():
        return own, ""
    is_real_root = not os.path.exists(os.path.join(own, "memory.max"))
    if is_real_root or not _procs(own):
        try:
            _write(os.path.join(own, "cgroup.subtree_control"), "+memory")
            return own, ""
        except OSError as e:
            own_err = f"cannot enable +memory in {own}/cgroup.subtree_control: {e.strerror}"
    else:
        own_err = (
            f"{own} holds processes, and cgroup v2's no-internal-processes rule forbids "
            "enabling +memory for its children"
        )
    parent = os.path.dirname(own)
    if own != info.memory_root and _may_hold_siblings(parent, info.memory_root):
        psc, _ = read_text(os.path.join(parent, "cgroup.subtree_control"))
        if psc and "memory" in psc.split() and os.access(parent, os.W_OK):
            return parent, ""
    return None, (
        f"{own_err}; nor is its parent {parent} a delegated, memory-enabled, writable group. "
        "Run the nanny in a leaf group (e.g. /nanny) below the root of a cgroup namespace "
        "mounted rw, or below a systemd Delegate=yes unit."
    )


def _may_hold_siblings(parent: str, memory_root: str | None) -> bool:
    # Only where the operator handed the subtree to us: the root of what we can see (a cgroup
    # namespace root, or the host root), or a group systemd marked delegated with the
    # trusted.delegate / user.delegate xattr (systemd 251+). Never a kubelet-managed pod
    # slice: a foreign group there would block its removal.
    if parent == memory_root:
        return True
    for attr in ("trusted.delegate", "user.delegate"):
        try:
            if os.getxattr(parent, attr) == b"1":
                return True
        except OSError:
            continue
    return False


class ChildGroup:
    """A per-worker memory cgroup under our own (v1) or beside it (v2 leaf sibling).

    >>> g = ChildGroup.create("oomguard-w1", 2 * 2**30)   # doctest: +SKIP
    >>> g.add_pid(worker_pid); g.counters().oom_kill        # doctest: +SKIP
    0
    >>> g.remove()                                          # doctest: +SKIP
    True
    """

    def __init__(self, path: str, version: int, home: str) -> None:
        self.path = path
        self.version = version
        self.home = home  # our own group: where remove() moves leftover processes

    def __repr__(self) -> str:
        return f"ChildGroup(path={self.path!r}, version={self.version})"

    @classmethod
    def create(cls, name: str, limit: int | None, *, info: CgroupInfo | None = None) -> ChildGroup:
        """mkdir the group and set `limit` bytes (None: no limit); CgroupError when impossible."""
        if not name or "/" in name or name in (".", ".."):
            raise CgroupError(f"name: {name!r} is not a valid cgroup directory name.")
        if limit is not None and (not isinstance(limit, int) or limit <= 0):
            raise CgroupError(f"limit: {limit!r} must be a positive number of bytes or None.")
        info = info or _self_info()
        parent, why = _child_parent(info)
        if parent is None or info.version is None or info.path is None:
            raise CgroupError(f"Cannot create memory cgroup {name!r}: {why}")
        path = os.path.join(parent, name)
        try:
            os.mkdir(path)
        except FileExistsError:
            raise CgroupError(
                f"Memory cgroup {path} already exists; cleanup_stale() removes empty "
                "left-overs of dead runs."
            ) from None
        except OSError as e:
            raise CgroupError(
                f"Cannot create memory cgroup {path}: {e.strerror}. The cgroup filesystem must "
                "be writable (root, or a delegated subtree; not a read-only container mount)."
            ) from None
        group = cls(path, info.version, info.path)
        if info.version == 2 and not os.path.exists(os.path.join(path, "memory.max")):
            group.remove(timeout=1.0)
            raise CgroupError(f"Memory controller is not enabled for children of {parent}.")
        if limit is not None:
            try:
                group._write_limit(limit)
            except OSError as e:
                group.remove(timeout=1.0)
                raise CgroupError(f"Cannot set memory limit {limit} on {path}: {e}") from None
        return group

    def _write_limit(self, limit: int) -> None:
        if self.version == 1:
            _write(os.path.join(self.path, "memory.limit_in_bytes"), str(limit))
            # memsw caps memory+swap (needs swap accounting); equal to the limit, swap cannot
            # absorb the overflow and hide the OOM. It must be written after the memory limit.
            memsw = os.path.join(self.path, "memory.memsw.limit_in_bytes")
            if os.path.exists(memsw):
                _write(memsw, str(limit))
        else:
            _write(os.path.join(self.path, "memory.max"), str(limit))
            swap = os.path.join(self.path, "memory.swap.max")  # Linux 4.8+, with swap accounting
            if os.path.exists(swap):
                _write(swap, "0")

    def set_move_charge(self, on: bool = True) -> tuple[bool, str]:
        """Ask the kernel to move what a process already charged when it joins this group.

        v1 only: `memory.move_charge_at_immigrate` = 3, its anonymous pages (bit 0) and the
        file pages it maps (bit 1), since RSS counts both. (True, "") when the kernel took
        it; (False, why) otherwise. Never raises.
        """
        if self.version != 1:
            return False, (
                "cgroup v2 never moves charges: what a process charged before it joined "
                "stays with its old group"
            )
        name = "memory.move_charge_at_immigrate"
        path = os.path.join(self.path, name)
        if not os.path.exists(path):
            return False, f"{name}: not found"
        try:
            _write(path, "3" if on else "0")
        except OSError as e:
            if e.errno == errno.EINVAL:
                # Linux 6.13 removed charge moving (deprecated since 6.2): only 0 is taken.
                return False, (
                    f"{name} refused (EINVAL): the kernel no longer moves charges "
                    "(removed in Linux 6.13)"
                )
            return False, f"{name} refused: {e.strerror or e}"
        return True, ""

    def add_pid(self, pid: int) -> None:
        """Move process `pid` (all its threads) into the group; CgroupError when refused."""
        try:
            _write(os.path.join(self.path, "cgroup.procs"), str(int(pid)))
        except OSError as e:
            raise CgroupError(f"Cannot move pid {pid} into {self.path}: {e.strerror}") from None

    def counters(self) -> MemoryCounters:
        return read_memory_counters(self.path, self.version)

    def remove(self, timeout: float = 5.0) -> bool:
        """Move leftover processes out, rmdir; retried until `timeout`. Never raises."""
        deadline = time.monotonic() + timeout
        while True:
            if not os.path.isdir(self.path):
                return True
            for pid in _procs(self.path):
                for target in (self.home, os.path.dirname(self.path)):
                    try:
                        _write(os.path.join(target, "cgroup.procs"), str(pid))
                        break
                    except OSError:
                        continue  # ESRCH: already gone; EBUSY (v2 inner node): try the next
            try:
                os.rmdir(self.path)
                return True
            except FileNotFoundError:
                return True
            except OSError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.05)


def can_create_child(info: CgroupInfo | None = None) -> tuple[bool, str]:
    """Probe for real: create and remove a throwaway child group.

    >>> can_create_child(CgroupInfo(None, None, None, "no memory controller"))[0]
    False
    """
    name = f"oomguard-probe-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        group = ChildGroup.create(name, None, info=info)
    except CgroupError as e:
        return False, str(e)
    except Exception as e:  # a probe reports, it does not raise
        return False, f"probe failed: {e!r}"
    if not group.remove(timeout=1.0):
        return False, f"probe group {group.path} could not be removed"
    return True, ""


def cleanup_stale(
    prefix: str = "oomguard-",
    info: CgroupInfo | None = None,
    *,
    stale: Callable[[str], bool] | None = None,
) -> int:
    """Remove empty child groups named `prefix*` (left by dead runs); return how many.

    A group still holding a process is left alone, and so is one `stale(name)` says is
    not stale (e.g. a group another nanny has just made for a live PID). Never raises.

    >>> cleanup_stale(info=CgroupInfo(None, None, None, "none"))
    0
    """
    try:
        parent, _ = _child_parent(info or _self_info())
        names = sorted(os.listdir(parent)) if parent else []
    except OSError:
        return 0
    removed = 0
    for name in names:
        path = os.path.join(parent, name)
        if (
            name.startswith(prefix)
            and (stale is None or stale(name))
            and os.path.isdir(path)
            and not _procs(path)
        ):
            try:
                os.rmdir(path)
                removed += 1
            except OSError:
                pass  # not empty after all, or gone already
    return removed
