"""The run-alone gate: a suspect retried after a shared memory kill runs alone on its worker.

The scheduler plugin marks a suspect with `RUN_ALONE_ANNOTATION` (its value: how long the
hold may last, in seconds), restricts it to this worker and puts it first in the worker's
queue. Here, when that task is about to start, the worker is held: the suspect starts only
once every task already running its code here has ended, and no other task starts until
the suspect ends or the hold runs out; then the tasks that waited start as usual.

Where it hooks in (distributed 2024.12.0 to 2026.8.0): `BaseWorker.handle_stimulus` turns
each `Execute` instruction into ``self._start_async_instruction(..., self.execute, key,
...)``, looking `execute` up on the instance each time, as memory admission does
(`_admission.py`). The gate shadows `worker.execute` on the instance with a coroutine that
waits (an `await` on the event loop, no thread blocked) and then awaits the `execute` it
found. Why there: the key and its annotations are in hand before any of the task's code
runs, and the call returns only once that code has ended (a cancelled or seceded task's
thread included), which is exactly the span "running" must mean here. An executor wrapper
sees neither the key nor the end of a task whose future was dropped, and
`Worker.active_threads` is filled under a lock that must not be held while waiting.

A task waiting here is "executing" to Dask (it holds one of the worker's slots, as a task
waiting for admission does) but has not started: `started`/`ended` (the flight record's
slots) are called only around the real run, so a death while it waits shows it queued,
never executing. The suspect itself is first in the worker's queue, so it is the next task
to take a slot; the tasks that take the other slots after it wait here.

Hot path: a task with no hold in force costs two dict lookups, a set insertion and its
flight slot (which the transition hook used to open); nothing waits and no I/O happens
unless a suspect holds this worker.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._protocol import RUN_ALONE_ANNOTATION

if TYPE_CHECKING:
    from distributed import Worker

logger = logging.getLogger("oomguard.worker")

#: The longest hold honoured, whatever the annotation says (one day).
MAX_HOLD = 86_400.0


def hold_seconds(annotations: Any) -> float | None:
    """The hold a task's annotations ask for, None when none (or not a sane number).

    >>> hold_seconds({"oomguard_alone": 600.0}), hold_seconds({}), hold_seconds(None)
    (600.0, None, None)
    >>> hold_seconds({"oomguard_alone": True}), hold_seconds({"oomguard_alone": "1"})
    (None, None)
    """
    value = annotations.get(RUN_ALONE_ANNOTATION) if annotations else None
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or value <= 0:
        return None
    return min(float(value), MAX_HOLD)


class AloneGate:
    """Holds a worker for one suspect at a time. `started(key)` / `ended(key)` are called
    just before a task's code may start and once it has ended (the flight record's slots).

    `running` holds the keys whose code may be running: those past the gate and, from the
    plugin's setup, those that were executing already (`left` removes them).
    """

    def __init__(
        self,
        started: Callable[[Any], None],
        ended: Callable[[Any], None],
        error: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.running: set = set()
        self.holder: Any = None  # the suspect holding the worker (waiting or running)
        self.until = 0.0  # when its hold runs out (clock)
        self.holds = 0  # holds begun
        self.overruns = 0  # holds that ran out before their suspect ended
        self._started, self._ended, self._error = started, ended, error
        self._clock = clock
        self._changed: asyncio.Event | None = None  # made when someone waits
        self._tasks: dict = {}  # the worker's task states (worker.state.tasks)
        self._original: Callable[..., Any] | None = None
        self._shadowed = False  # the instance had its own `execute` (admission's)

    # --- lifecycle ---------------------------------------------------------------------

    def install(self, worker: Worker) -> None:
        self._tasks = worker.state.tasks
        self._shadowed = "execute" in worker.__dict__
        self._original = worker.execute
        worker.execute = self.execute  # instance attribute shadows Worker.execute

    def uninstall(self, worker: Worker) -> None:
        """Give `execute` back and let every waiting task go (its slot is Dask's again)."""
        if worker.__dict__.get("execute") == self.execute:
            if self._shadowed:
                worker.execute = self._original
            else:
                del worker.execute
        self.holder = None
        self._notify()

    # --- the gate ----------------------------------------------------------------------

    async def execute(self, key, *, stimulus_id: str):
        try:
            ts = self._tasks.get(key)
            annotations = ts.annotations if ts is not None else None
            if self.holder is not None or (annotations and RUN_ALONE_ANNOTATION in annotations):
                await self._wait(key, hold_seconds(annotations))
        except asyncio.CancelledError:
            raise
        except Exception:  # never keep a task from running for a bug of ours
            self._error("alone_gate")
        running = self.running
        running.add(key)
        self._started(key)
        try:
            return await self._original(key, stimulus_id=stimulus_id)
        finally:
            running.discard(key)
            self._ended(key)
            if self.holder is not None or self._changed is not None:
                if key == self.holder:
                    self.holder = None
                self._notify()

    def left(self, key) -> None:
        """A task that was executing when the gate was installed has ended."""
        self.running.discard(key)
        self._notify()

    async def _wait(self, key, seconds: float | None) -> None:
        try:
            while self.holder is not None and self.holder != key:
                await self._changes(self.until)  # another suspect's hold, bounded
            if seconds is None:
                return
            self.holder, self.until = key, self._clock() + seconds
            self.holds += 1
            while self.running and self.holder == key:
                await self._changes(self.until)  # the tasks already running end first
        except BaseException:
            if self.holder == key:  # cancelled (the worker closes): nobody waits for it
                self.holder = None
                self._notify()
            raise

    async def _changes(self, deadline: float) -> None:
        """Until a task ends or the hold's deadline; then end a hold that ran out."""
        if self._changed is None:
            self._changed = asyncio.Event()
        remaining = deadline - self._clock()
        if remaining > 0:
            try:  # not wait_for: it can swallow a cancellation that meets a wake-up
                async with asyncio.timeout(remaining):
                    await self._changed.wait()
            except TimeoutError:
                pass
        if self.holder is not None and self._clock() >= self.until:
            logger.warning(
                "oomguard: the hold of this worker for %r ran out: other tasks start beside "
                "it again (oomguard.scheduler.run-alone-timeout)",
                self.holder,
            )
            self.holder = None
            self.overruns += 1
            self._notify()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None
