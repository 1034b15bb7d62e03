"""The host-wide memory ledger against a tmp_path file, with real processes for liveness."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from oomguard._admission.ledger import HostLedger
from oomguard._admission.needs import ANNOTATION, PeakEstimator, memory, need_of, parse_need
from oomguard._exceptions import AdmissionTimeout

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


def test_a_cold_start_borrows_the_floor_but_not_memory_that_is_not_there(tmp_path):
    ledger = _ledger(tmp_path, available=4 * GiB, floor=1 * GiB)
    adm = ledger.try_acquire("big", 4 * GiB)  # 3 GiB free above the floor; nothing else held
    assert adm.granted and adm.cold and adm.free == 3 * GiB
    ledger.release("big")
    short = ledger.try_acquire("bigger", 5 * GiB)  # more than there is: it waits
    assert not short.granted and not short.cold
    assert (short.available, short.others) == (4 * GiB, 0)
    assert (
        ledger.try_acquire("fits", 3 * GiB).granted
        and not ledger.try_acquire("fits", 3 * GiB).cold
    )


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
    ledger = _ledger(tmp_path, available=5 * GiB)
    other = _sleeper()
    assert ledger.try_acquire("held", 4 * GiB, pid=other.pid).granted
    assert not ledger.try_acquire("mine", 4 * GiB).granted
    os.kill(other.pid, signal.SIGKILL)
    other.wait()
    assert ledger.leases() == []
    assert ledger.try_acquire("mine", 4 * GiB).granted


def test_a_zombie_holder_does_not_keep_its_lease(tmp_path):
    ledger = _ledger(tmp_path, available=5 * GiB)
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


def test_unknown_available_memory_grants_one_lease_at_a_time(tmp_path):
    ledger = HostLedger(str(tmp_path / "ledger.json"), available=lambda: None)
    other = _sleeper()
    try:
        first = ledger.try_acquire("a", 4 * GiB, pid=other.pid)
        assert first.granted and first.cold
        second = ledger.try_acquire("b", 1 * MiB_)
        assert not second.granted and second.others == 1
    finally:
        other.kill()
        other.wait()


def test_two_leases_of_one_process_do_not_count_each_others_memory(tmp_path):
    """Per process: a worker with two threads holds two leases; what one task allocated is
    not the other's spending (it was, per lease: both looked spent)."""
    rss = [100 * MiB_]
    ledger = HostLedger(
        str(tmp_path / "ledger.json"),
        available=lambda: 2 * GiB - rss[0],
        _process=(4242, lambda: rss[0], lambda pid, start: (True, None)),
    )
    assert ledger.try_acquire("a", 600 * MiB_).granted
    assert ledger.try_acquire("b", 600 * MiB_).granted
    rss[0] += 600 * MiB_  # task a allocates its whole need; b has not started
    adm = ledger.try_acquire("c", 800 * MiB_)
    # 2048 - 700 MiB used = 1348 MiB available; a and b still claim 600 MiB between them, so
    # 748 MiB is free (per lease, both looked spent: 1348 free, and b's 600 MiB to come
    # would not have fitted beside c).
    assert (adm.claimed, adm.spent, adm.free) == (600 * MiB_, 600 * MiB_, 748 * MiB_)
    assert not adm.granted
    ledger.release("a")  # a's result stays in memory: b is rebased, its claim stays whole
    assert ledger.try_acquire("c", 800 * MiB_).claimed == 600 * MiB_


MiB_ = 2**20


def test_a_lease_spent_elsewhere_claims_its_whole_need_until_released(tmp_path):
    """A nanny's start-up lease: its worker spends it, so the nanny's own growth (here, the
    scheduler and client in the same process) is not that lease being spent, not even after
    a release rebases the process's other leases."""
    rss = [100 * MiB_]
    ledger = HostLedger(
        str(tmp_path / "ledger.json"),
        available=lambda: 2 * GiB - rss[0],
        _process=(4242, lambda: rss[0], lambda pid, start: (True, None)),
    )
    assert ledger.try_acquire("start-a", 300 * MiB_, elsewhere=True).granted
    assert ledger.try_acquire("start-b", 300 * MiB_, elsewhere=True).granted
    rss[0] += 250 * MiB_  # the process grows for other reasons
    adm = ledger.try_acquire("c", 1 * MiB_)
    assert (adm.claimed, adm.spent) == (600 * MiB_, 0)
    ledger.release("start-a")
    rss[0] += 100 * MiB_
    adm = ledger.try_acquire("d", 1 * MiB_)
    assert (adm.claimed, adm.spent) == (301 * MiB_, 0)  # start-b whole, and c


# -- waiting in turn: a refused request queues; later ones may not overtake it ------------


def test_a_later_request_does_not_overtake_a_waiting_one(tmp_path):
    """The worker that just released its lease asks again at once; it used to win over the
    task that had been waiting (15-19 s waits in the issue's scenario)."""
    ledger = _ledger(tmp_path, available=1 * GiB)
    assert ledger.try_acquire("a", 500 * MiB_).granted
    assert not ledger.try_acquire("w", 600 * MiB_).granted  # waits for a
    n = ledger.try_acquire("n", 300 * MiB_)  # fits beside a, but not beside w too
    assert not n.granted and n.ahead == 1 and n.free >= 300 * MiB_
    assert "1 earlier request(s) waiting" in n.detail()
    ledger.release("a")
    assert ledger.try_acquire("w", 600 * MiB_).granted  # w first
    assert ledger.try_acquire("n", 300 * MiB_).granted  # then n, beside it


def test_a_later_request_that_fits_beside_the_waiting_ones_goes_ahead(tmp_path):
    ledger = _ledger(tmp_path, available=1 * GiB)
    assert ledger.try_acquire("a", 500 * MiB_).granted
    assert not ledger.try_acquire("w", 600 * MiB_).granted
    assert not ledger.try_acquire("v", 400 * MiB_).granted  # 400 + 600 > 524: behind w
    ledger.release("a")
    small = ledger.try_acquire("s", 20 * MiB_)  # 20 + 600 + 400 <= 1024: no one waits longer
    assert small.granted and small.ahead == 2


def test_a_withdrawn_stale_or_dead_waiter_no_longer_holds_others_back(tmp_path, monkeypatch):
    ledger = _ledger(tmp_path, available=1 * GiB)
    assert ledger.try_acquire("a", 500 * MiB_).granted
    assert not ledger.try_acquire("w", 600 * MiB_).granted
    ledger.withdraw("w")  # timed out, or cancelled
    assert ledger.try_acquire("n", 300 * MiB_).granted
    ledger.release("n")

    monkeypatch.setattr("oomguard._admission.ledger.QUEUE_STALE", 0.2)
    assert not ledger.try_acquire("w2", 600 * MiB_).granted
    assert not ledger.try_acquire("n", 300 * MiB_).granted
    time.sleep(0.3)  # w2 stopped asking
    assert ledger.try_acquire("n", 300 * MiB_).granted
    ledger.release("n")

    other = _sleeper()
    assert not ledger.try_acquire("w3", 600 * MiB_, pid=other.pid).granted
    assert not ledger.try_acquire("n", 300 * MiB_).granted
    other.kill()
    other.wait()  # its worker died while waiting
    assert ledger.try_acquire("n", 300 * MiB_).granted


def test_a_waiter_that_cannot_fit_even_after_every_lease_ends_holds_no_one_back(tmp_path):
    ledger = _ledger(tmp_path, available=1 * GiB)
    assert ledger.try_acquire("a", 500 * MiB_).granted
    assert not ledger.try_acquire("huge", 2 * GiB).granted  # waits for its AdmissionTimeout
    assert ledger.try_acquire("n", 300 * MiB_).granted


def test_acquire_withdraws_at_its_timeout(tmp_path):
    ledger = _ledger(tmp_path, available=1 * GiB)
    assert ledger.try_acquire("a", 500 * MiB_).granted
    with pytest.raises(AdmissionTimeout):
        ledger.acquire("w", 600 * MiB_, timeout=0.2, poll=0.05)
    assert ledger.try_acquire("n", 300 * MiB_).granted


def test_junk_in_the_queue_is_dropped(tmp_path):
    path = tmp_path / "ledger.json"
    path.write_text('{"version":1,"leases":[],"peaks":{},"queue":[[1,"x"],"y",[2,"k",5,"t",1]]}')
    ledger = HostLedger(str(path), available=lambda: 1 * GiB)
    assert ledger.try_acquire("n", 300 * MiB_).granted
    assert '"queue":[]' in path.read_text()
