"""The host-wide memory ledger against a tmp_path file, with real processes for liveness."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from oomguard._ledger import AdmissionTimeout, HostLedger
from oomguard._memory import ANNOTATION, PeakEstimator, memory, need_of, parse_need

GiB = 2**30


def _ledger(tmp_path, available=10 * GiB, floor=0):
    return HostLedger(str(tmp_path / "ledger.json"), floor=floor, available=lambda: available)


def _sleeper():
    # Started and idle before it gets a lease, so its RSS no longer grows.
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout.readline() == b"ready\n"
    return proc


def test_cold_start_is_granted_even_when_memory_is_short(tmp_path):
    ledger = _ledger(tmp_path, available=1 * GiB)
    adm = ledger.try_acquire("big", 8 * GiB)
    assert adm.granted and adm.cold


def test_other_leases_and_floor_are_subtracted(tmp_path):
    ledger = _ledger(tmp_path, available=10 * GiB, floor=1 * GiB)
    other = _sleeper()
    try:
        assert ledger.try_acquire("a", 4 * GiB, pid=other.pid).granted
        # 10 - 4 (the other process's claim; it has not grown) - 1 (floor) = 5 GiB free.
        refused = ledger.try_acquire("b", 6 * GiB)
        assert not refused.granted and not refused.cold
        assert (refused.free, refused.claimed, refused.others) == (5 * GiB, 4 * GiB, 1)
        assert ledger.try_acquire("b", 5 * GiB).granted
        assert sorted(k for _, k, _ in ledger.leases()) == ["a", "b"]
        assert ledger.release("b") and not ledger.release("b")
    finally:
        other.kill()
        other.wait()


def test_leases_of_dead_pids_are_reclaimed(tmp_path):
    ledger = _ledger(tmp_path, available=1 * GiB)
    other = _sleeper()
    assert ledger.try_acquire("held", 4 * GiB, pid=other.pid).granted
    assert not ledger.try_acquire("mine", 4 * GiB).granted
    os.kill(other.pid, signal.SIGKILL)
    other.wait()
    assert ledger.leases() == []
    assert ledger.try_acquire("mine", 4 * GiB).granted


def test_a_zombie_holder_does_not_keep_its_lease(tmp_path):
    ledger = _ledger(tmp_path, available=1 * GiB)
    other = _sleeper()
    try:
        assert ledger.try_acquire("held", 4 * GiB, pid=other.pid).granted
        os.kill(other.pid, signal.SIGKILL)
        time.sleep(0.2)  # killed but not reaped: kill(pid, 0) still succeeds
        assert ledger.leases() == []
    finally:
        other.wait()


def test_acquire_times_out_with_need_and_free_in_the_message(tmp_path):
    ledger = _ledger(tmp_path, available=3 * GiB, floor=GiB)
    other = _sleeper()
    try:
        ledger.try_acquire("a", 1 * GiB, pid=other.pid)
        with pytest.raises(AdmissionTimeout) as info:
            ledger.acquire("task-1", 4 * GiB, timeout=0.2, poll=0.05)
    finally:
        other.kill()
        other.wait()
    msg = str(info.value)
    assert "4 GiB" in msg and "only 1 GiB was free" in msg and "task-1" in msg
    assert info.value.need == 4 * GiB and info.value.free == GiB
    assert isinstance(info.value, TimeoutError)


def test_peaks_are_kept_host_wide(tmp_path):
    a, b = _ledger(tmp_path), _ledger(tmp_path)
    a.record_peak("load", 300)
    a.release("nothing", peak=("load", 200))  # a lower peak does not lower the estimate
    assert b.refresh() == {"load": 300}


def test_a_garbled_file_starts_over(tmp_path):
    path = tmp_path / "ledger.json"
    path.write_bytes(b"{not json")
    ledger = HostLedger(str(path), available=lambda: GiB)
    assert ledger.try_acquire("a", 1).granted
    assert [k for _, k, _ in ledger.leases()] == ["a"]


def test_bad_floor_is_refused():
    with pytest.raises(ValueError, match="floor"):
        HostLedger("/tmp/x.json", floor=-1)


@pytest.mark.parametrize(
    "value, expected",
    [("6 GiB", 6 * GiB), (1024, 1024), ("512MiB", 512 * 2**20)],
)
def test_parse_need(value, expected):
    assert parse_need(value) == expected


@pytest.mark.parametrize("value", ["lots", 0, -5, True, None])
def test_parse_need_names_the_field(value):
    with pytest.raises(ValueError, match="oomguard_memory"):
        parse_need(value)


def test_memory_annotates_tasks():
    import dask

    with memory("2 GiB") as nbytes:
        x = dask.delayed(sum)([1, 2])
    assert nbytes == 2 * GiB
    assert x.__dask_graph__().layers[x.key].annotations == {ANNOTATION: 2 * GiB}


def test_need_prefers_the_annotation_then_the_estimate():
    est = PeakEstimator(min_bytes=100, margin=0.5)
    est.update({"load": 1000})
    assert need_of("load-1", {ANNOTATION: 7}, est) == 7
    assert need_of("load-1", {}, est) == 1500
    assert need_of("other-1", None, est) is None
