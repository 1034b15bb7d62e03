"""Issue 28, item 4: the intake bounds each sender, and a report a death waits for goes
first, whatever a flood from the same host does."""

from __future__ import annotations

import asyncio
import dataclasses

from oomguard._death import wire
from oomguard._death.build import EXAMPLE, build
from oomguard.scheduler_plugin._intake import ReportIntake
from oomguard.scheduler_plugin._senders import BURST

FORGER = "tcp://10.0.0.9:50001"
NANNY = "tcp://10.0.0.9:50002"  # the same host as the forger


def _report(worker: str) -> bytes:
    return wire.encode(build(dataclasses.replace(EXAMPLE, worker=worker)))


async def _drain(intake: ReportIntake, got: list, n: int) -> None:
    for _ in range(1000):
        if len(got) >= n and not intake.pending():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"only {len(got)} of {n} reports were handed over")


def test_a_flooding_sender_is_refused_past_its_rate_and_counted():
    async def main():
        got: list = []
        intake = ReportIntake(got.extend, room=lambda: None)
        intake.start(asyncio.get_running_loop())
        try:
            forged = _report("tcp://10.0.0.9:1")
            taken = [intake.submit(forged, FORGER) for _ in range(BURST + 500)]
            assert taken.count(True) <= BURST + 5  # its burst (and what refilled meanwhile)
            assert intake.limited() == taken.count(False) > 0
            assert intake.overflow == taken.count(False)
            assert intake.submit(forged, "tcp://10.0.0.7:1")  # another host: its own rate
        finally:
            intake.close()

    asyncio.run(main())


def test_a_report_its_death_waits_for_goes_first_through_a_flood():
    async def main():
        got: list = []
        waiting = {"tcp://10.0.0.9:40001"}
        intake = ReportIntake(
            got.extend, room=lambda: None, matched=waiting.__contains__, max_items=100
        )
        intake.start(asyncio.get_running_loop())
        try:
            forged = _report("tcp://10.0.0.9:1")
            for _ in range(BURST + 100):
                intake.submit(forged, FORGER)  # the host's rate and the queue are spent
            assert not intake.submit(forged, FORGER)
            assert intake.submit(_report("tcp://10.0.0.9:40001"), NANNY)
            assert intake.first == 1
            await _drain(intake, got, intake.accepted)
        finally:
            intake.close()
        workers = [r.worker for r, _, _ in got]
        # Taken before every forged report still queued when it came.
        assert workers.index("tcp://10.0.0.9:40001") < 10

    asyncio.run(main())


def test_senders_doctests():
    import doctest

    from oomguard.scheduler_plugin import _senders

    assert doctest.testmod(_senders).failed == 0
