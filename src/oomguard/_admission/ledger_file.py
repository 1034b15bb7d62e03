"""The ledger's file: one small JSON object, `{"version": 1, "leases": [...], "peaks":
{prefix: bytes}, "queue": [...]}`, read and rewritten in place under an exclusive
`fcntl.flock` (held for tens of microseconds). `flock` on one shared descriptor does not
exclude threads: a process's callers serialise their own (HostLedger holds a thread lock
around every update).

Crash-safe writes, in place (issue 28). The new JSON is padded with spaces to the old
length (JSON allows trailing whitespace), so one write replaces the whole old text and
never leaves a tail of it; only then is the file shrunk. A kill between the write and the
shrink (where an OOM kill lands) leaves valid JSON followed by blanks (up to `SLACK` of
them are kept: growing back into them costs nothing). A file that grows
first reserves its new length (`posix_fallocate`): a full disk fails the update before a
byte is written, the old state intact; short writes are looped on. Why not write-and-rename:
every process keeps its descriptor open (an open() per access doubles the cost) and locks
on it, so a rename would need a second, stable lock file, an open per access and directory
writes; in place keeps one file and one descriptor. What stays possible: a writer killed
in the middle of a write larger than a page (the kernel stops between pages on a fatal
signal), or a foreign writer. Such a torn file is logged once per process and rebuilt: each
process puts back, on its next access, the leases it holds (HostLedger keeps them in memory)
and the peaks it last read; a process that does not access the ledger meanwhile (a task
running under its lease) is not counted until it does.

The lock is never waited for without bound: `LOCK_NB`, retried for at most `wait` seconds,
then BlockingIOError (another process holds it: a stopped worker, or anything that can open
the file). The callers run on event loops; what they do instead is HostLedger's.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from collections.abc import Callable

from .. import _private

#: The file format's version; a file of another version is not ours and starts over.
VERSION = 1
#: Per-prefix peaks kept in the file; the least recently seen beyond this are dropped.
MAX_PEAKS = 512
#: The peaks entry for worker start-ups (nannies' start-up leases), beside task prefixes.
STARTUP_PEAK = "oomguard:worker-start-up"
#: How long an update may wait for the lock by default (seconds): a few times the longest
#: hold seen under load, small beside an event loop's tick.
LOCK_WAIT = 0.005
#: Trailing blanks kept after a shrink (bytes): a file that grows back into them needs no
#: reservation, and one that shrinks by less needs no truncate.
SLACK = 4096


class LedgerFile:
    """One process's handle on a ledger file, its descriptor kept open between updates."""

    def __init__(self, path: str) -> None:
        self._fd: int | None = None  # kept open: an open() per access doubles its cost
        directory = os.path.dirname(path)
        if directory:  # refused when another user could reach it: a private one instead
            directory = _private.private_dir(directory, "memory ledger directory")
            path = os.path.join(directory, os.path.basename(path))
        self.path = path

    def update(self, mutate: Callable[[dict], bool], wait: float = LOCK_WAIT) -> dict:
        """Read the file under an exclusive lock, let `mutate` change it, write it back
        if it says so (or the file was empty); returns the state, with "torn": True when
        the file held something that is not a ledger. Raises BlockingIOError when the lock
        stays held by another process for `wait` seconds."""
        if self._fd is None:
            self._fd = _private.open_regular(self.path, os.O_RDWR | os.O_CREAT)  # no symlink
        fd = self._fd
        _lock(fd, wait)
        try:
            raw = os.pread(fd, 1 << 16, 0)
            while len(raw) % (1 << 16) == 0 and raw:  # a large file: read the rest
                more = os.pread(fd, 1 << 16, len(raw))
                if not more:
                    break
                raw += more
            state = parse(raw)
            dirty = mutate(state) or not raw or raw.isspace()
            torn = state.pop("torn", False)
            if dirty or torn:
                _write(fd, json.dumps(state, separators=(",", ":")).encode(), len(raw))
            if torn:
                state["torn"] = True
            return state
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        fd = self._fd
        if fd is not None:
            self._fd = None
            os.close(fd)


def _lock(fd: int, wait: float) -> None:
    """flock(LOCK_EX) without blocking: retried with a short sleep until `wait` is spent."""
    deadline = None
    pause = 20e-6
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EINTR):
                raise
        if deadline is None:
            deadline = time.monotonic() + wait
        left = deadline - time.monotonic()
        if left <= 0:
            raise BlockingIOError(errno.EWOULDBLOCK, "memory ledger locked by another process")
        time.sleep(min(pause, left))
        pause = min(pause * 2, 1e-3)


def _write(fd: int, data: bytes, old: int) -> None:
    """Replace the file's `old` bytes by `data` so that no moment leaves a torn file."""
    end = len(data)
    if end < old:
        data += b" " * (old - end)  # one write covers the old text: no tail of it
    elif len(data) > old:
        try:
            os.posix_fallocate(fd, 0, len(data))  # a full disk fails here, nothing written
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
    done = os.pwrite(fd, data, 0)
    while done < len(data):  # short writes: go on from where it stopped
        n = os.pwrite(fd, memoryview(data)[done:], done)
        if n <= 0:
            raise OSError(errno.EIO, "memory ledger: short write")
        done += n
    if len(data) - end > SLACK:  # blanks are kept up to SLACK: the next growth is free
        os.ftruncate(fd, end)


def parse(raw: bytes) -> dict:
    # A torn or foreign file starts over empty here; HostLedger puts back what each process
    # holds (its leases, the peaks it read) and logs it once.
    torn = False
    try:
        state = json.loads(raw) if raw and not raw.isspace() else {}
    except ValueError:
        state, torn = {}, True
    if not isinstance(state, dict) or state.get("version") != VERSION:
        torn = torn or bool(state)
        state = {}
    leases = state.get("leases")
    peaks = state.get("peaks")
    queue = state.get("queue")
    return {
        "version": VERSION,
        "leases": [le for le in leases if _entry_ok(le)] if isinstance(leases, list) else [],
        "peaks": peaks if isinstance(peaks, dict) else {},
        "queue": [q for q in queue if _entry_ok(q, timed=True)] if isinstance(queue, list) else [],
        "torn": torn,
    }


def _entry_ok(entry, timed: bool = False) -> bool:
    """A lease [pid, key, need, base, start], or (`timed`) a waiting request
    [pid, key, need, asking since, asked last] (times from time.time())."""
    return (
        isinstance(entry, list)
        and len(entry) == 5
        and type(entry[0]) is int
        and entry[0] > 0
        and isinstance(entry[1], str)
        and type(entry[2]) is int
        and entry[2] >= 0
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
