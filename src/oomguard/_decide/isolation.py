"""After a memory kill shared by several tasks: each runs alone, one at a time (pure).

A worker killed for memory while it executed several tasks proves no single one too big
(`memory`), so the core holds them and lets them run again one by one, the likely culprit
first: each is then judged on its own death, if it dies again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Iterable, Mapping
from typing import Any

from .budget import DeathBudget
from .decisions import Decision, Release

__all__ = ["Isolation"]


class Isolation:
    """The suspects of shared memory kills, held in a queue, and the one running alone.

    It shares the core's `held` set (a queued suspect is held; the one it lets run is not)
    and reads its `stopped` keys (never run again) and the budget (a key that was on a
    worker whose death is undecided waits for that decision first).
    """

    def __init__(self, held: set, stopped: Mapping[Any, Any], budget: DeathBudget) -> None:
        self.suspects: deque = deque()  # held after a shared memory kill, run one at a time
        self.isolating: Any = None
        self._held = held
        self._stopped = stopped
        self._budget = budget

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

    def next(self) -> list[Decision]:
        """Let the first suspect run alone, unless one does or it waits for a death."""
        while self.isolating is None and self.suspects:
            key = self.suspects.popleft()
            if key in self._stopped or key not in self._held:
                continue
            if self._budget.undecided(key):
                # Still on a worker whose death is undecided: that decision comes first.
                self.suspects.appendleft(key)
                return []
            self.isolating = key
            self._held.discard(key)
            return [Release((key,))]
        return []

    def done(self, key: Any) -> list[Decision]:
        """`key` ended (in memory, erred, forgotten): if it ran alone, the next one runs."""
        if key is not None and key == self.isolating:
            self.isolating = None
            return self.next()
        return []

    def died(self, *keys: Container) -> None:
        """A death was charged to `keys`: the one running alone, if among them, died again
        (alone, and judged by the core, or shared again, and queued again)."""
        if self.isolating is not None and any(self.isolating in k for k in keys):
            self.isolating = None

    def displaced(self, keys: Container) -> None:
        """`keys` were only displaced: the one running alone, if among them, goes first
        again."""
        if self.isolating is not None and self.isolating in keys:
            self.suspects.appendleft(self.isolating)
            self.isolating = None

    def discard(self, key: Any) -> None:
        """`key` was stopped or forgotten: no suspect any more."""
        if key in self.suspects:
            self.suspects.remove(key)

    def after_stop(self) -> list[Decision]:
        """Keys were stopped: if the one running alone is among them, the next one runs."""
        if self.isolating in self._stopped:
            self.isolating = None
            return self.next()
        return []

    def clear(self) -> None:
        """The core is closing: nothing waits for isolation any more."""
        self.suspects.clear()
        self.isolating = None
