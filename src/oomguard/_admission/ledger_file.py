"""The ledger's file: one small JSON object, `{"version": 1, "leases": [...], "peaks":
{prefix: bytes}, "queue": [...]}`, read and rewritten in place under an exclusive
`fcntl.flock` (held for tens of microseconds). A torn or foreign file starts over empty.
`flock` on one shared descriptor does not exclude threads: a process's callers serialise
their own (HostLedger holds a thread lock around every update).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable

from .. import _private

#: The file format's version; a file of another version is not ours and starts over.
VERSION = 1
#: Per-prefix peaks kept in the file; the least recently seen beyond this are dropped.
MAX_PEAKS = 512
#: The peaks entry for worker start-ups (nannies' start-up leases), beside task prefixes.
STARTUP_PEAK = "oomguard:worker-start-up"


class LedgerFile:
    """One process's handle on a ledger file, its descriptor kept open between updates."""

    def __init__(self, path: str) -> None:
        self._fd: int | None = None  # kept open: an open() per access doubles its cost
        directory = os.path.dirname(path)
        if directory:  # refused when another user could reach it: a private one instead
            directory = _private.private_dir(directory, "memory ledger directory")
            path = os.path.join(directory, os.path.basename(path))
        self.path = path

    def update(self, mutate: Callable[[dict], bool]) -> dict:
        """Read the file under an exclusive lock, let `mutate` change it, write it back
        if it says so (or the file was empty); returns the state."""
        if self._fd is None:
            self._fd = _private.open_regular(self.path, os.O_RDWR | os.O_CREAT)  # no symlink
        fd = self._fd
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            raw = os.pread(fd, 1 << 16, 0)
            while len(raw) % (1 << 16) == 0 and raw:  # a large file: read the rest
                more = os.pread(fd, 1 << 16, len(raw))
                if not more:
                    break
                raw += more
            state = parse(raw)
            dirty = mutate(state) or not raw
            if dirty:
                data = json.dumps(state, separators=(",", ":")).encode()
                os.pwrite(fd, data, 0)
                if len(data) < len(raw):
                    os.ftruncate(fd, len(data))
            return state
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        fd = self._fd
        if fd is not None:
            self._fd = None
            os.close(fd)


def parse(raw: bytes) -> dict:
    # A torn or foreign file starts over empty: losing leases only errs towards admitting.
    try:
        state = json.loads(raw) if raw else {}
    except ValueError:
        state = {}
    if not isinstance(state, dict) or state.get("version") != VERSION:
        state = {}
    leases = state.get("leases")
    peaks = state.get("peaks")
    queue = state.get("queue")
    return {
        "version": VERSION,
        "leases": [le for le in leases if _entry_ok(le)] if isinstance(leases, list) else [],
        "peaks": peaks if isinstance(peaks, dict) else {},
        "queue": [q for q in queue if _entry_ok(q, timed=True)] if isinstance(queue, list) else [],
    }


def _entry_ok(entry, timed: bool = False) -> bool:
    """A lease [pid, key, need, base, start], or (`timed`) a waiting request
    [pid, key, need, asking since, asked last] (times from time.time())."""
    return (
        isinstance(entry, list)
        and len(entry) == 5
        and isinstance(entry[0], int)
        and isinstance(entry[1], str)
        and isinstance(entry[2], int)
        and (not timed or all(isinstance(t, (int, float)) for t in entry[3:]))
    )


def record_peak(state: dict, peak: tuple[str, int] | None) -> bool:
    """Record `peak` = (prefix, bytes) in `state`: the larger of it and the prefix's peak,
    now the most recently seen. True when there was a peak to record."""
    if peak is None:
        return False
    prefix, nbytes = peak
    peaks = state["peaks"]
    old = peaks.pop(prefix, 0)  # re-insert: dict order is recency, oldest dropped first
    peaks[prefix] = max(int(old) if isinstance(old, int) else 0, int(nbytes))
    while len(peaks) > MAX_PEAKS:
        peaks.pop(next(iter(peaks)))
    return True
