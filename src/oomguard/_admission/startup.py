"""Start-up reservations: a nanny leases its worker's start-up memory before it starts one.

A worker imports its libraries and runs its preloads before it takes any task; task
admission never sees that memory. After a host-wide memory event every nanny restarts its
worker at once, and together they can need more than is there. So each start (and restart)
first takes a lease in the host ledger, sized by the largest start-up peak seen on this host
(the ledger's `STARTUP_PEAK` entry; `startup.initial` before any), under the ledger's rule:
one start at a time when only one fits, several when they fit. The lease is released once
the worker is up, recording its peak: its own memory cgroup's peak when it has one (what the
kernel charged), else its process's RSS high-water mark (VmHWM: counts shared library pages
too, so it errs towards waiting).

The lease is held by the nanny's process (the worker does not exist yet) and claims its whole
need until released (`ELSEWHERE`: the nanny's RSS is not what the worker spends): the
worker's own growth shows in `available` as well while it starts, which errs towards
waiting. A start that waits past `startup.max-wait` (at most half the nanny's death-timeout)
goes ahead, as it would without oomguard, with one warning: a reservation never keeps a
worker down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from .._units import format_bytes
from .config import AdmissionConfig
from .ledger import HostLedger
from .ledger_file import STARTUP_PEAK

logger = logging.getLogger("oomguard.nanny")


@dataclass
class Start:
    """One start-up lease: what a nanny asked for, how long it waited, and how it ended."""

    key: str
    need: int
    asked_at: float  # time.time()
    granted_at: float | None = None  # when the start went ahead (granted or not)
    outcome: str = "waiting"  # granted | timeout (started anyway) | stopped (nanny closing)

    def event(self, pid: int | None, up_at: float, peak: int | None) -> dict:
        """The `oomguard-startup` event: pid None when the worker never came up."""
        ahead = self.granted_at if self.granted_at is not None else up_at
        return {
            "action": "startup",
            "pid": pid,
            "need": self.need,
            "waited": round(ahead - self.asked_at, 3),
            "asked_at": self.asked_at,
            "granted_at": ahead,
            "up_at": up_at,
            "outcome": self.outcome,
            "peak": peak,
        }


class StartupReservations:
    """The start-up leases of one nanny (its worker starts one at a time)."""

    def __init__(self, config: AdmissionConfig, key: str) -> None:
        self.config = config
        self.key = f"{STARTUP_PEAK} {key}"
        self.ledger: HostLedger = config.open_ledger()
        self.waits = 0
        self.timeouts = 0

    def need(self) -> int:
        learned = self.ledger.refresh().get(STARTUP_PEAK)
        return learned if isinstance(learned, int) and learned > 0 else self.config.startup_initial

    async def reserve(self, death_timeout: float | None, stop: Callable[[], bool]) -> Start:
        """Wait for the start-up lease; returns once granted, past max-wait, or at `stop()`."""
        start = Start(self.key, self.need(), time.time())
        max_wait = self.config.startup_max_wait
        if death_timeout:
            max_wait = min(max_wait, death_timeout / 2)
        adm = self.ledger.try_acquire(self.key, start.need, elsewhere=True)
        if adm.granted:
            start.granted_at, start.outcome = time.time(), "granted"
            return start
        self.waits += 1
        logger.info(
            "oomguard: a worker start waits for %s of host memory%s",
            format_bytes(start.need),
            adm.detail(),
        )
        try:
            start.outcome = await self._wait(start, max_wait, stop)
        finally:
            if start.outcome != "granted":  # stopped, timed out, or cancelled
                start.granted_at = time.time()
                self.ledger.withdraw(self.key)
        return start

    async def _wait(self, start: Start, max_wait: float, stop: Callable[[], bool]) -> str:
        delay = 0.01
        while True:
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.config.poll)
            if stop():  # the nanny closes: its start will not get far
                return "stopped"
            adm = self.ledger.try_acquire(self.key, start.need, elsewhere=True)
            if adm.granted:
                start.granted_at = time.time()
                return "granted"
            waited = time.time() - start.asked_at
            if waited >= max_wait:
                self.timeouts += 1
                logger.warning(
                    "oomguard: a worker start waited %.1f s for %s of host memory (only %s "
                    "free%s) and starts anyway, as without oomguard; see "
                    "oomguard.worker.admission.startup.max-wait.",
                    waited,
                    format_bytes(start.need),
                    format_bytes(max(adm.free, 0)),
                    adm.detail(),
                )
                return "timeout"

    def release(self, peak: int | None) -> None:
        """The worker is up (peak: its start-up peak) or never came up (None)."""
        self.ledger.release(self.key, peak=(STARTUP_PEAK, peak) if peak else None)
        self.ledger.flush_soon()  # the lock was held elsewhere: release it shortly

    def close(self) -> None:
        self.ledger.release(self.key)
        self.ledger.close()


def startup_peak(pid: int, group_peak: int | None) -> int | None:
    """A worker's start-up peak: its group's when it has its own group, else its VmHWM."""
    if group_peak:
        return group_peak
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
