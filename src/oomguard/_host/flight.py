"""The flight recorder: what a worker process was doing, kept where its death cannot erase it.

Nothing runs on SIGKILL, so a kernel OOM kill leaves only what was written before it. The
worker writes into a file-backed shared mapping (`MAP_SHARED`): a store into the mapping
lands in the page cache without a system call, and survives the process. The nanny reads the
file after the death.

Layout (little-endian; the signal slots in the host's own byte order), one file per worker
process:

    header   128 bytes  magic, pid, created, slot count, slot size, sample layout,
                        which of the two sample buffers is current, the signal area's offset
    slots    N x 1088   one per executing task: state, start time, key; its thread's ident
                        in the slot's last 8 bytes (0 until its thread is known)
    signals  16 + 8 x 4224  whether senders are recorded, and which signals' recorder task
                        code replaced; the last 8 received signals, one fixed record per slot
    samples  2 x S      msgpack blobs written alternately; the header names the complete one

A task slot is written on each transition into or out of "executing": O(1), a few stores into
the mapping. The sampler thread writes the other sample buffer, then flips the header's
`current` field, so a death mid-write leaves the previous sample intact. The signal slots are
written by the native recorder's signal handler (`sigrec`, `_sigrec.c`: its own mapping of
this file): sequence 0 first, then the record, then its sequence number, so a slot torn by a
SIGKILL mid-write reads as empty.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from typing import Any

import msgpack

from .. import _private
from . import senders as _senders

# 2: the signal area (issue 26); 3: its slots written by the native recorder (issue 39).
# A record of another layout is refused, not misread: the nanny and its worker run the
# same installed oomguard, so only a worker left from before an upgrade has another one.
MAGIC = b"OOMGFLT3"
# magic, pid, created, nslots, slot_size, sample_offset, sample_capacity, current, len0, len1,
# signal_offset
_HEADER = struct.Struct("<8sqdIIQQQQQQ")
HEADER_SIZE = 128
# state, start, keylen; then the key bytes
_SLOT = struct.Struct("<BxxxxxxxdH")
KEY_MAX = 1024
SLOT_SIZE = 1088
# The thread a task runs on (`threading.get_ident()`, what faulthandler prints), in the
# slot's last 8 bytes: written by that thread when it starts the task, after the slot.
_THREAD = struct.Struct("<Q")
_THREAD_AT = SLOT_SIZE - _THREAD.size
DEFAULT_SLOTS = 64
DEFAULT_SAMPLE_CAPACITY = 256 * 1024

_EMPTY = 0
_EXECUTING = 1

# The signal area: state, slot count, slot size, the signals whose recorder was replaced.
_SIG_AREA = struct.Struct("<IIII")
# One slot, as _sigrec.c's `struct slot` (host byte order): sequence, signo, si_code, si_pid,
# si_uid, seconds, nanoseconds, name length, cmdline length, /proc/PID/comm; the raw
# /proc/PID/cmdline at SIG_CMDLINE_AT.
_SIG_SLOT = struct.Struct("=QiiiIqqII64s")
SIG_CMDLINE_AT = 128
SIG_CMDLINE_BYTES = 4096
SIG_SLOTS = 8
SIG_SLOT_SIZE = SIG_CMDLINE_AT + SIG_CMDLINE_BYTES
SIG_AREA_SIZE = _SIG_AREA.size + SIG_SLOTS * SIG_SLOT_SIZE
#: Whether the worker records its signals' senders (the area's state).
SIGNALS_UNSET = 0  # the worker never said (it died before its plugin's setup finished)
SIGNALS_RECORDING = 1
SIGNALS_UNAVAILABLE = 2  # the native recorder is not installed or could not start
SIGNALS_DISABLED = 3  # oomguard.worker.signal-senders is false
#: The largest flight record read: 64 slots and 256 KiB samples make ~0.6 MiB; a header
#: declaring more than this is not a record of ours.
MAX_RECORD_BYTES = 16 << 20
_NOT_RECORDED = {
    SIGNALS_UNSET: "the worker had not started its signal recorder",
    SIGNALS_UNAVAILABLE: (
        "oomguard's native signal recorder is not installed here (a build without a C "
        "compiler), or could not start"
    ),
    SIGNALS_DISABLED: "oomguard.worker.signal-senders is false",
}


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
        self._signal_offset = HEADER_SIZE + nslots * SLOT_SIZE
        self._sample_offset = self._signal_offset + SIG_AREA_SIZE
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
        size = HEADER_SIZE + nslots * SLOT_SIZE + SIG_AREA_SIZE + 2 * sample_capacity
        fd = _private.create(path)  # O_EXCL | O_NOFOLLOW: never someone else's file
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        except BaseException:
            os.close(fd)
            raise
        rec = cls(path, mm, fd, nslots, sample_capacity)
        rec._write_header()
        rec.signals_state(SIGNALS_UNSET)
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
            self._signal_offset,
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
        _THREAD.pack_into(self._mm, off + _THREAD_AT, 0)
        _SLOT.pack_into(self._mm, off, _EXECUTING, start or time.time(), len(kb))
        return slot

    def task_thread(self, slot: int, ident: int) -> None:
        """Record the thread that runs the task in `slot` (its `threading.get_ident()`)."""
        if 0 <= slot < self._nslots and 0 < ident < 2**64:
            _THREAD.pack_into(self._mm, HEADER_SIZE + slot * SLOT_SIZE + _THREAD_AT, ident)

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

    def signals_state(self, state: int, replaced: int = 0) -> None:
        """Say whether the senders of this worker's signals are recorded (SIGNALS_*), and
        which signals' recorder a handler installed since replaced (a bit mask)."""
        _SIG_AREA.pack_into(
            self._mm, self._signal_offset, state, SIG_SLOTS, SIG_SLOT_SIZE, replaced
        )

    def signal_slots(self) -> tuple[int, int, int]:
        """(file descriptor, offset of the first signal slot, slot count): where the native
        recorder writes."""
        return self._fd, self._signal_offset + _SIG_AREA.size, SIG_SLOTS

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


def read_flight_record(path: str, *, cmdline: str = "hashed") -> dict[str, Any]:
    """Read a flight record left by a (dead) worker process. Never raises.

    Returns ``{"pid", "created", "executing": [{"key", "start", "thread"}] (thread 0: not
    known), "sample": dict | None,
    "signals": [dict] (oldest first, `senders.KEYS`), "missing": [str], "read": bool}``;
    what could not be read is named in ``missing``. ``read`` is True once the slot table
    was read: only then does an empty ``executing`` mean that nothing was executing.
    A sender's command line is kept as `cmdline` says (`senders.command_line`).
    """
    out: dict[str, Any] = {
        "pid": None,
        "created": None,
        "executing": [],
        "sample": None,
        "signals": [],
        "missing": [],
        "read": False,
    }
    try:
        data = _read_bounded(path)
    except OSError as e:
        out["missing"].append(f"flight record: {e.strerror or e}")
        return out
    except ValueError as e:
        out["missing"].append(f"flight record: {e}")
        return out
    if len(data) < HEADER_SIZE or data[:8] != MAGIC:
        out["missing"].append("flight record: not a flight record (bad header)")
        return out
    (_, pid, created, nslots, slot_size, s_off, cap, current, l0, l1, g_off) = _HEADER.unpack_from(
        data, 0
    )
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
        (thread,) = _THREAD.unpack_from(data, off + _THREAD_AT)
        out["executing"].append(
            {"key": key.decode("utf-8", "replace"), "start": start, "thread": thread}
        )
    out["read"] = True
    out["sample"] = _read_sample(data, s_off, cap, (l0, l1), current, out["missing"])
    _read_signals(data, g_off, out, cmdline)
    return out


def _read_bounded(path: str) -> bytes:
    """The record's bytes, no more than its header declares (a regular file of this user
    only: a link to /dev/zero or a FIFO is refused, never read until memory runs out)."""
    fd = _private.open_regular(path)
    try:
        head = _private.read_at_most(fd, HEADER_SIZE)
        if len(head) < HEADER_SIZE or head[:8] != MAGIC:
            return head
        (_, _, _, nslots, slot_size, s_off, cap, _, _, _, g_off) = _HEADER.unpack_from(head, 0)
        size = max(HEADER_SIZE + nslots * slot_size, g_off + SIG_AREA_SIZE, s_off + 2 * cap)
        if size > MAX_RECORD_BYTES:
            raise ValueError(
                f"header declares {size} bytes, more than the {MAX_RECORD_BYTES} read (not read)"
            )
        return head + _private.read_at_most(fd, size - HEADER_SIZE, HEADER_SIZE)
    finally:
        os.close(fd)


def _read_sample(data: bytes, s_off, cap, lens, current, missing: list[str]) -> dict | None:
    """The current sample buffer, None (and why in missing) when there is none."""
    length = lens[current] if current in (0, 1) else 0
    if length == 0:
        missing.append("flight record: no stack sample was taken before the death")
        return None
    start = s_off + current * cap
    if length > cap or start + length > len(data):
        missing.append("flight record: sample truncated")
        return None
    try:
        sample = msgpack.unpackb(data[start : start + length], raw=False)
    except Exception as e:  # corrupt bytes from a dying process
        missing.append(f"flight record: sample unreadable ({type(e).__name__})")
        return None
    if isinstance(sample, dict):
        return sample
    missing.append("flight record: sample is not a mapping")
    return None


def _read_signals(data: bytes, offset: int, out: dict[str, Any], cmdline: str) -> None:
    """The signal area into out["signals"] (oldest first); what is wrong into missing."""
    missing = out["missing"]
    if offset < HEADER_SIZE or offset + SIG_AREA_SIZE > len(data):
        missing.append("flight record: signal area truncated")
        return
    state, nslots, slot_size, replaced = _SIG_AREA.unpack_from(data, offset)
    if nslots != SIG_SLOTS or slot_size != SIG_SLOT_SIZE:
        missing.append("flight record: signal area unreadable (bad layout)")
        return
    if state != SIGNALS_RECORDING:
        why = _NOT_RECORDED.get(state, f"unknown state {state}")
        missing.append(f"signal senders: not recorded ({why})")
        return
    if replaced:
        names = ", ".join(_senders.signal_name(s) for s in range(1, 32) if replaced >> s & 1)
        missing.append(
            f"signal senders: {names} not recorded since a handler installed after "
            "oomguard's recorder replaced it (task code's signal.signal)"
        )
    found, bad = [], 0
    for i in range(nslots):
        off = offset + _SIG_AREA.size + i * slot_size
        seq, *fields, name_len, cmd_len, name = _SIG_SLOT.unpack_from(data, off)
        if seq == 0:
            continue  # never written, or torn before its record was complete
        at = off + SIG_CMDLINE_AT
        raw = data[at : at + min(cmd_len, SIG_CMDLINE_BYTES)]
        entry = _senders.from_slot(*fields, name[: min(name_len, 64)], raw, cmdline)
        if entry is None:
            bad += 1
        else:
            found.append((seq, entry))
    found.sort(key=lambda se: se[0])
    out["signals"] = [entry for _, entry in found[-SIG_SLOTS:]]
    if bad:
        missing.append(f"signal senders: {bad} unreadable signal record(s) dropped")
