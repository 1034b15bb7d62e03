"""The scheduler side: a thin adapter between Dask's hooks and the decision core.

Dask's hooks become plain events for `oomguard._decide.DecisionCore`; its decisions become
Dask transitions here, in one place (`apply`). Dask's `allowed_failures` is left as set; the
core keeps that bound itself with the death report in hand (`_dask_bound`), holds the tasks
of a dead worker until its death is decided, and forgives Dask's count for tasks that were
only queued there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import SchedulerPlugin

from .. import _compat, _config
from .._decide import DecisionCore, Record
from .._exceptions import ConfigError
from .._guard import Guard
from .._log import follow_dask_logging
from .._metrics import OomguardMetrics
from .._protocol import ADMISSION_TOPIC, HOST_TOPIC, SCHEDULER_PLUGIN
from .._store import FailureStore
from .._urls import is_postgres, redact
from . import _cluster_name, _removals, _setup
from ._actions import DaskActions, address_host
from ._dask_bound import DaskBound
from ._handlers import Handlers
from ._intake import ReportIntake
from ._trust import Bounded

if TYPE_CHECKING:
    from distributed import Scheduler
    from distributed.scheduler import WorkerState

    from .._models import PipelineStatus

logger = logging.getLogger("oomguard.scheduler")

#: Machines (IP -> hostname) remembered for naming workers that died before they spoke.
MACHINES_KEPT = 4096


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
    intake: ReportIntake | None  # death reports between the RPC and the core
    actions: DaskActions | None  # the one place that changes Dask's state
    dashboard_path: str  # the dashboard page's path, "" without one
    # Here from the start.
    metrics: OomguardMetrics  # this plugin's collector, served on /metrics
    guard: Guard  # catches, logs and counts the plugin's own errors
    handlers: Handlers  # the RPCs, with their own counts (scheduler_plugin/_handlers.py)
    _tasks: list[asyncio.Task]  # the tick and gauge loops
    bound: DaskBound | None  # Dask's remove_worker, wrapped so the core decides first
    _started: bool  # start() ran to its end: the tick loop may check for removal
    _original_task_erred: Callable[..., Any] | None  # Dask's "task-erred" handler, wrapped
    _workers: dict[str, WorkerState]  # address -> WorkerState, to read after removal
    _hostnames: dict[str, str]  # address -> the hostname its worker plugin sent
    _machines: Bounded  # IP -> the hostname a worker plugin there sent (see host_name)
    _persisted: dict[str, PipelineStatus]  # run -> last status written
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
        self.intake = None
        self.actions = None
        self.dashboard_path = ""
        self.metrics = OomguardMetrics()
        self.guard = Guard(self.metrics, logger)
        self.handlers = Handlers(self)
        self._tasks = []
        self.bound = None
        self._started = False
        self._original_task_erred = None
        self._workers = {}
        self._hostnames = {}
        self._machines = Bounded(MACHINES_KEPT)
        self._persisted = {}
        self._undo_stop = _nothing

    def __getstate__(self):
        return {"config": self.config}

    def __setstate__(self, state):
        self.config = state["config"]
        self._reset()

    @property
    def policy(self):
        return self.core.policy if self.core is not None else None

    @property
    def unguarded(self) -> dict[str, str]:
        """Nanny -> why its worker runs without oomguard (`Handlers.unguarded_nannies`)."""
        return self.handlers.unguarded_nannies

    @property
    def stats(self) -> dict[str, Any]:
        """The death reports so far (`Handlers.counts`) and the latest latencies."""
        return {**self.handlers.counts(), "latencies": list(self.handlers.latencies)}

    def apply_settings(self, config: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        """Take `install(client, **config)` settings while running: {key: (old, new)} of
        those that changed. Refuses (ConfigError, nothing changed) a bad value, or a
        change of a setting fixed while running (the store, the pod lookup)."""
        config = {k.replace("_", "-"): v for k, v in config.items()}
        new = _config.scheduler_settings(config, only=frozenset(config))
        current = dict(self.settings)
        if "store" in new and self.store is not None:
            # The file in use, not the setting (None: the default path), so a refusal
            # names it and the same file, however spelt, is no change.
            current["store"] = getattr(self.store.history, "url", self.store.path)
            if new["store"] is not None and _same_file(new["store"], current["store"]):
                new["store"] = current["store"]
        changed = {k: (current[k], v) for k, v in new.items() if current[k] != v}
        fixed = sorted(set(changed) - _config.LIVE_SCHEDULER_KEYS)
        if fixed:
            old, value = (redact(v) if isinstance(v, str) else v for v in changed[fixed[0]])
            raise ConfigError(
                f"oomguard.scheduler.{fixed[0]} is {old!r} on this running scheduler and "
                f"cannot change to {value!r} while oomguard runs; use "
                "oomguard.uninstall(client) first, or set it where the scheduler starts."
            )
        self.settings.update({k: v for k, v in new.items() if k in changed})
        self.config.update({k: v for k, v in config.items() if k in changed})
        self.core.configure(
            report_grace=self.settings["report-grace-timeout"],
            max_shard_infra_failures=self.settings["max-shard-infra-failures"],
            abort_on_repeat_signature=self.settings["abort-on-repeat-signature"],
            larger_only=self.settings["memory-retry-larger-only"],
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
        self.core = DecisionCore(
            allowed_failures=allowed,
            grace=grace,
            max_shard_infra_failures=settings["max-shard-infra-failures"],
            abort_on_repeat_signature=settings["abort-on-repeat-signature"],
            larger_only=settings["memory-retry-larger-only"],
        )
        self.store = await _setup.open_store(scheduler, settings, self.metrics, self.cluster)
        self.intake = ReportIntake(
            self.handlers.on_reports, room=self.handlers.room, matched=self.core.pairing.waits
        )
        self.intake.start(asyncio.get_running_loop())
        self.scheduler = scheduler
        self._undo_stop = _setup.on_stop(scheduler, self._stopped)
        self.actions = DaskActions(
            scheduler,
            self.store,
            self.metrics,
            self.guard,
            pods=_setup.pod_lookup(settings, self.guard),
            host_name=self.host_name,
            cluster=self.cluster,
        )
        self.bound = DaskBound(scheduler, holds=lambda key: key not in self.core.stopped)
        if not self.bound.install():
            logger.info(
                "oomguard: Dask's remove_worker is not its own here: Dask errs a task "
                "at allowed-failures before the death report can say it was queued"
            )
        self.handlers.register(scheduler)
        original = scheduler.stream_handlers.get("task-erred")
        if original is not None:  # else logged by _compat.check
            self._original_task_erred = original
            scheduler.stream_handlers["task-erred"] = self._task_erred
        for addr, ws in scheduler.workers.items():
            self._workers[addr] = ws
            self.core.worker_added(addr, ws.memory_limit)
        self._tasks = [
            asyncio.create_task(self._tick_loop(min(grace / 4, 0.5))),
            asyncio.create_task(_setup.gauge_loop(self.store, self.metrics, self.guard, 2.0)),
        ]
        _setup.register_metrics(self)
        try:
            from ._dashboard import register_dashboard

            self.dashboard_path = register_dashboard(scheduler)
        except ImportError:
            logger.info("oomguard: no dashboard page (bokeh is not installed)")
        except Exception:
            self.guard.error("dashboard")
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
            if addr not in self._workers:
                self.add_worker(scheduler, addr)
        self._started = True
        logger.info(
            "oomguard: watching failures of cluster %r (from %s); store at %s",
            self.cluster,
            named_by,
            self.store.path,
        )

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
                # In slices, yielding between them: a storm of expired reports must not
                # stall the event loop.
                while out := self.core.tick(time.monotonic(), limit=16):
                    self.apply(out)
                    await asyncio.sleep(0)
                self.persist_pipelines()
                self.handlers.prune_unguarded()

    async def close(self) -> None:
        if self.scheduler is None:
            return
        self._stop_loops()
        if self.intake is not None:
            await asyncio.to_thread(self.intake.close)
        store = self._detach()
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
            if self.intake is not None:
                self.intake.close()
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
        self.handlers.unregister(scheduler)
        if self._original_task_erred is not None:
            scheduler.stream_handlers["task-erred"] = self._original_task_erred
        if self.store is not None:
            self.persist_pipelines(final=True)
        return self.store

    # --- Dask's hooks -> events (hot path: O(1), no I/O) ------------------------------

    def update_graph(self, scheduler, *, client, keys, tasks, annotations, stimulus_id, **kw):
        if self.core is None:
            return
        with self.guard("update_graph"):
            self.core.submitted(
                tasks, keys, annotations, time.time(), _prefix_path(scheduler, keys), client
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
        self._workers[worker] = ws
        with self.guard("add_worker"):
            self.apply(self.core.worker_added(worker, ws.memory_limit))

    def log_event(self, topic, msg):
        if topic == ADMISSION_TOPIC:
            self._admission_event(msg)
            return
        if topic == HOST_TOPIC:
            self._host_event(msg)
            return
        if topic == "all":
            _removals.on_event(self, msg)

    def remove_worker(self, scheduler, worker, *, stimulus_id=None, **kw):
        _removals.after_removal(self, worker)

    def _admission_event(self, msg) -> None:
        """A worker's task waited for host memory and then ran: its pipeline's summary
        says how long its tasks waited. Sent by workers: checked, never trusted."""
        if self.core is None or not isinstance(msg, dict) or msg.get("outcome") != "granted":
            return
        key, waited = msg.get("key"), msg.get("waited")
        if (
            isinstance(key, str)
            and isinstance(waited, (int, float))
            and not isinstance(waited, bool)
            and 0 <= waited < 1e7
        ):
            with self.guard("admission"):
                self.core.memory_waited(key, float(waited))

    def _host_event(self, msg) -> None:
        """A worker's hostname, from its worker plugin's setup. Dask sets `worker` to the
        sender's address for a worker's event; a label only, it decides nothing."""
        if self.core is None or not isinstance(msg, dict):
            return
        worker, host = msg.get("worker"), msg.get("host")
        if (
            isinstance(worker, str)
            and worker in self._workers
            and isinstance(host, str)
            and 0 < len(host) <= 255
            and host.isprintable()
            and not any(c.isspace() for c in host)
        ):
            self._hostnames[worker] = host
            self._machines[address_host(worker)] = host
            if self.actions is not None:  # its SLURM job, if any (_slurm_jobs.py)
                self.actions.slurm_jobs.note(worker, msg)

    def host_name(self, address: str) -> str:
        """The one name of a worker's machine in events: the hostname its worker plugin
        sent (the name its nanny's death reports carry), else for a worker that died before
        its plugin spoke the one another worker at its IP sent, or this machine's for a
        loopback IP, else its IP."""
        ip = address_host(address)
        name = self._hostnames.get(address) or self._machines.get(ip)
        return name or (_setup.own_hostname() if _setup.is_loopback(ip) else ip)

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
                    self.host_name(worker),
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

    def worker_state(self, address: str) -> WorkerState | None:
        """Dask's record of a worker, kept here until its removal is handled."""
        return self._workers.get(address)

    def persist_pipelines(self, final: bool = False) -> None:
        """Write the runs that changed; drop runs whose keys are all forgotten."""
        policy = self.core.policy
        names = policy.pipelines() if final else policy.take_dirty()
        gone, self.core.gone = self.core.gone, []
        for run in set(names) | set(gone):
            if not policy.has(run):
                continue
            status = dataclasses.replace(policy.status(run), cluster=self.cluster)
            if final or self._persisted.get(run) != status:
                self.store.upsert_pipeline(status)
                self._persisted[run] = status
        for run in gone:
            policy.forget_pipeline(run)
            self._persisted.pop(run, None)

    def metrics_snapshot(self) -> dict:
        core = self.core
        out = self.handlers.counts()
        out["internal_errors"] = self.guard.count
        out["removals_refused"] = self.handlers.removals_refused
        if core is not None:
            out.update(unguarded=dict(self.unguarded))
            out.update(
                deaths=core.deaths,
                displaced=core.displaced,
                aborts=core.aborts,
                held=len(core.held),
                pending_deaths=len(core.pairing),
            )
        return out


def _nothing() -> None:
    pass


def _prefix_path(scheduler, keys, steps: int = 64):
    """Task prefixes from the first output key down its first dependencies to a root."""
    ts = scheduler.tasks.get(next(iter(keys), None))
    for _ in range(steps):
        if ts is None:
            return
        yield ts.prefix.name
        ts = next(iter(ts.dependencies), None)


def _same_file(a: str, b: str) -> bool:
    if is_postgres(a) or is_postgres(b):
        return a == b
    return os.path.abspath(os.path.expanduser(a)) == os.path.abspath(os.path.expanduser(b))
