"""The host around a worker, as its nanny reads it: host memory and pressure, systemd-oomd's
counting xattrs on the worker's cgroup and its ancestors, and the SLURM job it runs in.

Everything here reads /proc, cgroupfs or xattrs only, never raises, and turns what it
cannot read into None. The filesystem root is a parameter (`root="/"`) for fixture trees.
The userspace killers on the host are found in `killers`.

Readings taken every sample interval are cheap by construction (benchmarks/
bench_group_reading.py): `HostMeter` keeps /proc/meminfo and /proc/pressure/memory open and
reads their first bytes with one pread each; `OomdXattrs` finds the group's ancestors once
and lists each one's xattrs with one syscall.
"""

from __future__ import annotations

import os
import time
from typing import Any

from .cgroup.files import join_root

# The first three lines of /proc/meminfo (MemTotal, MemFree, MemAvailable, in this order
# since Linux 3.14) fit in 128 bytes; PSI's two lines in 256.
_MEMINFO_HEAD = 256
_PSI_SIZE = 256
OOMD_OOMS = "user.oomd_ooms"  # systemd-oomd: times it acted on this group
OOMD_KILL = "user.oomd_kill"  # systemd-oomd: processes it killed there (src/oom/oomd-util.c)
_ENVIRON_MAX = 256 * 1024


def _meminfo(data: bytes) -> tuple[int | None, int | None]:
    """(MemTotal, MemAvailable) in bytes from /proc/meminfo's head; None where missing."""
    total = available = None
    for line in data.split(b"\n"):
        key, _, rest = line.partition(b":")
        if key == b"MemTotal" or key == b"MemAvailable":
            parts = rest.split()
            if parts and parts[0].isdigit():
                value = int(parts[0]) * (1024 if parts[1:2] == [b"kB"] else 1)
                if key == b"MemTotal":
                    total = value
                else:
                    available = value
            if total is not None and available is not None:
                break
    return total, available


def _psi(data: bytes | None) -> tuple[float | None, float | None]:
    """avg10 of the `some` and `full` lines of /proc/pressure/memory (Linux 4.20+)."""
    out: dict[bytes, float] = {}
    for line in (data or b"").split(b"\n"):
        kind, _, rest = line.partition(b" ")
        for field in rest.split():
            if field.startswith(b"avg10="):
                try:
                    out[kind] = float(field[6:])
                except ValueError:
                    pass
    return out.get(b"some"), out.get(b"full")


def _open(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _pread(fd: int | None, size: int) -> bytes | None:
    if fd is None:
        return None
    try:
        return os.pread(fd, size, 0)
    except OSError:
        return None


class HostMeter:
    """The host's memory and memory pressure, read again and again through open files.

    >>> with HostMeter("/nonexistent") as meter:
    ...     sorted(meter.read().items())[:2]
    [('available', None), ('psi_full10', None)]
    """

    def __init__(self, root: str = "/") -> None:
        self._meminfo = _open(join_root(root, "proc/meminfo"))
        self._psi = _open(join_root(root, "proc/pressure/memory"))

    def read(self) -> dict[str, Any]:
        """{"time", "total", "available" (MemAvailable), "psi_some10", "psi_full10"}."""
        data = _pread(self._meminfo, _MEMINFO_HEAD)
        total, available = _meminfo(data) if data else (None, None)
        some, full = _psi(_pread(self._psi, _PSI_SIZE))
        return {
            "time": time.time(),
            "total": total,
            "available": available,
            "psi_some10": some,
            "psi_full10": full,
        }

    @property
    def has_psi(self) -> bool:
        return self._psi is not None

    def close(self) -> None:
        for fd in (self._meminfo, self._psi):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._meminfo = self._psi = None

    def __enter__(self) -> HostMeter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def host_reading(root: str = "/") -> dict[str, Any]:
    """One reading of the host's memory: `HostMeter.read` through freshly opened files.

    >>> host_reading("/nonexistent")["total"] is None
    True
    """
    with HostMeter(root) as meter:
        return meter.read()


# --- systemd-oomd's xattrs ---------------------------------------------------------------


def cgroup_chain(path: str) -> list[str]:
    """`path` and each ancestor directory up to its cgroup mount's root (the last one that
    still has `cgroup.procs`); empty when `path` is not a cgroup directory."""
    chain: list[str] = []
    path = os.path.normpath(path)
    while len(chain) < 64 and os.path.exists(os.path.join(path, "cgroup.procs")):
        chain.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return chain


def _xattr_int(path: str, name: str) -> int | None:
    try:
        text = os.getxattr(path, name, follow_symlinks=False)
    except OSError:
        return None
    try:
        value = int(text.strip(b"\0 \n").decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    return value if value >= 0 else None


def _sum_xattrs(chain: list[str]) -> dict[str, int | None]:
    """Sums of user.oomd_ooms and user.oomd_kill over `chain`.

    An attribute a readable group lacks counts 0, as systemd reads it (ENODATA is 0 in
    src/core/cgroup.c unit_check_oomd_kill, and oomd-util.c increments from 0): systemd-oomd
    creates it at its first kill there. None when the group itself (chain[0]) cannot be read
    (gone, no xattr support, permission); an unreadable ancestor is left out.
    """
    ooms = kill = 0
    for i, path in enumerate(chain):
        try:
            names = os.listxattr(path, follow_symlinks=False)
        except OSError:
            if i == 0:
                return {"ooms": None, "kill": None}
            continue
        if OOMD_OOMS in names:
            ooms += _xattr_int(path, OOMD_OOMS) or 0
        if OOMD_KILL in names:
            kill += _xattr_int(path, OOMD_KILL) or 0
    if not chain:
        return {"ooms": None, "kill": None}
    return {"ooms": ooms, "kill": kill}


def oomd_xattrs(cgroup_path: str | None) -> dict[str, int | None]:
    """{"ooms", "kill"}: systemd-oomd's counts on the group and every ancestor, summed.

    >>> oomd_xattrs("/nonexistent")
    {'ooms': None, 'kill': None}
    """
    try:
        return _sum_xattrs(cgroup_chain(cgroup_path) if cgroup_path else [])
    except Exception:
        return {"ooms": None, "kill": None}


class OomdXattrs:
    """`oomd_xattrs` for one group, its ancestors found once (at the worker's start)."""

    def __init__(self, cgroup_path: str) -> None:
        self.path = cgroup_path
        self._chain = cgroup_chain(cgroup_path)

    def read(self) -> dict[str, int | None]:
        try:
            return _sum_xattrs(self._chain)
        except Exception:
            return {"ooms": None, "kill": None}


# --- the worker's environment ------------------------------------------------------------


def slurm_environment(pid: int, root: str = "/") -> dict[str, str | None]:
    """SLURM_JOB_ID and SLURM_STEP_ID from /proc/PID/environ (its environment at exec),
    None where absent or unreadable.

    >>> slurm_environment(1, root="/nonexistent")
    {'slurm_job_id': None, 'slurm_step_id': None}
    """
    out: dict[str, str | None] = {"slurm_job_id": None, "slurm_step_id": None}
    try:
        with open(join_root(root, f"proc/{int(pid)}/environ"), "rb") as f:
            data = f.read(_ENVIRON_MAX)
    except (OSError, ValueError):
        return out
    want = {b"SLURM_JOB_ID": "slurm_job_id", b"SLURM_STEP_ID": "slurm_step_id"}
    for entry in data.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name in want:
            text = value[:64].decode("utf-8", "replace")
            out[want[name]] = "".join(c for c in text if c.isprintable()) or None
    return out
