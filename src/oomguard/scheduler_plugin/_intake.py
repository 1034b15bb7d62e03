"""A bounded intake for death reports: the RPC handler only queues bytes; a thread decodes
and validates them and hands batches back to the event loop.

A flood of reports (a rack going down, or a hostile client) then costs the event loop a
queue append each; what does not fit is refused and counted as overflow, never dropped
silently. What fits is bounded twice: by the queue's own caps, and by the room its consumer
has left (`room`), counting every report taken in and not yet handed over. Without the
second bound a storm on a loaded machine fills the queue with thousands of reports that the
consumer can only refuse after they were decoded (holding the GIL) and delivered (on the
event loop). Batches are small: each is one lump of work on the loop, and on a loaded
machine the loop's lag grows with the largest lumps it runs.

Per sender (`_senders`): a report the scheduler waits for (`matched`: its worker's
removal is pending) is taken first, in a lane of its own that a flood cannot fill; any
other is counted against its host's rate, and past it refused unread (`overflow`, and
`limited` by host): the nanny of a real death retries.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .._death import wire as _wire
from .._death.record import Death
from .._exceptions import ReportError
from ._senders import SenderLimit, peek_worker

logger = logging.getLogger("oomguard.scheduler")

Result = tuple[Death | ReportError, float, Any]  # (death or error, arrival, meta)


class ReportIntake:
    """Queue -> decoding thread -> `on_batch(results)` on the event loop.

    >>> intake = ReportIntake(on_batch=print, max_items=2)   # doctest: +SKIP
    >>> intake.start(asyncio.get_running_loop())              # doctest: +SKIP
    """

    def __init__(
        self,
        on_batch: Callable[[list[Result]], None],
        *,
        max_items: int = 10_000,
        max_bytes: int = 256 * 2**20,
        max_report_bytes: int = _wire.MAX_REPORT_BYTES,
        batch: int = 8,
        room: Callable[[], int | None] | None = None,
        matched: Callable[[str], bool] | None = None,
        senders: SenderLimit | None = None,
        max_matched: int = 1_000,
    ):
        self.on_batch = on_batch
        # How many more reports the consumer could take now (None: no limit). Called on
        # the event loop by `submit`, so it may read the consumer's state.
        self.room = room
        # Whether a death of this worker waits for its report (event loop).
        self.matched = matched
        self.senders = senders if senders is not None else SenderLimit()
        self.max_matched = max_matched
        self._first: deque[tuple[bytes, float, Any]] = deque()  # matched reports
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.max_report_bytes = max_report_bytes
        self.batch = batch
        self._queue: deque[tuple[bytes, float, Any]] = deque()
        self._bytes = 0
        self._unsettled = 0  # submitted, not yet through on_batch (event loop only)
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.overflow = 0  # refused unread: the one count of these (`ReportDesk.counts`)
        self.accepted = 0
        self.first = 0  # of accepted: matched to a death that waited for its report

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="oomguard-intake", daemon=True)
        self._thread.start()

    def submit(self, data: bytes, meta: Any = None) -> bool:
        """Queue one report (event loop; O(1)) with `meta` (the sender), handed back with
        its result. A report whose death waits for it goes first, past every other limit
        but its lane's size. Any other: False when its sender is over its rate, when full,
        or when the reports taken in and not yet handed over already fill the consumer's
        `room`: counted in `overflow`."""
        if self.matched is not None:
            worker = peek_worker(data)
            if worker is not None and self.matched(worker):
                with self._cond:
                    if len(self._first) < self.max_matched:
                        self._first.append((data, time.time(), meta))
                        self.first += 1
                        self.accepted += 1
                        self._unsettled += 1
                        self._cond.notify()
                        return True
        if not self.senders.take(meta, time.monotonic()):
            self.overflow += 1
            return False
        room = self.room() if self.room is not None else None
        if room is not None and self._unsettled >= room:
            self.overflow += 1
            return False
        with self._cond:
            if len(self._queue) >= self.max_items or self._bytes + len(data) > self.max_bytes:
                self.overflow += 1
                return False
            self._queue.append((data, time.time(), meta))
            self._bytes += len(data)
            self.accepted += 1
            self._unsettled += 1
            self._cond.notify()
        return True

    def limited(self) -> int:
        """Reports refused because their sender was over its rate."""
        return sum(self.senders.limited.values())

    def pending(self) -> int:
        return len(self._queue) + len(self._first)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._first and not self._closed:
                    self._cond.wait()
                if self._closed and not self._queue and not self._first:
                    return
                first = self._first
                items = [first.popleft() for _ in range(min(self.batch, len(first)))]
                queue = self._queue
                rest = [queue.popleft() for _ in range(min(self.batch - len(items), len(queue)))]
                self._bytes -= sum(len(d) for d, _, _ in rest)
                items += rest
            results: list[Result] = []
            for data, arrived, meta in items:
                try:
                    results.append((_wire.decode(data, self.max_report_bytes), arrived, meta))
                except ReportError as e:
                    results.append((e, arrived, meta))
                except Exception as e:  # the validator's own bug: refuse, never crash
                    error = ReportError("report", f"unreadable ({e!r})", "undecodable")
                    results.append((error, arrived, meta))
            # Back-pressure: decode the next batch only once the event loop has taken this
            # one. The thread competes with the loop for the GIL; decoding ahead of a busy
            # loop (a storm on a loaded machine) only starves it, while the queue's cap
            # refuses and counts what cannot be taken.
            taken = threading.Event()
            try:
                self._loop.call_soon_threadsafe(self._deliver, results, taken)
            except RuntimeError:  # the loop is closed: the scheduler is gone
                return
            while not taken.wait(0.5):
                if self._closed or self._loop.is_closed():
                    return

    def _deliver(self, results: list[Result], taken: threading.Event) -> None:
        try:
            self.on_batch(results)
        finally:
            self._unsettled -= len(results)
            taken.set()

    def close(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)
