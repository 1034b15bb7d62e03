"""A worker process's life as its nanny sees it: what is known of it from its start, and
the latest reading of its memory group and of the host, against which its death is judged.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from .._death.record import Environment, MemoryCounters
from .._host import cgroup as _cgroup
from .._host.readings import HostMeter, OomdXattrs


@dataclass
class _Life:
    """What the nanny knows of one worker process while it lives."""

    pid: int
    started: float
    address: str | None
    name: str
    memory_limit: int | None
    group: _cgroup.ChildGroup | None = None
    cgroup_path: str | None = None
    cgroup_version: int | None = None
    cgroup_before: MemoryCounters | None = None
    placement: dict | None = None  # _Placement.facts(): what the group's peak covers
    missing: list[str] = field(default_factory=list)
    started_monotonic: float = field(default_factory=time.monotonic)
    reading: _Reading | None = None  # the group's last reading while the worker ran
    host: dict | None = None  # HostMeter.read() at the last reading while it ran
    oomd_watch: OomdXattrs | None = None  # systemd-oomd's xattrs on its group, ancestors
    oomd: dict | None = None  # their sums at the last reading while it ran
    slurm_job: dict | None = None  # slurm_environment(pid), read at its start
    environment: Environment | None = None  # _host.environment.read, at its start
    files: _Files | None = None  # kept open for take_readings; closed by close()

    def close(self) -> None:
        if self.files is not None:
            self.files.close()


@dataclass(frozen=True)
class _Reading:
    """The worker's group, read while the worker was running: its oom_kill count and the
    other processes in it. A death is judged against this, not against the worker's start:
    an OOM kill of another process there before this reading is not this worker's."""

    time: float
    oom_kill: int
    others: tuple[int, ...]

    @classmethod
    def take(cls, life: _Life) -> _Reading | None:
        """None when unreadable, or when the worker is already on its way out (the count
        may then include its own kill)."""
        if life.cgroup_path is None or life.cgroup_version is None:
            return None
        oom_kill = _cgroup.read_oom_kill(life.cgroup_path, life.cgroup_version)
        pids = _cgroup.group_pids(life.cgroup_path)
        if oom_kill is None or not _cgroup.process_running(life.pid):
            return None
        me = os.getpid()
        return cls(time.time(), oom_kill, tuple(p for p in pids if p not in (life.pid, me)))

    def facts(self, death_time: float) -> dict[str, Any]:
        """For the report: how old it is at the death, and whether every other process in
        the group then is still running (if one is not, a kill counted since could be its)."""
        gone = [p for p in self.others if not _cgroup.process_running(p)]
        return {
            "oom_kill": self.oom_kill,
            "age": round(max(death_time - self.time, 0.0), 3),
            "others": len(self.others),
            "others_gone": len(gone),
        }


def take_readings(life: _Life, meter: HostMeter | None) -> None:
    """The nanny's reading every sample interval: the group (`_Reading`), the host's memory
    and pressure, and systemd-oomd's xattrs; kept only while the worker still runs (read
    first, then checked, so a count that includes its own kill is never kept)."""
    files = life.files
    if files is None:
        files = life.files = _Files(life)
    oom_kill = None
    pids: list[int] = []
    if life.cgroup_path is not None and life.cgroup_version is not None:
        text = files.read(files.oom_kill)
        oom_kill = _cgroup.parse_oom_kill(text.decode("ascii", "replace") if text else None)
        pids = _cgroup.group_pids(life.cgroup_path)  # reopened: v1 caches an open list
    host = meter.read() if meter is not None else None
    oomd = life.oomd_watch.read() if life.oomd_watch is not None else None
    stat = files.read(files.stat)
    if stat is None or not _cgroup.stat_running(stat):
        return
    now = time.time()
    if oom_kill is not None:
        me = os.getpid()
        life.reading = _Reading(now, oom_kill, tuple(p for p in pids if p not in (life.pid, me)))
    if host is not None:
        before = life.host
        if (
            before is not None
            and _both(before, host, "available")
            and host["time"] > before["time"]
        ):
            # How fast MemAvailable moves (bytes/s; falling < 0): a userspace OOM killer
            # can act between two readings (`_death.memory_killer`).
            host["available_rate"] = (host["available"] - before["available"]) / (
                host["time"] - before["time"]
            )
        life.host = host
    if oomd is not None:
        life.oomd = oomd


def _both(a: dict, b: dict, key: str) -> bool:
    return a.get(key) is not None and b.get(key) is not None


class _Files:
    """The files `take_readings` reads each time, kept open: a pread costs a few µs where
    an open() costs ~15 (benchmarks/bench_group_reading.py). The open /proc/PID/stat stays
    the worker's own: once it is reaped a read fails (ESRCH), a recycled PID never answers.
    """

    def __init__(self, life: _Life) -> None:
        self.stat = _open(f"/proc/{int(life.pid)}/stat")
        self.oom_kill = None
        if life.cgroup_path is not None and life.cgroup_version is not None:
            name = _cgroup.oom_kill_file(life.cgroup_version)
            self.oom_kill = _open(os.path.join(life.cgroup_path, name))

    @staticmethod
    def read(fd: int | None) -> bytes | None:
        if fd is None:
            return None
        try:
            return os.pread(fd, 4096, 0)
        except OSError:
            return None

    def close(self) -> None:
        for fd in (self.stat, self.oom_kill):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.stat = self.oom_kill = None

    def __del__(self) -> None:
        self.close()


def _open(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
