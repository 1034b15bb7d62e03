"""The sender of a signal as the nanny reads it back (issues 26, 39): the native recorder's
slots in the flight record's signal area, bounded, a torn slot dropped, the command line
kept as its program name and a hash unless `sender-cmdline: full`. The slots are packed
here as `_sigrec.c` writes them (its layout is checked against flight.py's in
test_sigrec.py); the recorder itself runs in real processes in test_sigrec.py."""

from __future__ import annotations

import doctest
import hashlib
import signal

import pytest

from oomguard._host import flight, senders
from oomguard._host.flight import FlightRecorder, read_flight_record


def test_docstring_examples():
    result = doctest.testmod(senders)
    assert result.attempted > 0 and result.failed == 0


def _slot_offset(rec: FlightRecorder, i: int) -> int:
    return rec._signal_offset + flight._SIG_AREA.size + i * flight.SIG_SLOT_SIZE


def write_slot(rec, i, seq, *, signo=15, code=0, pid=812, uid=0, at=1.5, comm=b"", cmd=b""):
    """Slot `i` as the native recorder leaves it."""
    off = _slot_offset(rec, i)
    sec, nsec = int(at), round((at - int(at)) * 1e9)
    fields = (seq, signo, code, pid, uid, sec, nsec, len(comm), len(cmd), comm)
    with open(rec.path, "r+b") as f:
        f.seek(off)
        f.write(flight._SIG_SLOT.pack(*fields))
        f.seek(off + flight.SIG_CMDLINE_AT)
        f.write(cmd)


def _recording(tmp_path) -> FlightRecorder:
    rec = FlightRecorder.create(str(tmp_path / "f"))
    rec.signals_state(flight.SIGNALS_RECORDING)
    return rec


CHAOS = b"/usr/bin/python3\0/opt/chaos/monkey.py\0--token=s3cr3t\0"


def test_a_slot_reads_back_as_a_record_with_the_command_line_hashed(tmp_path):
    rec = _recording(tmp_path)
    write_slot(rec, 0, 1, pid=4242, uid=1000, at=1700000000.25, comm=b"chaos-monkey\n", cmd=CHAOS)
    (got,) = read_flight_record(rec.path)["signals"]
    digest = hashlib.sha256(b"/opt/chaos/monkey.py\0--token=s3cr3t").hexdigest()[:16]
    assert got == {
        "signal": "SIGTERM",
        "signo": 15,
        "time": 1700000000.25,
        "code": 0,
        "pid": 4242,
        "uid": 1000,
        "name": "chaos-monkey",
        "cmdline": f"python3 [2 arguments, sha256:{digest}]",
    }
    assert "s3cr3t" not in str(read_flight_record(rec.path))
    full = read_flight_record(rec.path, cmdline="full")["signals"][0]["cmdline"]
    assert full == "/usr/bin/python3 /opt/chaos/monkey.py --token=s3cr3t"


@pytest.mark.parametrize(
    "raw, hashed",
    [
        (b"sleep\0", "sleep"),  # no arguments: nothing to hide
        (b"", None),  # a kernel thread, or a zombie
        (b"/bin/sh\0-c\0kill 5\0", "sh [2 arguments, sha256:"),
        (b"\x1b[31mevil\0x\0", "[31mevil [1 argument, sha256:"),  # no escape reaches a log
        (b"no-nul-terminator\0y", "no-nul-terminator [1 argument, sha256:"),
    ],
)
def test_command_line_keeps_the_program_name_and_a_hash(raw, hashed):
    got = senders.command_line(raw)
    assert got == hashed if hashed is None or "[" not in hashed else got.startswith(hashed)


def test_names_and_command_lines_are_bounded_and_cleaned(tmp_path):
    rec = _recording(tmp_path)
    cmd = b"\0".join([b"prog"] + [b"c\n" * 100] * 40)[: flight.SIG_CMDLINE_BYTES]
    write_slot(rec, 0, 1, comm=b"n\x07" * 32, cmd=cmd)
    got = read_flight_record(rec.path, cmdline="full")["signals"][0]
    assert got["name"] == "n" * 32
    assert len(got["cmdline"]) == senders.CMDLINE_MAX and "\n" not in got["cmdline"]


def test_the_last_eight_oldest_first_a_torn_or_bad_slot_dropped(tmp_path):
    rec = _recording(tmp_path)
    for i in range(flight.SIG_SLOTS):
        write_slot(rec, i, 10 + (i + 3) % 8, signo=signal.SIGUSR1, pid=i + 1, uid=i)
    write_slot(rec, 5, 0, pid=99)  # torn: the handler died before it set the sequence
    write_slot(rec, 6, 30, signo=0)  # not a signal
    out = read_flight_record(rec.path)
    seqs = {i: 10 + (i + 3) % 8 for i in range(8) if i not in (5, 6)}
    assert [s["pid"] for s in out["signals"]] == [i + 1 for i in sorted(seqs, key=seqs.get)]
    assert "signal senders: 1 unreadable signal record(s) dropped" in out["missing"]


def test_signals_not_recorded_say_why(tmp_path):
    rec = FlightRecorder.create(str(tmp_path / "f"))
    write_slot(rec, 0, 1)
    says = {
        flight.SIGNALS_UNSET: "had not started its signal recorder",
        flight.SIGNALS_UNAVAILABLE: "native signal recorder is not installed",
        flight.SIGNALS_DISABLED: "signal-senders is false",
    }
    for state, why in says.items():
        rec.signals_state(state)
        out = read_flight_record(rec.path)
        assert out["signals"] == []
        assert any(
            m.startswith("signal senders: not recorded") and why in m for m in out["missing"]
        )


def test_a_replaced_recorder_is_named_and_what_it_recorded_kept(tmp_path):
    rec = FlightRecorder.create(str(tmp_path / "f"))
    rec.signals_state(flight.SIGNALS_RECORDING, 1 << signal.SIGINT | 1 << signal.SIGTERM)
    write_slot(rec, 0, 1)
    out = read_flight_record(rec.path)
    assert [s["signal"] for s in out["signals"]] == ["SIGTERM"]
    assert any(
        m.startswith("signal senders: SIGINT, SIGTERM not recorded since a handler installed")
        for m in out["missing"]
    )


def test_a_bad_signal_area_layout_loses_nothing_else(tmp_path):
    rec = FlightRecorder.create(str(tmp_path / "f"))
    rec.task_started("k", start=1.0)
    rec.write_sample({"time": 1.0})
    with open(rec.path, "r+b") as f:
        f.seek(rec._signal_offset)
        f.write(flight._SIG_AREA.pack(1, 99, 7, 0))
    out = read_flight_record(rec.path)
    assert out["signals"] == [] and out["executing"] == [{"key": "k", "start": 1.0, "thread": 0}]
    assert out["sample"] == {"time": 1.0}
    assert "flight record: signal area unreadable (bad layout)" in out["missing"]


@pytest.mark.parametrize("magic", [b"OOMGFLT1", b"OOMGFLT2"])
def test_an_older_layout_is_refused(tmp_path, magic):
    rec = FlightRecorder.create(str(tmp_path / "f"))
    with open(rec.path, "r+b") as f:
        f.write(magic)
    assert "bad header" in read_flight_record(rec.path)["missing"][0]
