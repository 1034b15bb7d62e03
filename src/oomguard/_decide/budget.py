"""The death budget: how many worker deaths each task key may cause (pure).

Dask's own safety net is `allowed_failures`: a task that was on `allowed_failures + 1`
dead workers errs with `KilledWorker`. oomguard keeps exactly that bound for every key it
ever sees in a removal, including keys of no pipeline and keys submitted before oomguard
was installed (`prior` seeds them with Dask's own count). It only counts better: a death
is charged at once, when the worker is removed, to every task that may have been executing
there (`charge`), and the charge is taken back (`settle(..., blamed=False)`) once the death
report shows the task was only queued there.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class DeathBudget:
    """Deaths charged per key; `over(key)` once a key has used more than `allowed`.

    >>> b = DeathBudget(allowed=1)
    >>> b.charge(["k"]); b.settle("k", blamed=True); b.over("k")
    False
    >>> b.charge(["k"]); b.over("k")
    True
    """

    def __init__(self, allowed: int) -> None:
        self.allowed = allowed
        self._deaths: dict[Any, int] = {}  # settled charges
        self._pending: dict[Any, int] = {}  # charges of deaths not decided yet

    def charge(self, keys, prior: dict[Any, int] | None = None) -> None:
        """A worker holding `keys` was removed; its death is not decided yet."""
        for key in keys:
            if key not in self._deaths:
                self._deaths[key] = (prior or {}).get(key, 0)
            self._pending[key] = self._pending.get(key, 0) + 1

    def settle(self, key: Any, *, blamed: bool) -> None:
        """The death is decided: keep the charge (`blamed`) or take it back."""
        n = self._pending.get(key, 0)
        if n > 1:
            self._pending[key] = n - 1
        elif n == 1:
            del self._pending[key]
        if blamed:
            self._deaths[key] = self._deaths.get(key, 0) + 1
        elif n == 0 and key not in self._deaths:
            return
        else:
            self._deaths.setdefault(key, 0)

    def decided(
        self, charged: Iterable[Any], forgiven: Iterable[Any], uncharged: Iterable[Any] = ()
    ) -> None:
        """A death is decided: keep its charge of the `charged` keys, take it back from the
        `forgiven` ones, and charge the `uncharged` ones it is blamed on too (a report whose
        removal never came: nothing charged them).

        >>> b = DeathBudget(allowed=1)
        >>> b.charge(["a", "q"]); b.decided(["a"], ["q"], ["r"]); b.deaths("a"), b.deaths("q"), b.deaths("r")
        (1, 0, 1)
        """
        uncharged = list(uncharged)
        self.charge(uncharged)
        for key in (*charged, *uncharged):
            self.settle(key, blamed=True)
        for key in forgiven:
            self.settle(key, blamed=False)

    def undecided(self, key: Any) -> int:
        """Deaths charged to `key` that are not decided yet."""
        return self._pending.get(key, 0)

    def deaths(self, key: Any) -> int:
        """Deaths charged to `key`, decided or not."""
        return self._deaths.get(key, 0) + self._pending.get(key, 0)

    def over(self, key: Any) -> bool:
        return self.deaths(key) > self.allowed

    def forget(self, key: Any) -> None:
        self._deaths.pop(key, None)
        self._pending.pop(key, None)

    def __len__(self) -> int:
        return len(self._deaths.keys() | self._pending.keys())
