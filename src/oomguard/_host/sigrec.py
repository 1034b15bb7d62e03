"""Who sent each catchable signal that reaches a worker: the native recorder, from Python.

`_sigrec` (C, `_sigrec.c`) puts a small SA_SIGINFO handler in front of the handler already
installed for each of `SIGNALS`. On a signal it writes the sender (si_pid, si_uid, si_code,
the time, /proc/PID/comm and cmdline) into the flight record's signal area, then chains to
the handler it found (CPython's trampoline for a `signal.signal` handler, faulthandler's
dump) or, where it found the default action, puts that back and raises the signal again.
It blocks no signal, patches nothing and has no at-fork hook: task code, its threads and its
children see the signal dispositions and masks they would see without oomguard. A handler
installed later (`signal.signal` in task code) replaces it as it would any other; `stop()`
puts back only what it replaced itself.

The worker plugin starts it after faulthandler's SIGTERM registration (so it runs first and
sees the real sender; faulthandler's dump then runs and chains on to the default action)
and stops it before faulthandler is unregistered (docs/configuration.md).

>>> rec = Recorder()                             # doctest: +SKIP
>>> rec.start(flight_recorder)                   # doctest: +SKIP
>>> rec.stop()                                   # doctest: +SKIP
"""

from __future__ import annotations

import signal

from . import flight as _flight

try:
    from . import _sigrec
except ImportError:  # built without a C compiler, or not Linux: nothing is recorded
    _sigrec = None

#: The catchable signals that end a worker by default (or by Dask's handlers).
SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
)
_MASK = sum(1 << int(s) for s in SIGNALS)
_owner: Recorder | None = None  # the recorder whose handlers are in place (one per process)


def available() -> tuple[bool, str]:
    """Whether the native recorder can run here, and why not."""
    if _sigrec is None:
        return False, "oomguard._host._sigrec is not installed (built without a C compiler?)"
    layout = (_sigrec.SLOT_SIZE, _sigrec.CMDLINE_AT, _sigrec.CMDLINE_BYTES)
    if layout != (_flight.SIG_SLOT_SIZE, _flight.SIG_CMDLINE_AT, _flight.SIG_CMDLINE_BYTES):
        return False, f"_sigrec's slot layout {layout} is not the flight record's (a stale build)"
    return True, ""


def names(mask: int) -> list[str]:
    """The signal names of a bit mask, in `SIGNALS` order."""
    return [s.name for s in SIGNALS if mask >> int(s) & 1]


class Recorder:
    """The native recorder for one flight record. `start` returns the state to write into
    the record (`flight.SIGNALS_*`); `replaced()` the signals whose handler is no longer
    the recorder (a bit mask); `stop()` puts back the handlers it replaced."""

    def __init__(self) -> None:
        self.started = 0  # the signals recorded since start (a bit mask)
        self.why = ""  # why nothing is recorded, where it is not

    def start(self, record: _flight.FlightRecorder) -> int:
        global _owner
        ok, self.why = available()
        if not ok:
            return _flight.SIGNALS_UNAVAILABLE
        if _owner is not None:  # a plugin replaced without its teardown: its handlers go
            _owner.stop()
        fd, offset, slots = record.signal_slots()
        try:
            self.started = _sigrec.start(fd, offset, slots, _MASK)
        except (OSError, RuntimeError, ValueError) as e:  # e.g. the mapping refused
            self.why = f"the native signal recorder could not start: {e}"
            return _flight.SIGNALS_UNAVAILABLE
        _owner = self
        return _flight.SIGNALS_RECORDING

    def replaced(self) -> int:
        """The signals recorded since start whose handler is something else now."""
        if _owner is not self or _sigrec is None:
            return 0
        return self.started & ~_sigrec.recording()

    def stop(self) -> None:
        global _owner
        if _owner is self and _sigrec is not None:
            _owner = None
            _sigrec.stop()
        self.started = 0
