"""A memory cgroup's counters (OOM kills, failcnt, peak, limit, usage) and the processes it
holds, read from its directory; what is missing or garbled is listed, never raised."""

from __future__ import annotations

import os

from ..._death.record import MemoryCounters
from ..._units import NO_LIMIT
from .files import read_text


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
            limit=None if limit is None or limit >= NO_LIMIT else limit,
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
    text, _ = read_text(os.path.join(path, oom_kill_file(version)))
    return parse_oom_kill(text)


def oom_kill_file(version: int) -> str:
    """The file that holds a group's ``oom_kill`` count."""
    return "memory.oom_control" if version == 1 else "memory.events"


def parse_oom_kill(text: str | None) -> int | None:
    """The ``oom_kill`` line of `oom_kill_file`'s text."""
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
    text, _ = read_text(os.path.join(path, "cgroup.procs"))
    return [int(x) for x in (text or "").split() if x.isdigit()]
