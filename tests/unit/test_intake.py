"""The report intake: bounded by its own caps and by the room its consumer has left."""

from __future__ import annotations

import asyncio

from oomguard._death.record import Death
from oomguard._decide import DecisionCore, Removal
from oomguard.scheduler_plugin._intake import ReportIntake
from oomguard.scheduler_plugin._plugin import OomguardSchedulerPlugin


async def _drain(intake: ReportIntake, got: list, n: int) -> None:
    for _ in range(500):
        if len(got) >= n and not intake.pending():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"only {len(got)} of {n} reports were handed over")


def test_reports_taken_in_count_against_the_room():
    # A storm: reports arrive faster than the loop takes them. Only as many as the consumer
    # has room for are taken in (queued or on their way); the rest are refused unread.
    async def main():
        got: list = []
        cap = 5
        intake = ReportIntake(got.extend, room=lambda: cap - len(got), batch=2)
        intake.start(asyncio.get_running_loop())
        try:
            # No await between submits: nothing is handed over meanwhile.
            taken = [intake.submit(b"not msgpack", "peer") for _ in range(12)]
            assert taken == [True] * 5 + [False] * 7
            assert (intake.accepted, intake.overflow) == (5, 7)
            await _drain(intake, got, 5)
            assert intake.submit(b"x") is False  # the consumer is full
            cap = 7  # it made room for two
            assert [intake.submit(b"x") for _ in range(3)] == [True, True, False]
            await _drain(intake, got, 7)
            assert (intake.accepted, intake.overflow) == (7, 9)
        finally:
            intake.close()
        # Every report taken in was handed over with its result (undecodable here).
        assert len(got) == 7
        assert all(type(r).__name__ == "ReportError" for r, _, _ in got)

    asyncio.run(main())


def test_no_room_limit_takes_everything_that_fits_the_queue():
    async def main():
        got: list = []
        intake = ReportIntake(got.extend, room=lambda: None, max_items=4)
        intake.start(asyncio.get_running_loop())
        try:
            assert [intake.submit(b"x") for _ in range(6)] == [True] * 4 + [False] * 2
            await _drain(intake, got, 4)
            assert [intake.submit(b"x") for _ in range(4)] == [True] * 4
            await _drain(intake, got, 8)
        finally:
            intake.close()

    asyncio.run(main())


def test_the_plugins_room_is_the_pairings_cap_unless_a_removal_waits():
    plugin = OomguardSchedulerPlugin()
    pairing = DecisionCore(grace=5.0, max_reports=3).pairing

    async def main():
        plugin.desk.start(pairing, lambda death: None, asyncio.get_running_loop())
        try:
            assert plugin.desk._room() == 3
            pairing.reported(Death(worker="tcp://a:1", pid=1), now=0.0)
            assert plugin.desk._room() == 2
            # A removal waits for its report, which any queued report may be: no limit.
            pairing.removed(Removal("tcp://b:1", "b", 0.0, {}), now=0.0)
            assert plugin.desk._room() is None
        finally:
            plugin.desk.close()

    asyncio.run(main())
