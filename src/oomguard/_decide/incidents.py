"""Incidents: worker deaths that one cause explains, grouped as they are decided (pure).

Three workers of one host SIGKILLed in the same second (a container kill, a node's OOM
sweep, a SLURM job ending) are one incident of three deaths. Deaths are in one incident
when they share a place, a cause and a killer (`oomguard._death.incident.incident_key`: the
host, or the SLURM job or Kubernetes node their evidence names) and all fall within
`WINDOW` seconds of each other, by their own times; a death its own worker or nanny
brought on (a segfault, an exit, the nanny's memory limit) is always its own incident.

Each death names its incident (`Death.incident`): the id of the incident's first death to
be decided, so a death alone is its own incident. Deaths are decided out of their order
(a removal may wait for its report, a report for its removal): a death decided later but
earlier in time joins the incident all the same, as long as the incident still spans at
most `WINDOW`. A late report amends its death and keeps its incident.

This changes no count: the failure policy, Dask's budget and the signatures count each
death as before (tests/unit/test_incidents.py proves it for a 3-death incident); an
incident is how the deaths are shown. Memory is bounded: at most `OPEN_MAX` places with
incidents still open (each at most `PER_KEY`), open for `KEEP` seconds of the scheduler's
clock after their last death, and the incidents of the last `REMEMBER` deaths for their
amends. Each death costs a few dict operations.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass

from .._death.incident import incident_key
from .._death.record import Death
from .decisions import Record

#: Seconds: the deaths of one incident are all within this of each other (by their times).
WINDOW = 5.0
#: Seconds of the scheduler's clock an incident stays open after its last death joined:
#: deaths are decided up to the report grace (and a lookup) after they happened.
KEEP = 600.0
#: Places (with cause and killer) whose incidents are kept open, at most; the least
#: recently joined goes first.
OPEN_MAX = 4096
#: Incidents kept open per place at most (deaths decided out of order may join an older one).
PER_KEY = 4
#: Deaths whose incident is remembered for a late report's amend.
REMEMBER = 10_000
#: Deaths in one incident at most: past it a new incident begins (a bound, not a rule).
MAX_DEATHS = 10_000


@dataclass(slots=True)
class _Open:
    """An incident still taking deaths."""

    id: str
    start: float
    end: float
    deaths: int


class Incidents:
    """The incidents of the deaths decided so far.

    >>> incidents = Incidents()
    >>> [incidents.assign(Death(id=i, host="node-1", cause="sigkill", time=t), now=t)
    ...  for i, t in (("a", 0.0), ("b", 0.4), ("c", 9.0))]
    ['a', 'a', 'c']
    """

    def __init__(self, window: float = WINDOW, keep: float = KEEP) -> None:
        self.window = window
        self.keep = keep
        # key -> its open incidents, newest first; ordered by the last death that joined
        self._open: OrderedDict[tuple, tuple[float, list[_Open]]] = OrderedDict()
        self._of: OrderedDict[str, str] = OrderedDict()  # death id -> incident id

    def __len__(self) -> int:
        """Incidents open now."""
        return sum(len(v[1]) for v in self._open.values())

    def assign(self, death: Death, now: float) -> str:
        """The incident of `death`, decided now (`now`: the scheduler's clock)."""
        self._expire(now)
        key = incident_key(death)
        found = death.id
        if key is not None and death.id:
            _, opened = self._open.pop(key, (now, []))
            t = death.time
            for o in opened:
                if o.deaths < MAX_DEATHS and max(o.end, t) - min(o.start, t) <= self.window:
                    o.start, o.end, o.deaths = min(o.start, t), max(o.end, t), o.deaths + 1
                    found = o.id
                    break
            else:
                opened.insert(0, _Open(death.id, t, t, 1))
                del opened[PER_KEY:]
            self._open[key] = (now, opened)
            while len(self._open) > OPEN_MAX:
                self._open.popitem(last=False)
        self._remember(death.id, found)
        return found

    def of(self, death_id: str) -> str:
        """The incident of a death decided before (its own id when not remembered)."""
        return self._of.get(death_id, death_id)

    def named(self, record: Record, now: float) -> Record:
        """`record` with its death naming its incident: assigned now, or for an amend (a
        late report) the incident of the death it replaces."""
        death = record.death
        if death is None:
            return record
        incident = self.of(death.id) if record.amends is not None else self.assign(death, now)
        return dataclasses.replace(record, death=dataclasses.replace(death, incident=incident))

    def _remember(self, death_id: str, incident: str) -> None:
        if not death_id:
            return
        self._of[death_id] = incident
        self._of.move_to_end(death_id)
        while len(self._of) > REMEMBER:
            self._of.popitem(last=False)

    def _expire(self, now: float) -> None:
        while self._open:
            key, (touched, _) = next(iter(self._open.items()))
            if now - touched <= self.keep:
                return
            del self._open[key]
