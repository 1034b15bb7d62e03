"""The worker-process side: faulthandler to a crash file, the flight recorder, and the gate
that runs a suspect alone."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import psutil
from distributed.diagnostics.plugin import WorkerPlugin

from .. import _compat, _config
from .._death.wire import to_wire
from .._guard import Guard
from .._host import cgroup as _cgroup
from .._host import environment as _environment
from .._host import sigrec as _sigrec
from .._host.flight import (
    SIGNALS_DISABLED,
    SIGNALS_RECORDING,
    SIGNALS_UNAVAILABLE,
    FlightRecorder,
)
from .._host.growth import GrowthSplit, thread_system_time
from .._host.paths import configured_crash_dir, crash_path, flight_path
from .._log import follow_dask_logging
from .._private import create, private_dir
from .._protocol import ENVIRONMENT_FIELD, HOST_TOPIC, RUNS_ALONE_FIELD, WORKER_PLUGIN
from ._admission import install_admission
from ._alone import AloneGate

if TYPE_CHECKING:
    from distributed import Worker

logger = logging.getLogger("oomguard.worker")

#: The SLURM job the worker runs in, as its HOST_TOPIC event names it (see _slurm_jobs).
_SLURM_VARS = (("slurm_job_id", "SLURM_JOB_ID"), ("slurm_step_id", "SLURM_STEP_ID"))
#: The most frames the sampler keeps of one executing task's stack (the innermost ones).
_STACK_LIMIT = 64


class OomguardWorkerPlugin(WorkerPlugin):
    """Runs inside each worker process.

    Dumps every thread's stack to a crash file on SIGSEGV/SIGABRT/SIGBUS/SIGFPE/SIGILL and
    SIGTERM, and keeps a flight record of the executing tasks and their last sampled stacks,
    which the nanny reads when the process dies (even by SIGKILL, when nothing can run).
    Records who sent each catchable signal (`_host.sigrec`, a native signal handler in front
    of the ones in place), also when installed on a running worker. Runs a suspect alone
    when the scheduler asks (`_alone.py`): the flight record's slots then open and close
    around each task's real run.

    `crash_dir` and `sample_interval` left None are read in `setup`, from the worker's own
    config (`oomguard.worker.crash-dir`, `.sample-interval`), as its nanny reads them: so the
    scheduler sends it without them. Dask gives the scheduler's plugin to every worker that
    registers, replacing its nanny's; with the scheduler's crash dir in it, a worker on a
    host with a crash dir of its own wrote its crash file and flight record where its nanny
    never looked (found by the multi-host lab, tests/hosts).
    """

    name = WORKER_PLUGIN
    idempotent = True

    crash_dir: str | None
    sample_interval: float | None
    signal_senders: bool | None

    def __init__(
        self,
        crash_dir: str | None = None,
        sample_interval: float | None = None,
        signal_senders: bool | None = None,
    ):
        self.crash_dir = crash_dir
        self.sample_interval = sample_interval
        self.signal_senders = signal_senders  # None: oomguard.worker.signal-senders
        self._senders: _sigrec.Recorder | None = None
        self._worker: Worker | None = None
        self._recorder: FlightRecorder | None = None
        self._crash_file: Any = None
        self._slots: dict[Any, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._process: psutil.Process | None = None
        self._cgroup: _cgroup.CgroupInfo | None = None
        self._samples = 0
        self._growth = GrowthSplit()
        self.guard = Guard(None, logger)  # never take the worker down
        self._admission = None  # host-wide memory admission
        self._wrap_threads = False  # Worker.active_threads still to be wrapped (_ThreadsSeen)
        self._gate: AloneGate | None = None  # the run-alone gate, where Worker.execute is
        self._early: set = set()  # keys executing when the gate came: ended by transition

    def __getstate__(self):
        return {
            "crash_dir": self.crash_dir,
            "sample_interval": self.sample_interval,
            "signal_senders": self.signal_senders,
        }

    def __setstate__(self, state):
        self.__init__(**state)

    def setup(self, worker: Worker) -> None:
        follow_dask_logging()
        self._worker = worker
        if self.crash_dir is None:
            self.crash_dir = configured_crash_dir()
        if self.sample_interval is None:
            self.sample_interval = _config.get_seconds("worker.sample-interval") or 0.5
        pid = os.getpid()
        # Its nanny chose a private one and handed it over (crash_dir, and the config its
        # process starts with); checked again, as a worker may run without that nanny.
        self.crash_dir = private_dir(self.crash_dir, "crash dir")
        self._crash_file = os.fdopen(create(crash_path(self.crash_dir, pid), os.O_WRONLY), "w")
        faulthandler.enable(file=self._crash_file, all_threads=True)
        faulthandler.register(signal.SIGTERM, file=self._crash_file, all_threads=True, chain=True)
        self._recorder = FlightRecorder.create(flight_path(self.crash_dir, pid))
        # After faulthandler's SIGTERM registration: the recorder runs first and sees the
        # real sender, then chains to faulthandler's dump.
        self._record_senders(worker, self._recorder)
        try:  # host-wide memory leases (oomguard.memory, learned peaks)
            self._admission = install_admission(worker, self.crash_dir)
        except Exception:
            self._internal_error("admission")
        self._install_gate(worker)  # after admission: a task waits here before its lease
        # Tasks already executing when the plugin arrives at runtime.
        for ts in list(worker.state.executing):
            self._task_started(ts.key)
            if self._gate is not None:
                self._gate.running.add(ts.key)
                self._early.add(ts.key)
        self._watch_threads(worker)
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._sample_loop, name="oomguard-sampler", daemon=True
        )
        self._thread.start()
        try:
            # The name its nanny's death reports give this host, so that the scheduler
            # names the host of an exception, or of a death without a report, the same.
            # Its SLURM job too, for the scheduler to ask SLURM when the worker is lost.
            # And whether it can run a task alone (the scheduler places suspects so), and
            # its environment (the scheduler counts the cluster's workers by their values).
            job = {k: os.environ[v] for k, v in _SLURM_VARS if os.environ.get(v)}
            alone = {RUNS_ALONE_FIELD: True} if self._gate is not None else {}
            env = self._environment()
            worker.log_event(HOST_TOPIC, {"host": socket.gethostname(), **job, **alone, **env})
        except Exception:
            self._internal_error("setup")

    def _environment(self) -> dict[str, Any]:
        """{ENVIRONMENT_FIELD: ...} for the host event, as the nanny reads it for its reports
        ({} when it cannot be read: the host event goes without it)."""
        try:
            labels = _environment.configured_labels()
            return {ENVIRONMENT_FIELD: to_wire(_environment.read(os.environ, labels))}
        except Exception:
            self._internal_error("environment")
            return {}

    def _install_gate(self, worker: Worker) -> None:
        """The run-alone gate around `Worker.execute`; without that internal (said once),
        none, and the scheduler places no suspect here."""
        gone = _compat.missing(_compat.WORKER, worker)
        if gone:
            logger.warning("oomguard: %s", "; ".join(f"no {i.name}, so {i.without}" for i in gone))
            return
        try:
            self._gate = AloneGate(self._task_started, self._task_ended, self._internal_error)
            self._gate.install(worker)
        except Exception:
            self._gate = None
            self._internal_error("alone_gate")

    def _task_started(self, key) -> None:
        # The task's code may start now: its flight slot opens (event loop, O(1)).
        if key not in self._slots and self._recorder is not None:
            self._slots[key] = self._recorder.task_started(str(key))

    def _task_ended(self, key) -> None:
        slot = self._slots.pop(key, None)
        if slot is not None and self._recorder is not None:
            self._recorder.task_finished(slot)

    def _watch_threads(self, worker: Worker) -> None:
        """Have each task's thread recorded in its flight slot as the thread starts it: a
        native crash's dump names the crashing thread, this says which task ran there."""
        threads = getattr(worker, "active_threads", None)
        if isinstance(threads, _ThreadsSeen):  # wrapped by an earlier plugin: take it over
            threads.plugin = self
            with worker.active_threads_lock:
                for ident, key in list(threads.items()):  # tasks running now
                    self._task_thread(key, ident)
        elif type(threads) is dict:
            self._wrap_threads = True
            self._wrap_when_idle()
        else:
            logger.warning(
                "oomguard: Worker.active_threads is %s, not a dict: a native crash cannot be "
                "charged to the thread that crashed on this worker",
                type(threads).__name__,
            )

    def _wrap_when_idle(self) -> None:
        """Wrap Dask's dict once no task runs (event loop): a dispatched task holds the
        dict it was given and deletes its entry from that one, so a copy made while tasks
        run would keep their entries for ever. Until then the sampler's thread serves."""
        worker = self._worker
        if worker is None or worker.state.executing or getattr(worker.state, "long_running", ()):
            return
        with worker.active_threads_lock:
            threads = _ThreadsSeen(worker.active_threads)
            threads.plugin = self
            worker.active_threads = threads
        self._wrap_threads = False

    def _task_thread(self, key, ident: int) -> None:
        # Called on the task's own thread (`_ThreadsSeen`): O(1), never raises.
        try:
            slot = self._slots.get(key)
            if slot is not None and self._recorder is not None:
                self._recorder.task_thread(slot, ident)
        except Exception:
            self._internal_error("task_thread")

    def _record_senders(self, worker: Worker, recorder: FlightRecorder) -> None:
        """Record the senders of the catchable signals (`_host.sigrec`), unless
        oomguard.worker.signal-senders is false; the flight record says which. Not in a
        worker without a nanny: none reads its flight record, and the process it runs in
        (a notebook's, a test's) keeps its signal handlers as they are."""
        if getattr(worker, "nanny", None) is None:
            recorder.signals_state(SIGNALS_UNAVAILABLE)
            return
        enabled = self.signal_senders
        if enabled is None:
            try:
                enabled = _config.get_bool("worker.signal-senders")
            except Exception:  # its nanny read the same setting and refused a bad one
                enabled = True
        if not enabled:
            recorder.signals_state(SIGNALS_DISABLED)
            return
        senders = _sigrec.Recorder()
        state = senders.start(recorder)
        recorder.signals_state(state)
        if state == SIGNALS_RECORDING:
            self._senders = senders
        else:
            logger.info(
                "oomguard: the senders of this worker's signals are not recorded: %s", senders.why
            )

    def teardown(self, worker: Worker) -> None:
        if self._senders is not None:
            # First, before faulthandler puts back what it replaced (the recorder is in
            # front of it): each signal's handler is again the one before oomguard.
            self._senders.stop()
            self._senders = None
        self._stop.set()
        if isinstance(threads := getattr(worker, "active_threads", None), _ThreadsSeen):
            threads.plugin = None
        if self._gate is not None:  # before admission: it wraps admission's execute
            self._gate.uninstall(worker)
            self._gate = None
        if self._admission is not None:  # host-wide memory admission
            self._admission.uninstall(worker)
            self._admission = None
        if self._thread is not None:
            self._thread.join(timeout=2 * self.sample_interval + 1)
        if self._crash_file is not None:
            try:
                faulthandler.unregister(signal.SIGTERM)
                faulthandler.disable()
            finally:
                self._crash_file.close()
                self._crash_file = None
        if self._recorder is not None:
            # The nanny removes the files once it has read them; a clean teardown means
            # there is nothing to read.
            self._recorder.close(remove=True)
            self._recorder = None
            try:
                os.unlink(crash_path(self.crash_dir, os.getpid()))
            except OSError:
                pass

    # Hot path: called for every task transition on the worker's event loop.
    def transition(self, key, start, finish, **kwargs) -> None:
        try:
            if self._wrap_threads and start in ("executing", "long-running"):
                self._wrap_when_idle()  # O(1): two set sizes, most times
            gate = self._gate
            if gate is not None and key not in self._early:
                return  # the gate opens and closes the slots, around the real run
            if finish == "executing":
                self._task_started(key)
            elif finish != "long-running" and start in ("executing", "long-running"):
                # A task that seceded (executing -> long-running) still runs and can still
                # kill its worker: its slot stays until it really ends.
                self._task_ended(key)
                if gate is not None:
                    self._early.discard(key)
                    gate.left(key)
        except Exception:
            self._internal_error("transition")

    def _sample_loop(self) -> None:
        while not self._stop.wait(self.sample_interval):
            try:
                self.sample()
            except Exception:
                self._internal_error("sampler")

    def sample(self) -> None:
        """Record the executing threads' stacks, RSS and cgroup usage (sampler thread)."""
        worker, rec = self._worker, self._recorder
        if worker is None or rec is None:
            return
        active = dict(worker.active_threads)
        stacks = _stacks(active)
        native = {t.ident: t.native_id for t in threading.enumerate()}
        tasks: dict[str, Any] = {}
        running: dict[str, tuple[int, float | None]] = {}
        for ident, key in active.items():
            if (stack := stacks.get(ident)) is None:
                continue
            tasks[str(key)] = {"thread": ident, "stack": stack}
            if (tid := native.get(ident)) is not None:
                running[str(key)] = (tid, thread_system_time(tid))
        if self._process is None:
            self._process = psutil.Process()
        rss = self._process.memory_info().rss
        for key, grew in self._growth.update(rss, running).items():
            tasks[key]["grew"] = grew
        if self._admission is not None:  # learn this prefix's peak
            self._admission.observe(rss)
        if self._senders is not None and (replaced := self._senders.replaced()):
            rec.signals_state(SIGNALS_RECORDING, replaced)  # task code's signal.signal
        rec.write_sample(
            {
                "time": time.time(),
                "rss": rss,
                "cgroup_usage": self._cgroup_usage(),
                "tasks": tasks,
            }
        )

    def _cgroup_usage(self) -> int | None:
        # Re-detected every 20 samples: the nanny moves this process into its own group
        # after it has started.
        if self._cgroup is None or self._samples % 20 == 0:
            self._cgroup = _cgroup.detect(os.getpid())
        self._samples += 1
        info = self._cgroup
        if info.path is None or info.version is None:
            return None
        return _cgroup.read_memory_counters(info.path, info.version).usage

    def _internal_error(self, where: str) -> None:
        self.guard.error(where)

    @property
    def errors(self) -> int:
        return self.guard.count


class _ThreadsSeen(dict):
    """`Worker.active_threads` ({thread ident: key}), which Dask's `_run_task` fills from
    the task's own thread as it starts the task: each entry also goes to the flight record.
    Never replaced back (a running task still deletes its entry from this object)."""

    plugin: OomguardWorkerPlugin | None = None

    def __setitem__(self, ident, key) -> None:
        super().__setitem__(ident, key)
        if (plugin := self.plugin) is not None:
            plugin._task_thread(key, ident)


def _stacks(idents) -> dict[int, list[list]]:
    """The stacks of these threads. `sys._current_frames()` holds the caller's own frame, so
    its dict and that frame form a cycle: kept until the cycle collector runs, it would keep
    every sampled task frame, and with them the task's memory, alive after the task ended
    (300 MiB per finished task, seen in the admission scenario of issue 16)."""
    frames = sys._current_frames()
    try:
        return {i: _stack(frames[i]) for i in idents if i in frames}
    finally:
        frames.clear()


def _stack(frame) -> list[list]:
    """[filename, lineno, function] innermost last, at most _STACK_LIMIT frames. A plain
    walk: traceback.extract_stack would also read source lines we do not keep."""
    out = []
    while frame is not None and len(out) < _STACK_LIMIT:
        code = frame.f_code
        out.append([code.co_filename, frame.f_lineno, code.co_name])
        frame = frame.f_back
    out.reverse()
    return out
