"""Who sent the signal that ended a worker: the nanny blocks, the worker waits and replays.

CPython's `signal.signal` handlers get no siginfo, but `sigtimedwait` does (si_pid, si_uid,
si_code). It only sees a signal that every thread of the process blocks, and threads inherit
their creator's mask, the child of a fork the forking thread's:

- the NANNY (`spawning_blocked`): Dask's `WorkerProcess.start` makes an `AsyncProcess`,
  whose "watch message queue" thread later runs `multiprocessing`'s spawn (the fork and
  exec of `_posixsubprocess`, which keep the calling thread's mask). That thread is created
  in the start's first step, which runs in the first step of `Nanny.instantiate`: so the
  nanny's loop thread blocks `SIGNALS` for that one step only, and the worker process starts
  with them blocked in its every thread. Dask helper threads made in that step (the watch
  thread, a queue's feeder) keep them blocked; the nanny's own signal handling is unchanged,
  its main thread's mask is restored at once.
- the WORKER (`SignalWaiter`): one daemon thread waits for them, writes the sender (read
  from /proc at once, `_host.senders`) into the flight record, then REPLAYS the signal
  to itself with it unblocked in that thread only: the installed handler (faulthandler's
  chained SIGTERM dump, Python's handler, or the default action) runs as it would have.
  Its `stop()` runs on the worker's event loop (the plugin's teardown, also when Dask
  replaces the nanny's plugin by the scheduler's as the worker registers) and wakes it at
  once with `_WAKE`, a signal sent to that thread alone: sitting out the wait's poll there
  held the worker's "running" status back from the scheduler, whose tasks went elsewhere.

Processes that task code starts get the worker's own mask back (`_unmask_children`), except
those that C code forks by itself: docs/configuration.md, `oomguard.worker.signal-senders`.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
import types
from collections.abc import Callable, Coroutine
from typing import Any

from .._host import senders as _senders
from .._host.flight import SIGNALS_RECORDING, FlightRecorder

logger = logging.getLogger("oomguard.worker")

#: The catchable signals that end a worker by default (or by Dask's handlers).
SIGNALS = frozenset(
    {
        signal.SIGTERM,
        signal.SIGINT,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGALRM,
    }
)
_POLL = 0.25  # how often the waiter looks at its stop flag (seconds)
#: What `SignalWaiter.stop` wakes the waiter with: sent to that thread only (pthread_kill),
#: blocked there and in no other thread, never replayed. A real-time signal nothing of
#: Dask's uses; one sent to the process goes to a thread that does not block it. Linux has
#: them (elsewhere, where a client imports this module, there is no waiter to wake).
_WAKE: int | None = getattr(signal, "SIGRTMAX", None)
_WAITED = SIGNALS if _WAKE is None else SIGNALS | {_WAKE}
_waiting = False  # a waiter runs in this process: forked children unblock (at-fork hook)
_hooked = False
_inherited: bool | None = None  # this process started with SIGNALS blocked (first setup)


def started_blocked() -> bool:
    """Whether this process started with `SIGNALS` blocked, judged at the first call (the
    plugin's first setup, on the worker's main thread). A plugin replaced at runtime (Dask
    tears the old one down, which unblocks the main thread, then sets up the new one) keeps
    recording: the new setup blocks them again there."""
    global _inherited
    if _inherited is None:
        _inherited = blocked_here()
    if _inherited:
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    return _inherited


def blocked_here() -> bool:
    """Whether the calling thread blocks every one of `SIGNALS` (inherited from the nanny)."""
    return SIGNALS <= signal.pthread_sigmask(signal.SIG_BLOCK, [])


def process_blocks(pid: int, proc: str = "/proc") -> bool | None:
    """Whether process `pid`'s main thread blocks every one of `SIGNALS` (None: unreadable)."""
    try:
        with open(f"{proc}/{pid}/status") as f:
            line = next((x for x in f if x.startswith("SigBlk:")), None)
    except OSError:
        return None
    if line is None:
        return None
    mask = int(line.split()[1], 16)
    return all(mask >> (int(s) - 1) & 1 for s in SIGNALS)


# --- the nanny ------------------------------------------------------------------------


def can_block_spawn() -> tuple[bool, str]:
    """Whether Dask's start method hands the worker the forking thread's mask: spawn and
    fork do; forkserver forks every worker from its server process, whose mask it gets."""
    from distributed.utils import get_mp_context

    method = get_mp_context().get_start_method()
    if method in ("spawn", "fork"):
        return True, ""
    return False, f"distributed.worker.multiprocessing-method is {method!r}"


def prepare_spawn() -> None:
    """Start multiprocessing's resource tracker now, unmasked. Started lazily inside the
    blocked step (by the first `mp.Queue`), it would unblock SIGINT and SIGTERM in that
    thread after its own spawn (CPython's resource_tracker.ensure_running), and keep the
    other signals blocked in the tracker for good."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()


@types.coroutine
def _first_step_blocked(coro: Coroutine) -> Any:
    """Await `coro`, with `SIGNALS` blocked in this thread during its first step only."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        try:
            yielded = coro.send(None)
        except StopIteration as stop:
            return stop.value
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    while True:
        try:
            sent = yield yielded
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as e:  # CancelledError and the like, thrown in by the task
            try:
                yielded = coro.throw(e)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration as stop:
                return stop.value


async def spawning_blocked(coro: Coroutine) -> Any:
    """`await coro` (Dask's `Nanny.instantiate`), the worker process spawned with `SIGNALS`
    blocked: see the module's docstring."""
    return await _first_step_blocked(coro)


# --- the worker -----------------------------------------------------------------------


def _unmask_children() -> None:
    """Children that task code starts get the mask the worker was started with, not the
    blocked one: Python's fork-and-exec paths (`subprocess`, `multiprocessing`'s spawn and
    forkserver, `os.posix_spawn`; asyncio's subprocesses go through `subprocess`) run with
    `SIGNALS` unblocked in the calling thread, which the child inherits. Without this a
    child's SIGTERM stayed pending for good: `Popen.terminate()` did nothing, and
    `multiprocessing.Pool.terminate()` (what `with Pool() as p:` ends with) hung.
    While the call runs, a signal to the worker may be handled on that thread as without
    oomguard, its sender unrecorded. C code that forks by itself (`os.system`, a library's
    own fork) still passes the blocked mask on: docs/configuration.md."""
    import _posixsubprocess
    import subprocess

    for owner, name in (
        (subprocess, "_fork_exec"),  # subprocess.Popen
        (_posixsubprocess, "fork_exec"),  # multiprocessing.util.spawnv_passfds
        (os, "posix_spawn"),
        (os, "posix_spawnp"),
    ):
        fn = getattr(owner, name, None)
        if callable(fn) and not getattr(fn, "_oomguard_unmasked", False):
            setattr(owner, name, _unmasked(fn))


def _unmasked(fn: Callable) -> Callable:
    """`fn`, called with `SIGNALS` unblocked in the calling thread while a waiter runs."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if not _waiting:
            return fn(*args, **kwargs)
        old = signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
        try:
            return fn(*args, **kwargs)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    call._oomguard_unmasked = True  # type: ignore[attr-defined]
    return call


def _unblock_in_child() -> None:
    # A child forked by task code (os.fork, multiprocessing's fork) has no waiter thread.
    if _waiting:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


class SignalWaiter:
    """Takes the worker's blocked `SIGNALS` on one thread, records each sender, replays it.

    >>> waiter = SignalWaiter(recorder, on_error)  # doctest: +SKIP
    >>> waiter.start()                              # doctest: +SKIP
    """

    def __init__(self, recorder: FlightRecorder, on_error: Callable[[str], None]):
        self._recorder = recorder
        self._on_error = on_error
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # held to wake the thread, and by it as it ends
        self._wakeable = False  # the thread runs and may be sent _WAKE
        self.received = 0

    def start(self) -> None:
        global _waiting, _hooked
        if not _hooked:
            os.register_at_fork(after_in_child=_unblock_in_child)
            _unmask_children()
            _hooked = True
        _waiting = True
        self._recorder.signals_state(SIGNALS_RECORDING)
        self._thread = threading.Thread(target=self._run, name="oomguard-signals", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop waiting and unblock `SIGNALS` in the calling thread (the worker's event
        loop, its main thread): one pending there now is delivered as without oomguard."""
        global _waiting
        _waiting = False
        thread = self._thread
        with self._lock:
            self._stop.set()
            if self._wakeable and _WAKE is not None and thread is not None and thread.ident:
                # Alive until it clears _wakeable under this lock: the thread id is valid.
                try:
                    signal.pthread_kill(thread.ident, _WAKE)
                except Exception:
                    self._on_error("signals")  # it ends at its next poll all the same
        if thread is not None:
            thread.join(timeout=2 * _POLL + 1)
            self._thread = None
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)

    def _run(self) -> None:
        # _WAKE blocked here only: one sent by stop() waits for the sigtimedwait below (or
        # is dropped with the thread), whatever this thread is doing when it comes.
        signal.pthread_sigmask(signal.SIG_BLOCK, _WAITED)
        with self._lock:
            self._wakeable = True
        try:
            self._wait()
        finally:
            with self._lock:
                self._wakeable = False

    def _wait(self) -> None:
        while not self._stop.is_set():
            try:
                info = signal.sigtimedwait(_WAITED, _POLL)
            except Exception:
                self._on_error("signals")
                continue
            if info is None or info.si_signo == _WAKE:
                continue
            self.received += 1
            try:
                self._recorder.write_signal(
                    _senders.record(info.si_signo, info.si_code, info.si_pid, info.si_uid)
                )
            except Exception:
                self._on_error("signals")
            _replay(info.si_signo)


def _replay(signo: int) -> None:
    """Deliver `signo` again, to this thread, with it unblocked here only: the handler
    installed for it runs (or the default action: the process ends as without oomguard)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signo})
    try:
        signal.pthread_kill(threading.get_ident(), signo)
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signo})
