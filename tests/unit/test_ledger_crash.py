"""The ledger file under faults (issue 28): a writer SIGKILLed between its write and its
truncate, a full disk, a lock held by another process, entries no oomguard process wrote,
and a torn file rebuilt by the processes that hold leases. Real processes throughout."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from capabilities import require
from oomguard._admission import host
from oomguard._admission.ledger import HostLedger

GiB = 2**30
MiB = 2**20

# A process with a long-keyed lease releases it, so the file shrinks; its ftruncate is
# replaced by a SIGKILL to itself: the kill lands between the write and the truncate.
KILLED_WRITER = """
import os, signal, sys
from oomguard._admission.ledger import HostLedger
ledger = HostLedger(sys.argv[1], available=lambda: 10 * 2**30)
key = "k" * 6000
assert ledger.try_acquire(key, 2**20).granted
def kill(fd, length):
    os.kill(os.getpid(), signal.SIGKILL)
os.ftruncate = kill
ledger.release(key)
print("not killed", flush=True)
"""


HOLD_LOCK = (
    "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); "
    "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(3)"
)


def _ledger(path, available=10 * GiB):
    return HostLedger(str(path), available=lambda: available)


def _sleeper(*prefix: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout.readline() == b"ready\n"
    return proc


def _stop(*procs):
    for p in procs:
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()


def test_a_writer_killed_between_write_and_truncate_loses_no_lease(tmp_path):
    path = tmp_path / "ledger.json"
    holder = _sleeper()
    try:
        assert _ledger(path).try_acquire("held", 6 * GiB, pid=holder.pid).granted
        killed = subprocess.run(
            [sys.executable, "-c", KILLED_WRITER, str(path)], capture_output=True, timeout=60
        )
        assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
        # The next process (nothing in memory) must see the live 6 GiB lease.
        adm = _ledger(path).try_acquire("next", 6 * GiB)
        assert not adm.granted and adm.claimed == 6 * GiB, adm
        json.loads(path.read_bytes())  # whole: no tail of the old text
    finally:
        _stop(holder)


@pytest.fixture
def small_tmpfs():
    require(os.geteuid() == 0, "not root: cannot mount a tmpfs")
    where = tempfile.mkdtemp(prefix="oomguard-enospc-")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k,mode=0700", "tmpfs", where], capture_output=True
    )
    require(done.returncode == 0, f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", where], check=True)
        shutil.rmtree(where, ignore_errors=True)


def _fill(directory: str) -> str:
    filler = os.path.join(directory, "filler")
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 4096)
        except OSError:
            pass
    return filler


def test_a_full_disk_never_tears_the_file(small_tmpfs):
    path = os.path.join(small_tmpfs, "ledger.json")
    holder = _sleeper()
    ledgers = [_ledger(path) for _ in range(3)]
    try:
        assert ledgers[0].try_acquire("held", 6 * GiB, pid=holder.pid).granted
        filler = _fill(small_tmpfs)
        # This write needs a second page that the disk does not have.
        try:
            ledgers[1].record_peak("p" * 6000, MiB)
        except OSError:
            pass  # refused whole: the old state stays
        os.unlink(filler)
        adm = ledgers[2].try_acquire("next", 6 * GiB)
        assert not adm.granted and adm.claimed == 6 * GiB, adm
        with open(path, "rb") as f:
            json.loads(f.read())
    finally:
        _stop(holder)
        for ledger in ledgers:
            ledger.close()


def test_a_held_lock_does_not_block_the_caller(tmp_path):
    path = tmp_path / "ledger.json"
    ledger = _ledger(path)
    assert ledger.try_acquire("mine", GiB).granted
    # Another process holds the lock (a stopped worker, or anything that opens the file).
    locker = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(path)], stdout=subprocess.PIPE)
    try:
        assert locker.stdout.readline() == b"locked\n"
        began = time.monotonic()
        adm = ledger.try_acquire("other", GiB)
        ledger.release("mine")
        took = time.monotonic() - began
        assert took < 0.5, f"blocked {took:.2f} s on the ledger's lock"
        assert adm.busy and not adm.granted and "lock" in adm.detail()
        assert ledger.busy == 2 and ledger.pending()
        locker.wait(timeout=30)
        ledger.refresh()  # the next access applies the release the lock kept out
        assert not ledger.pending() and ledger.leases() == []
    finally:
        _stop(locker)


def test_entries_no_oomguard_process_wrote_are_dropped(tmp_path):
    path = tmp_path / "ledger.json"
    now = time.time()
    entries = {
        "version": 1,
        # pid 1 is always alive: a need beyond the host, or one without its start time,
        # or PID 1 that does not hold the ledger open
        "leases": [[1, "x", 2**62, 0, None], [1, "y", 6 * GiB, 0, host.proc_start(1)]],
        "peaks": {},
        # a waiter asking "last" far in the future would never go stale
        "queue": [[1, "z", GiB, now, now + 1e6]],
    }
    path.write_text(json.dumps(entries))
    ledger = _ledger(path)
    adm = ledger.try_acquire("a", 6 * GiB)
    assert adm.granted and adm.others == 0 and adm.ahead == 0, adm
    assert ledger.dropped >= 3
    assert [k for _, k, _ in ledger.leases()] == ["a"]


def test_a_lease_of_another_users_process_is_dropped(tmp_path):
    require(os.geteuid() == 0 and shutil.which("setpriv"), "not root, or no setpriv")
    path = tmp_path / "ledger.json"
    other = _sleeper("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    try:
        entries = {"version": 1, "peaks": {}, "queue": []}
        entries["leases"] = [[other.pid, "theirs", 6 * GiB, 0, host.proc_start(other.pid)]]
        path.write_text(json.dumps(entries))
        adm = _ledger(path).try_acquire("a", 6 * GiB)
        assert adm.granted and adm.others == 0, adm
    finally:
        _stop(other)


def test_a_torn_file_is_rebuilt_by_the_lease_holders(tmp_path, caplog):
    path = tmp_path / "ledger.json"
    holder = _ledger(path)
    assert holder.try_acquire("mine", 6 * GiB).granted
    holder.record_peak("load", 300)
    path.write_bytes(b'{"version":1,"leases":[[12,"x"')  # torn by a foreign writer
    with caplog.at_level("WARNING", logger="oomguard.admission"):
        holder.refresh()  # the holder's next access puts back what it holds
    assert "torn" in caplog.text and holder.torn == 1
    other = _ledger(path)
    assert not other.try_acquire("next", 6 * GiB).granted
    assert other.refresh() == {"load": 300}
    holder.release("mine")
    assert other.try_acquire("next", 6 * GiB).granted


# Each process keeps one descriptor and records its own peaks, one update at a time.
PEAK_WRITER = """
import sys
from oomguard._admission.ledger_file import LedgerFile, record_peak
ledger = LedgerFile(sys.argv[1])
for i in range(int(sys.argv[3])):
    while True:
        try:
            ledger.update(lambda s: record_peak(s, (f"{sys.argv[2]}-{i}", i + 1)), wait=1.0)
            break
        except BlockingIOError:
            pass
"""


def test_the_ledger_is_rewritten_in_place_and_no_update_is_lost(tmp_path):
    """docs/security.md, "Crash-safe writes": the file is rewritten in place under a flock
    of the descriptor each process keeps open, not written aside and renamed. A rename
    would give the next process a new inode while another still locks the old one: two
    holders of "the" lock at once, and updates lost. Four processes of 100 updates each,
    at once: the one inode holds all 400."""
    path = tmp_path / "memory-ledger.json"
    path.write_text("{}")
    inode = path.stat().st_ino
    procs = [
        subprocess.Popen([sys.executable, "-c", PEAK_WRITER, str(path), f"p{n}", "100"])
        for n in range(4)
    ]
    for p in procs:
        assert p.wait(120) == 0
    assert path.stat().st_ino == inode
    peaks = json.loads(path.read_text())["peaks"]
    assert sorted(peaks) == sorted(f"p{n}-{i}" for n in range(4) for i in range(100))
