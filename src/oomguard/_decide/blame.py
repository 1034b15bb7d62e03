"""Who a death is blamed on, and how sure that is (pure).

The nanny's flight record names the tasks that were executing when the worker died: they
are blamed, everything else Dask had sent the worker was only queued there (displaced).
Without a report (the nanny died too) the scheduler's last heartbeat says what was
executing; failing that, every task on the worker is blamed, as Dask itself would, so a
killer that took its nanny with it is never "nobody".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .deaths import Death

FLIGHT_RECORD = "flight record"
HEARTBEAT = "last heartbeat"
THREADS = "no more tasks than threads"
EVERYTHING = "every task on the worker (nothing said what was executing)"


@dataclass(frozen=True)
class Blame:
    """`executing`: str(key) -> key (None where the scheduler does not know the key), what
    the death is blamed on. `displaced`: tasks it is certainly not charged to. Without a
    report nothing is certain, so nothing is displaced: every task on the worker keeps
    Dask's own charge (the death budget), while the events blame only `executing`."""

    executing: dict[str, Any]
    displaced: dict[str, Any]
    source: str

    @property
    def certain(self) -> bool:
        return self.source == FLIGHT_RECORD


def blame(death: Death) -> Blame:
    """>>> from .deaths import Removal
    >>> r = Removal("tcp://a:1", "a", 0.0, {"x": "x", "y": "y"}, nthreads=1)
    >>> b = blame(Death("tcp://a:1", r, {"executing": [{"key": "x"}]}))
    >>> sorted(b.executing), sorted(b.displaced), b.certain
    (['x'], ['y'], True)
    """
    processing = death.removal.processing if death.removal is not None else {}
    if death.report is not None:
        executing = {e["key"]: processing.get(e["key"]) for e in death.report["executing"]}
        source = FLIGHT_RECORD
    else:
        removal = death.removal
        assert removal is not None
        if removal.executing_guess:
            executing, source = dict(removal.executing_guess), HEARTBEAT
        elif len(processing) <= removal.nthreads:
            executing, source = dict(processing), THREADS
        else:
            executing, source = dict(processing), EVERYTHING
    displaced = {}
    if source == FLIGHT_RECORD:
        displaced = {s: k for s, k in processing.items() if s not in executing}
    return Blame(executing, displaced, source)
