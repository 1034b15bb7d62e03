"""The nanny side: learn each worker process's exit, gather the evidence, send one report.

Dask's nanny reads the exit code in `WorkerProcess.mark_stopped` and drops it; `NannyPlugin`
has no worker-exit hook (dask/distributed#5465). So, on this nanny instance only, we wrap:

- `nanny.instantiate` and `nanny.process._wait_until_connected`: before each worker start,
  take a start-up lease from the host's memory ledger (`_admission.startup`); right after the
  worker process is spawned, before it has imported anything, put it in its own memory cgroup
  (charges stay where they were made, so a later move would leave its start-up memory out
  of the group's peak and limit); once it is up, remember its PID and snapshot the counters,
  and release the lease with the start-up peak;
- `nanny.process.mark_stopped`: read the PID and exit code before Dask forgets them;
- `nanny.log_event`: notice `worker-restart-memory`, the nanny's own memory kill.

Each wrap checks for the attribute first and says in the log when it is missing.

This module is the hooks; the plugin holds a `_placement.Placement` (each worker's memory
cgroup) and a `_reporting.Reporter` (the evidence after an exit, and the report). What it
knows of the running worker process is a `_life._Life`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING, Any

import dask
from distributed.core import Status
from distributed.diagnostics.plugin import NannyPlugin

from .. import _compat, _config
from .._admission.config import AdmissionConfig
from .._admission.startup import Start, StartupReservations, startup_peak
from .._guard import Guard
from .._host import cgroup as _cgroup
from .._host.environment import configured_labels
from .._host.oom_killers import find_killers
from .._host.paths import configured_crash_dir, private_crash_dir
from .._host.readings import HostMeter, OomdXattrs, slurm_environment
from .._host.senders import CMDLINE_MODES
from .._log import follow_dask_logging
from .._protocol import NANNY_PLUGIN, STARTUP_TOPIC
from ._life import _Life, take_readings
from ._placement import Placement
from ._reporting import Reporter, remove_files, stopped_by
from ._worker import OomguardWorkerPlugin

if TYPE_CHECKING:
    from distributed import Nanny

logger = logging.getLogger("oomguard.nanny")

KILLERS_REFRESH = 60.0  # seconds between two scans of /proc for userspace killers


_CLOSING = (Status.closing, Status.closed, Status.closing_gracefully, Status.failed)


class OomguardNannyPlugin(NannyPlugin):
    """Turns every worker-process death into one death report sent to the scheduler.

    Load with ``dask worker --preload-nanny oomguard.worker_plugin``, or at runtime with
    ``oomguard.install(client)``. Also installs `OomguardWorkerPlugin` in the worker.
    """

    name = NANNY_PLUGIN
    idempotent = True

    crash_dir: str | None
    cgroup_limit: str | None
    sample_interval: float | None
    max_report_size: int | None
    signal_senders: bool | None

    def __init__(
        self,
        *,
        crash_dir: str | None = None,
        cgroup_limit: str | None = None,
        sample_interval: float | None = None,
        max_report_size: int | None = None,
        signal_senders: bool | None = None,
    ):
        # None: read oomguard.worker.* from the nanny's Dask config in setup().
        self.crash_dir = crash_dir
        self.cgroup_limit = cgroup_limit
        self.sample_interval = sample_interval
        self.max_report_size = max_report_size
        self.signal_senders = signal_senders
        self._reset()

    def _reset(self) -> None:
        self._nanny: Nanny | None = None
        self._life: _Life | None = None
        self._closing = False
        self._close_reason = ""  # Nanny.close's reason, e.g. "signal-15"
        self.sender_cmdline = "hashed"  # oomguard.worker.sender-cmdline, read in setup
        self.labels: tuple[str, ...] = ()  # oomguard.worker.labels, read in setup
        self._tasks: set[asyncio.Task] = set()
        self._watcher: asyncio.Task | None = None
        self._delegate: OomguardNannyPlugin | None = None
        self._startup: StartupReservations | None = None
        self._meter: HostMeter | None = None  # the host's memory, read at each reading
        self._killers_at = float("-inf")  # time.monotonic() of the last scan for killers
        self.guard = Guard(None, logger)  # never take the nanny down
        # Set up in setup(), once the configuration is read.
        self.placement = Placement(self.cgroup_limit, self.guard, lambda: self._closing)
        self.reporter = Reporter(None, "", self.max_report_size, self.guard, self._stopping)

    def _stopping(self) -> bool:
        return self._closing

    def __getstate__(self):
        return {
            "crash_dir": self.crash_dir,
            "cgroup_limit": self.cgroup_limit,
            "sample_interval": self.sample_interval,
            "max_report_size": self.max_report_size,
            "signal_senders": self.signal_senders,
        }

    def __setstate__(self, state):
        self.__init__(**state)

    # --- set-up -----------------------------------------------------------------------

    def _resolve_config(self) -> None:
        _config.check_keys(logger)  # its worker's keys too: it starts with this config
        if self.crash_dir is None:
            self.crash_dir = configured_crash_dir()
        if self.cgroup_limit is None:
            self.cgroup_limit = _config.get_choice(
                "worker.cgroup-limit", ("auto", "true", "false")
            )
        if self.sample_interval is None:
            self.sample_interval = _config.get_seconds("worker.sample-interval")
        if self.max_report_size is None:
            self.max_report_size = _config.get_bytes("worker.max-report-size")
        if self.signal_senders is None:
            self.signal_senders = _config.get_bool("worker.signal-senders")
        self.sender_cmdline = _config.get_choice("worker.sender-cmdline", CMDLINE_MODES)
        self.labels = configured_labels()

    async def setup(self, nanny: Nanny) -> None:
        follow_dask_logging()
        if self.crash_dir is None:  # the nanny's own config first: its workers start with it
            own = getattr(nanny, "config", None)
            if isinstance(own, dict):
                value = dask.config.get("oomguard.worker.crash-dir", None, config=own)
                self.crash_dir = (
                    os.path.expanduser(value) if isinstance(value, str) and value else None
                )
        self._resolve_config()
        self.placement = Placement(self.cgroup_limit, self.guard, self._stopping)
        self.placement.decide()
        assert self.crash_dir is not None
        self._private_crash_dir(nanny)
        admission = AdmissionConfig.from_dask(self.crash_dir)  # ConfigError names a bad key
        if any(i.essential for i in _compat.check("nanny", _compat.NANNY, nanny, logger)):
            return  # no reports from here: the scheduler sees this nanny's deaths as lost
        active = getattr(nanny, "_oomguard_nanny_plugin", None)
        if active is not None and active is not self and not active._closing:
            # Loaded twice (preload, then again by the scheduler): the first one keeps
            # watching; Nanny.plugin_add does not tear down the instance it replaces.
            self._delegate = active
            return
        nanny._oomguard_nanny_plugin = self
        self._nanny = nanny
        self.reporter = Reporter(
            nanny, self.crash_dir, self.max_report_size, self.guard, self._stopping
        )
        self.reporter.sender_cmdline = self.sender_cmdline
        self.reporter.labels = self.labels
        self._meter = HostMeter()
        if admission.enabled and admission.startup:
            self._startup = StartupReservations(admission, f"{os.getpid()}-{id(self):x}")
        worker_plugin = OomguardWorkerPlugin(
            self.crash_dir, self.sample_interval or 0.5, self.signal_senders
        )
        self._add_worker_plugin(nanny.worker_kwargs, worker_plugin)
        if nanny.process is not None:
            self._add_worker_plugin(nanny.process.worker_kwargs, worker_plugin)

        original_instantiate = nanny.instantiate
        original_log_event = nanny.log_event

        async def instantiate(*args, **kwargs):
            await self.placement.after_the_previous_start()
            if self._guard(self.placement.killed_while_starting, "instantiate", nanny):
                # Dask's _on_worker_exit logs this ("Failed to restart worker"), and the
                # nanny's start fails as on distributed 2026.7.0 and later.
                raise RuntimeError(
                    "oomguard: not restarting a worker OOM-killed by its own "
                    "memory cgroup's limit while its nanny starts"
                )
            start = await self._reserve(nanny)
            try:
                return await self._instantiate(nanny, original_instantiate(*args, **kwargs))
            finally:
                if start is not None:
                    self._guard(self._started_up, "startup", nanny, start)

        def log_event(topic, msg):
            if topic == "worker-restart-memory" and isinstance(msg, dict):
                self._guard(self.reporter.memory_kill, "log_event", msg)
            return original_log_event(topic, msg)

        original_close = nanny.close

        async def close(*args, **kwargs):
            # Why the nanny closes: "signal-15" when `dask worker` got SIGTERM (a kubelet
            # eviction, a container stop, a person): teardown tells the scheduler so.
            reason = kwargs.get("reason", args[1] if len(args) > 1 else "")
            self._close_reason = reason if isinstance(reason, str) else ""
            return await original_close(*args, **kwargs)

        nanny.instantiate = instantiate  # type: ignore[method-assign]
        nanny.log_event = log_event  # type: ignore[method-assign]
        nanny.close = close  # type: ignore[method-assign]
        if nanny.process is not None:
            self._guard(self.placement.wrap_wait_until_connected, "setup", nanny.process, nanny)
        if nanny.process is not None and nanny.process.pid is not None:
            # Installed at runtime: the current worker process is already running.
            self._guard(self._on_started, "setup")
        self._watcher = asyncio.ensure_future(self._watch_group())

    async def _watch_group(self) -> None:
        """Read the worker's group and the host every sample interval (small cgroupfs and
        /proc reads on the nanny's loop), so a death is judged against a recent reading;
        look for userspace killers on the host now and then, off the loop."""
        while not self._closing:
            if time.monotonic() - self._killers_at >= KILLERS_REFRESH:
                with self.guard("killers"):
                    self._killers_at = time.monotonic()
                    self.reporter.killers = await asyncio.to_thread(self._find_killers)
            await asyncio.sleep(self.sample_interval or 0.5)
            life = self._life
            if life is not None:
                with self.guard("reading"):
                    take_readings(life, self._meter)

    def _find_killers(self) -> list[dict]:
        total = self._meter.read()["total"] if self._meter is not None else None
        return find_killers(total)

    async def _instantiate(self, nanny: Nanny, instantiating: Any) -> Any:
        """Dask's `Nanny.instantiate`, with the worker moved into its group at its spawn."""
        starting = asyncio.ensure_future(instantiating)
        if nanny.process is None:
            # The first start creates the WorkerProcess in its first step, before it awaits
            # anything: one turn of the loop later it exists, and the spawned process has
            # not yet been waited for (that needs the spawn thread's reply first).
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                starting.cancel()
                raise
        if nanny.process is not None:
            self._guard(
                self.placement.wrap_wait_until_connected, "instantiate", nanny.process, nanny
            )
        try:
            result = await starting
        except BaseException:
            self._guard(self.placement.failed_start, "instantiate", nanny)
            raise
        self._guard(self._on_started, "instantiate")
        if self.placement.placed is not None:
            # Moved at its spawn but never up: Dask returns a status here, not an error.
            self._guard(self.placement.failed_start, "instantiate", nanny)
        return result

    def _private_crash_dir(self, nanny: Nanny) -> None:
        """A crash dir only this user can write, handed to the worker processes (their
        plugin, and the config they start with), cleared of dead processes' files."""
        process = getattr(nanny, "process", None)  # a copy of nanny.config, where started
        configs = (getattr(nanny, "config", None), getattr(process, "config", None))
        self.crash_dir = private_crash_dir(self.crash_dir or "", configs)

    @staticmethod
    def _add_worker_plugin(kwargs: dict, plugin: OomguardWorkerPlugin) -> None:
        plugins = tuple(
            p for p in kwargs.get("plugins", ()) if getattr(p, "name", None) != plugin.name
        )
        kwargs["plugins"] = plugins + (plugin,)

    @staticmethod
    def _remove_worker_plugin(kwargs: dict | None) -> None:
        if kwargs is not None and "plugins" in kwargs:
            name = OomguardWorkerPlugin.name
            kwargs["plugins"] = tuple(
                p for p in kwargs["plugins"] if getattr(p, "name", None) != name
            )

    async def teardown(self, nanny: Nanny) -> None:
        # Nanny.close tears plugins down *before* it kills the worker: that kill is
        # requested, never a failure.
        if self._delegate is not None:
            await self._delegate.teardown(nanny)
            return
        self._closing = True
        if self._watcher is not None:
            self._watcher.cancel()
        if nanny.process is not None and nanny.process.worker_address:
            # Nanny.close kills the worker right after this: tell the scheduler first.
            process = getattr(nanny.process, "process", None)
            pid = getattr(process, "pid", None)
            stopped = self._guard(stopped_by, "teardown", self._close_reason, self.crash_dir, pid)
            await self.reporter.send_clean_exit(nanny.process.worker_address, True, pid, stopped)
        if getattr(nanny, "_oomguard_nanny_plugin", None) is self:
            # Back to Dask's own methods (the wraps live on the instance only), and a worker
            # it starts from now on without oomguard's worker plugin (uninstall()).
            for attr in ("instantiate", "log_event", "close"):
                nanny.__dict__.pop(attr, None)
            for kwargs in (nanny.worker_kwargs, getattr(nanny.process, "worker_kwargs", None)):
                self._remove_worker_plugin(kwargs)
            if nanny.process is not None and "_oomguard_placing" in vars(nanny.process):
                for attr in ("_wait_until_connected", "_oomguard_placing"):
                    nanny.process.__dict__.pop(attr, None)
            nanny._oomguard_nanny_plugin = None
        for task in list(self._tasks):
            try:
                await asyncio.wait_for(asyncio.shield(task), 5)
            except Exception:
                pass
        if self._startup is not None:
            self._guard(self._startup.close, "startup")
        if self._meter is not None:
            self._meter.close()
        life, self._life = self._life, None
        if life is not None:
            life.close()
        placed = self.placement.release()
        for group in (life.group if life else None, placed.group if placed else None):
            if group is not None:
                # The worker may still be in it; remove() moves it to the parent first.
                await asyncio.to_thread(group.remove)

    # --- start-up reservations -----------------------------------------------------------

    async def _reserve(self, nanny: Nanny) -> Start | None:
        """Wait for this start's lease of host memory (None: no reservation)."""
        if self._startup is None:
            return None
        try:
            return await self._startup.reserve(
                getattr(nanny, "death_timeout", None),
                lambda: self._closing or nanny.status in _CLOSING,
            )
        except Exception:
            self._internal_error("startup")
            return None

    def _started_up(self, nanny: Nanny, start: Start) -> None:
        """Release the start's lease, with the worker's start-up peak when it is up."""
        process = nanny.process
        pid = process.pid if process is not None else None
        life = self._life if self._life is not None and self._life.pid == pid else None
        peak = None
        if life is not None:
            peak = startup_peak(life.pid, life.group.counters().peak if life.group else None)
        self._startup.release(peak)
        if nanny.status not in _CLOSING:
            nanny.log_event(STARTUP_TOPIC, start.event(life and life.pid, time.time(), peak))

    # --- the worker process's life ----------------------------------------------------

    def _on_started(self) -> None:
        nanny = self._nanny
        if nanny is None or nanny.process is None:
            return
        wp = nanny.process
        pid = wp.pid
        if pid is None:
            return
        if self._life is not None and self._life.pid == pid:
            return
        self._wrap_mark_stopped(wp)
        life = _Life(
            pid=pid,
            started=time.time(),
            address=wp.worker_address,
            name=str(nanny.name),
            memory_limit=nanny.memory_manager.memory_limit,
        )
        placed = self.placement.started(pid, life.memory_limit)
        life.group = placed.group
        life.placement = placed.facts()
        life.missing.extend(placed.missing)
        if life.group is not None:
            life.cgroup_path, life.cgroup_version = life.group.path, life.group.version
        else:
            info = _cgroup.detect(pid)
            life.cgroup_path, life.cgroup_version = info.path, info.version
            if info.path is None:
                life.missing.append(f"cgroup: {info.reason or 'not found'}")
        if life.cgroup_path is not None and life.cgroup_version is not None:
            counters = _cgroup.read_memory_counters(life.cgroup_path, life.cgroup_version)
            life.cgroup_before = counters
            life.missing.extend(f"cgroup at worker start: {m}" for m in counters.missing)
            life.oomd_watch = OomdXattrs(life.cgroup_path)
        life.slurm_job = slurm_environment(pid)
        life.environment = self.reporter.environment()
        take_readings(life, self._meter)
        self._life = life

    def _wrap_mark_stopped(self, wp: Any) -> None:
        if getattr(wp, "_oomguard_wrapped", False):
            return
        if not hasattr(wp, "mark_stopped"):  # setup found it missing and stopped there
            return
        original = wp.mark_stopped

        def mark_stopped():
            exit_facts = None
            try:
                if wp.status != Status.stopped and wp.process is not None:
                    exit_facts = (
                        wp.process.pid,
                        wp.process.exitcode,
                        wp.status == Status.stopping,  # Nanny.kill: close or restart
                        wp.worker_address,
                    )
            except Exception:
                self._internal_error("mark_stopped")
            original()
            if exit_facts is not None:
                self._guard(self._on_exit, "mark_stopped", *exit_facts)

        wp.mark_stopped = mark_stopped
        wp._oomguard_wrapped = True

    def _on_exit(self, pid: int, exitcode: int | None, stopping: bool, address) -> None:
        nanny = self._nanny
        life = self._life if self._life is not None and self._life.pid == pid else None
        if life is not None:
            self._life = None
            life.close()
        placed = self.placement.exited(pid)
        if placed is not None:
            # Died before it was up: the report reads its group's counters all the same.
            if life is None and placed.group is not None:
                life = _Life(
                    pid=pid,
                    started=placed.at,
                    address=address,
                    name=str(nanny.name) if nanny is not None else "",
                    memory_limit=nanny.memory_manager.memory_limit if nanny else None,
                    group=placed.group,
                    cgroup_path=placed.group.path,
                    cgroup_version=placed.group.version,
                    cgroup_before=placed.before,
                    placement=placed.facts(),
                    started_monotonic=placed.at_monotonic,
                    missing=[*placed.missing, "the worker died before it was up"],
                    environment=self.reporter.environment(),
                )
        requested = stopping or self._closing or (nanny is not None and nanny.status in _CLOSING)
        death_time = time.time()
        if requested or exitcode == 0:
            coro = self.reporter.send_clean_exit(address, requested, pid)
            if life is not None and life.group is not None:
                life.group.remove()
            remove_files(self.crash_dir, pid)
        else:
            coro = self.reporter.report(pid, exitcode, requested, address, life, death_time)
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- never take the nanny down ----------------------------------------------------

    def _guard(self, fn, where: str, *args) -> Any:
        """fn(*args), or None when it raised (logged once per site, counted)."""
        with self.guard(where):
            return fn(*args)
        return None

    def _internal_error(self, where: str) -> None:
        self.guard.error(where)

    @property
    def errors(self) -> int:
        return self.guard.count
