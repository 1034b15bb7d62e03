"""What the decision core asks the scheduler to do: plain values, applied by the plugin."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._death.record import Death
from .._exceptions import PipelineAborted
from .._models import FailureEvent
from .runs import RunLabel


@dataclass(frozen=True)
class Hold:
    """Keep these keys from running anywhere until a `Release` or a `Stop` (applied at once,
    before Dask reschedules a dead worker's tasks)."""

    keys: tuple


@dataclass(frozen=True)
class Release:
    """Let held keys run again."""

    keys: tuple


@dataclass(frozen=True)
class Restrict:
    """Run `key` only on `workers` (a shard killed for memory, retried on larger workers)."""

    key: Any
    workers: frozenset[str]
    limit: int


@dataclass(frozen=True)
class Widen:
    """`worker` joined, larger than what these restricted keys died under: they may run on
    it too (one value per worker added, whatever the number of keys or workers)."""

    keys: tuple
    worker: str


@dataclass(frozen=True)
class Stop:
    """Err these keys with `exception` for good: running ones are released on their
    workers first, the rest never start again."""

    keys: tuple
    exception: PipelineAborted
    run: RunLabel = RunLabel("")  # "" for keys of no run


@dataclass(frozen=True)
class Forgive:
    """The dead worker only held these keys queued: take back Dask's own count."""

    keys: tuple


@dataclass(frozen=True)
class Record:
    """One failure to store and count: a worker death with the events of the tasks it is
    blamed on (each naming it), or a task's exception (one event, no death)."""

    events: tuple[FailureEvent, ...]
    death: Death | None = None
    grouping_version: int = 1
    example: str = ""
    amends: float | None = None  # a late report: replaces the worker_lost death of that time


Decision = Hold | Release | Restrict | Widen | Stop | Forgive | Record
