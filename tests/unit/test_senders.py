"""The sender of a signal as a worker records it (issue 26): read from /proc while the
sender runs, bounded, and stored in the flight record's signal area, which survives torn
writes and refuses garbage. Real processes and real signals throughout."""

from __future__ import annotations

import doctest
import os
import signal
import subprocess
import sys
import textwrap
import time

import msgpack
import pytest

from oomguard._host import flight, senders
from oomguard._host.flight import FlightRecorder, read_flight_record


def test_docstring_examples():
    result = doctest.testmod(senders)
    assert result.attempted > 0 and result.failed == 0


def test_a_running_sender_is_named_from_proc():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "x" * 3000])
    try:
        time.sleep(0.2)
        rec = senders.record(signal.SIGTERM, 0, proc.pid, os.getuid(), at=7.0)
    finally:
        proc.kill()
        proc.wait()
    assert rec["name"] == os.path.basename(sys.executable)[:15]
    assert rec["cmdline"].startswith(f"{sys.executable} -c import time")
    assert len(rec["cmdline"]) == senders.CMDLINE_MAX  # cut at 1 KiB
    assert (rec["signal"], rec["signo"], rec["pid"], rec["time"]) == ("SIGTERM", 15, proc.pid, 7.0)


def test_a_sender_that_exited_is_named_by_pid_and_uid_alone():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: its /proc entry is gone
    rec = senders.record(signal.SIGHUP, 0, proc.pid, 1234)
    assert (rec["pid"], rec["uid"], rec["name"], rec["cmdline"]) == (proc.pid, 1234, None, None)
    assert senders.validate(rec) == rec


def test_sender_outside_the_namespace_is_not_read(tmp_path):
    # A fake /proc with an entry for pid 0 must still not be read: 0 is "from outside".
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "comm").write_text("nope\n")
    assert senders.read_sender(0, proc=str(tmp_path)) == (None, None)


def test_control_characters_are_stripped_from_proc_text(tmp_path):
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "comm").write_bytes(b"evil\x1b[2J\n")
    (tmp_path / "42" / "cmdline").write_bytes(b"rm\x00-rf\x00\x07\xc2\x9b/\x00" + b"a" * 9000)
    name, cmdline = senders.read_sender(42, proc=str(tmp_path))
    assert name == "evil[2J"
    assert cmdline.startswith("rm -rf /") and len(cmdline) == 1024
    assert all(c >= " " and not "\x7f" <= c <= "\x9f" for c in cmdline)


@pytest.mark.parametrize(
    "bad",
    [
        None,
        [],
        {"signal": "SIGTERM"},
        {**senders.record(15, 0, 0, 0, at=1.0), "pid": -1},
        {**senders.record(15, 0, 0, 0, at=1.0), "signo": 0},
        {**senders.record(15, 0, 0, 0, at=1.0), "uid": True},
        {**senders.record(15, 0, 0, 0, at=1.0), "time": "now"},
        {**senders.record(15, 0, 0, 0, at=1.0), "name": 5},
        {**senders.record(15, 0, 0, 0, at=1.0), "signal": "TERM"},
        {**senders.record(15, 0, 0, 0, at=1.0), "extra": 1},
    ],
)
def test_validate_refuses_what_is_not_a_record(bad):
    assert senders.validate(bad) is None


def test_validate_bounds_oversized_text():
    rec = {**senders.record(15, 0, 1, 0, at=1.0), "name": "n" * 500, "cmdline": "c\n" * 5000}
    out = senders.validate(rec)
    assert len(out["name"]) == senders.NAME_MAX and out["cmdline"] == "c" * 1024


# --- the flight record's signal area ---------------------------------------------------


def _rec(i: int) -> dict:
    return senders.record(signal.SIGUSR1, 0, 0, i, at=float(i))


def test_signal_area_round_trip_keeps_the_last_eight_oldest_first(tmp_path):
    rec = FlightRecorder.create(str(tmp_path / "f"), nslots=2)
    rec.signals_state(flight.SIGNALS_RECORDING)
    assert read_flight_record(rec.path)["signals"] == []
    for i in range(1, 12):
        rec.write_signal(_rec(i))
    out = read_flight_record(rec.path)
    assert [s["uid"] for s in out["signals"]] == list(range(4, 12))
    assert not any("signal" in m for m in out["missing"])


def test_signals_not_recorded_say_why(tmp_path):
    rec = FlightRecorder.create(str(tmp_path / "f"))
    out = read_flight_record(rec.path)
    assert out["signals"] == []
    assert any("signal senders: not recorded" in m for m in out["missing"])
    rec.signals_state(flight.SIGNALS_NOT_BLOCKED)
    assert any("installed after its start" in m for m in read_flight_record(rec.path)["missing"])
    rec.signals_state(flight.SIGNALS_DISABLED)
    assert any("signal-senders is false" in m for m in read_flight_record(rec.path)["missing"])


def _slot_offset(rec: FlightRecorder, i: int) -> int:
    return rec._signal_offset + flight._SIG_AREA.size + i * flight.SIG_SLOT_SIZE


def test_torn_and_garbage_slots_are_dropped_with_a_note(tmp_path):
    rec = FlightRecorder.create(str(tmp_path / "f"))
    rec.signals_state(flight.SIGNALS_RECORDING)
    for i in range(1, 5):
        rec.write_signal(_rec(i))
    with open(rec.path, "r+b") as f:
        # slot 0: a record torn mid-write (bytes changed after its CRC was taken)
        f.seek(_slot_offset(rec, 0) + flight._SIG_SLOT.size + 3)
        f.write(b"\xff\xff")
        # slot 1: a valid CRC over msgpack that is no record
        body = msgpack.packb({"signal": "SIGTERM", "pid": "x"})
        import zlib

        f.seek(_slot_offset(rec, 1))
        f.write(flight._SIG_SLOT.pack(2, len(body), zlib.crc32(body)) + body)
        # slot 2: a length past the slot
        f.seek(_slot_offset(rec, 2))
        f.write(flight._SIG_SLOT.pack(3, 10**6, 0))
    out = read_flight_record(rec.path)
    assert [s["uid"] for s in out["signals"]] == [4]
    assert "signal senders: 3 unreadable signal record(s) dropped" in out["missing"]


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


def test_an_older_layout_is_refused(tmp_path):
    rec = FlightRecorder.create(str(tmp_path / "f"))
    with open(rec.path, "r+b") as f:
        f.write(b"OOMGFLT1")
    assert "bad header" in read_flight_record(rec.path)["missing"][0]


# --- the waiter, in a real process ------------------------------------------------------

_CHILD = """
import faulthandler, os, signal, sys, time
# Blocked first, as the nanny spawns a worker: threads made by imports (distributed's) inherit.
signal.pthread_sigmask(signal.SIG_BLOCK, {{1, 2, 3, 10, 12, 14, 15}})
from oomguard._host.flight import FlightRecorder
from oomguard.worker_plugin import _signals
crash = open({crash!r}, "w")
faulthandler.register(signal.SIGTERM, file=crash, all_threads=True, chain=True)
signal.signal(signal.SIGUSR1, lambda *a: print("usr1 handled", flush=True))
rec = FlightRecorder.create({path!r})
assert _signals.started_blocked()
_signals.SignalWaiter(rec, lambda where: print("error", where, flush=True)).start()
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def test_waiter_records_the_sender_and_replays_the_signal(tmp_path):
    path, crash = str(tmp_path / "w.flight"), str(tmp_path / "w.crash")
    code = textwrap.dedent(_CHILD.format(path=path, crash=crash))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGUSR1)  # a Python handler: it runs, the process lives
        assert proc.stdout.readline().strip() == "usr1 handled"
        os.kill(proc.pid, signal.SIGTERM)  # faulthandler's dump, then the default action
        assert proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        proc.kill()
    got = read_flight_record(path)["signals"]
    assert [s["signal"] for s in got] == ["SIGUSR1", "SIGTERM"]
    me = senders.read_sender(os.getpid())
    for s in got:
        assert (s["pid"], s["uid"], s["name"], s["cmdline"]) == (os.getpid(), os.getuid(), *me)
        assert s["code"] == 0  # SI_USER: sent by kill(2)
    assert "most recent call first" in open(crash).read()


_STOPPING = """
import os, signal, sys, threading, time
signal.pthread_sigmask(signal.SIG_BLOCK, {{1, 2, 3, 10, 12, 14, 15}})
from oomguard._host.flight import FlightRecorder
from oomguard.worker_plugin import _signals
_signals._POLL = 3.0  # a long wait: stop() must not sit it out
signal.signal(signal.SIGUSR1, lambda *a: print("usr1 handled", flush=True))
waiter = _signals.SignalWaiter(FlightRecorder.create({path!r}), print)
waiter.start()
time.sleep(0.2)  # the waiter is in its sigtimedwait now
t0 = time.monotonic()
waiter.stop()
print(f"stopped {{time.monotonic() - t0:.3f}}", flush=True)
print("waiters", sum(t.name == "oomguard-signals" for t in threading.enumerate()), flush=True)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def test_stopping_the_waiter_is_prompt_and_hands_signals_back(tmp_path):
    """`stop()` runs on the worker's event loop (the plugin's teardown, also when Dask
    replaces the nanny's plugin with the scheduler's right after the worker registered):
    it must not block that loop for the waiter's poll. Blocked 0.25 s there, the worker's
    "running" status reached the scheduler late, and tasks submitted meanwhile went to
    another worker (the multi-host lab, tests/hosts/test_host_loss.py)."""
    code = textwrap.dedent(_STOPPING.format(path=str(tmp_path / "w.flight")))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        word, seconds = proc.stdout.readline().split()
        assert word == "stopped" and float(seconds) < 1.0, seconds
        assert proc.stdout.readline().strip() == "waiters 0"
        assert proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGUSR1)  # no waiter: the main thread's handler runs
        assert proc.stdout.readline().strip() == "usr1 handled"
    finally:
        proc.kill()
        proc.wait()
