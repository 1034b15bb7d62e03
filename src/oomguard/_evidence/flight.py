"""The flight recorder: what a worker process was doing, kept where its death cannot erase it.

Nothing runs on SIGKILL, so a kernel OOM kill leaves only what was written before it. The
worker writes into a file-backed shared mapping (`MAP_SHARED`): a store into the mapping
lands in the page cache without a system call, and survives the process. The nanny reads the
file after the death.

Layout (little-endian), one file per worker process:

    header   64 bytes   magic, pid, created, slot count, slot size, sample layout,
                        and which of the two sample buffers is current
    slots    N x 1088   one per executing task: state, start time, key
    samples  2 x S      msgpack blobs written alternately; the header names the complete one

A task slot is written on each transition into or out of "executing": O(1), a few stores into
the mapping. The sampler thread writes the other sample buffer, then flips the header's
`current` field, so a death mid-write leaves the previous sample intact.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from typing import Any

import msgpack

MAGIC = b"OOMGFLT1"
# magic, pid, created, nslots, slot_size, sample_offset, sample_capacity, current, len0, len1
_HEADER = struct.Struct("<8sqdIIQQQQQ")
HEADER_SIZE = 128
# state, start, keylen; then the key bytes
_SLOT = struct.Struct("<BxxxxxxxdH")
KEY_MAX = 1024
SLOT_SIZE = 1088
DEFAULT_SLOTS = 64
DEFAULT_SAMPLE_CAPACITY = 256 * 1024

_EMPTY = 0
_EXECUTING = 1


class FlightRecorder:
    """Writer side, used inside the worker process.

    >>> rec = FlightRecorder.create("/tmp/oomguard/1234.flight")  # doctest: +SKIP
    >>> slot = rec.task_started("('load', 7)")                    # doctest: +SKIP
    >>> rec.task_finished(slot)                                    # doctest: +SKIP
    """

    def __init__(self, path: str, mm: mmap.mmap, fd: int, nslots: int, capacity: int):
        self.path = path
        self._mm = mm
        self._fd = fd
        self._nslots = nslots
        self._capacity = capacity
        self._sample_offset = HEADER_SIZE + nslots * SLOT_SIZE
        self._free = list(range(nslots - 1, -1, -1))
        self._current = 0
        self._lens = [0, 0]
        self.dropped_tasks = 0  # executing tasks beyond the slot count (not recorded)
        self.dropped_samples = 0  # samples larger than a buffer (not recorded)

    @classmethod
    def create(
        cls,
        path: str,
        *,
        nslots: int = DEFAULT_SLOTS,
        sample_capacity: int = DEFAULT_SAMPLE_CAPACITY,
    ) -> FlightRecorder:
        size = HEADER_SIZE + nslots * SLOT_SIZE + 2 * sample_capacity
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        except BaseException:
            os.close(fd)
            raise
        rec = cls(path, mm, fd, nslots, sample_capacity)
        rec._write_header()
        return rec

    def _write_header(self) -> None:
        _HEADER.pack_into(
            self._mm,
            0,
            MAGIC,
            os.getpid(),
            time.time(),
            self._nslots,
            SLOT_SIZE,
            self._sample_offset,
            self._capacity,
            self._current,
            self._lens[0],
            self._lens[1],
        )

    def task_started(self, key: str, start: float | None = None) -> int:
        """Record a task as executing; returns its slot (-1 when every slot is taken)."""
        if not self._free:
            self.dropped_tasks += 1
            return -1
        slot = self._free.pop()
        kb = key.encode("utf-8", "replace")[:KEY_MAX]
        off = HEADER_SIZE + slot * SLOT_SIZE
        # Key first, state last: a reader never sees an executing slot with a stale key.
        self._mm[off + _SLOT.size : off + _SLOT.size + len(kb)] = kb
        _SLOT.pack_into(self._mm, off, _EXECUTING, start or time.time(), len(kb))
        return slot

    def task_finished(self, slot: int) -> None:
        if slot < 0:
            return
        self._mm[HEADER_SIZE + slot * SLOT_SIZE] = _EMPTY
        self._free.append(slot)

    def write_sample(self, sample: dict[str, Any]) -> bool:
        """Write a sample into the buffer that is not current, then make it current."""
        data = msgpack.packb(sample, use_bin_type=True)
        if len(data) > self._capacity:
            self.dropped_samples += 1
            return False
        nxt = 1 - self._current
        off = self._sample_offset + nxt * self._capacity
        self._mm[off : off + len(data)] = data
        self._lens[nxt] = len(data)
        self._current = nxt
        self._write_header()
        return True

    def close(self, *, remove: bool = False) -> None:
        try:
            self._mm.close()
        finally:
            os.close(self._fd)
            if remove:
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass


def read_flight_record(path: str) -> dict[str, Any]:
    """Read a flight record left by a (dead) worker process. Never raises.

    Returns ``{"pid", "created", "executing": [{"key", "start"}], "sample": dict | None,
    "missing": [str]}``; what could not be read is named in ``missing``.
    """
    out: dict[str, Any] = {
        "pid": None,
        "created": None,
        "executing": [],
        "sample": None,
        "missing": [],
    }
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        out["missing"].append(f"flight record: {e.strerror or e}")
        return out
    if len(data) < HEADER_SIZE or data[:8] != MAGIC:
        out["missing"].append("flight record: not a flight record (bad header)")
        return out
    try:
        (_, pid, created, nslots, slot_size, s_off, cap, current, l0, l1) = _HEADER.unpack_from(
            data, 0
        )
    except struct.error:
        out["missing"].append("flight record: truncated header")
        return out
    out["pid"], out["created"] = pid, created
    if slot_size != SLOT_SIZE or HEADER_SIZE + nslots * slot_size > len(data):
        out["missing"].append("flight record: slot table truncated")
        return out
    for i in range(nslots):
        off = HEADER_SIZE + i * slot_size
        state, start, keylen = _SLOT.unpack_from(data, off)
        if state != _EXECUTING:
            continue
        key = data[off + _SLOT.size : off + _SLOT.size + min(keylen, KEY_MAX)]
        out["executing"].append({"key": key.decode("utf-8", "replace"), "start": start})
    length = (l0, l1)[current] if current in (0, 1) else 0
    if length == 0:
        out["missing"].append("flight record: no stack sample was taken before the death")
        return out
    start = s_off + current * cap
    if length > cap or start + length > len(data):
        out["missing"].append("flight record: sample truncated")
        return out
    try:
        sample = msgpack.unpackb(data[start : start + length], raw=False)
    except Exception as e:  # corrupt bytes from a dying process
        out["missing"].append(f"flight record: sample unreadable ({type(e).__name__})")
        return out
    if isinstance(sample, dict):
        out["sample"] = sample
    else:
        out["missing"].append("flight record: sample is not a mapping")
    return out
