"""The scheduler side: a thin adapter between Dask and the decision core.

Dask's hooks and oomguard's RPCs are this class's own methods, each a plain call on the core
(`oomguard._decide.DecisionCore`), whose decisions become Dask transitions in one place
(`_actions.DaskActions`); what is kept of workers, reports and queries lives in objects of
their own (`_workers`, `_reports`, `_queries`). Dask's `allowed_failures` is left as set;
the core keeps that bound itself with the death report in hand (`_dask_bound`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import SchedulerPlugin

from .. import _compat, _config
from .._decide import DecisionCore, Hold, Record
from .._exceptions import ReportError
from .._guard import Guard
from .._log import follow_dask_logging
from .._metrics import OomguardMetrics
from .._protocol import (
    ADMISSION_TOPIC,
    CLEAN_EXIT_HANDLER,
    QUERY_HANDLER,
    REPORT_HANDLER,
    RESOLVE_HANDLER,
    RUNS_ALONE_FIELD,
    SCHEDULER_PLUGIN,
    UNGUARDED_HANDLER,
)
from .._store import FailureStore
from . import _cluster_name, _resolve, _setup
from ._actions import DaskActions
from ._dask_bound import DaskBound
from ._queries import Queries
from ._removals import removal
from ._reports import ReportDesk, notice
from ._worker_events import WorkerEvents
from ._workers import Workers, admission_wait

if TYPE_CHECKING:
    from distributed import Scheduler

logger = logging.getLogger("oomguard.scheduler")


class OomguardSchedulerPlugin(SchedulerPlugin):
    """Classifies every failure as INFRA or USER, blames only executing shards, aborts a
    pipeline run whose shard is a deterministic crasher, and keeps the history.

    Load with ``dask scheduler --preload oomguard.scheduler_plugin`` or
    ``oomguard.install(client)``; it installs the worker side on every nanny and worker.
    """

    name = SCHEDULER_PLUGIN
    idempotent = True

    # Configuration: all that is pickled and shipped. The rest is set by `_reset`.
    config: dict[str, Any]  # oomguard.scheduler.* as given, keys with dashes
    # Opened by start() (where `core` stays None, oomguard is off), released by close().
    scheduler: Scheduler | None  # the scheduler served; None before start and after close
    settings: dict[str, Any]  # oomguard.scheduler.*, validated at start
    cluster: str  # this cluster's name on every event and run stored (_cluster_name.py)
    store: FailureStore | None  # the failure history
    core: DecisionCore | None  # every decision: pure, fed by the hooks and the RPCs
    actions: DaskActions | None  # the one place that changes Dask's state
    queries: Queries | None  # the history, read for clients
    dashboard_path: str  # the dashboard page's path, "" without one
    # Here from the start.
    metrics: OomguardMetrics  # this plugin's collector, served on /metrics
    guard: Guard  # catches, logs and counts the plugin's own errors
    workers: Workers  # what is known of each worker: its state, machine, nanny
    desk: ReportDesk  # whom reports are believed from, and what was counted
    removals_refused: int  # remove-worker events on "all" that were not Dask's
    _tasks: list[asyncio.Task]  # the tick and gauge loops
    bound: DaskBound | None  # Dask's remove_worker, wrapped so the core decides first
    _started: bool  # start() ran to its end: the tick loop may check for removal
    _original_task_erred: Callable[..., Any] | None  # Dask's "task-erred" handler, wrapped
    _worker_events: WorkerEvents  # Dask's "log-event" handler, wrapped: workers' own events
    _undo_stop: Callable[[], None]  # takes back the hook on Scheduler.stop() (_setup.on_stop)

    def __init__(self, **config: Any):
        # Keys as in oomguard.scheduler.* with dashes or underscores; unset ones come from
        # the scheduler's Dask config in start().
        self.config = {k.replace("_", "-"): v for k, v in config.items()}
        _config.scheduler_settings(self.config, only=frozenset(self.config))  # fail here
        self._reset()

    def _reset(self) -> None:
        self.scheduler = None
        self.settings = {}
        self.cluster = ""
        self.store = None
        self.core = None
        self.actions = None
        self.queries = None
        self.dashboard_path = ""
        self.metrics = OomguardMetrics()
        self.guard = Guard(self.metrics, logger)
        self.workers = Workers(self.metrics, self.guard)
        self.desk = ReportDesk(self.workers.nannies, self.metrics, self.guard)
        self.removals_refused = 0
        self._tasks = []
        self.bound = None
        self._started = False
        self._original_task_erred = None
        self._worker_events = WorkerEvents(self._worker_event)
        self._undo_stop = lambda: None

    def __getstate__(self):
        return {"config": self.config}

    def __setstate__(self, state):
        self.config = state["config"]
        self._reset()

    @property
    def unguarded(self) -> dict[str, str]:
        """Nanny -> why its worker runs without oomguard (`Workers.unguarded`)."""
        return self.workers.unguarded

    @property
    def stats(self) -> dict[str, Any]:
        """The death reports so far (`ReportDesk.counts`) and the latest latencies."""
        return {**self.desk.counts(), "latencies": list(self.desk.latencies)}

    def apply_settings(self, config: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        """Take `install(client, **config)` settings while running: {key: (old, new)} of
        those that changed. Refuses (ConfigError, nothing changed) a bad value, or a
        change of a setting fixed while running (`_setup.settings_change`)."""
        config = {k.replace("_", "-"): v for k, v in config.items()}
        changed = _setup.settings_change(self.settings, config, self.store)
        self.settings.update({k: v for k, (_, v) in changed.items()})
        self.config.update({k: v for k, v in config.items() if k in changed})
        self.core.configure(
            report_grace=self.settings["report-grace-timeout"], **_setup.core(self.settings)
        )
        _setup.configure_store(self.store, self.settings)
        if changed:
            logger.info(
                "oomguard: settings changed: %s",
                ", ".join(f"{k} {old!r} -> {v!r}" for k, (old, v) in sorted(changed.items())),
            )
        return changed

    # --- lifecycle --------------------------------------------------------------------

    async def start(self, scheduler: Scheduler) -> None:
        follow_dask_logging()
        if any(
            i.essential for i in _compat.check("scheduler", _compat.SCHEDULER, scheduler, logger)
        ):
            return  # stays off: every hook below returns while `core` is None
        _config.check_keys(logger)  # once per key and process: a preload checked already
        self.settings = settings = _config.scheduler_settings(self.config)
        self.cluster, named_by = _cluster_name.resolve(settings["cluster-name"], scheduler)
        grace = settings["report-grace-timeout"]
        allowed = scheduler.allowed_failures
        self.core = DecisionCore(allowed_failures=allowed, grace=grace, **_setup.core(settings))
        self.store = await _setup.open_store(settings, self.metrics, self.cluster)
        self.desk.start(self.core.pairing, self._decide_report, asyncio.get_running_loop())
        self.scheduler = scheduler
        self._undo_stop = _setup.on_stop(scheduler, self._stopped)
        self.actions = DaskActions(
            scheduler,
            self.store,
            self.metrics,
            self.guard,
            pods=_setup.pod_lookup(settings, self.guard),
            host_name=self.workers.host_name,
            cluster=self.cluster,
        )
        self.queries = Queries(self.store, self.cluster, self.core.policy, self.metrics_snapshot)
        self.bound = DaskBound(scheduler, holds=lambda key: key not in self.core.stopped)
        if not self.bound.install():
            logger.info(
                "oomguard: Dask's remove_worker is not its own here: Dask errs a task "
                "at allowed-failures before the death report can say it was queued"
            )
        for name, handler in self._handlers().items():
            scheduler.handlers[name] = handler
        original = scheduler.stream_handlers.get("task-erred")
        if original is not None:  # else logged by _compat.check
            self._original_task_erred = original
            scheduler.stream_handlers["task-erred"] = self._task_erred
        self._worker_events.install(scheduler)
        for addr, ws in scheduler.workers.items():
            self.workers.added(addr, ws)
            self.core.worker_added(addr, ws.memory_limit)
        self._tasks = [
            asyncio.create_task(self._tick_loop(min(grace / 4, 0.5))),
            asyncio.create_task(_setup.gauge_loop(self.store, self.metrics, self.guard, 2.0)),
        ]
        _setup.register_metrics(self)
        self.dashboard_path = _setup.dashboard(scheduler, self.guard)
        # Hooks from here on, not only once Dask adds the plugin after start() returns (its
        # add_plugin keeps this one): a worker that joins or dies while the nannies get
        # their plugin is seen, its nanny known, its removal counted (_trust.py).
        added = scheduler.plugins.setdefault(self.name, self) is self
        try:
            await _setup.install_worker_side(scheduler)
        except BaseException:
            if added and scheduler.plugins.get(self.name) is self:
                del scheduler.plugins[self.name]
            raise
        for addr in list(scheduler.workers):  # joined while the line above waited
            if addr not in self.workers.states:
                self.add_worker(scheduler, addr)
        self._started = True
        logger.info(
            "oomguard: watching failures of cluster %r (from %s); store at %s",
            self.cluster,
            named_by,
            self.store.path,
        )

    def _handlers(self) -> dict[str, Callable]:
        return {
            REPORT_HANDLER: self.report,
            CLEAN_EXIT_HANDLER: self.clean_exit,
            QUERY_HANDLER: self.query,
            RESOLVE_HANDLER: self.resolve,
            UNGUARDED_HANDLER: self.unguarded_setup,
        }

    async def _tick_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            # Dask adds a registered plugin to `scheduler.plugins` right after its start()
            # returns (start awaits the nannies): absent before that is not removed.
            if self._started and self.scheduler.plugins.get(self.name) is not self:
                # Removed with Scheduler.remove_plugin, which does not call close().
                await self.close()
                return
            with self.guard("expire"):
                # In slices, yielding between them: a storm of expired reports never stalls.
                while out := self.core.tick(time.monotonic(), limit=16):
                    self.apply(out)
                    await asyncio.sleep(0)
                self.persist_pipelines()
                self.workers.prune_unguarded({ws.nanny for ws in self.scheduler.workers.values()})

    async def close(self) -> None:
        if self.scheduler is None:
            return
        self._stop_loops()
        await asyncio.to_thread(self.desk.close)
        store = self._detach()  # on the event loop: it gives Dask back its tasks
        if store is not None:
            await asyncio.to_thread(store.close)
        self.scheduler = None

    def _stopped(self) -> None:
        """`Scheduler.stop()` ran without close() (some of Dask's tests stop a scheduler
        so): the same as close(), blocking the loop for the threads to finish, since
        nothing may outlive the scheduler (Dask's tests fail on a leaked thread)."""
        if self.scheduler is None:
            return
        with self.guard("close"):
            self._stop_loops()
            self.desk.close()
            store = self._detach()
            if store is not None:
                store.close()
        self.scheduler = None

    def _stop_loops(self) -> None:
        try:
            current = asyncio.current_task()
        except RuntimeError:  # Scheduler.stop() called off the event loop
            current = None
        for task in self._tasks:
            # close() may run inside the tick loop itself (plugin removed).
            if task is not current:
                task.cancel()
        self.metrics.unregister()

    def _detach(self) -> FailureStore | None:
        """Give the scheduler back what start() changed; the store to close, if any."""
        scheduler = self.scheduler
        self._undo_stop()
        with self.guard("close"):
            self.apply(self.core.close())
        if self.bound is not None:
            self.bound.uninstall()
        for name, handler in self._handlers().items():
            if scheduler.handlers.get(name) == handler:
                del scheduler.handlers[name]
        if self._original_task_erred is not None:
            scheduler.stream_handlers["task-erred"] = self._original_task_erred
        self._worker_events.uninstall(scheduler)
        if self.store is not None:
            self.persist_pipelines(final=True)
        return self.store

    # --- Dask's hooks -> events (hot path: O(1), no I/O) ------------------------------

    def update_graph(self, scheduler, *, client, keys, tasks, annotations, stimulus_id, **kw):
        if self.core is None:
            return
        with self.guard("update_graph"):
            self.core.submitted(
                tasks, keys, annotations, time.time(), _setup.prefix_path(scheduler, keys), client
            )

    def transition(self, key, start, finish, *args, stimulus_id, **kwargs):
        core = self.core
        if core is None:
            return
        try:  # the guard's work without its context object: this runs per transition
            out = core.transition(key, start, finish)
            if out:  # never transition from inside a transition: after Dask's are done
                asyncio.get_running_loop().call_soon(self._apply_guarded, out)
        except Exception:
            self.guard.error("transition")

    def add_worker(self, scheduler, worker):
        ws = scheduler.workers.get(worker)
        if ws is None or self.core is None:
            return
        self.workers.added(worker, ws)
        with self.guard("add_worker"):
            self.apply(self.core.worker_added(worker, ws.memory_limit))

    def log_event(self, topic, msg):
        # A worker's own topics come through `_worker_event`, never from here: any client
        # may publish them (_worker_events.py).
        if topic == "all" and isinstance(msg, dict) and msg.get("action") == "remove-worker":
            with self.guard("log_event"):
                self._removed(msg)

    def _worker_event(self, worker: str, topic: str, msg: dict) -> None:
        """An event of `worker` itself, from its own stream (`WorkerEvents`): a task that
        waited for host memory, or its hostname, SLURM job, environment and whether it can
        run a task alone (its worker plugin's setup)."""
        if self.core is None:
            return
        if topic == ADMISSION_TOPIC:
            if (waited := admission_wait(msg)) is not None:
                with self.guard("admission"):
                    self.core.memory_waited(*waited)
            return
        with self.guard("log_event"):
            if msg.get(RUNS_ALONE_FIELD) is True:
                out = self.core.isolation.worker_able(worker, time.monotonic())
                asyncio.get_running_loop().call_soon(self._apply_guarded, out)  # after the hook
            if self.workers.host_event({**msg, "worker": worker}) and self.actions is not None:
                self.actions.host_event(worker, msg, self.core.environments)

    def _removed(self, msg: dict) -> None:
        """Dask's `remove-worker` event, published after it counted the dead worker's tasks
        and before it reschedules them: holds apply now, everything else once Dask's
        transitions ran. Anyone may publish to "all": an event that is not Dask's own
        removal is refused (logged once, counted in `removals_refused`)."""
        if self.bound is not None:  # Dask has counted: its counts back as it left them
            self.bound.counted(msg.get("worker"))
        scheduler = self.scheduler
        if scheduler is None:
            return  # before start() or after close()
        taken = self.workers.take_removal(msg, scheduler.workers)
        if taken is None:
            self.removals_refused += 1
            self.guard.once(
                "removal_refused",
                "oomguard: ignored a remove-worker event naming %r: not a registered worker "
                "that Dask removed (someone else published it); further ones are counted",
                str(msg.get("worker"))[:200],
            )
            return
        ws, host = taken
        if self.core is None or scheduler.status in _setup.SHUTTING_DOWN:
            return  # an event after close(), or the cluster is closing: no death
        if msg.get("expected"):  # retired: no death, but a suspect placed there moves
            out = self.core.isolation.worker_gone(msg["worker"], (), time.monotonic())
        else:
            out = self.core.removed(removal(scheduler, msg, ws, host), time.monotonic())
        self.apply([d for d in out if isinstance(d, Hold)])
        later = [d for d in out if not isinstance(d, Hold)]
        if later:
            asyncio.get_running_loop().call_soon(self._apply_guarded, later)

    def remove_worker(self, scheduler, worker, *, stimulus_id=None, **kw):
        """After Dask moved the worker's tasks. Its event was handled already (`_removed`);
        a worker still known here had no event oomguard saw (a Dask release that stops
        publishing it): it is let go, its nanny remembered, and Dask's own count decides
        its death."""
        if worker in (self.scheduler.workers if self.scheduler is not None else ()):
            return
        with self.guard("log_event"):
            if self.workers.removed(worker) is not None:
                self.guard.once(
                    "removal_unseen",
                    "oomguard: Dask removed the worker %s without a remove-worker event; "
                    "Dask's own count decides its death",
                    worker,
                )

    # --- RPCs from nannies, and from clients -----------------------------------------

    async def report(self, comm=None, report: Any = None, **extra: Any) -> dict:
        """RPC from a nanny: one death report as msgpack bytes (`ReportDesk.submit`)."""
        with self.guard("report"):
            return self.desk.submit(report, getattr(comm, "peer_address", None))
        return {"status": "error"}

    def _decide_report(self, death) -> None:
        """A trusted report, decoded: to the core, and its decisions to Dask."""
        self.apply(self.core.reported(death, time.monotonic()))

    async def clean_exit(
        self, comm=None, worker: Any = None, requested: Any = False, pid: Any = None, **extra
    ) -> dict:
        """RPC from a nanny: its worker (process `pid`) ended with status 0, `requested`
        (close, restart, SIGTERM) or not (it ended itself). Without the field: not
        requested, the safe side (a death, counted as Dask counts it)."""
        try:
            said = notice(worker, requested, pid, extra.get("stopped_by"))
        except ReportError as e:
            self.desk.reject(e)
            return {"status": "rejected", "field": e.field}
        if not self.desk.trusted(getattr(comm, "peer_address", None), worker):
            return {"status": "rejected", "field": "worker"}
        with self.guard("report"):
            stopped = said["stopped"]
            if stopped is not None and requested:
                # The nanny itself got a signal (an eviction, a container stop): its tasks
                # are moved without a count, as for any requested stop, and leave a trace.
                self.actions.nanny_stopped(
                    worker, stopped["signal"], stopped["executing"], self.core.pipeline_of
                )
            # A removal that waited for this is decided now (its held tasks go back to Dask).
            executing = stopped["executing"] if stopped is not None and requested else None
            self.apply(self.core.clean_exit(worker, time.monotonic(), requested, pid, executing))
        return {"status": "ok"}

    async def unguarded_setup(self, comm=None, nanny: Any = None, reason: Any = "", **extra):
        """RPC from a nanny whose oomguard setup failed (on-setup-error: warn): its worker
        runs without oomguard. Counted while a worker of that nanny is here, and logged."""
        if not self.desk.from_nanny(getattr(comm, "peer_address", None), nanny):
            return {"status": "rejected"}
        with self.guard("unguarded"):
            self.workers.unguarded_nanny(nanny, reason)
        return {"status": "ok"}

    async def query(self, comm=None, what: str = "", **filters: Any) -> Any:
        """RPC for `oomguard.Failures` and `oomguard report` (`Queries.answer`)."""
        return await self.queries.answer(what, filters)

    async def resolve(self, comm=None, **request: Any) -> dict:
        """RPC for `Failures.resolve` and `oomguard report --resolve` (`_resolve.py`)."""
        return await _resolve.resolve(self.store, request)

    # --- task exceptions --------------------------------------------------------------

    def _task_erred(self, key=None, stimulus_id=None, **msg):
        out = []
        with self.guard("task-erred"):
            ts = self.scheduler.tasks.get(key)
            if ts is not None and ts.state == "processing" and ts.run_id == msg.get("run_id"):
                worker = msg.get("worker") or ""
                out, memory = self.core.task_erred(
                    key,
                    msg.get("exception_text") or "",
                    msg.get("traceback_text") or "",
                    worker,
                    self.workers.host_name(worker),
                    ts.retries,
                )
                if memory:  # INFRA: retried like a death, never from the user's retries
                    ts.retries += 1
                self.apply([d for d in out if isinstance(d, Record)])
        self._original_task_erred(key=key, stimulus_id=stimulus_id, **msg)
        self._apply_guarded([d for d in out if not isinstance(d, Record)])

    # --- decisions -> Dask (scheduler_plugin/_actions.py) -------------------------------

    def _apply_guarded(self, decisions: list) -> None:
        with self.guard("apply"):
            self.apply(decisions)

    def apply(self, decisions: list) -> None:
        """Carry out the core's decisions on Dask and the store (on the event loop)."""
        self.actions.apply(decisions)

    def persist_pipelines(self, final: bool = False) -> None:
        """Write the runs whose status changed (`DecisionCore.changed_runs`)."""
        for status in self.core.changed_runs(final):
            self.store.upsert_pipeline(dataclasses.replace(status, cluster=self.cluster))

    def metrics_snapshot(self) -> dict:
        """The scheduler side's counts, for the "stats" query (`ReportDesk.snapshot`)."""
        return self.desk.snapshot(
            self.core, self.guard.count, self.removals_refused, self.unguarded
        )
