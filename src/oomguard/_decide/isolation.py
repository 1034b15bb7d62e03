"""After a memory kill shared by several tasks: each runs alone, one at a time (pure).

A worker killed for memory while it executed several tasks proves no single one too big
(`memory`), so the core holds them and lets them run again one by one, the likely culprit
first: each is then judged on its own death, if it dies again.

"Alone" is exact, also when every thread of the cluster is busy: a suspect is placed
(`RunAlone`) on the worker with the largest memory limit among those whose oomguard worker
plugin can hold its tasks back (`able`, as each worker's plugin says when it starts); that
worker starts no other task while the suspect runs, and the suspect starts only once the
tasks already running there have ended (`worker_plugin/_alone.py`). The hold is bounded by
`seconds`: when it runs out, the worker starts other tasks beside the suspect again, the
next suspect is placed, and a death shared with that suspect says so in its evidence
(`explain`). When no worker can hold (no worker plugin could run there), a suspect runs where
Dask places it, as before; when able workers exist but none is here (restarting), it waits
for one, up to `seconds` too.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Iterable, Mapping
from typing import Any

from .budget import DeathBudget
from .decisions import Decision, EndAlone, Hold, RunAlone
from .resize import Resized

__all__ = ["RUN_ALONE_TIMEOUT", "Isolation"]

#: How long a suspect may hold its worker (oomguard.scheduler.run-alone-timeout's default).
RUN_ALONE_TIMEOUT = 600.0


class Isolation:
    """The suspects of shared memory kills, held in a queue, and the one running alone.

    It shares the core's `held` set (a queued suspect is held; the one it lets run is not)
    and reads its `stopped` keys (never run again), the budget (a key that was on a worker
    whose death is undecided waits for that decision first), the workers here (address ->
    memory limit) and the keys retried on larger workers (`resized`: their floor).
    """

    def __init__(
        self,
        held: set,
        stopped: Mapping[Any, Any],
        budget: DeathBudget,
        workers: Mapping[str, int | None],
        resized: Mapping[Any, Resized],
        seconds: float = RUN_ALONE_TIMEOUT,
    ) -> None:
        self.suspects: deque = deque()  # held after a shared memory kill, run one at a time
        self.isolating: Any = None
        self.worker: str | None = None  # where `isolating` runs alone (None: anywhere)
        self.since = 0.0  # when it was placed
        self.seconds = seconds  # how long it may hold its worker
        self.able: set[str] = set()  # workers whose plugin can hold their other tasks back
        self.overran: dict[Any, str] = {}  # key -> why it may have run beside others
        self._ever_able = False
        self._waits: float | None = None  # since when the first suspect waits for a worker
        self._held = held
        self._stopped = stopped
        self._budget = budget
        self._workers = workers
        self._resized = resized

    @property
    def waiting(self) -> bool:
        """The first suspect waits for an able worker to come (bounded by `seconds`)."""
        return self._waits is not None

    def waits(self, key: Any) -> bool:
        """`key` is held for isolation: queued, or the one running alone."""
        return key in self.suspects or key == self.isolating

    def queue(self, keys: Iterable, first: Any = None) -> list:
        """Hold `keys` (None: a key not known here) to run alone, `first` first, the others
        in their order; the keys newly queued."""
        queued = []
        for key in sorted((k for k in keys if k is not None), key=lambda k: k != first):
            if key not in self._stopped and key not in self.suspects and key != self.isolating:
                self.suspects.append(key)
                self._held.add(key)
                queued.append(key)
        return queued

    def next(self, now: float) -> list[Decision]:
        """Let the first suspect run alone, unless one does, it waits for a death to be
        decided, or for a worker that can hold (bounded by `seconds`)."""
        while self.isolating is None and self.suspects:
            key = self.suspects[0]
            if key in self._stopped or key not in self._held:
                self.suspects.popleft()
                continue
            if self._budget.undecided(key):
                return []  # still on a worker whose death is undecided: that comes first
            worker = self._choose(key)
            if worker is None and self._ever_able:
                # Able workers exist but none (large enough) is here: one may be restarting.
                self._waits = now if self._waits is None else self._waits
                if now - self._waits < self.seconds:
                    return []
                self.overran[key] = (
                    f"no worker able to hold its other tasks back came within {self.seconds:g} s"
                )
            elif worker is None:
                self.overran[key] = (
                    "no worker here runs oomguard's worker plugin, which alone can hold a "
                    "worker's other tasks back"
                )
            else:
                self.overran.pop(key, None)
            self.suspects.popleft()
            self._waits = None
            self.isolating, self.worker, self.since = key, worker, now
            self._held.discard(key)
            return [RunAlone(key, worker, self.seconds)]
        return []

    def _choose(self, key: Any) -> str | None:
        """The able worker here with the largest memory limit (none: the largest), above the
        limit `key` died under if it is retried on larger workers."""
        resized = self._resized.get(key)
        floor = resized.limit if resized is not None else 0
        fits = [
            (not limit, limit or 0, address)
            for address in self.able
            if (limit := self._workers.get(address, -1)) != -1 and (not limit or limit > floor)
        ]
        return max(fits)[2] if fits else None

    def _end(self) -> list[Decision]:
        key, self.isolating, self.worker = self.isolating, None, None
        return [EndAlone(key)]

    def done(self, key: Any, now: float) -> list[Decision]:
        """`key` ended (in memory, erred, forgotten): if it ran alone, the next one runs."""
        if self.overran:
            self.overran.pop(key, None)
        if key is not None and key == self.isolating:
            return self._end() + self.next(now)
        return []

    def died(self, *keys: Container) -> list[Decision]:
        """A death was charged to `keys`: the one running alone, if among them, died again
        (alone, and judged by the core, or shared again, and queued again)."""
        if self.isolating is not None and any(self.isolating in k for k in keys):
            return self._end()
        return []

    def displaced(self, keys: Container) -> list[Decision]:
        """`keys` were only displaced: the one running alone, if among them, goes first
        again (it waited at its worker's gate, or stood beside a crash)."""
        if self.isolating is not None and self.isolating in keys:
            self.suspects.appendleft(self.isolating)
            return self._end()
        return []

    def discard(self, key: Any) -> None:
        """`key` was stopped or forgotten: no suspect any more."""
        if key in self.suspects:
            self.suspects.remove(key)
        self.overran.pop(key, None)

    def after_stop(self, now: float) -> list[Decision]:
        """Keys were stopped: if the one running alone is among them, the next one runs."""
        if self.isolating is not None and self.isolating in self._stopped:
            return self._end() + self.next(now)
        return []

    # --- workers and time ------------------------------------------------------------

    def worker_able(self, address: str, now: float) -> list[Decision]:
        """`address`'s worker plugin can hold its other tasks back (it said so when it
        started): a suspect waiting for such a worker may run there."""
        if address not in self._workers:
            return []  # removed meanwhile
        self.able.add(address)
        self._ever_able = True
        return self.next(now)

    def worker_gone(self, address: str, processing: Container, now: float) -> list[Decision]:
        """`address` left (died, or retired: `processing` empty). The suspect placed there
        that had not reached it (not among `processing`) is placed again; one that had is
        decided with that death."""
        self.able.discard(address)
        key = self.isolating
        if key is None or self.worker != address or key in processing:
            return []
        self.suspects.appendleft(key)
        self._held.add(key)
        return [Hold((key,)), *self._end(), *self.next(now)]

    def tick(self, now: float) -> list[Decision]:
        """The hold of the one running alone ran out: its worker starts other tasks again
        (its own plugin ends the hold at the same bound), and the next suspect is placed."""
        if self.isolating is not None and now - self.since >= self.seconds:
            if self.worker is not None:
                self.overran[self.isolating] = (
                    f"its hold of {self.worker} ran out after {self.seconds:g} s and other "
                    "tasks started beside it"
                )
            return self._end() + self.next(now)
        if self.isolating is None and self._waits is not None:
            return self.next(now)
        return []

    def why(self, keys: Iterable) -> str:
        """A memory death shared by `keys`: when one of them was a suspect placed to run
        alone, why it did not run alone ("" when none was)."""
        for key in keys:
            if key in self.overran:
                return f"{key!s} was retried to run alone, but {self.overran[key]}"
        return ""

    def clear(self) -> list[Decision]:
        """The core is closing: nothing waits for isolation any more."""
        self.suspects.clear()
        self.overran.clear()
        self._waits = None
        return self._end() if self.isolating is not None else []
