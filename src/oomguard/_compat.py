"""Which Dask oomguard runs on: the internals it relies on, checked once at setup.

oomguard supports distributed 2024.12.0 and later; `./dev test-matrix` runs the cluster tests
on both ends of that range (`TESTED`). The plugins reach into a few Dask internals that are
not public API. When a plugin starts, it checks each one here and logs one line: the Dask
version, and either that everything it uses is there, or, for each missing internal, what
oomguard does without it. A missing internal is never a crash: the part that needs it is
left out, and where that part is essential the plugin leaves Dask's own behaviour alone.

How the differences between the supported releases are handled (`docs/deploying.md`,
"Dask releases"):

- a worker that dies while its nanny starts is restarted by distributed before 2026.7.0
  (later releases fail the start): after an OOM kill by its own group's limit at start-up,
  the nanny plugin starts the next workers without that limit
  (`worker_plugin/_placement.py`), so the restarts cannot loop on any release;
- `WorkerProcess._wait_until_connected` gained an argument: the wrapper passes all through;
- `register_*_plugin(..., idempotent=)` became keyword-only: oomguard passes it by keyword;
- `SchedulerPlugin.update_graph` is called with `dependencies=` in 2024.12: taken by `**kw`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: The ends of the supported range that the test matrix runs.
TESTED = ("2024.12.0", "2026.8.0")


@dataclass(frozen=True)
class Internal:
    """A Dask internal oomguard uses, and what it does when a release lacks it."""

    name: str
    present: Callable[[Any], bool]
    without: str
    essential: bool = False  # without it the plugin does nothing at all


def _has(*names: str) -> Callable[[Any], bool]:
    return lambda obj: all(hasattr(obj, n) for n in names)


#: Checked on the scheduler (an instance) when the scheduler plugin starts.
SCHEDULER = (
    Internal(
        "Scheduler.allowed_failures, .workers, .tasks, .stream_handlers",
        _has("allowed_failures", "workers", "tasks", "stream_handlers"),
        "oomguard stays off and Dask's allowed-failures applies as it is",
        essential=True,
    ),
    Internal(
        "TaskState.suspicious, .run_id, .retries",
        lambda s: _has("suspicious", "run_id", "retries")(_task_state()),
        "oomguard stays off and Dask's allowed-failures applies as it is",
        essential=True,
    ),
    Internal(
        "WorkerState.executing, .nanny, .pid",
        lambda s: _has("executing", "nanny", "pid")(_worker_state()),
        "oomguard stays off and Dask's allowed-failures applies as it is",
        essential=True,
    ),
    Internal(
        "the scheduler's 'task-erred' stream handler",
        lambda s: "task-erred" in getattr(s, "stream_handlers", {}),
        "task exceptions are not recorded (no USER failures, no memory errors)",
    ),
    Internal(
        "the scheduler's 'log-event' stream handler",
        lambda s: "log-event" in getattr(s, "stream_handlers", {}),
        "workers' host names, SLURM jobs and memory waits are not taken (hosts named by IP)",
    ),
)

#: Checked on the nanny (an instance) and Dask's WorkerProcess class when the nanny plugin
#: starts.
NANNY = (
    Internal(
        "Nanny.instantiate, .log_event, .worker_kwargs, .process",
        _has("instantiate", "log_event", "worker_kwargs", "process"),
        "no death reports from this nanny: the scheduler sees its deaths as worker_lost",
        essential=True,
    ),
    Internal(
        "WorkerProcess.mark_stopped",
        lambda n: _has("mark_stopped")(_worker_process()),
        "no death reports from this nanny: the scheduler sees its deaths as worker_lost",
        essential=True,
    ),
    Internal(
        "WorkerProcess._wait_until_connected",
        lambda n: _has("_wait_until_connected")(_worker_process()),
        "a worker joins its memory cgroup once it is up, not at its spawn",
    ),
)


#: Checked on the worker (an instance) when the worker plugin starts.
WORKER = (
    Internal(
        "Worker.execute, .state.tasks",
        lambda w: callable(getattr(w, "execute", None)) and hasattr(w.state, "tasks"),
        "no suspect runs alone on this worker: the scheduler places none here, and the "
        "flight record says which tasks ran from Dask's task states",
    ),
)


def _task_state() -> type:
    from distributed.scheduler import TaskState

    return TaskState


def _worker_state() -> type:
    from distributed.scheduler import WorkerState

    return WorkerState


def _worker_process() -> type:
    from distributed.nanny import WorkerProcess

    return WorkerProcess


def missing(internals: tuple[Internal, ...], obj: Any) -> list[Internal]:
    """The internals `obj`'s Dask lacks (a check that raises counts as missing)."""
    out = []
    for internal in internals:
        try:
            ok = internal.present(obj)
        except Exception:
            ok = False
        if not ok:
            out.append(internal)
    return out


def check(
    side: str, internals: tuple[Internal, ...], obj: Any, logger: logging.Logger
) -> list[Internal]:
    """Log the one set-up line for `side` ("scheduler" or "nanny"); return what is missing."""
    import distributed

    from . import __version__

    version = distributed.__version__
    gone = missing(internals, obj)
    where = f"oomguard {__version__} ({side}) on distributed {version}"
    untested = _untested(version)
    if not gone:
        logger.info("%s: every Dask internal it uses is present%s", where, untested)
        return gone
    logger.warning(
        "%s%s: %s", where, untested, "; ".join(f"no {i.name}, so {i.without}" for i in gone)
    )
    return gone


def _untested(version: str) -> str:
    def key(v: str) -> tuple[int, ...]:
        parts = []
        for p in v.split(".")[:3]:
            digits = "".join(c for c in p if c.isdigit())
            parts.append(int(digits) if digits else 0)
        return tuple(parts)

    try:
        if key(TESTED[0]) <= key(version) <= key(TESTED[1]):
            return ""
    except Exception:
        pass
    return f" (tested from {TESTED[0]} to {TESTED[1]})"
