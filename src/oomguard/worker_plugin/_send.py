"""Sending a death report: a scheduler that answers `overflow` (a flood of reports, or a
storm of deaths past what it takes at once) is asked again, with backoff.

Bounded: at most `RETRY_SECONDS` in all, each wait doubling from `FIRST_WAIT` to
`MAX_WAIT` with jitter (nannies of one rack do not retry in step); every wait is an
`asyncio.sleep`, so the nanny's event loop never blocks. A report that arrives after the
scheduler decided its death without one (its grace ran out) still amends that death with
its evidence, so retrying well past the grace is worth it.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .._protocol import OVERFLOW

RETRY_SECONDS = 60.0
FIRST_WAIT = 0.05
MAX_WAIT = 5.0


async def send_with_retry(
    call: Callable[[], Awaitable[Any]],
    *,
    budget: float = RETRY_SECONDS,
    first: float = FIRST_WAIT,
    most: float = MAX_WAIT,
    stop: Callable[[], bool] = lambda: False,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> tuple[Any, int]:
    """The scheduler's last reply to `call()`, and how many times it answered `overflow`.
    Asked again while it answers `overflow`, `budget` seconds at most, unless `stop()`
    (the nanny is closing). Errors propagate (no scheduler plugin: the caller's fallback).

    >>> replies = iter([{"status": "overflow"}, {"status": "queued"}])
    >>> async def call(): return next(replies)
    >>> async def nap(s): pass
    >>> asyncio.run(send_with_retry(call, sleep=nap))
    ({'status': 'queued'}, 1)
    """
    deadline = time.monotonic() + budget
    wait = first
    overflows = 0
    while True:
        reply = await call()
        if not (isinstance(reply, dict) and reply.get("status") == OVERFLOW):
            return reply, overflows
        overflows += 1
        pause = wait * random.uniform(0.5, 1.0)
        if stop() or time.monotonic() + pause > deadline:
            return reply, overflows
        await sleep(pause)
        wait = min(most, wait * 2)
