"""Issue 28, item 7: a nanny whose report the scheduler answers `overflow` asks again,
with bounded backoff, without blocking its event loop."""

from __future__ import annotations

import asyncio
import logging
import time

from oomguard._death import wire
from oomguard._death.build import EXAMPLE, build
from oomguard._guard import Guard
from oomguard.worker_plugin._reporting import Reporter
from oomguard.worker_plugin._send import send_with_retry


class _Nanny:
    """What the plugin's `_send` uses of its nanny: an RPC to the scheduler, and the
    fallback event (recorded here)."""

    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler
        self.events: list = []

    def log_event(self, topic, msg) -> None:
        self.events.append((topic, msg))


def test_the_nanny_sends_again_after_overflow_and_the_loop_keeps_running():
    from distributed import Scheduler
    from distributed.core import rpc

    async def main():
        got: list[bytes] = []

        async def busy_then_queued(comm=None, report=None, **kw):
            # A real scheduler's RPC answering as oomguard's does during a flood.
            got.append(report)
            return {"status": "overflow" if len(got) <= 4 else "queued"}

        async with Scheduler(dashboard_address=":0", host="127.0.0.1") as s:
            s.handlers["oomguard_death_report"] = busy_then_queued
            nanny = _Nanny(rpc(s.address))
            plugin = Reporter(nanny, "", None, Guard(None, logging.getLogger("test")))
            ticks = 0

            async def ticker():
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.005)

            t = asyncio.create_task(ticker())
            try:
                await plugin.send(build(EXAMPLE))
            finally:
                t.cancel()
                await nanny.scheduler.close_rpc()
        assert len(got) == 5  # four overflows, then taken
        assert wire.decode(got[-1]).worker == EXAMPLE.worker
        assert nanny.events == []  # taken by the scheduler, no fallback event
        assert plugin.reports_sent == 1
        assert ticks > 5  # the nanny's loop ran meanwhile

    asyncio.run(main())


def test_the_retry_is_bounded_in_time():
    async def main():
        calls = 0

        async def call():
            nonlocal calls
            calls += 1
            return {"status": "overflow"}

        start = time.monotonic()
        reply, overflows = await send_with_retry(call, budget=0.5, first=0.01, most=0.1)
        assert reply == {"status": "overflow"} and overflows == calls > 3
        assert time.monotonic() - start < 1.0

    asyncio.run(main())


def test_a_closing_nanny_stops_asking():
    async def main():
        calls = 0

        async def call():
            nonlocal calls
            calls += 1
            return {"status": "overflow"}

        await send_with_retry(call, budget=10.0, stop=lambda: calls >= 2)
        assert calls == 2

    asyncio.run(main())


def test_send_doctests():
    import doctest

    from oomguard.worker_plugin import _send

    assert doctest.testmod(_send).failed == 0
