"""What the scheduler knows, since it started, of where its deaths live: each worker's
environment as its worker plugin said it at its start, and each signature's latest deaths;
from them the suspects an abort names (`_death.environment.suspects`, the same test the
history's reads run over everything stored). Pure, bounded: `SLOTS_KEPT` workers,
`SIGNATURES_KEPT` signatures of `DEATHS_KEPT` deaths each, the least recently told going
first; a distinct environment is kept once, however many deaths share it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from .._death.environment import Baseline, suspects, values
from .._death.record import Death, Environment

#: Workers (slots: a nanny's address, a worker's without one) kept, as the history keeps.
SLOTS_KEPT = 4096
SIGNATURES_KEPT = 256
#: A signature's latest deaths kept, as many as the history's reads look at.
DEATHS_KEPT = 200


def slot(worker: str, nanny: str | None) -> str:
    """What a worker counts as among the cluster's workers: its nanny, which its restarts
    keep (its own address without one)."""
    return nanny or worker


class EnvironmentTally:
    """Each worker's environment (`worker`), each signature's deaths (`died`), and the
    suspects of a signature (`suspects`).

    >>> tally = EnvironmentTally()
    >>> for i in range(5):
    ...     tally.worker(f"n{i}", Environment(labels={"POOL": "spot" if i < 2 else "od"}))
    >>> for i in range(4):
    ...     tally.died(Death(id=f"d{i}", nanny=f"n{i % 2}", signature_id="s"))
    >>> [(s["name"], s["value"], s["deaths"]) for s in tally.suspects("s")]
    [('POOL', 'spot', 4)]
    """

    def __init__(self) -> None:
        self._workers: OrderedDict[str, Environment] = OrderedDict()
        self._values: dict[str, dict[str, str]] = {}  # slot -> values(its environment)
        # signature -> {death id: (slot, values)}, oldest first
        self._deaths: OrderedDict[str, OrderedDict[str, tuple[str, dict]]] = OrderedDict()
        self._kept: dict[tuple, dict[str, str]] = {}  # one dict per distinct environment
        self._baseline: Baseline | None = None  # the workers indexed, until one starts

    def worker(self, at: str, environment: Environment) -> None:
        """The worker at slot `at` started with `environment`."""
        self._workers.pop(at, None)
        self._workers[at] = environment
        self._values[at] = self._one(values(environment))
        self._baseline = None
        while len(self._workers) > SLOTS_KEPT:
            gone, _ = self._workers.popitem(last=False)
            self._values.pop(gone, None)

    def of(self, at: str) -> Environment | None:
        """The environment the worker at slot `at` said at its start (None: not known)."""
        return self._workers.get(at)

    def died(self, death: Death) -> None:
        """A decided death (a late report's amend replaces the one of its id): counted for
        its signature with its environment, else its worker's."""
        if not death.signature_id or not death.id:
            return
        at = slot(death.worker, death.nanny)
        environment = death.environment or self.of(at)
        if environment is None:
            return
        deaths = self._deaths.pop(death.signature_id, None) or OrderedDict()
        self._deaths[death.signature_id] = deaths
        deaths.pop(death.id, None)
        deaths[death.id] = (at, self._one(values(environment)))
        while len(deaths) > DEATHS_KEPT:
            deaths.popitem(last=False)
        while len(self._deaths) > SIGNATURES_KEPT:
            self._deaths.popitem(last=False)

    def suspects(self, signature_id: str) -> list[dict[str, Any]]:
        """The suspects of `signature_id` from the deaths seen since the start, as dicts."""
        deaths = self._deaths.get(signature_id)
        if not deaths:
            return []
        if self._baseline is None:
            self._baseline = Baseline(self._values)
        return [s.to_dict() for s in suspects(deaths.values(), self._baseline)]

    def _one(self, its: dict[str, str]) -> dict[str, str]:
        """`its`, or the equal dict kept already: many deaths, few environments."""
        key = tuple(sorted(its.items()))
        kept = self._kept.get(key)
        if kept is None:
            if len(self._kept) >= SLOTS_KEPT:
                self._kept.clear()  # only sharing is lost: the dicts in use stay
            kept = self._kept[key] = its
        return kept
