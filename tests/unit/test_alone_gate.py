"""The run-alone gate (worker_plugin/_alone.py) on an event loop, without a cluster.

The worker here is the smallest stand-in the gate touches: an `execute` coroutine that
runs until the test ends the task, and `state.tasks[key].annotations`. What a task "runs"
is what the gate's `started`/`ended` say (the flight record's slots): a task waiting at the
gate is never started.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from oomguard._protocol import RUN_ALONE_ANNOTATION
from oomguard.worker_plugin._alone import AloneGate


class Worker:
    """`execute(key)` returns when the test calls `end(key)`."""

    def __init__(self) -> None:
        self.state = SimpleNamespace(tasks={})
        self._done: dict = {}

    def add(self, key, hold: float | None = None) -> None:
        ann = {RUN_ALONE_ANNOTATION: hold} if hold is not None else {}
        self.state.tasks[key] = SimpleNamespace(annotations=ann)

    async def execute(self, key, *, stimulus_id):
        self._done[key] = asyncio.get_running_loop().create_future()
        return await self._done[key]

    def end(self, key) -> None:
        self._done[key].set_result(f"{key} done")


class Run:
    """A worker with the gate installed, and what ran when."""

    def __init__(self) -> None:
        self.worker = Worker()
        self.running: set = set()
        self.log: list = []  # (key, what ran beside it when it started)
        self.errors: list = []
        self.gate = AloneGate(self._started, self._ended, self.errors.append)
        self.gate.install(self.worker)
        self.calls: dict = {}

    def _started(self, key) -> None:
        self.log.append((key, sorted(self.running)))
        self.running.add(key)

    def _ended(self, key) -> None:
        self.running.discard(key)

    async def submit(self, key, hold: float | None = None) -> None:
        self.worker.add(key, hold)
        self.calls[key] = asyncio.create_task(self.worker.execute(key, stimulus_id="s"))
        await settle()

    async def end(self, key) -> None:
        self.worker.end(key)
        assert await self.calls[key] == f"{key} done"
        await settle()


async def settle() -> None:
    for _ in range(20):  # a woken waiter runs a few loop turns later
        await asyncio.sleep(0)


def test_a_suspect_starts_once_the_running_tasks_end_and_nothing_starts_beside_it():
    async def main():
        r = Run()
        await r.submit("a")
        await r.submit("b")
        await r.submit("suspect", hold=60.0)
        await r.submit("c")  # took the thread "a" gave up, after the suspect: waits
        assert r.running == {"a", "b"}  # the suspect waits for them, and "c" for it
        await r.end("a")
        assert r.running == {"b"}
        await r.end("b")
        assert r.running == {"suspect"}  # alone
        await r.end("suspect")
        assert r.running == {"c"}
        await r.end("c")
        assert r.log == [("a", []), ("b", ["a"]), ("suspect", []), ("c", [])]
        assert (r.gate.holds, r.gate.overruns, r.errors) == (1, 0, [])

    asyncio.run(main())


def test_when_the_hold_runs_out_the_tasks_that_waited_start_beside_the_suspect():
    async def main():
        r = Run()
        await r.submit("long")  # outlasts the hold
        await r.submit("suspect", hold=0.2)
        await r.submit("c")
        assert r.running == {"long"}
        await asyncio.sleep(0.4)
        await settle()
        assert r.running == {"long", "suspect", "c"}  # the bound ran out: as without a hold
        assert (r.gate.holds, r.gate.overruns) == (1, 1)
        for key in ("long", "suspect", "c"):
            await r.end(key)
        # Once running alone, a later hold's bound ends its hold too.
        await r.submit("second", hold=0.2)
        await r.submit("d")
        assert r.running == {"second"}
        await asyncio.sleep(0.4)
        await r.submit("e")
        assert r.running == {"second", "d", "e"} and r.gate.overruns == 2

    asyncio.run(main())


def test_two_suspects_hold_one_after_the_other():
    async def main():
        r = Run()
        await r.submit("one", hold=60.0)
        await r.submit("two", hold=60.0)
        await r.submit("c")
        assert r.running == {"one"}
        await r.end("one")
        assert r.running == {"two"}
        await r.end("two")
        assert r.running == {"c"}

    asyncio.run(main())


def test_a_task_with_no_hold_in_force_never_waits():
    async def main():
        r = Run()
        await r.submit("a")
        assert r.running == {"a"} and r.gate._changed is None  # nothing waited, no event
        await r.end("a")
        assert r.gate.holds == 0 and r.running == set()

    asyncio.run(main())


def test_tasks_executing_when_the_gate_came_count_until_they_leave():
    async def main():
        r = Run()
        r.gate.running.add("early")  # the plugin's setup: executing before the gate
        await r.submit("suspect", hold=60.0)
        assert r.running == set()
        r.gate.left("early")  # its transition out of executing
        await settle()
        assert r.running == {"suspect"}

    asyncio.run(main())


def test_a_suspect_cancelled_while_it_waits_gives_the_worker_back():
    async def main():
        r = Run()
        await r.submit("a")
        await r.submit("suspect", hold=60.0)
        await r.submit("c")
        r.calls["suspect"].cancel()  # the worker closes
        await settle()
        assert r.gate.holder is None and r.running == {"a", "c"}
        with pytest.raises(asyncio.CancelledError):
            await r.calls["suspect"]

    asyncio.run(main())


def test_uninstall_gives_execute_back_and_lets_the_waiting_tasks_go():
    async def main():
        r = Run()
        await r.submit("a")
        await r.submit("suspect", hold=60.0)
        await r.submit("c")
        r.gate.uninstall(r.worker)
        await settle()
        assert r.running == {"a", "suspect", "c"}
        assert "execute" not in r.worker.__dict__  # Worker.execute again

        # Over another wrapper of execute (memory admission's), that one comes back.
        w = Worker()
        own = w.execute
        w.execute = own  # an instance attribute, as admission sets it
        gate = AloneGate(lambda k: None, lambda k: None, lambda s: None)
        gate.install(w)
        assert w.execute == gate.execute
        gate.uninstall(w)
        assert w.__dict__["execute"] == own

    asyncio.run(main())


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), "60", True, None])
def test_a_bad_hold_is_no_hold(value):
    async def main():
        r = Run()
        await r.submit("a")
        r.worker.state.tasks["x"] = SimpleNamespace(annotations={RUN_ALONE_ANNOTATION: value})
        r.calls["x"] = asyncio.create_task(r.worker.execute("x", stimulus_id="s"))
        await settle()
        assert r.running == {"a", "x"} and r.gate.holds == 0

    asyncio.run(main())
