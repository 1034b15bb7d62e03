"""Why did a worker process die? Facts in, one `Cause` out, and the sentences that say why.

Pure code: no Dask, no I/O. The nanny gathers the facts (exit status, cgroup ``oom_kill``
counters before and after, its own ``worker-restart-memory`` event, the kernel log, the
faulthandler crash file; `facts.facts_from`, with the evidence naming their sources in
`facts.evidence`) and `classify` applies the rules below, first match wins.

====  =======================================================================  ================
rule  when                                                                     cause
====  =======================================================================  ================
R1    the nanny or the user asked for the close (any exit status)              None
R2    exit status 0 (no report; the scheduler counts an unexpected removal     None
      of it as an `exit` death: see `_decide.pairing`)
R3a   exit signal SIGSEGV/... while being terminated: the nanny's memory kill  memory_terminate
      was sent, or the crash file begins with a SIGTERM dump                   or sigterm
R3    exit signal SIGSEGV/SIGABRT/SIGBUS/SIGFPE/SIGILL                         native_crash
R4    exit status unknown (None or 255) and the crash file says                native_crash
      "Fatal Python error" (its signal, or SIGABRT for a Py_FatalError)
R5    kernel OOM evidence for this worker and exit SIGKILL or unknown (None    oom_kill
      or 255): the kernel log names its PID (records since it started), or
      its group's ``oom_kill`` moved since the last reading taken while it
      ran and every other process in the group then still runs
R6    the nanny's ``worker-restart-memory`` event and exit SIGTERM, SIGKILL    memory_terminate
      or unknown
R7    exit SIGTERM                                                             sigterm
R8    exit SIGKILL                                                             sigkill
R9    anything else: another positive status, another signal, unknown          exit
====  =======================================================================  ================

Precedence, and why:

- R3a before R3: faulthandler dumps every thread from inside the SIGTERM handler, which can
  itself crash a busy process (other threads change their frames meanwhile). Seen here: a
  worker the nanny terminated for memory died of SIGSEGV. The termination came first, so
  it is the cause; the evidence keeps the signal.
- R3/R4 before R5: the exit signal (or a faulthandler "Fatal Python error", which SIGKILL can
  never produce) is direct proof of how *this* process died, while a moved ``oom_kill``
  counter only says the kernel killed *something* in the group (a task's subprocess, say).
  So ``oom_kill`` moved + exit -11 is a native crash; the evidence still shows the delta.
- R5 before R6: when both the kernel and the nanny went after the worker and it died of
  SIGKILL, the kernel's counter is the harder evidence; both are memory causes anyway.
  With exit SIGTERM the kernel did not kill it (the OOM killer sends SIGKILL), so R6 wins.
- R6 also takes an unknown exit status: the nanny's own event says it sent the signals.
- A counter that could not be read (None) is "unknown", never "moved".
- Where the nanny sent a reading taken while the worker ran (every sample interval), the
  counter is compared with it, not with the worker's start: a task subprocess OOM-killed an
  hour earlier, or another worker sharing a container's group, moved it before. A kill
  counted since that reading is not this worker's proof when another process in the group
  stopped since (the kill may be that one's): then R5 does not apply (R8: ``sigkill``), and
  the evidence says so. The OOM killer counts the kill before it sends SIGKILL, and a
  reading is kept only while the worker still runs (no SIGKILL pending), so it never
  includes the worker's own kill.
- Exit status 255 counts as unknown: the nanny reports it when the status was already reaped.

Example:

>>> classify(DeathFacts(exitcode=-9, oom_kill_before=0, oom_kill_after=1))
<Cause.OOM_KILL: 'oom_kill'>
"""

from __future__ import annotations

import re
import signal as _signal
from dataclasses import dataclass

from .._causes import Cause

#: Signals whose death means the process itself crashed in native code.
NATIVE_SIGNALS = frozenset({"SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL"})

#: Exit statuses that mean "we do not know how it ended".
UNKNOWN_EXITCODES = frozenset({None, 255})

# faulthandler.c's names for the fatal signals it handles (CPython 3.11-3.13).
_FATAL_ERROR_SIGNALS = {
    "segmentation fault": "SIGSEGV",
    "aborted": "SIGABRT",
    "bus error": "SIGBUS",
    "floating point exception": "SIGFPE",
    "illegal instruction": "SIGILL",
}
_FATAL_RE = re.compile(r"^Fatal Python error: ([^\n]*)", re.MULTILINE)


@dataclass(frozen=True)
class DeathFacts:
    """What the nanny knows about one death; every field may be unknown (None/False)."""

    exitcode: int | None = None
    oom_kill_before: int | None = None
    oom_kill_after: int | None = None
    nanny_memory_kill: bool = False
    kernel_log_oom: bool = False
    crash_signal: str | None = None  # from the crash file's "Fatal Python error" line
    requested_close: bool = False
    # The crash file begins with a SIGTERM dump: the process was being terminated when
    # whatever came next (often a crash inside the dying process) happened.
    terminated_first: bool = False
    # The group's oom_kill count at the last reading while the worker ran, and how many
    # other processes in the group then have stopped since (None: no reading).
    oom_kill_reading: int | None = None
    others_gone: int | None = None


def describe_signal(exitcode: int | None) -> str | None:
    """The signal name for a negative (multiprocessing-style) exit status, else None.

    >>> describe_signal(-11), describe_signal(-9), describe_signal(1), describe_signal(255)
    ('SIGSEGV', 'SIGKILL', None, None)
    """
    if type(exitcode) is not int or exitcode >= 0:
        return None
    try:
        return _signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"  # a real-time or unnamed signal


def crash_signal(crash_text: str | None) -> str | None:
    """The fatal signal a faulthandler dump reports, or None if it is no fatal-error dump.

    A dump written for a registered signal (SIGTERM) has no "Fatal Python error" header.
    Any other fatal error (Py_FatalError) ends in abort(), hence SIGABRT.

    >>> crash_signal("Fatal Python error: Segmentation fault\\n\\nCurrent thread 0x1 ...")
    'SIGSEGV'
    """
    if not isinstance(crash_text, str):
        return None
    m = _FATAL_RE.search(crash_text[:65536])  # the header is at the top; bound the scan
    if m is None:
        return None
    return _FATAL_ERROR_SIGNALS.get(m.group(1).strip().lower(), "SIGABRT")


def terminated_first(crash_text: str | None) -> bool:
    """Whether a crash file begins with a dump for SIGTERM (a registered signal: no
    "Fatal Python error" header) rather than with a fatal error.

    >>> terminated_first("Current thread 0x1 (most recent call first): ...")
    True
    >>> terminated_first("Fatal Python error: Segmentation fault ...")
    False
    """
    if not isinstance(crash_text, str):
        return False
    head = crash_text[:4096].lstrip()
    return head.startswith(("Current thread ", "Thread 0x", "Stack (most recent call first)"))


def oom_counter_moved(before: int | None, after: int | None) -> bool | None:
    """True/False when both counters were read, None (unknown) when either was not."""
    if type(before) is not int or type(after) is not int:
        return None
    return after > before


def explain(facts: DeathFacts) -> tuple[Cause | None, str]:
    """`classify` plus the rule that decided, as a short phrase for the evidence."""
    code = facts.exitcode
    sig = describe_signal(code)
    unknown = code in UNKNOWN_EXITCODES
    if facts.requested_close:
        return None, "R1 close requested by the nanny or user"
    if code == 0:
        return None, "R2 clean exit"
    if sig in NATIVE_SIGNALS and (facts.nanny_memory_kill or facts.terminated_first):
        # Dumping every thread from a signal handler can itself crash a busy process.
        if facts.nanny_memory_kill:
            return (
                Cause.MEMORY_TERMINATE,
                f"R3a nanny memory kill, crashed ({sig}) while terminating",
            )
        return Cause.SIGTERM, f"R3a SIGTERM, crashed ({sig}) while terminating"
    if sig in NATIVE_SIGNALS:
        return Cause.NATIVE_CRASH, f"R3 exit signal {sig}"
    if unknown and facts.crash_signal in NATIVE_SIGNALS:
        return Cause.NATIVE_CRASH, f"R4 exit status unknown, crash file {facts.crash_signal}"
    reading = facts.oom_kill_reading
    moved = bool(
        oom_counter_moved(
            facts.oom_kill_before if reading is None else reading, facts.oom_kill_after
        )
    )
    since = "since the last reading" if reading is not None else "since the worker started"
    kernel_oom = moved and not facts.others_gone
    if (kernel_oom or facts.kernel_log_oom) and (sig == "SIGKILL" or unknown):
        what = "kernel log names this PID" if facts.kernel_log_oom else f"oom_kill moved {since}"
        return Cause.OOM_KILL, f"R5 {what}, exit {sig or 'unknown'}"
    if moved and sig == "SIGKILL" and not facts.nanny_memory_kill:
        return Cause.SIGKILL, (
            f"R8 exit signal SIGKILL; the oom_kill counted {since} is not confirmed as this "
            f"worker's: {facts.others_gone} other process(es) in its group stopped too"
        )
    if facts.nanny_memory_kill and (sig in ("SIGTERM", "SIGKILL") or unknown):
        return Cause.MEMORY_TERMINATE, f"R6 nanny memory kill, exit {sig or 'unknown'}"
    if sig == "SIGTERM":
        return Cause.SIGTERM, "R7 exit signal SIGTERM"
    if sig == "SIGKILL":
        return Cause.SIGKILL, "R8 exit signal SIGKILL, no kernel OOM evidence"
    return Cause.EXIT, f"R9 exit {sig or ('status unknown' if unknown else f'status {code}')}"


def classify(facts: DeathFacts) -> Cause | None:
    """The cause of one worker death, or None when it was no failure (see the table above).

    >>> classify(DeathFacts(exitcode=-15, nanny_memory_kill=True))
    <Cause.MEMORY_TERMINATE: 'memory_terminate'>
    >>> classify(DeathFacts(exitcode=-9, requested_close=True)) is None
    True
    """
    return explain(facts)[0]
