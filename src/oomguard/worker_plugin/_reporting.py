"""The death report: after a worker process's exit, gather the evidence and send it.

Reads the worker's crash file and flight record, its group's counters and the kernel log,
builds one `Death` and sends it to the scheduler's oomguard (an event in its log where
there is none); a clean or requested exit sends the clean-exit notice instead. The nanny
plugin holds one `Reporter`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from collections import ChainMap
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from .._death import wire as _wire
from .._death.build import build
from .._death.environment import stack_packages, stack_paths
from .._death.record import Death, Environment, Seen
from .._host import cgroup as _cgroup
from .._host.environment import PackageVersions
from .._host.environment import read as read_environment
from .._host.flight import read_flight_record
from .._host.oom_killers import (
    find_killers,
    largest_process,
    memory_killer,
    merge_killers,
)
from .._host.paths import crash_path, flight_path
from .._host.readings import oomd_xattrs
from .._lookups.slurm_job import query as query_job
from .._lookups.slurm_job import valid_job_id
from .._private import read_regular
from .._protocol import CLEAN_EXIT_HANDLER, DEATH_TOPIC, OVERFLOW, REPORT_HANDLER
from ._send import send_with_retry

if TYPE_CHECKING:
    from distributed import Nanny

    from .._guard import Guard

logger = logging.getLogger("oomguard.nanny")


class Reporter:
    """What a nanny tells the scheduler of its worker processes' ends: one death report
    per death (`report`), or a clean-exit notice (`send_clean_exit`). It keeps what the
    report needs beyond the worker's own files: the nanny's own memory kills (`memory_kill`),
    the userspace killers found at the nanny's last scan (`killers`), and what it reads of
    the environment each worker starts with (`environment`)."""

    crash_dir: str
    max_report_size: int | None
    memory_kills: dict[int, dict]  # the nanny's own memory kills, by PID, until reported
    killers: list[dict] | None  # the userspace killers at the nanny's last scan
    sender_cmdline: str  # how a signal sender's command line is kept (senders.command_line)
    labels: tuple[str, ...]  # oomguard.worker.labels, set by the plugin
    reports_sent: int

    def __init__(
        self,
        nanny: Nanny | None,
        crash_dir: str,
        max_report_size: int | None,
        guard: Guard,
        closing: Callable[[], bool] = lambda: False,
    ) -> None:
        self.nanny = nanny
        self.crash_dir = crash_dir
        self.max_report_size = max_report_size
        self.guard = guard
        self.closing = closing  # the nanny is closing: stop asking a busy scheduler again
        self.memory_kills = {}
        self.killers = None
        self.sender_cmdline = "hashed"  # oomguard.worker.sender-cmdline, set by the plugin
        self.labels = ()
        self.versions = PackageVersions()  # of the packages crashes name, each looked up once
        self.reports_sent = 0

    def environment(self) -> Environment:
        """The environment the nanny's next worker starts with: the nanny's own variables
        and those it sets for its worker (`Nanny.env`: its `env=`, distributed.nanny.environ
        and pre-spawn-environ), labelled by `labels`."""
        env = getattr(self.nanny, "env", None)
        return read_environment(
            ChainMap(env if isinstance(env, dict) else {}, os.environ), self.labels
        )

    def memory_kill(self, msg: dict) -> None:
        """The nanny's own `worker-restart-memory` event: it is killing the worker for
        memory (the one way to tell that from any other SIGTERM)."""
        pid = msg.get("pid")
        if isinstance(pid, int):
            self.memory_kills[pid] = {"rss": msg.get("rss"), "time": time.time()}

    async def report(self, pid, exitcode, requested, address, life, death_time) -> None:
        with self.guard("report"):
            death = await asyncio.to_thread(
                self.build, pid, exitcode, requested, address, life, death_time
            )
            if death.cause:
                await self.send(death)
            else:
                await self.send_clean_exit(address, requested, pid)

    def build(self, pid, exitcode, requested, address, life, death_time) -> Death:
        """Gather the evidence (files, counters, kernel log) and build the death."""
        nanny = self.nanny
        missing: list[str] = list(life.missing) if life else ["worker start not observed"]
        crash_text = _read_text(crash_path(self.crash_dir, pid), missing)
        flight = read_flight_record(flight_path(self.crash_dir, pid), cmdline=self.sender_cmdline)
        missing.extend(flight["missing"])
        executing = _executing(flight)
        sample = flight["sample"] or {}
        cgroup_after = None
        if life is not None and life.cgroup_path is not None:
            counters = _cgroup.read_memory_counters(life.cgroup_path, life.cgroup_version)
            cgroup_after = counters
            missing.extend(f"cgroup after the death: {m}" for m in counters.missing)
        kernel_victim = None
        if exitcode in (-9, 255, None):
            # Only records since the worker started: an old line may name a recycled PID.
            since = life.started_monotonic - 1.0 if life is not None else None
            # From the buffer's start: on a slow host a whole buffer takes well over 0.2 s.
            log = _cgroup.read_kernel_log(since_monotonic=since, timeout=2.0)
            kernel_victim = _cgroup.kernel_oom_victims(log).get(pid)
        reading = life.reading.facts(death_time) if life and life.reading else None
        memory_kill = self.memory_kills.pop(pid, None)
        host_memory = _cgroup.host_memory()
        # Killers now, and those of the last scan that are gone since (stopped after a kill).
        killers = merge_killers(self.killers, find_killers(host_memory.get("total")))
        if any(memory_killer(k) for k in killers or ()):
            # Was the worker the largest process, the one a userspace OOM killer picks?
            host_memory["largest_other"] = largest_process(pid)
        job = life.slurm_job if life else None
        if job and valid_job_id(job.get("slurm_job_id")):
            # What SLURM says of the job now (its state, its --mem): bounded subprocesses.
            said = query_job(job["slurm_job_id"], job.get("slurm_step_id"))
            job = {**job, "slurm": said}
        # Read at its start (now, where its start was not seen), with the packages the
        # crash's stack names.
        environment = life.environment if life and life.environment else self.environment()
        paths = stack_paths(crash_text, executing)
        environment = replace(environment, packages=stack_packages(paths, self.versions))
        oomd = None
        if life is not None and life.cgroup_path is not None:
            after = oomd_xattrs(life.cgroup_path)  # before the group is removed, below
            oomd = {"reading": life.oomd, "after": after, "path": life.cgroup_path}
        seen = Seen(
            worker=address or (life.address if life else "") or "",
            nanny=nanny.address if nanny is not None else "",
            name=life.name if life else (str(nanny.name) if nanny else ""),
            host=socket.gethostname(),
            pid=pid,
            exitcode=exitcode,
            time=death_time,
            started=life.started if life else None,
            memory_limit=life.memory_limit if life else None,
            requested=requested,
            nanny_pid=os.getpid(),
            executing=tuple(executing),
            flight_read=flight["read"],
            signals=tuple(flight.get("signals") or ()),
            crash_text=crash_text,
            rss_sampled=sample.get("rss"),
            rss_time=sample.get("time"),
            cgroup_path=life.cgroup_path if life else None,
            cgroup_version=life.cgroup_version if life else None,
            cgroup_before=life.cgroup_before if life else None,
            cgroup_after=cgroup_after,
            cgroup_placement=life.placement if life else None,
            cgroup_reading=reading,
            host_memory=host_memory,
            host_reading=life.host if life else None,
            nanny_memory_kill=memory_kill,
            kernel_log_victim=kernel_victim,
            killers=tuple(killers) if killers is not None else None,
            oomd=oomd,
            slurm_job=job,
            missing=tuple(missing),
            environment=environment,
        )
        death = build(seen, self.max_report_size or _wire.MAX_REPORT_BYTES)
        remove_files(self.crash_dir, pid)
        if life is not None and life.group is not None:
            life.group.remove()
        return death

    async def send(self, death: Death) -> None:
        nanny = self.nanny
        if nanny is None:
            return
        data = _wire.encode(death)
        try:
            call = getattr(nanny.scheduler, REPORT_HANDLER)
            reply, overflows = await send_with_retry(lambda: call(report=data), stop=self.closing)
            self.reports_sent += 1
            if overflows:
                status = reply.get("status") if isinstance(reply, dict) else reply
                log = logger.warning if status == OVERFLOW else logger.info
                log(
                    "oomguard: the scheduler answered 'overflow' %d times to the death report "
                    "of %s (asked again with backoff); its last answer: %s",
                    overflows,
                    death.worker,
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

    async def send_clean_exit(
        self, address: str | None, requested: bool, pid: int | None, stopped: dict | None = None
    ) -> None:
        """No report: the worker (process `pid`) ended with status 0 or its stop was
        `requested` (the scheduler decides its removal at once, not after the grace
        timeout). `stopped`: the nanny itself was stopped by a signal (`stopped_by`)."""
        nanny = self.nanny
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
