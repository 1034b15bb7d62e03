"""The native signal recorder (issue 39, point 1) in real processes with real signals.

Each test drives a child Python process line by line (`_Child`): it installs handlers the
way a worker and its task code would (faulthandler's chained SIGTERM dump, `signal.signal`
handlers, SIG_IGN), starts and stops the recorder on a real flight record, and answers with
what it sees. The senders are real processes, one of them renamed `chaos-monkey`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from capabilities import require
from chaos_monkey import chaos_monkey
from oomguard._host import flight, sigrec
from oomguard._host.flight import read_flight_record

pytestmark = pytest.mark.timeout(120)

_CHILD = r"""
import ctypes, faulthandler, os, signal, subprocess, sys, time
from oomguard._host.flight import FlightRecorder
from oomguard._host import sigrec

libc = ctypes.CDLL(None, use_errno=True)
record = FlightRecorder.create(sys.argv[1])
crash = open(sys.argv[2], "w")
recorder = sigrec.Recorder()
handled = []

def handler(signo, frame):
    handled.append(signal.Signals(signo).name)

def raw(signo):  # what the kernel keeps of signo's action: handler, mask, flags (glibc x86-64)
    buf = ctypes.create_string_buffer(256)
    assert libc.sigaction(signo, None, buf) == 0
    flags = int.from_bytes(buf.raw[136:140], "little") & ~0x04000000
    # SA_RESTORER left out: glibc sets it on every action it installs, SIG_DFL too (as
    # signal.signal(s, SIG_DFL) would); the kernel uses it only to return from a handler.
    return buf.raw[:16].hex() + f"/{flags:x}"

def names(mask):
    return ",".join(sigrec.names(mask)) or "-"

print("ready", flush=True)
for line in sys.stdin:
    cmd, *args = line.split()
    sig = getattr(signal, args[0]) if cmd in ("py", "ign") else None
    if cmd == "fault":
        faulthandler.register(signal.SIGTERM, file=crash, all_threads=True, chain=True)
        out = "ok"
    elif cmd == "py":
        signal.signal(sig, handler)
        out = "ok"
    elif cmd == "ign":
        signal.signal(sig, signal.SIG_IGN)
        out = "ok"
    elif cmd == "start":
        record.signals_state(recorder.start(record))
        out = names(recorder.started)
    elif cmd == "replaced":
        out = names(recorder.replaced())
    elif cmd == "stop":
        recorder.stop()
        out = "ok"
    elif cmd == "raw":
        out = ";".join(raw(s) for s in sigrec.SIGNALS)
    elif cmd == "handled":
        time.sleep(0.05)  # Python runs a handler between two bytecodes of this thread
        out = ",".join(handled) or "-"
    elif cmd == "masks":  # SigBlk of every thread of this process
        out = ",".join(
            open(f"/proc/self/task/{t}/status").read().split("SigBlk:")[1].split()[0]
            for t in os.listdir("/proc/self/task")
        )
    elif cmd == "fork":  # a child that only sleeps
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        out = str(pid)
    elif cmd == "reap":
        out = str(os.waitstatus_to_exitcode(os.waitpid(int(args[0]), 0)[1]))
    elif cmd == "exec-ignored":  # what an exec'd child inherits: its SigIgn
        out = subprocess.run(["grep", "SigIgn", "/proc/self/status"], capture_output=True,
                             text=True).stdout.split()[1]
    print(out, flush=True)
"""


class _Child:
    def __init__(self, tmp_path):
        self.flight = str(tmp_path / "c.flight")
        self.crash = str(tmp_path / "c.crash")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_CHILD), self.flight, self.crash],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout.readline().strip() == "ready"
        self.pid = self.proc.pid

    def __call__(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def signals(self) -> list[dict]:
        return read_flight_record(self.flight, cmdline="full")["signals"]

    def close(self):
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def child(tmp_path):
    require(sigrec.available()[0], f"no native signal recorder: {sigrec.available()[1]}")
    c = _Child(tmp_path)
    yield c
    c.close()


ALL = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2,SIGALRM"


def test_the_recorders_layout_is_the_flight_records():
    require(sigrec._sigrec is not None, "no native signal recorder (./dev test builds it)")
    assert sigrec.available() == (True, "")
    assert sigrec._sigrec.SLOT_SIZE == flight.SIG_SLOT_SIZE


def test_a_named_sender_is_recorded_and_the_handlers_in_place_still_run(child):
    """A Python handler runs as before; SIGTERM then goes through faulthandler's dump to
    the default action: the order is recorder, faulthandler, default (exit -15)."""
    assert child("fault") == "ok" and child("py SIGUSR1") == "ok"
    assert child("start") == ALL
    with chaos_monkey() as send:
        send(child.pid, signal.SIGUSR1)
        assert child("handled") == "SIGUSR1"
        send(child.pid, signal.SIGTERM)
        assert child.proc.wait(timeout=30) == -signal.SIGTERM
        got = child.signals()
        assert [(s["signal"], s["pid"], s["name"], s["code"]) for s in got] == [
            ("SIGUSR1", send.pid, "chaos-monkey", 0),
            ("SIGTERM", send.pid, "chaos-monkey", 0),
        ]
        assert got[1]["cmdline"].endswith("--chaos") and got[1]["uid"] == os.getuid()
    assert "most recent call first" in open(child.crash).read()


def test_no_signal_is_blocked_in_any_thread(child):
    assert child("masks") == child("masks")  # the same before...
    before = child("masks")
    child("start")
    assert child("masks") == before and set(before.split(",")) == {"0000000000000000"}


def test_stop_puts_back_exactly_what_was_there(child):
    require(os.uname().machine == "x86_64", "the probe reads glibc's x86-64 struct sigaction")
    child("fault")
    child("py SIGUSR1")
    child("ign SIGHUP")
    before = child("raw")
    assert child("start") == ALL.replace("SIGHUP,", "")  # ignored: left alone
    assert child("raw") != before
    child("stop")
    assert child("raw") == before
    os.kill(child.pid, signal.SIGUSR1)
    assert child("handled") == "SIGUSR1"
    assert child.signals() == []  # stopped: nothing recorded


def test_a_handler_set_later_replaces_the_recorder_as_any_other(child):
    """Observe, never fight: task code's signal.signal wins, and stays after stop()."""
    child("start")
    assert child("replaced") == "-"
    child("py SIGUSR2")  # task code, after oomguard
    assert child("replaced") == "SIGUSR2"
    os.kill(child.pid, signal.SIGUSR2)
    assert child("handled") == "SIGUSR2"
    assert child.signals() == []  # its handler ran, not the recorder
    child("stop")
    os.kill(child.pid, signal.SIGUSR2)
    assert child("handled") == "SIGUSR2,SIGUSR2"


def test_an_ignored_signal_stays_ignored_for_exec_children(child):
    child("ign SIGHUP")
    ignored = child("exec-ignored")
    assert int(ignored, 16) >> (signal.SIGHUP - 1) & 1
    child("start")
    assert child("exec-ignored") == ignored
    os.kill(child.pid, signal.SIGHUP)
    assert child("handled") == "-" and child.proc.poll() is None


def test_faulthandler_re_registering_leaves_the_recorder_in_front(child):
    """A Python SIGTERM handler (as Dask's `dask worker` without a nanny installs) under
    faulthandler's chained dump: faulthandler puts its previous handler back, raises and
    registers itself again; the recorder puts itself back in front, so a second SIGTERM
    is recorded too, and each one is dumped once and handled once."""
    child("py SIGTERM")
    child("fault")
    child("start")
    for _ in range(2):
        os.kill(child.pid, signal.SIGTERM)
        child("handled")
    assert child("handled") == "SIGTERM,SIGTERM"
    assert [s["signal"] for s in child.signals()] == ["SIGTERM", "SIGTERM"]
    assert [s["pid"] for s in child.signals()] == [os.getpid()] * 2
    assert open(child.crash).read().count("most recent call first") == 2
    assert child("replaced") == "-"


def test_the_default_action_ends_the_process_as_before(child):
    child("start")
    os.kill(child.pid, signal.SIGUSR2)  # no handler: its default action ends the process
    assert child.proc.wait(timeout=30) == -signal.SIGUSR2
    assert [s["signal"] for s in child.signals()] == ["SIGUSR2"]


def test_a_forked_childs_signals_are_not_the_workers(child):
    child("start")
    pid = int(child("fork"))
    os.kill(pid, signal.SIGTERM)  # the inherited recorder chains to the default action
    assert child(f"reap {pid}") == str(-signal.SIGTERM)
    assert child.signals() == []  # not written into the parent's flight record


def test_the_last_eight_are_kept_and_a_burst_is_harmless(child):
    child("py SIGUSR1")
    child("py SIGUSR2")
    child("start")
    for i in range(12):  # one at a time: each is delivered (pending signals coalesce)
        os.kill(child.pid, signal.SIGUSR2 if i >= 4 else signal.SIGUSR1)
        assert child("handled").count("SIGUSR") == i + 1
    got = child.signals()
    assert [s["signal"] for s in got] == ["SIGUSR2"] * flight.SIG_SLOTS
    assert [s["time"] for s in got] == sorted(s["time"] for s in got)
    for _ in range(500):
        os.kill(child.pid, signal.SIGUSR1)
    assert child("masks") and child.proc.poll() is None


def test_without_the_native_part_senders_are_not_recorded(tmp_path, monkeypatch):
    """A build without a C compiler installs without `_sigrec` (setup.py: optional)."""
    monkeypatch.setattr(sigrec, "_sigrec", None)
    record = flight.FlightRecorder.create(str(tmp_path / "f"))
    recorder = sigrec.Recorder()
    record.signals_state(recorder.start(record))
    assert "not installed" in recorder.why and recorder.replaced() == 0
    recorder.stop()
    (note,) = [m for m in read_flight_record(record.path)["missing"] if "signal senders" in m]
    assert note.startswith("signal senders: not recorded (oomguard's native signal recorder")
