"""Placement: each worker process in a memory cgroup of its own, from its spawn on (or not:
`_cgroup.per_worker_choice`, e.g. none by default inside a SLURM job's group).

The group's limit is Dask's memory_limit. Groups left by a nanny that died with its workers
are swept at setup; a restart of a worker that its own limit killed while the nanny starts
is refused, and the next workers start without that limit. The nanny plugin holds one
`Placement`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from distributed.core import Status

from .._death.record import MemoryCounters
from .._exceptions import CgroupError
from .._host import cgroup as _cgroup
from .._protocol import WORKER_GROUP_PREFIX
from .._units import format_bytes

if TYPE_CHECKING:
    from distributed import Nanny

    from .._guard import Guard

logger = logging.getLogger("oomguard.nanny")
_SAID: set[str] = set()  # why no per-worker groups, logged once a process


@dataclass
class _Placement:
    """How one worker process was put into a memory group of its own, or why it was not."""

    pid: int
    group: _cgroup.ChildGroup | None = None
    charge_moved: bool | None = None  # its earlier charges moved with it (v1 only)
    rss_at_move: int | None = None
    note: str = ""  # why the charges did not move
    before: MemoryCounters | None = None  # the group's counters right after the move
    at: float = field(default_factory=time.time)
    at_monotonic: float = field(default_factory=time.monotonic)
    missing: list[str] = field(default_factory=list)

    def facts(self) -> dict[str, Any]:
        return {
            "own_group": self.group is not None,
            "charge_moved": self.charge_moved,
            "rss_at_move": self.rss_at_move,
            "note": self.note,
        }


class Placement:
    """Where a nanny's worker processes go: each into a memory group of its own when the
    setting and the host allow it (`use_cgroups`, decided by `decide`), from its spawn on.
    `placed` is the latest spawn, placed and not yet up."""

    cgroup_limit: str
    use_cgroups: bool
    placed: _Placement | None  # moved at spawn, not yet up
    _connecting: int  # Dask's waits for a spawned worker still running
    _start_kills: int  # workers OOM-killed by their own group's limit while starting
    _unlimited: bool  # set by the first of those: no group limit from then on

    def __init__(
        self, cgroup_limit: str | None, guard: Guard, closing: Callable[[], bool]
    ) -> None:
        self.cgroup_limit = cgroup_limit or "auto"
        self.guard = guard
        self.closing = closing  # the nanny is closing: place nothing more
        self.use_cgroups = False
        self.placed = None
        self._connecting = 0
        self._start_kills = 0
        self._unlimited = False

    def decide(self) -> None:
        """Whether workers get groups of their own here (`use_cgroups`); raises
        CgroupError when the setting requires them and none can be made."""
        choice, why = _cgroup.per_worker_choice(
            self.cgroup_limit, os.environ.get("SLURM_JOB_ID"), _cgroup.detect().path
        )
        if choice == "off":
            if self.cgroup_limit != "false" and why not in _SAID:  # oomguard chose it
                _SAID.add(why)  # once a process: a nanny's plugin is set up twice
                logger.info("oomguard: no per-worker memory cgroups (%s)", why)
            return
        ok, reason = _cgroup.can_create_child()
        if ok:
            self.use_cgroups = True
            # Groups of workers whose nanny died with them (SIGKILL of the whole host
            # process tree) cannot be removed by that nanny: sweep them here.
            _cgroup.cleanup_stale(f"{WORKER_GROUP_PREFIX}", stale=_dead_worker_group)
        elif choice == "required":
            raise CgroupError(
                f"oomguard.worker.cgroup-limit is true but a per-worker memory cgroup "
                f"cannot be made here: {reason}. Set it to 'auto' to go on without one."
            )
        else:
            logger.info("oomguard: no per-worker memory cgroups (%s)", reason)

    def started(self, pid: int, limit: int | None) -> _Placement:
        """The worker process `pid` is up: its placement, made now where it was not seen
        at its spawn (installed at runtime, or a Dask without the hook: what it charged so
        far stays outside its group unless it moves)."""
        placed, self.placed = self.placed, None
        if placed is not None and placed.pid != pid:
            if placed.group is not None:
                placed.group.remove()  # a process that never came up
            placed = None
        if placed is None:
            placed = self.place(pid, limit) if self.use_cgroups else _Placement(pid)
        return placed

    def exited(self, pid: int) -> _Placement | None:
        """The worker process `pid` ended: its placement when it died before it was up
        (the report reads its group's counters all the same), saying so when its own
        group's limit killed it."""
        if self.placed is None or self.placed.pid != pid:
            return None
        placed, self.placed = self.placed, None
        if placed.group is not None:
            with self.guard("exit"):
                self._killed_by_its_limit(placed)
        return placed

    def release(self) -> _Placement | None:
        """The nanny is closing: the placement of a spawn not yet up, whose group goes."""
        placed, self.placed = self.placed, None
        return placed

    def wrap_wait_until_connected(self, wp: Any, nanny: Nanny) -> None:
        """Move each new worker process into its group as soon as it exists: Dask's
        `WorkerProcess.start` awaits `_wait_until_connected` right after the spawn."""
        if not self.use_cgroups or getattr(wp, "_oomguard_placing", False):
            return
        if not hasattr(wp, "_wait_until_connected"):  # logged at setup by _compat.check
            wp._oomguard_placing = True
            return
        original = wp._wait_until_connected

        async def _wait_until_connected(*args, **kwargs):
            process = getattr(wp, "process", None)
            pid = getattr(process, "pid", None)
            if isinstance(pid, int) and not self.closing():
                with self.guard("spawn"):
                    self._place_at_spawn(pid, nanny.memory_manager.memory_limit)
            self._connecting += 1
            try:
                return await original(*args, **kwargs)
            finally:
                self._connecting -= 1

        wp._wait_until_connected = _wait_until_connected
        wp._oomguard_placing = True

    def _place_at_spawn(self, pid: int, limit: int | None) -> None:
        if self.placed is not None and self.placed.pid == pid:
            return
        if self.placed is not None:
            # The previous spawn never came up, and Dask spawns again (distributed before
            # 2026.7.0 restarts a worker that dies while its nanny starts).
            self._discard(self.placed)
        self.placed = self.place(pid, limit)

    def place(self, pid: int, limit: int | None) -> _Placement:
        """Make the worker's own group and move it in, its charges too where the kernel can."""
        placed = _Placement(pid)
        group = None
        if self._unlimited:
            limit = None
        try:
            group = _cgroup.ChildGroup.create(f"{WORKER_GROUP_PREFIX}{pid}", limit)
            # Set before the move: the kernel reads it when the process joins.
            moves, why = group.set_move_charge()
            placed.rss_at_move = _cgroup.process_rss(pid)
            try:
                group.add_pid(pid)
            except CgroupError as e:
                if not moves:
                    raise
                # v1 refuses the whole move when the charge does not fit under the limit.
                group.set_move_charge(False)
                moves, why = False, f"moving its charge was refused ({e}); moved without it"
                group.add_pid(pid)
        except Exception as e:
            placed.missing.append(f"per-worker cgroup: {e}")
            if group is not None:
                group.remove()
            return placed
        placed.group = group
        placed.charge_moved = moves and group.version == 1
        placed.note = why
        placed.before = group.counters()
        return placed

    async def after_the_previous_start(self, timeout: float = 10.0) -> None:
        """A restart waits until the previous start stopped waiting for its worker.

        Dask restarts a worker that died while starting from its exit callback, at once.
        Before 2026.7.0 the previous start's `_wait_until_connected` can still be polling
        then: it takes the new worker's message off the queue, drops it (another uid), and
        the new start waits for ever, and `Nanny.close` with it. Seen when a worker killed
        by its own group's limit at start-up was restarted (tests/cluster/test_cgroup_live.py).
        The previous wait ends within one poll (0.1 s) once its process is gone."""
        deadline = time.monotonic() + timeout
        while self._connecting and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    def killed_while_starting(self, nanny: Nanny) -> bool:
        """Is this a restart of a worker that its own group's limit killed while the nanny
        was starting? distributed before 2026.7.0 restarts it there, and that restart races
        the first start's wait for its worker (which can then wait forever); 2026.7.0 and
        later fail the nanny's start instead, which is what oomguard makes of it here."""
        if nanny.status not in (Status.init, Status.starting):
            return False
        if self.placed is not None:  # not yet seen by the nanny's exit hook
            placed, self.placed = self.placed, None
            self._discard(placed)
        return self._start_kills > 0

    def failed_start(self, nanny: Nanny) -> None:
        """The worker process died or hung before it was up: say so when its own group's
        limit killed it (the limit now holds its start-up memory too), and remove the group."""
        placed = self.placed
        process = nanny.process
        if placed is None or (process is not None and process.pid == placed.pid):
            return  # nothing placed, or it is alive after all: its group stays
        self.placed = None
        self._discard(placed)

    def _discard(self, placed: _Placement) -> None:
        """Remove the group of a worker process that never came up, saying so when its own
        limit killed it."""
        if placed.group is None:
            return
        self._killed_by_its_limit(placed)
        placed.group.remove()

    def _killed_by_its_limit(self, placed: _Placement) -> None:
        """A worker process that never came up: say so when its own group's limit killed it
        (the limit holds its start-up memory too)."""
        counters = placed.group.counters()
        if counters.oom_kill:
            self._start_kills += 1
            logger.error(
                "oomguard: worker process %d was OOM-killed while starting: its memory "
                "cgroup's limit (%s, Dask's memory_limit) is below what it needs to start "
                "(peak %s). Raise the worker's memory_limit, or set "
                "oomguard.worker.cgroup-limit: false.",
                placed.pid,
                format_bytes(counters.limit) if counters.limit else "none",
                format_bytes(counters.peak) if counters.peak is not None else "unknown",
            )
            if not self._unlimited:
                # distributed before 2026.7.0 restarts a worker that dies while its nanny
                # starts (later releases fail the start), and the same limit would kill each
                # one: the loop never ends. Restarts of any release meet the same limit.
                # Said once; the spawns after it run without a limit.
                self._unlimited = True
                logger.warning(
                    "oomguard: the next workers of this nanny start without oomguard's "
                    "memory cgroup limit (as without oomguard), so a restart cannot be "
                    "killed the same way again; their groups still count OOM kills."
                )


def _dead_worker_group(name: str) -> bool:
    """A per-worker group whose worker PID no longer exists."""
    try:
        pid = int(name[len(WORKER_GROUP_PREFIX) :])
    except ValueError:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False
