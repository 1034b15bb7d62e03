"""The core's decisions applied to Dask: the only place oomguard changes task state."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import pickle
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._death import wire
from .._decide import (
    EndAlone,
    Forgive,
    Hold,
    Record,
    Release,
    Restrict,
    RunAlone,
    Stop,
    Widen,
    nanny_stop_record,
)
from .._decide.environments import EnvironmentTally, slot
from .._exceptions import ReportError
from .._protocol import ENVIRONMENT_FIELD, RUN_ALONE_ANNOTATION
from .._safe_text import safe_name, safe_text
from .._words import death_line
from ._setup import address_host
from ._slurm_jobs import SlurmJobs
from ._trust import LOGGED_ABORTS, Bounded
from ._verdict import KILLER_FIELDS, with_verdict

if TYPE_CHECKING:
    from distributed import Scheduler

    from .._guard import Guard
    from .._metrics import OomguardMetrics
    from .._store import FailureStore

logger = logging.getLogger("oomguard.scheduler")
#: A death's line in the log at most (bytes): one printable line, its key escaped.
LINE_BYTES = 4096
#: Where Dask logs a task it errs at allowed-failures: oomguard, deciding that instead
#: (`_dask_bound`), logs the same line there.
_dask_log = logging.getLogger("distributed.scheduler")

#: No worker has this address: a task restricted to it waits in "no-worker".
HOLD = "oomguard://held"


class DaskActions:
    """Holds, releases, restrictions, stops, forgiveness and records, done to Dask."""

    def __init__(
        self,
        scheduler: Scheduler,
        store: FailureStore,
        metrics: OomguardMetrics,
        guard: Guard,
        pods: Any = None,
        host_name: Callable[[str], str] | None = None,
        cluster: str = "",
    ) -> None:
        self.scheduler = scheduler
        self.cluster = cluster  # stamped on every event stored (the core knows no cluster)
        self.host_name = host_name or address_host  # a worker's machine, as events name it
        self.store = store
        self.metrics = metrics
        self.guard = guard
        self._pods = pods  # oomguard._lookups.kubernetes.PodLookup where enabled
        self.slurm_jobs = SlurmJobs()  # workers' SLURM jobs, asked about when one is lost
        self._lookups: set[asyncio.Task] = set()
        self._saved: dict[Any, tuple] = {}  # held key -> its own restrictions, to restore
        # key running alone -> its own restrictions, priority and annotations, to restore
        self._alone: dict[Any, tuple] = {}
        self._logged_aborts = Bounded(LOGGED_ABORTS)  # runs whose abort was announced

    def apply(self, decisions: list) -> None:
        """Apply the core's decisions, in order."""
        for d in decisions:
            if isinstance(d, Record):
                self._record(d)
            elif isinstance(d, Hold):
                self._hold(d.keys)
            elif isinstance(d, Release):
                self._release(d.keys)
            elif isinstance(d, RunAlone):
                self._run_alone(d)
            elif isinstance(d, EndAlone):
                self._end_alone(d.key)
            elif isinstance(d, Forgive):
                self.metrics.displaced(len(d.keys))
                for key in d.keys:
                    if (ts := self.scheduler.tasks.get(key)) is not None and ts.suspicious:
                        ts.suspicious -= 1
            elif isinstance(d, Restrict):
                self._restrict(d)
            elif isinstance(d, Widen):
                self._widen(d)
            elif isinstance(d, Stop):
                self._stop(d)

    def host_event(self, worker: str, msg: dict, environments: EnvironmentTally) -> None:
        """A worker's host event, taken (`Workers.host_event`): its SLURM job noted, and its
        environment checked as a report's is, counted among the cluster's workers
        (`environments`: the core's) and kept in the history. A worker that sends none (an
        older oomguard) is left out of the count; one that sends a bad one too, said once."""
        self.slurm_jobs.note(worker, msg)
        if ENVIRONMENT_FIELD not in msg:
            return
        try:
            environment = wire.environment(msg[ENVIRONMENT_FIELD])
        except ReportError as e:
            self.guard.once(
                "environment",
                "oomguard: the worker %s sent an environment that was refused (%s); "
                "further refusals are not logged",
                safe_name(worker),
                safe_name(str(e), 512),
            )
            return
        ws = self.scheduler.workers.get(worker)
        at = slot(worker, ws.nanny if ws is not None else None)
        environments.worker(at, environment)
        self.store.worker_environment(self.cluster, at, environment, time.time())

    def _record(self, d: Record) -> None:
        """Store a failure and count it: a death once (`oomguard_worker_deaths_total`),
        with its events (`oomguard_failures_total`, one each); a late report only amends
        the death counted when it was decided without one."""
        cluster = self.cluster
        events = [
            e if e.cluster == cluster else dataclasses.replace(e, cluster=cluster)
            for e in d.events
        ]
        death = d.death
        if death is None:  # a task's exception, a stopped nanny's task: events only
            for event in events:
                self.store.add(
                    event,
                    grouping_version=d.grouping_version,
                    example=d.example,
                    aliases=d.aliases,
                )
                self.metrics.failure(event.kind, event.cause)
            return
        if death.cluster != cluster:
            death = dataclasses.replace(death, cluster=cluster)
        amend = d.amends is not None
        self.store.record(
            death,
            events,
            grouping_version=d.grouping_version,
            example=d.example,
            amend=amend,
            aliases=d.aliases,
        )
        if amend:
            return
        for event in events:
            self.metrics.failure(event.kind, event.cause)
        self.metrics.deaths(death.cause, death.killer.name if death.killer is not None else "")
        if events:
            logger.info("oomguard: %s", safe_name(death_line(events[0]), LINE_BYTES))
        if death.cause == "worker_lost":
            self.slurm_jobs.lost(self.store, self.guard, death, events, d.grouping_version)
            if self._pods is not None:
                lookup = self._pod_evidence(death, events, d.grouping_version)
                task = asyncio.create_task(lookup)
                self._lookups.add(task)
                task.add_done_callback(self._lookups.discard)

    async def _pod_evidence(self, death, events, grouping_version: int) -> None:
        """No report: the nanny died too. Ask Kubernetes what happened to the pod, and
        amend the death with its verdict."""
        with self.guard("pod_lookup"):
            # Pods are found by IP: the worker's address, not the hostname events carry.
            ip = address_host(death.worker) or death.host
            found = await asyncio.to_thread(self._pods.evidence, ip, since=death.time)
            if found is not None:
                cause, extra = found
                evidence = {k: v for k, v in extra.items() if _scalar(v)}
                killer = {k: evidence.pop(k) for k in KILLER_FIELDS if k in evidence}
                amended, amended_events = with_verdict(death, events, evidence, killer, str(cause))
                self.store.record(
                    amended, amended_events, grouping_version=grouping_version, amend=True
                )

    def nanny_stopped(self, worker: str, signal: str, keys: list[str], pipeline_of) -> None:
        """The nanny of `worker` was stopped by `signal` (its own: `dask worker` closed on
        it) while its worker executed `keys`: a requested stop for Dask and for blame (the
        tasks move without a count), and one log line. A stop in order (a scale-down, a
        service stop) is no failure; an eviction is one: where the pod lookup is on and the
        pod's status names its killer (the kubelet), one external event per task is stored
        with that verdict, so an eviction is never silent."""
        logger.info(
            "oomguard: the nanny of %s was stopped by %s (its own signal: a stop, an "
            "eviction, a person) while its worker ran %d task(s)%s",
            worker,
            signal,
            len(keys),
            f": {', '.join(keys[:5])}" if keys else "",
        )
        if signal != "SIGTERM" or self._pods is None:
            return
        host = self.host_name(worker)
        now = time.time()
        records = [
            nanny_stop_record(worker, host, key, pipeline_of(key) if key else "", now)
            for key in keys or [""]
        ]
        task = asyncio.create_task(self._if_evicted(records))
        self._lookups.add(task)
        task.add_done_callback(self._lookups.discard)

    async def _if_evicted(self, records: list) -> None:
        """Store a stopped nanny's events when the pod's status names a killer."""
        with self.guard("pod_lookup"):
            e = records[0].events[0]
            ip = address_host(e.worker) or e.host  # pods are found by IP
            found = await asyncio.to_thread(self._pods.evidence, ip, since=e.time)
            extra = {k: v for k, v in found[1].items() if _scalar(v)} if found else {}
            killer = {k: extra.pop(k) for k in KILLER_FIELDS if k in extra}
            if not killer:
                return  # stopped in order (or deleted): no failure
            for r in records:
                evidence = {**r.events[0].evidence, **extra}
                event = dataclasses.replace(r.events[0], evidence=evidence, **killer)
                self._record(dataclasses.replace(r, events=(event,)))

    def _hold(self, keys) -> None:
        tasks = self.scheduler.tasks
        for key in keys:
            ts = tasks.get(key)
            if ts is None or key in self._saved:
                continue
            self._restore_alone(key, ts)  # it ran alone on the dead worker: that is over
            own = set(ts.worker_restrictions) if ts.worker_restrictions else None
            self._saved[key] = (own, ts.loose_restrictions)
            ts.worker_restrictions = {HOLD}
            ts.loose_restrictions = False

    def _release(self, keys) -> None:
        tasks, recs = self.scheduler.tasks, {}
        for key in keys:
            saved = self._saved.pop(key, None)
            ts = tasks.get(key)
            if saved is None or ts is None:
                continue
            ts.worker_restrictions, ts.loose_restrictions = saved
            if ts.state == "no-worker":
                recs[key] = "waiting"
        if recs:
            self.scheduler.transitions(recs, stimulus_id=f"oomguard-release-{time.time()}")

    def _run_alone(self, d: RunAlone) -> None:
        """Restrict the held suspect to its worker, tell that worker's plugin to run it
        alone there (an annotation, which the compute-task message carries), and put it
        first in that worker's queue (so no other task takes the thread it waits for)."""
        ts = self.scheduler.tasks.get(d.key)
        if ts is None or d.key in self._alone:
            return
        own = self._saved.pop(d.key, None)
        if own is None:  # not held: as it stands
            own = (
                set(ts.worker_restrictions) if ts.worker_restrictions else None,
                ts.loose_restrictions,
            )
        restrictions, loose = own
        self._alone[d.key] = (restrictions, loose, ts.priority, ts.annotations)
        if d.worker is not None and (not restrictions or loose or d.worker in restrictions):
            ts.worker_restrictions, ts.loose_restrictions = {d.worker}, False
            if ts.priority:  # (-user priority, generation, order): first in its queue there
                ts.priority = (-math.inf, *ts.priority[1:])
        else:  # no able worker, or one its own restrictions exclude: within them
            ts.worker_restrictions, ts.loose_restrictions = restrictions, loose
        # A copy: several tasks may share one annotations dict. Where it runs, a worker
        # plugin that can hold holds for it.
        ts.annotations = {**(ts.annotations or {}), RUN_ALONE_ANNOTATION: d.seconds}
        self.scheduler.log_event(
            "oomguard",
            {"action": "run-alone", "shard": str(d.key), "worker": d.worker, "hold": d.seconds},
        )
        if ts.state == "no-worker":
            self.scheduler.transitions(
                {d.key: "waiting"}, stimulus_id=f"oomguard-run-alone-{time.time()}"
            )

    def _restore_alone(self, key, ts) -> bool:
        """Give back what `_run_alone` changed; False when it changed nothing."""
        saved = self._alone.pop(key, None)
        if saved is None:
            return False
        # The priority first: restricted to one worker, the task is in no queue keyed by it.
        restrictions, loose, ts.priority, ts.annotations = saved
        ts.worker_restrictions, ts.loose_restrictions = restrictions, loose
        return True

    def _end_alone(self, key) -> None:
        ts = self.scheduler.tasks.get(key)
        if ts is None:
            self._alone.pop(key, None)
        elif self._restore_alone(key, ts) and ts.state == "no-worker":
            self.scheduler.transitions(
                {key: "waiting"}, stimulus_id=f"oomguard-alone-{time.time()}"
            )

    def _restrict(self, d: Restrict) -> None:
        self.scheduler.log_event(
            "oomguard",
            {
                "action": "retry-resize",
                "shard": str(d.key),
                "limit": d.limit,
                "workers": sorted(d.workers),
            },
        )
        # No larger worker yet (one is restarting): wait for it. An empty restriction would
        # be none at all to Dask (`valid_workers`): the shard would run on any worker.
        workers = set(d.workers) or {HOLD}
        if d.key in self._saved:  # held: the restriction applies when it is released
            self._saved[d.key] = (workers, False)
            return
        ts = self.scheduler.tasks.get(d.key)
        if ts is None:
            return
        ts.worker_restrictions = workers
        ts.loose_restrictions = False
        on = ts.processing_on.address if ts.processing_on is not None else None
        if ts.state in ("queued", "no-worker") or (
            ts.state == "processing" and on not in d.workers
        ):
            # Handed to a worker of the old size, or queued (where restrictions are not
            # consulted): schedule it again under the restriction.
            self.scheduler.transitions(
                {d.key: "released"}, stimulus_id=f"oomguard-resize-{time.time()}"
            )

    def _widen(self, d: Widen) -> None:
        """Add one worker to the restrictions of keys retried on larger workers: O(1) per key.
        Called from the add_worker hook, before Dask looks for no-worker tasks that the new
        worker can run."""
        tasks = self.scheduler.tasks
        for key in d.keys:
            saved = self._saved.get(key) or self._alone.get(key)
            if saved is not None:  # held or alone: the restriction applies after that
                restrictions = saved[0]
            else:
                ts = tasks.get(key)
                restrictions = ts.worker_restrictions if ts is not None else None
            if restrictions:  # ours, set by _restrict; {HOLD} while it waited
                restrictions.discard(HOLD)
                restrictions.add(d.worker)
        self.scheduler.log_event(
            "oomguard",
            {
                "action": "retry-resize-widened",
                "worker": d.worker,
                "count": len(d.keys),
                "shards": [str(k) for k in d.keys[:10]],  # the first ten
            },
        )

    def _stop(self, d: Stop) -> None:
        scheduler = self.scheduler
        stimulus_id = f"oomguard-abort-{time.time()}"
        release = {}
        for key in d.keys:
            self._saved.pop(key, None)  # never restored: it must not run again
            ts = scheduler.tasks.get(key)
            if ts is not None:
                self._restore_alone(key, ts)
            if ts is None or ts.state in ("memory", "erred", "forgotten"):
                continue
            ts.worker_restrictions = {HOLD}
            ts.loose_restrictions = False
            if ts.state == "processing":
                release[key] = "released"  # sends free-keys: its result is dropped
        if release:
            scheduler.transitions(release, stimulus_id=stimulus_id)
        exc = pickle.dumps(d.exception)
        text = f"PipelineAborted: {d.exception.message}"
        recs: dict = {}
        for key in d.keys:
            ts = scheduler.tasks.get(key)
            if ts is None or ts.state not in ("no-worker", "queued"):
                continue  # waiting ones reach no-worker later and are erred then
            if ts.suspicious > scheduler.allowed_failures:  # Dask's own bound: its own line
                _dask_log.error(
                    "Task %s marked as failed because %d workers died while trying to run it",
                    key,
                    ts.suspicious,
                )
            recs.update(
                scheduler.transition(
                    key,
                    "erred",
                    exception=exc,
                    exception_text=text,
                    cause=key,
                    stimulus_id=stimulus_id,
                )
            )
        scheduler.transitions(recs, stimulus_id=stimulus_id)
        if d.run and d.run not in self._logged_aborts:
            self._logged_aborts.add(d.run)
            self.metrics.pipeline_aborted()
            # It starts "oomguard aborted|stopped"; task keys in it are a client's words.
            logger.warning("%s", safe_text(d.exception.message))
            scheduler.log_event(
                "oomguard",
                {
                    "action": "pipeline-aborted",
                    "pipeline": d.exception.pipeline,
                    "run": d.run,
                    "shard": d.exception.shard,
                    "message": d.exception.message,
                },
            )


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, str | int | float | bool)
