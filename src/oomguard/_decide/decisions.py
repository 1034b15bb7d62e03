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
class RunAlone:
    """Let held `key` run alone on `worker`: only there, and there it starts once the tasks
    already running have ended, and no other task starts until it ends or `seconds` have
    passed (its worker's plugin holds them back). `worker` None: no worker here can hold;
    it runs where Dask places it."""

    key: Any
    worker: str | None
    seconds: float


@dataclass(frozen=True)
class EndAlone:
    """`key`'s run alone is over (it ended, died, was stopped or forgotten, or its hold ran
    out): what `RunAlone` changed is given back."""

    key: Any


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
    #: The ids older grouping versions gave this crash, (id, version): the store makes
    #: each an alias of the signature's id (`oomguard._signature._versions`).
    aliases: tuple[tuple[str, int], ...] = ()


Decision = Hold | Release | RunAlone | EndAlone | Restrict | Widen | Stop | Forgive | Record
