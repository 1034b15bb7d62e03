"""Start-up reservations on a real ledger file: who waits, for how long, what is learned."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time

import pytest

from oomguard._admission.config import AdmissionConfig
from oomguard._admission.ledger import HostLedger
from oomguard._admission.ledger_file import STARTUP_PEAK
from oomguard._admission.startup import StartupReservations, startup_peak

MiB = 2**20


def _config(tmp_path, **kw) -> AdmissionConfig:
    base = AdmissionConfig(
        enabled=True,
        floor=0,
        max_wait=60.0,
        ledger=str(tmp_path / "ledger.json"),
        poll=0.02,
        min_estimate=64 * MiB,
        cgroup=None,
        startup=True,
        startup_initial=100 * MiB,
        startup_max_wait=5.0,
    )
    return dataclasses.replace(base, **kw)


def _nanny(config: AdmissionConfig, name: str, available: int) -> StartupReservations:
    r = StartupReservations(config, name)
    r.ledger.available = lambda: available  # a host with this much available, fixed
    return r


def test_the_first_start_is_granted_and_its_peak_is_learned(tmp_path):
    r = _nanny(_config(tmp_path), "a", 1024 * MiB)
    start = asyncio.run(r.reserve(None, lambda: False))
    assert (start.outcome, start.need) == ("granted", 100 * MiB)
    assert r.ledger.leases() == [(os.getpid(), start.key, 100 * MiB)]
    r.release(70 * MiB)
    assert r.ledger.leases() == []
    assert r.need() == 70 * MiB  # learned, now smaller than the initial guess
    r.release(None)  # a start that never came up teaches nothing
    assert HostLedger(r.ledger.path).refresh()[STARTUP_PEAK] == 70 * MiB


def test_a_second_start_that_does_not_fit_waits_for_the_first(tmp_path):
    config = _config(tmp_path)
    a, b = _nanny(config, "a", 150 * MiB), _nanny(config, "b", 150 * MiB)

    async def main():
        first = await a.reserve(None, lambda: False)
        waiting = asyncio.ensure_future(b.reserve(None, lambda: False))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # 100 + 100 > 150: one after another
        a.release(90 * MiB)
        second = await asyncio.wait_for(waiting, 5)
        return first, second

    first, second = asyncio.run(main())
    assert second.outcome == "granted"
    assert second.granted_at - second.asked_at >= 0.3
    assert second.granted_at >= first.asked_at
    assert b.waits == 1 and b.timeouts == 0


def test_starts_that_fit_together_go_together(tmp_path):
    config = _config(tmp_path)
    nannies = [_nanny(config, n, 400 * MiB) for n in "abc"]

    async def main():
        return await asyncio.gather(*(r.reserve(None, lambda: False) for r in nannies))

    starts = asyncio.run(main())
    assert [s.outcome for s in starts] == ["granted"] * 3
    assert sum(r.waits for r in nannies) == 0


def test_past_max_wait_the_worker_starts_anyway_with_a_warning(tmp_path, caplog):
    config = _config(tmp_path, startup_max_wait=0.3)
    a, b = _nanny(config, "a", 150 * MiB), _nanny(config, "b", 150 * MiB)
    asyncio.run(a.reserve(None, lambda: False))
    with caplog.at_level(logging.WARNING, logger="oomguard.nanny"):
        start = asyncio.run(b.reserve(None, lambda: False))
    assert start.outcome == "timeout" and b.timeouts == 1
    assert "starts anyway" in caplog.text and "100 MiB" in caplog.text
    assert [k for _, k, _ in b.ledger.leases()] == [a.key]  # b holds nothing


def test_the_wait_is_at_most_half_the_death_timeout(tmp_path):
    config = _config(tmp_path, startup_max_wait=30.0)
    a, b = _nanny(config, "a", 150 * MiB), _nanny(config, "b", 150 * MiB)
    asyncio.run(a.reserve(None, lambda: False))
    began = time.monotonic()
    start = asyncio.run(b.reserve(0.6, lambda: False))
    assert start.outcome == "timeout"
    assert 0.3 <= time.monotonic() - began < 10  # 0.3 s, not max-wait's 30 s


def test_a_closing_nanny_stops_waiting_without_a_warning(tmp_path, caplog):
    config = _config(tmp_path)
    a, b = _nanny(config, "a", 150 * MiB), _nanny(config, "b", 150 * MiB)
    asyncio.run(a.reserve(None, lambda: False))
    with caplog.at_level(logging.WARNING, logger="oomguard.nanny"):
        start = asyncio.run(b.reserve(None, lambda: True))
    assert start.outcome == "stopped" and b.timeouts == 0
    assert "starts anyway" not in caplog.text


def test_close_releases_a_held_lease(tmp_path):
    r = _nanny(_config(tmp_path), "a", 1024 * MiB)
    asyncio.run(r.reserve(None, lambda: False))
    r.close()
    assert HostLedger(r.ledger.path).leases() == []


def test_the_event_says_what_happened(tmp_path):
    r = _nanny(_config(tmp_path), "a", 1024 * MiB)
    start = asyncio.run(r.reserve(None, lambda: False))
    event = start.event(1234, start.granted_at + 1.0, 70 * MiB)
    assert event["action"] == "startup" and event["pid"] == 1234
    assert event["need"] == 100 * MiB and event["peak"] == 70 * MiB
    assert event["waited"] == pytest.approx(start.granted_at - start.asked_at, abs=1e-3)
    assert event["up_at"] - event["granted_at"] == pytest.approx(1.0)


def test_startup_peak_prefers_the_group_and_else_reads_vmhwm():
    assert startup_peak(os.getpid(), 12345) == 12345
    hwm = startup_peak(os.getpid(), None)
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    assert hwm is not None and hwm >= rss
    assert startup_peak(2**22 + 12345, None) is None  # no such process
