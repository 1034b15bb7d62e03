"""What the ledger reads of the host, from /proc and /sys: whether a lease holder is alive,
its RSS, and the memory available now (the host's MemAvailable, or what a memory cgroup the
workers share has left). Missing files are not errors: a reading is None.
"""

from __future__ import annotations

import os

from .._host import cgroup as _cgroup
from .._units import NO_LIMIT

PAGE = os.sysconf("SC_PAGE_SIZE")


#: `alive`'s start for a holder whose start time is not recorded (a waiting request).
ANY = -1


def _proc_stat(pid: int) -> tuple[int, str, int, int] | None:
    """(start time in clock ticks, state letter, RSS bytes, owner uid) from one read of
    /proc/<pid>/stat (fields 22, 3 and 24; the file's owner is the process's); None when
    the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
            uid = os.fstat(f.fileno()).st_uid
        fields = data.rsplit(b")", 1)[1].split()
        return int(fields[19]), fields[0].decode(), int(fields[21]) * PAGE, uid
    except (OSError, IndexError, ValueError):
        return None


def proc_start(pid: int) -> int | None:
    info = _proc_stat(pid)
    return None if info is None else info[0]


def rss(pid: int) -> int | None:
    info = _proc_stat(pid)
    return None if info is None else info[2]


def alive(pid: int, start: int | None) -> tuple[bool, int | None]:
    """(alive, its RSS) for a lease holder; a reused PID (other start time) or a zombie
    (killed, not yet reaped: kill(0) still succeeds) is dead, and so is what cannot be an
    oomguard process sharing this ledger: a process of another user (the file is private
    to one), or a lease without the start time every writer records (`start` None while
    /proc shows one). `start` ANY: a waiting request, which records none."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone, or another user's
        return False, None
    except OSError:
        return False, None
    info = _proc_stat(pid)
    if info is None:
        return True, None  # no /proc (another mount namespace): trust kill(0)
    now, state, rss, uid = info
    if uid != os.geteuid() or state in ("Z", "X"):
        return False, rss
    return (start == ANY or now == start), rss


def holds_open(pid: int, fd: int) -> bool:
    """Whether process `pid` has the file open that our descriptor `fd` names: every
    process with a lease keeps the ledger open. For PID 1, always alive, whose lease
    (a container's nanny) is only believed when it does."""
    try:
        mine = os.readlink(f"/proc/self/fd/{fd}")
        fds = f"/proc/{pid}/fd"
        for name in os.listdir(fds):
            try:
                if os.readlink(f"{fds}/{name}") == mine:
                    return True
            except OSError:
                continue
    except OSError:
        pass
    return False


def total_memory() -> int | None:
    """MemTotal of the host, bytes (a bound on any sane lease); None if unreadable."""
    try:
        with open("/proc/meminfo", "rb") as f:
            text = f.read(4096)
        at = text.index(b"MemTotal:")
        return int(text[at + 9 : text.index(b"kB", at)]) * 1024
    except (OSError, ValueError):
        return _cgroup.host_memory().get("total")


class _Kept:
    """A small file kept open and re-read with pread: every grant reads `available` now,
    and an open() per reading would cost more than the decision. Closed with its owner
    (a worker started and closed in-process gives back every descriptor it took)."""

    def __init__(self, path: str) -> None:
        self.path, self.fd = path, None

    def read(self, size: int = 64) -> bytes:
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        return os.pread(self.fd, size, 0)

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


class HostAvailable:
    """MemAvailable of the host, bytes, each call; None when unreadable (then a lease is
    granted only when no other is held). `close()` gives back its descriptor."""

    def __init__(self) -> None:
        self._meminfo = _Kept("/proc/meminfo")

    def __call__(self) -> int | None:
        try:
            text = self._meminfo.read(4096)
            at = text.index(b"MemAvailable:")
            return int(text[at + 13 : text.index(b"kB", at)]) * 1024
        except (OSError, ValueError):
            return _cgroup.host_memory().get("available")

    def close(self) -> None:
        self._meminfo.close()


def host_available() -> int | None:
    """MemAvailable of the host now, one read (a ledger keeps a `HostAvailable` open)."""
    available = HostAvailable()
    try:
        return available()
    finally:
        available.close()


class CgroupAvailable(HostAvailable):
    """`available` for workers sharing one memory cgroup: limit - usage of that group
    (the host's MemAvailable when the group has no limit or cannot be read).

    >>> avail = CgroupAvailable("/sys/fs/cgroup/memory/workers")  # doctest: +SKIP
    """

    def __init__(self, path: str, version: int | None = None) -> None:
        super().__init__()
        if version is None:
            version = 2 if os.path.exists(os.path.join(path, "memory.max")) else 1
        names = (
            ("memory.max", "memory.current")
            if version == 2
            else ("memory.limit_in_bytes", "memory.usage_in_bytes")
        )
        self._limit, self._usage = (_Kept(os.path.join(path, n)) for n in names)

    def __call__(self) -> int | None:
        try:
            raw = self._limit.read().strip()
            usage = int(self._usage.read())
            limit = None if raw == b"max" else int(raw)
        except (OSError, ValueError):
            return super().__call__()
        if limit is None or limit >= NO_LIMIT:
            return super().__call__()
        return max(0, limit - usage)

    def close(self) -> None:
        super().close()
        self._limit.close()
        self._usage.close()
