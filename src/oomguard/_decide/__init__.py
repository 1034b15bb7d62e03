"""The scheduler side's decisions, as a pure state machine (no Dask, no I/O).

`DecisionCore` takes plain events (graphs submitted, task transitions, workers added and
removed, death reports, task exceptions, clock ticks) and returns plain decisions
(`Hold`, `Release`, `RunAlone`, `EndAlone`, `Restrict`, `Widen`, `Stop`, `Forgive`,
`Record`) that the scheduler plugin applies to Dask.
"""

from .accounts import nanny_stop_record
from .core import DecisionCore
from .decisions import (
    Decision,
    EndAlone,
    Forgive,
    Hold,
    Record,
    Release,
    Restrict,
    RunAlone,
    Stop,
    Widen,
)
from .pairing import Case, DeathPairing, Removal
from .runs import ANNOTATION, IDLE_RUNS, Run, Runs

__all__ = [
    "ANNOTATION",
    "Case",
    "DeathPairing",
    "Decision",
    "DecisionCore",
    "EndAlone",
    "Forgive",
    "Hold",
    "IDLE_RUNS",
    "Record",
    "Release",
    "Removal",
    "Restrict",
    "RunAlone",
    "Run",
    "Runs",
    "Stop",
    "Widen",
    "nanny_stop_record",
]
