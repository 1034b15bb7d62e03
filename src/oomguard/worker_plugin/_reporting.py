"""The death report: after a worker process's exit, gather the evidence and send it.

Reads the worker's crash file and flight record, its group's counters and the kernel log,
builds one report and sends it to the scheduler's oomguard (an event in its log where there
is none); a clean or requested exit sends the clean-exit notice instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from typing import TYPE_CHECKING, Any

from .._evidence import cgroup as _cgroup
from .._evidence import wire as _wire
from .._evidence.build import build_report
from .._evidence.flight import read_flight_record
from .._evidence.host import oomd_xattrs
from .._evidence.killers import find_killers, largest_process, memory_killer, merge_killers
from .._evidence.paths import crash_path, flight_path
from .._evidence.slurm_job import query as query_job
from .._evidence.slurm_job import valid_job_id
from .._private import read_regular
from .._protocol import CLEAN_EXIT_HANDLER, DEATH_TOPIC, OVERFLOW, REPORT_HANDLER
from ._send import send_with_retry

if TYPE_CHECKING:
    from distributed import Nanny

logger = logging.getLogger("oomguard.nanny")


class ReportingMixin:
    """`OomguardNannyPlugin`'s reporting half: its methods run on the plugin and share its
    state (set in `OomguardNannyPlugin._reset`, configuration in `__init__`)."""

    crash_dir: str | None
    max_report_size: int | None
    sender_cmdline: str  # how a signal sender's command line is kept (senders.command_line)
    _nanny: Nanny | None
    _memory_kills: dict[int, dict]  # the nanny's own memory kills, by PID, until reported
    _killers: list[dict] | None  # the userspace killers at the nanny's last scan
    reports_sent: int
    _internal_error: Any  # OomguardNannyPlugin._internal_error(where)

    async def _report(self, pid, exitcode, requested, address, life, death_time) -> None:
        try:
            report = await asyncio.to_thread(
                self._build, pid, exitcode, requested, address, life, death_time
            )
            if report is not None and report.get("cause") is not None:
                await self._send(report)
            else:
                await self._send_clean_exit(address, requested, pid)
        except Exception:
            self._internal_error("report")

    def _build(self, pid, exitcode, requested, address, life, death_time) -> dict | None:
        """Gather the evidence (files, counters, kernel log) and build the report."""
        assert self.crash_dir is not None
        nanny = self._nanny
        missing: list[str] = list(life.missing) if life else ["worker start not observed"]
        crash_text = _read_text(crash_path(self.crash_dir, pid), missing)
        flight = read_flight_record(flight_path(self.crash_dir, pid), cmdline=self.sender_cmdline)
        missing.extend(flight["missing"])
        executing = _executing(flight)
        sample = flight["sample"] or {}
        cgroup_after = None
        if life is not None and life.cgroup_path is not None:
            counters = _cgroup.read_memory_counters(life.cgroup_path, life.cgroup_version)
            cgroup_after = counters.to_dict()
            missing.extend(f"cgroup after the death: {m}" for m in counters.missing)
        kernel_victim = None
        if exitcode in (-9, 255, None):
            # Only records since the worker started: an old line may name a recycled PID.
            since = life.started_monotonic - 1.0 if life is not None else None
            # From the buffer's start: on a slow host a whole buffer takes well over 0.2 s.
            log = _cgroup.read_kernel_log(since_monotonic=since, timeout=2.0)
            kernel_victim = _cgroup.kernel_oom_victims(log).get(pid)
        reading = life.reading.facts(death_time) if life and life.reading else None
        memory_kill = self._memory_kills.pop(pid, None)
        host_memory = _cgroup.host_memory()
        # Killers now, and those of the last scan that are gone since (stopped after a kill).
        killers = merge_killers(self._killers, find_killers(host_memory.get("total")))
        if any(memory_killer(k) for k in killers or ()):
            # Was the worker the largest process, the one a userspace OOM killer picks?
            host_memory["largest_other"] = largest_process(pid)
        environment = life.environment if life else None
        if environment and valid_job_id(environment.get("slurm_job_id")):
            # What SLURM says of the job now (its state, its --mem): bounded subprocesses.
            said = query_job(environment["slurm_job_id"], environment.get("slurm_step_id"))
            environment = {**environment, "slurm": said}
        oomd = None
        if life is not None and life.cgroup_path is not None:
            after = oomd_xattrs(life.cgroup_path)  # before the group is removed, below
            oomd = {"reading": life.oomd, "after": after, "path": life.cgroup_path}
        report = build_report(
            worker=address or (life.address if life else "") or "",
            nanny=nanny.address if nanny is not None else "",
            name=life.name if life else (str(nanny.name) if nanny else ""),
            host=socket.gethostname(),
            pid=pid,
            exitcode=exitcode,
            time=death_time,
            started=life.started if life else None,
            memory_limit=life.memory_limit if life else None,
            executing=executing,
            crash_text=crash_text,
            cgroup_before=life.cgroup_before if life else None,
            cgroup_after=cgroup_after,
            cgroup_path=life.cgroup_path if life else None,
            cgroup_version=life.cgroup_version if life else None,
            cgroup_placement=life.placement if life else None,
            cgroup_reading=reading,
            rss_sampled=sample.get("rss"),
            rss_time=sample.get("time"),
            host_memory=host_memory,
            nanny_memory_kill=memory_kill,
            kernel_log_victim=kernel_victim,
            requested_close=requested,
            signals=flight.get("signals"),
            nanny_pid=os.getpid(),
            missing=missing,
            max_bytes=self.max_report_size or _wire.MAX_REPORT_BYTES,
            host_reading=life.host if life else None,
            killers=killers,
            oomd=oomd,
            environment=environment,
            flight_read=flight["read"],
        )
        remove_files(self.crash_dir, pid)
        if life is not None and life.group is not None:
            life.group.remove()
        return report

    async def _send(self, report: dict) -> None:
        nanny = self._nanny
        if nanny is None:
            return
        data = _wire.encode(report)
        try:
            call = getattr(nanny.scheduler, REPORT_HANDLER)
            reply, overflows = await send_with_retry(
                lambda: call(report=data), stop=lambda: bool(getattr(self, "_closing", False))
            )
            self.reports_sent += 1
            if overflows:
                status = reply.get("status") if isinstance(reply, dict) else reply
                log = logger.warning if status == OVERFLOW else logger.info
                log(
                    "oomguard: the scheduler answered 'overflow' %d times to the death report "
                    "of %s (asked again with backoff); its last answer: %s",
                    overflows,
                    report.get("worker"),
                    status,
                )
            return
        except Exception as e:
            # No scheduler plugin: still leave a trace in the scheduler's event log.
            logger.warning(
                "oomguard: scheduler did not take the death report (%s); "
                "sending it as a '%s' event instead",
                e,
                DEATH_TOPIC,
            )
        nanny.log_event(DEATH_TOPIC, {"report": data})
        self.reports_sent += 1

    async def _send_clean_exit(
        self, address: str | None, requested: bool, pid: int | None, stopped: dict | None = None
    ) -> None:
        """No report: the worker (process `pid`) ended with status 0 or its stop was
        `requested` (the scheduler decides its removal at once, not after the grace
        timeout). `stopped`: the nanny itself was stopped by a signal (`stopped_by`)."""
        nanny = self._nanny
        if nanny is None or not address:
            return
        extra = {} if stopped is None else {"stopped_by": stopped}
        try:
            await asyncio.wait_for(
                getattr(nanny.scheduler, CLEAN_EXIT_HANDLER)(
                    worker=address,
                    requested=bool(requested),
                    pid=pid if isinstance(pid, int) and pid > 0 else None,
                    **extra,
                ),
                2,
            )
        except Exception:
            pass  # no scheduler plugin, or the scheduler is gone: nothing to correct


#: The most executing tasks a nanny's stop names (the scheduler refuses more).
STOPPED_TASKS_MAX = 16


def stopped_by(reason: str, crash_dir: str | None, pid: int | None) -> dict | None:
    """When `dask worker` closes its nanny on a signal (Nanny.close's reason "signal-15"):
    that signal and the tasks its worker was executing (its flight record, read before the
    worker is killed), for the scheduler. None for any other close. Who sent the nanny's
    signal is not known here: Dask's handler gets no siginfo (in a container, a SIGTERM to
    its main process comes from the runtime or the kubelet)."""
    if not reason.startswith("signal-") or not reason[7:].isdigit():
        return None
    try:
        name = signal.Signals(int(reason[7:])).name
    except ValueError:
        name = f"signal {reason[7:]}"
    keys: list[str] = []
    if crash_dir is not None and isinstance(pid, int):
        flight = read_flight_record(flight_path(crash_dir, pid))
        keys = [e["key"][:1024] for e in flight["executing"][:STOPPED_TASKS_MAX]]
    return {"signal": name, "executing": keys}


def remove_files(crash_dir: str, pid: int) -> None:
    """The worker's crash file and flight record, once read or not needed."""
    for path in (crash_path(crash_dir, pid), flight_path(crash_dir, pid)):
        _unlink(path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _read_text(path: str, missing: list[str], limit: int = 1 << 20) -> str | None:
    try:
        data = read_regular(path, limit)  # no symlink, FIFO or device; at most `limit`
    except FileNotFoundError:
        missing.append("crash file: not found")
        return None
    except OSError as e:
        missing.append(f"crash file: {e.strerror or e}")
        return None
    return data.decode("utf-8", "replace") or None


def _executing(flight: dict) -> list[dict]:
    """Join the executing slots with the last sample's stacks."""
    sample = flight.get("sample") or {}
    tasks = sample.get("tasks") if isinstance(sample.get("tasks"), dict) else {}
    out = []
    for slot in flight["executing"]:
        seen = tasks.get(slot["key"]) or {}
        out.append(
            {
                "key": slot["key"],
                "prefix": _prefix(slot["key"]),
                "start": float(slot["start"]),
                # Recorded as its thread started it, else seen by the last sample.
                "thread": int(slot.get("thread") or seen.get("thread") or 0),
                "stack": seen.get("stack"),
                "stack_time": sample.get("time") if seen else None,
                "grew": seen.get("grew") if seen else None,
            }
        )
    return out


def _prefix(key: str) -> str:
    from distributed.utils import key_split

    if key.startswith("(") and "," in key:
        key = key[1:].split(",", 1)[0].strip("'\"")
    return key_split(key)
