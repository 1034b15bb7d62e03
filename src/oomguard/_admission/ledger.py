"""The host-wide memory ledger: leases of memory held by running tasks, shared by every
oomguard worker process on a host, whatever cluster it belongs to.

Pure (no Dask). One small JSON file (`ledger_file.py`), read and rewritten under an exclusive
`fcntl.flock` (held for tens of microseconds) and, within a process, a thread lock (`flock` on
one shared descriptor does not exclude threads). A lease is keyed by (pid, key) and records the
holder's RSS when it was granted (its base), so memory a running task has already
allocated is not counted twice (once in `available`, once in its lease). Per process: its
leases still claim ``max(0, sum(nbytes) - (rss_now - min(base)))``. Per process, not per
lease: two leases of one process (threads) would otherwise each count the other's memory as
their own. When a lease is released, the process's other leases are rebased to its RSS then
(what the finished task left behind, a kept result, is not theirs). Leases of dead
processes (a SIGKILLed or OOM-killed worker) are dropped on the next access; a PID is
compared with its start time so a reused PID does not keep a dead lease alive.

Admission rule for a need N, every reading taken under the lock: free = available - claims
of live leases - floor; granted when N <= free, or, with no other live lease on the host
(a cold start), when N <= available: a cold start may borrow the floor, never memory that
is not there. So at every instant, for tasks that stay within their needs,
claims + usage + floor <= limit, and claims + usage <= limit during a cold start
(tests/unit/test_ledger_model.py). `available` is MemAvailable (/proc/meminfo) by default,
or limit - usage of a memory cgroup the workers share (`host.CgroupAvailable`).

In turn: a refused request is queued in the file while it keeps asking (until `withdraw`,
its process's death, or `QUEUE_STALE` seconds without asking). A request must also fit
beside the needs of every earlier waiter that could fit once the current leases end, so a
worker that has just released cannot take the memory back ahead of one that waited for it.
A nanny's start-up lease is spent by the worker it starts, not by the nanny: its base is
`ELSEWHERE` and it claims its whole need until released.

The file must be shared only by processes in one PID namespace (one container, or the
host): PIDs from elsewhere cannot be checked for liveness.

What is believed (issue 28): an entry needing more than the host's memory, or held by a
process that cannot be an oomguard process of this user (another user's, a lease without
its holder's start time, PID 1 without the ledger open) is dropped, counted in `dropped`
and logged once. The file is private to one user: a process of that user can still write
a plausible lease (it could as well kill the workers).

The lock is waited for at most `lock_wait` seconds (the callers run on event loops). When
it stays held (`busy` counts it): a request is refused for now, unqueued (`Admission.busy`:
the caller asks again, as after any refusal, until its max-wait); a release, withdrawal or
peak is kept and applied first by this process's next access (`pending`); a refresh keeps
the peaks last read. A torn file (`ledger_file`) is rebuilt: the first access of each
process puts back the leases it holds and the peaks it last read, and logs it once.

    >>> ledger = HostLedger("/tmp/oomguard-0/memory-ledger.json", floor=2**30)  # doctest: +SKIP
    >>> lease = ledger.acquire("('load', 7)", 6 * 2**30, timeout=60)           # doctest: +SKIP
    >>> ledger.release("('load', 7)")                                          # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .._exceptions import AdmissionTimeout
from .._units import format_bytes
from . import host
from .ledger_file import LOCK_WAIT, LedgerFile, record_peak

__all__ = ["Admission", "HostLedger", "format_bytes"]

logger = logging.getLogger("oomguard.admission")

#: A refused request that has not asked again for this long has given up (seconds).
QUEUE_STALE = 10.0
#: The base of a lease whose memory another process spends (a nanny's start-up lease: its
#: worker does): it claims its whole need until released, whatever its holder's RSS does.
ELSEWHERE = -1


@dataclass(frozen=True)
class Admission:
    """The outcome of one admission attempt (bytes). `cold`: granted only because no other
    lease was held on the host."""

    granted: bool
    need: int
    free: int
    available: int
    claimed: int  # what other live leases still claim (not yet spent)
    floor: int
    others: int  # other live leases
    cold: bool = False  # granted only by borrowing the floor: no other lease was held
    spent: int = 0  # what other live leases have already spent (in `available` already)
    ahead: int = 0  # earlier requests still waiting, that this one may not overtake
    busy: bool = False  # not decided: another process held the ledger's lock too long

    def detail(self) -> str:
        if self.busy:
            return " (the memory ledger's lock is held by another process; asking again)"
        queued = f", {self.ahead} earlier request(s) waiting" if self.ahead else ""
        return (
            f" (available {format_bytes(self.available)}, claimed by {self.others} other "
            f"lease(s) {format_bytes(self.claimed)}, floor {format_bytes(self.floor)}{queued})"
        )


class HostLedger:
    """Leases of host memory, in a JSON file shared by every worker process on the host.

    `available` returns the bytes available now; `floor` is kept free at all times.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "ledger.json")
    >>> ledger = HostLedger(path, floor=0, available=lambda: 10 * 2**30)
    >>> ledger.try_acquire("a", 6 * 2**30).granted
    True
    >>> ledger.release("a")
    True
    """

    def __init__(
        self,
        path: str,
        *,
        floor: int = 0,
        available: Callable[[], int | None] | None = None,
        _process: tuple[
            int, Callable[[], int | None], Callable[[int, int | None], tuple[bool, int | None]]
        ]
        | None = None,
    ) -> None:
        if isinstance(floor, bool) or not isinstance(floor, int) or floor < 0:
            raise ValueError(f"floor is {floor!r}; expected a number of bytes >= 0.")
        self.path = path
        self.floor = floor
        self.available = available or host.HostAvailable()
        self.pid = os.getpid()
        self._probe = host.alive
        if _process is not None:  # tests: (pid, own RSS, probe of another process)
            self.pid, self.own_rss, self._probe = _process
        self._start = host.proc_start(self.pid) if _process is None else None
        self._tlock = threading.Lock()
        self.peaks: dict[str, int] = {}  # prefix -> observed peak, refreshed on each access
        self._statm: int | None = None
        self._rss_of: dict[int, tuple[bool, int | None]] = {}  # pid -> read in this access
        self._file = LedgerFile(path)
        self.lock_wait = LOCK_WAIT
        self.total = host.total_memory() if _process is None else None  # bound on a need
        self._held: dict[tuple[int, str], list] = {}  # leases granted here, put back if torn
        self._pending: list[Callable[[dict], bool]] = []  # changes the lock kept out
        self._flushing = False
        self._pid1: dict[int | None, bool] = {}  # PID 1's start -> holds the ledger open
        self.busy = self.dropped = self.torn = 0  # counters: lock busy, bad entries, tears

    # -- the file --------------------------------------------------------------------

    def _locked(
        self, mutate: Callable[[dict], bool], reclaim: bool = True, defer: bool = False
    ) -> dict | None:
        """Read the file under an exclusive lock, let `mutate` change it, write it back
        if it says so. Dead leases are dropped on the way. When the lock stays held past
        `lock_wait`: None, and `mutate` kept for the next access if `defer`."""

        def step(state: dict) -> bool:
            n = len(state["leases"])
            torn = state.get("torn", False)
            if torn:
                self._rebuild(state)
            changed = False
            for due in self._pending:
                changed = due(state) or changed
            if reclaim:
                self._reclaim(state)
            return mutate(state) or changed or torn or len(state["leases"]) != n

        if not (self._tlock.acquire(False) or self._tlock.acquire(timeout=self.lock_wait)):
            return self._busy(mutate, defer)
        try:
            try:
                state = self._file.update(step, self.lock_wait)
            except BlockingIOError:
                return self._busy(mutate, defer)
            self._pending = []
            self.peaks = state["peaks"]
            return state
        finally:
            self._tlock.release()

    def _busy(self, mutate: Callable[[dict], bool], defer: bool) -> None:
        self.busy += 1
        if defer:
            self._pending.append(mutate)
        return None

    def pending(self) -> bool:
        """Changes the lock kept out, applied by this process's next access."""
        return bool(self._pending)

    def flush_soon(self, delay: float = 0.05) -> None:
        """From an event loop: apply what is pending shortly, again until it is done (a
        release must not wait for this process's next task)."""
        if not self._pending or self._flushing:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop: the next access applies it

        def flush() -> None:
            self._flushing = False
            try:
                self.refresh()
            except Exception:
                logger.debug("oomguard: memory ledger flush failed", exc_info=True)
            self.flush_soon(min(delay * 2, 1.0))

        self._flushing = True
        loop.call_later(delay, flush)

    def _rebuild(self, state: dict) -> None:
        """A torn file: put back the leases held here and the peaks last read."""
        self.torn += 1
        if self.torn == 1:
            logger.warning(
                "oomguard: memory ledger %s was torn or foreign; rebuilt from this "
                "process's %d lease(s) and %d peak(s) (each process puts back its own)",
                self.path,
                len(self._held),
                len(self.peaks),
            )
        state["leases"] = [list(le) for le in self._held.values()]
        state["peaks"] = dict(self.peaks)

    def _reclaim(self, state: dict) -> None:
        """Drop the leases of dead processes and bad entries; note each holder's RSS for
        this access."""
        me, kept, self._rss_of = self.pid, [], {}
        for le in state["leases"]:
            if le[0] == me:  # our own leases: we are alive
                kept.append(le)
                continue
            if not self._sane(le[0], le[2], le[4]):
                continue
            alive, rss = self._rss_of.get(le[0]) or self._probe(le[0], le[4])
            self._rss_of[le[0]] = (alive, rss)
            if alive:
                kept.append(le)
        state["leases"] = kept

    def _sane(self, pid: int, need: int, start, ok: bool = True) -> bool:
        """False (counted, logged once) for an entry no oomguard process wrote: not `ok`,
        a need beyond the host's memory, or PID 1 (always alive) without the ledger open."""
        ok = ok and (self.total is None or need <= self.total)
        if ok and pid == 1 and self._probe is host.alive:
            if start not in self._pid1:
                self._pid1 = {start: host.holds_open(1, self._file._fd)}
            ok = self._pid1[start]
        if not ok:
            self.dropped += 1
            if self.dropped == 1:
                logger.warning(
                    "oomguard: memory ledger %s: dropped an entry of pid %s needing %s "
                    "(not an oomguard process of this user, or more than the host has)",
                    self.path,
                    pid,
                    format_bytes(need),
                )
        return ok

    def close(self) -> None:
        """Close the ledger's file descriptors (leases stay until released or reclaimed)."""
        self._file.close()
        close = getattr(self.available, "close", None)  # HostAvailable, CgroupAvailable
        if close is not None:
            close()
        fd = self._statm
        if fd is not None:
            self._statm = None
            os.close(fd)

    def own_rss(self) -> int | None:
        """This process's RSS, bytes, from /proc/self/statm kept open; None if unreadable."""
        try:
            if self._statm is None:
                self._statm = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
            return int(os.pread(self._statm, 128, 0).split()[1]) * host.PAGE
        except (OSError, IndexError, ValueError):
            return None

    # -- leases ------------------------------------------------------------------------

    def try_acquire(
        self, key: str, nbytes: int, *, pid: int | None = None, elsewhere: bool = False
    ) -> Admission:
        """One attempt: grant a lease of `nbytes` for `key` now, or say why not (and
        queue it: see `withdraw`). `elsewhere`: another process will spend it."""
        pid = self.pid if pid is None else pid
        start = self._start if pid == self.pid else host.proc_start(pid)
        result: list = []  # the Admission, then the lease granted

        def mutate(state: dict) -> bool:
            leases = state["leases"]
            others = [le for le in leases if not (le[0] == pid and le[1] == key)]
            claimed, spent = self._claims(others)
            available = self.available()
            now = time.time()
            queue = self._waiting(state, now)
            mine = next((q for q in queue if q[0] == pid and q[1] == key), None)
            since = mine[3] if mine is not None else now
            if available is None:  # unknown: one lease at a time, in order
                available, free = 0, -claimed - self.floor
                ahead = [q for q in queue if (q[3], q[0], q[1]) < (since, pid, key)]
                granted = cold = not others and not ahead
            else:
                free = available - claimed - self.floor
                # Waiters asking since before this request, whose need fits once the
                # leases held now have ended, go first: fits only beside all of them.
                ahead = [
                    q
                    for q in queue
                    if (q[3], q[0], q[1]) < (since, pid, key) and q[2] <= available + spent
                ]
                before = sum(q[2] for q in ahead)
                granted = nbytes + before <= free or (
                    not others and not ahead and nbytes <= available
                )
                cold = granted and nbytes > free
            result.append(
                Admission(
                    granted,
                    nbytes,
                    free,
                    available,
                    claimed,
                    self.floor,
                    len(others),
                    cold,
                    spent,
                    len(ahead),
                )
            )
            if mine is not None:
                queue.remove(mine)
            if granted:
                rss = (
                    ELSEWHERE
                    if elsewhere
                    else (self.own_rss() if pid == self.pid else host.rss(pid))
                )
                lease = [pid, key, nbytes, rss, start]
                others.append(lease)
                state["leases"] = others
                result.append(list(lease))
            else:
                queue.append([pid, key, nbytes, since, now])
            state["queue"] = queue
            return True

        if self._locked(mutate) is None:  # the lock stayed held: not decided, ask again
            return Admission(False, nbytes, 0, 0, 0, self.floor, 0, busy=True)
        if len(result) > 1:  # written: held here, put back should the file be torn
            self._held[(pid, key)] = result[1]
        return result[0]

    def _waiting(self, state: dict, now: float) -> list:
        """The queue of refused requests still asking: a waiter that has not asked again
        within `QUEUE_STALE` seconds, or whose process is gone, has given up."""
        queue = []
        for q in state["queue"]:
            if now - q[4] > QUEUE_STALE:
                continue
            if q[0] != self.pid:
                # Asked "last" in the future, it would never go stale.
                if not self._sane(q[0], q[2], None, q[4] <= now + QUEUE_STALE):
                    continue
                if q[0] not in self._rss_of:
                    self._rss_of[q[0]] = self._probe(q[0], host.ANY)
                if not self._rss_of[q[0]][0]:
                    continue
            queue.append(q)
        return queue

    def withdraw(self, key: str, *, pid: int | None = None) -> None:
        """Stop waiting for `key` (timed out, cancelled): later requests no longer queue
        behind it."""
        pid = self.pid if pid is None else pid

        def mutate(state: dict) -> bool:
            before = len(state["queue"])
            state["queue"] = [q for q in state["queue"] if not (q[0] == pid and q[1] == key)]
            return len(state["queue"]) != before

        self._locked(mutate, reclaim=False, defer=True)

    def _claims(self, leases: list) -> tuple[int, int]:
        """(what `leases` still claim, what they have spent), per holding process: a
        process's growth since its earliest base counts against the sum of its leases."""
        # pid -> [sum of needs, min base, or -1 (unknown, or ELSEWHERE): all of it claimed]
        per: dict[int, list[int]] = {}
        for p, _, n, base, _ in leases:
            entry = per.setdefault(p, [0, base if isinstance(base, int) else -1])
            entry[0] += n
            if entry[1] >= 0:
                entry[1] = min(entry[1], base) if isinstance(base, int) else -1
        claimed = spent = 0
        for p, (need, base) in per.items():
            rss = self.own_rss() if p == self.pid else self._rss_of.get(p, (True, None))[1]
            used = min(need, max(0, rss - base)) if rss is not None and base >= 0 else 0
            claimed += need - used
            spent += used
        return claimed, spent

    def release(
        self, key: str, *, pid: int | None = None, peak: tuple[str, int] | None = None
    ) -> bool:
        """Drop the lease of `key`; optionally record `peak` = (prefix, bytes) in the same
        write. True when a lease was dropped."""
        pid = self.pid if pid is None else pid
        held = self._held.pop((pid, key), None) is not None
        found: list[bool] = []

        def mutate(state: dict) -> bool:
            before = len(state["leases"])
            state["leases"] = [le for le in state["leases"] if not (le[0] == pid and le[1] == key)]
            found.append(len(state["leases"]) != before)
            state["queue"] = [q for q in state["queue"] if not (q[0] == pid and q[1] == key)]
            mine = [le for le in state["leases"] if le[0] == pid]
            if found[0] and mine:
                # What the finished task left (a kept result) is not the others' spending.
                rss = self.own_rss() if pid == self.pid else host.rss(pid)
                if rss is not None:
                    for le in mine:
                        if not isinstance(le[3], int):
                            le[3] = rss
                        elif le[3] != ELSEWHERE:
                            le[3] = max(le[3], rss)
            return record_peak(state, peak) or found[0]

        # Reclaiming others' dead leases is left to acquisitions: a release stays cheap.
        if self._locked(mutate, reclaim=False, defer=True) is None:
            return held  # the lock stayed held: dropped by this process's next access
        return found[0]

    def record_peak(self, prefix: str, nbytes: int) -> None:
        """Remember the largest memory peak seen for a task prefix (host-wide)."""
        self._locked(lambda state: record_peak(state, (prefix, nbytes)), defer=True)

    def refresh(self) -> dict[str, int]:
        """Re-read the peaks (and reclaim dead leases, apply what is pending); returns
        the peaks (those last read while the lock is held elsewhere)."""
        self._locked(lambda state: False)
        return self.peaks

    def leases(self) -> list[tuple[int, str, int]]:
        """Live leases as (pid, key, nbytes); dead ones are reclaimed by this call."""
        state = self._locked(lambda state: False)
        if state is None:
            raise BlockingIOError("memory ledger locked by another process")
        return [(le[0], le[1], le[2]) for le in state["leases"]]

    def acquire(
        self,
        key: str,
        nbytes: int,
        *,
        timeout: float,
        poll: float = 0.05,
        on_wait: Callable[[Admission], None] | None = None,
    ) -> tuple[Admission, float]:
        """Block until granted; returns (the granting Admission, seconds waited). Raises
        AdmissionTimeout past `timeout`. `on_wait` is called once, at the first refusal."""
        began = time.monotonic()
        delay = min(poll, 0.01)
        first = True
        while True:
            adm = self.try_acquire(key, nbytes)
            if adm.granted:
                return adm, time.monotonic() - began
            waited = time.monotonic() - began
            if first and on_wait is not None:
                on_wait(adm)
            first = False
            if waited >= timeout:
                self.withdraw(key)
                raise AdmissionTimeout(key, nbytes, adm.free, waited, adm.detail())
            time.sleep(min(delay, max(0.0, timeout - waited)))
            delay = min(delay * 2, poll)
