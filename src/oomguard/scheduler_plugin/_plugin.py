"""The scheduler side: the decision-maker for worker deaths and task failures.

It takes the death decision from Dask: `allowed_failures` is raised so Dask never raises
`KilledWorker` first, and each unexpected worker removal waits for its nanny's death report
(or a grace timeout: `worker_lost`). Only the tasks the dead worker was *executing* (from its
flight record) are blamed; the rest were displaced and are rescheduled without a count.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import pickle
import time
from typing import TYPE_CHECKING, Any

import dask.config
from distributed.core import Status
from distributed.diagnostics.plugin import SchedulerPlugin

from .. import _config
from .._causes import MEMORY_CAUSES, Cause, Kind, kind_of
from .._classify import evidence_summary
from .._exceptions import ConfigError, ReportError
from .._metrics import OomguardMetrics, store_totals
from .._models import FailureEvent
from .._policy import AbortDecision, FailurePolicy
from .._signature import fingerprint, fingerprint_dask, fingerprint_stack, scrub
from .._store import FailureStore
from ..worker_plugin import CLEAN_EXIT_HANDLER, REPORT_HANDLER
from ._deaths import Death, DeathLedger, Removal
from ._intake import ReportIntake
from ._resize import retry_larger
from ._pipelines import PipelineNames

if TYPE_CHECKING:
    from distributed import Scheduler

logger = logging.getLogger("oomguard.scheduler")

QUERY_HANDLER = "oomguard_query"
#: Dask's own death-counting, raised out of the way while oomguard owns the decision.
_NEVER = 2**31
_UNFINISHED = ("processing", "queued", "no-worker")
_RUNNABLE = ("waiting", "processing", "queued", "no-worker")
_SHUTTING_DOWN = (Status.closing, Status.closed, Status.closing_gracefully)


class OomguardSchedulerPlugin(SchedulerPlugin):
    """Classifies every failure as INFRA or USER, blames only executing shards, aborts a
    pipeline whose shard is a deterministic crasher, and keeps the history.

    Load with ``dask scheduler --preload oomguard.scheduler_plugin`` or
    ``oomguard.install(client)``; it installs the worker side on every nanny and worker.
    """

    name = "oomguard"
    idempotent = True

    def __init__(self, **config: Any):
        # Keys as in oomguard.scheduler.* with dashes or underscores; unset ones come from
        # the scheduler's Dask config in start().
        self.config = {k.replace("_", "-"): v for k, v in config.items()}
        unknown = sorted(set(self.config) - _config.scheduler_keys())
        if unknown:
            raise ConfigError(
                f"unknown oomguard scheduler setting {unknown[0]!r}; expected one of "
                f"{', '.join(sorted(_config.scheduler_keys()))}."
            )
        self._reset()

    def _reset(self) -> None:
        self.scheduler: Scheduler | None = None
        self.store: FailureStore | None = None
        self.policy: FailurePolicy | None = None
        self.ledger: DeathLedger | None = None
        self.intake: ReportIntake | None = None
        self.pipelines = PipelineNames()
        self._aborted: set[Any] = set()  # keys we erred with PipelineAborted
        self._timer: asyncio.Task | None = None
        self._gauges: asyncio.Task | None = None
        self.metrics = OomguardMetrics()
        self.dashboard_path = ""
        self._pods = None  # oomguard._kubernetes.PodLookup where enabled
        self._lookups: set[asyncio.Task] = set()
        self._larger_only = True
        self._resized: dict[Any, int] = {}  # key -> memory limit it died under
        self._saved_allowed_failures: int | None = None
        self._original_task_erred = None
        self._workers: dict[str, Any] = {}  # address -> WorkerState, to read after removal
        self._persisted: dict[str, Any] = {}  # pipeline -> last status written
        self._cgroup_workers: set[str] = set()  # nannies whose workers have their own cgroup
        self.stats: dict[str, Any] = {
            "reports": 0,
            "rejected": {},
            "deaths": 0,
            "displaced": 0,
            "aborts": 0,
            "overflow": 0,
            "internal_errors": 0,
            "latencies": [],
        }
        self._logged: set[str] = set()

    def __getstate__(self):
        return {"config": self.config}

    def __setstate__(self, state):
        self.config = state["config"]
        self._reset()

    # --- configuration ----------------------------------------------------------------

    def _setting(self, key: str, getter, *args):
        """oomguard.scheduler.<key>, from install(**config) if given there, else config."""
        if key in self.config:
            with dask.config.set({f"oomguard.scheduler.{key}": self.config[key]}):
                return getter(f"scheduler.{key}", *args)
        return getter(f"scheduler.{key}", *args)

    # --- lifecycle --------------------------------------------------------------------

    async def start(self, scheduler: Scheduler) -> None:
        grace = self._setting("report-grace-timeout", _config.get_seconds)
        self.policy = FailurePolicy(
            max_shard_infra_failures=self._setting(
                "max-shard-infra-failures", _config.get_int, 1
            ),
            abort_on_repeat_signature=self._setting(
                "abort-on-repeat-signature", _config.get_bool
            ),
        )
        self._larger_only = self._setting("memory-retry-larger-only", _config.get_bool)
        path = self._setting("store", _config.get_optional_path) or os.path.join(
            scheduler.local_directory or ".", "oomguard.sqlite3"
        )
        self.store = FailureStore(
            path, max_events=self._setting("max-events", _config.get_int, 1)
        )
        await asyncio.to_thread(self.store.start)
        self.ledger = DeathLedger(grace)
        self.intake = ReportIntake(self._on_reports)
        self.intake.start(asyncio.get_running_loop())
        self.scheduler = scheduler
        self._saved_allowed_failures = scheduler.allowed_failures
        scheduler.allowed_failures = _NEVER
        scheduler.handlers[REPORT_HANDLER] = self._handle_report
        scheduler.handlers[CLEAN_EXIT_HANDLER] = self._handle_clean_exit
        scheduler.handlers[QUERY_HANDLER] = self._handle_query
        original = scheduler.stream_handlers.get("task-erred")
        if original is None:
            logger.error(
                "oomguard: this Dask version has no 'task-erred' stream handler; task "
                "exceptions will not be recorded."
            )
        else:
            self._original_task_erred = original
            scheduler.stream_handlers["task-erred"] = self._task_erred
        for addr, ws in scheduler.workers.items():
            self._workers[addr] = ws
        self._timer = asyncio.create_task(self._expire_loop(min(grace / 4, 0.5)))
        if not self.metrics.register():
            logger.warning("oomguard: another oomguard in this process holds the metrics")
        self._gauges = asyncio.create_task(self._gauge_loop(2.0))
        try:
            from ._dashboard import register_dashboard

            self.dashboard_path = register_dashboard(scheduler)
        except ImportError:
            logger.info("oomguard: no dashboard page (bokeh is not installed)")
        except Exception:
            self._internal_error("dashboard")
        self._start_pod_lookup()
        await self._install_worker_side(scheduler)
        logger.info("oomguard: watching failures; store at %s", path)

    async def _install_worker_side(self, scheduler: Scheduler) -> None:
        from ..worker_plugin import OomguardNannyPlugin, OomguardWorkerPlugin
        from ..worker_plugin._paths import default_crash_dir

        nanny_plugin = OomguardNannyPlugin()
        await scheduler.register_nanny_plugin(
            comm=None,
            plugin=pickle.dumps(nanny_plugin),
            name=nanny_plugin.name,
            idempotent=True,
        )
        # Workers already running get the worker plugin now; restarted ones get it from
        # their nanny. The crash dir must agree with the nanny's, so read the same config.
        crash_dir = _config.get_optional_path("worker.crash-dir") or default_crash_dir()
        worker_plugin = OomguardWorkerPlugin(
            crash_dir, _config.get_seconds("worker.sample-interval")
        )
        await scheduler.register_worker_plugin(
            comm=None,
            plugin=pickle.dumps(worker_plugin),
            name=worker_plugin.name,
            idempotent=True,
        )

    def _start_pod_lookup(self) -> None:
        if not self._setting("kubernetes.enabled", _config.get_bool):
            return
        try:
            from .._kubernetes import PodLookup

            self._pods = PodLookup.in_cluster(
                self._setting("kubernetes.namespace", _config.get_optional_str),
                label_selector=self._setting("kubernetes.label-selector", _config.get_optional_str),
                container=self._setting("kubernetes.container", _config.get_optional_str),
            )
        except ImportError as e:
            logger.warning("oomguard: %s", e)
        except Exception:
            self._internal_error("pod_lookup")

    async def _gauge_loop(self, interval: float) -> None:
        seen = None
        while True:
            try:
                if self.store.written != seen:  # recount only after new writes
                    seen = self.store.written
                    n, hosts = await asyncio.to_thread(store_totals, self.store)
                    self.metrics.set_signatures(n)
                    self.metrics.set_signature_max_hosts(hosts)
            except Exception:
                self._internal_error("store")
            await asyncio.sleep(interval)

    async def close(self) -> None:
        scheduler = self.scheduler
        if scheduler is None:
            return
        for task in (self._timer, self._gauges):
            # close() may run inside the expire loop itself (plugin removed).
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self.metrics.unregister()
        if self.intake is not None:
            await asyncio.to_thread(self.intake.close)
        if self.ledger is not None:
            for death in self.ledger.drain():
                self._guard(self._decide, "close", death)
        if self._saved_allowed_failures is not None:
            scheduler.allowed_failures = self._saved_allowed_failures
        for name, fn in (
            (REPORT_HANDLER, self._handle_report),
            (CLEAN_EXIT_HANDLER, self._handle_clean_exit),
            (QUERY_HANDLER, self._handle_query),
        ):
            if scheduler.handlers.get(name) == fn:
                del scheduler.handlers[name]
        if self._original_task_erred is not None:
            scheduler.stream_handlers["task-erred"] = self._original_task_erred
        if self.store is not None:
            self._persist_pipelines(final=True)
            await asyncio.to_thread(self.store.close)
        self.scheduler = None

    # --- graphs and task states (hot path: O(1), no I/O) ------------------------------

    def update_graph(self, scheduler, *, client, keys, tasks, annotations, stimulus_id, **kw):
        try:
            names = self.pipelines.observe(tasks, keys, annotations, stimulus_id)
            for pipeline, shards in names.items():
                self.policy.pipeline_submitted(pipeline, shards)
        except Exception:
            self._internal_error("update_graph")

    def transition(self, key, start, finish, *args, stimulus_id, **kwargs):
        try:
            if finish == "memory" or finish == "erred":
                self._resized.pop(key, None)
                pipeline = self.pipelines.end(key)
                if pipeline is not None:
                    if finish == "memory":
                        self.policy.shard_done(pipeline, str(key))
                    else:
                        aborted = key in self._aborted
                        self.policy.shard_erred(pipeline, str(key), aborted=aborted)
            elif finish == "forgotten":
                self._aborted.discard(key)
                self._resized.pop(key, None)
                gone = self.pipelines.forget(key)
                if gone is not None and not gone[1]:
                    self.policy.shard_forgotten(gone[0], str(key))
            elif start == "released" and finish in _RUNNABLE:
                # A finished shard runs again: its result was lost, or the client
                # retried it.
                pipeline = self.pipelines.reopen(key)
                if pipeline is not None:
                    self.policy.shard_reopened(pipeline, str(key))
        except Exception:
            self._internal_error("transition")

    def add_worker(self, scheduler, worker):
        ws = scheduler.workers.get(worker)
        if ws is None:
            return
        self._workers[worker] = ws
        if self._resized:
            self._guard(self._admit_larger, "add_worker", ws)

    def _admit_larger(self, ws) -> None:
        """A worker joined (perhaps a larger one restarted under a new address): shards
        restricted to workers larger than the one they died on may run there too."""
        release = []
        for key, limit in self._resized.items():
            ts = self.scheduler.tasks.get(key)
            if ts is None or ts.worker_restrictions is None:
                continue
            if not ws.memory_limit or ws.memory_limit > limit:
                ts.worker_restrictions.add(ws.address)
                if ts.state == "no-worker":
                    release.append(key)
        if release:
            stimulus_id = f"oomguard-larger-worker-{time.time()}"
            self.scheduler.transitions(dict.fromkeys(release, "released"), stimulus_id)

    # --- worker deaths ----------------------------------------------------------------

    def log_event(self, topic, msg):
        # Dask publishes this before it reschedules the dead worker's tasks.
        if topic != "all" or not isinstance(msg, dict) or msg.get("action") != "remove-worker":
            return
        try:
            address = msg.get("worker")
            ws = self._workers.pop(address, None)
            if msg.get("expected") or self.ledger is None:
                return
            if self.scheduler is not None and self.scheduler.status in _SHUTTING_DOWN:
                return  # the cluster is closing: its workers leave, they do not die
            processing = {str(k): k for k in msg.get("processing-tasks") or ()}
            guess = {}
            if ws is not None:
                guess = {str(ts.key): ts.key for ts in ws.executing if str(ts.key) in processing}
            removal = Removal(
                worker=address,
                host=ws.host if ws is not None else _host_of(address),
                time=time.time(),
                processing=processing,
                executing_guess=guess,
                nthreads=ws.nthreads if ws is not None else 1,
            )
            death = self.ledger.removed(removal, time.monotonic())
            if death is not None:
                self._decide(death)
        except Exception:
            self._internal_error("log_event")

    async def _handle_report(self, report: Any = None, **extra: Any) -> dict:
        """RPC from a nanny: one death report as msgpack bytes. Only queued here; the
        intake thread decodes and validates it (never unpickles)."""
        try:
            if not isinstance(report, bytes | bytearray | memoryview):
                e = ReportError(
                    "report", f"expected msgpack bytes, got {type(report).__name__}", "wrong_type"
                )
                self._reject(e)
                return {"status": "rejected", "reason": e.reason, "field": e.field}
            if not self.intake.submit(bytes(report)):
                self.stats["overflow"] += 1
                self.metrics.report_rejected("overflow")
                return {"status": "overflow"}
        except Exception:
            self._internal_error("report")
            return {"status": "error"}
        return {"status": "queued"}

    async def _handle_clean_exit(self, worker: Any = None, **extra: Any) -> dict:
        """RPC from a nanny: its worker's exit was requested (close, restart) or clean."""
        if not isinstance(worker, str) or not 0 < len(worker) <= 256:
            self._reject(ReportError("worker", "expected a worker address", "wrong_type"))
            return {"status": "rejected"}
        try:
            self.ledger.clean(worker, time.monotonic())
        except Exception:
            self._internal_error("report")
        return {"status": "ok"}

    def _on_reports(self, results: list) -> None:
        """A batch from the intake thread, on the event loop."""
        for clean, arrived in results:
            try:
                if isinstance(clean, ReportError):
                    self._reject(clean)
                    continue
                latencies = self.stats["latencies"]
                latencies.append(max(0.0, arrived - clean["time"]))
                del latencies[:-1000]
                self.metrics.report_latency(latencies[-1])
                cgroup_name = ((clean.get("cgroup") or {}).get("path") or "").rsplit("/", 1)[-1]
                if cgroup_name.startswith("oomguard-worker-"):
                    self._cgroup_workers.add(clean["nanny"])
                    self.metrics.set_cgroup_workers(len(self._cgroup_workers))
                if clean.get("cause") is None:
                    continue
                dropped = self.ledger.dropped
                death = self.ledger.reported(clean, time.monotonic())
                if self.ledger.dropped != dropped:
                    self.stats["overflow"] += 1
                    self.metrics.report_rejected("overflow")
                    continue
                # Accepted; with overflow and rejected, every report is counted once.
                self.stats["reports"] += 1
                if death is not None:
                    self._decide(death)
            except Exception:
                self._internal_error("report")

    def _reject(self, e: ReportError) -> None:
        rejected = self.stats["rejected"]
        rejected[e.reason] = rejected.get(e.reason, 0) + 1
        self.metrics.report_rejected(e.reason)
        if e.reason not in self._logged:
            self._logged.add(e.reason)
            logger.warning("oomguard: rejected a death report (%s); further ones are counted", e)

    async def _expire_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            if self.scheduler is not None and self.scheduler.plugins.get(self.name) is not self:
                # Removed with Scheduler.remove_plugin, which does not call close().
                await self.close()
                return
            try:
                slice_start = time.monotonic()
                for death in self.ledger.expired(time.monotonic()):
                    if death.report is None and self._pods is not None:
                        task = asyncio.create_task(self._decide_lost(death))
                        self._lookups.add(task)
                        task.add_done_callback(self._lookups.discard)
                    else:
                        self._guard(self._decide, "expire", death)
                    if time.monotonic() - slice_start > 0.01:
                        # A storm of late reports: let the event loop breathe.
                        await asyncio.sleep(0)
                        slice_start = time.monotonic()
                self._persist_pipelines()
            except Exception:
                self._internal_error("expire")

    async def _decide_lost(self, death: Death) -> None:
        """No report: the nanny died too. Ask Kubernetes what happened to the pod."""
        found = None
        try:
            found = await asyncio.to_thread(
                self._pods.evidence, death.removal.host, since=death.removal.time
            )
        except Exception:
            self._internal_error("pod_lookup")
        self._guard(self._decide, "expire", death, found)

    def _decide(self, death: Death, pod: tuple[str, dict] | None = None) -> None:
        """Turn one death into failure events; abort a pipeline if a shard is doomed."""
        self.stats["deaths"] += 1
        report, removal = death.report, death.removal
        cause = report["cause"] if report is not None else Cause.WORKER_LOST
        if pod is not None:
            cause = Cause(pod[0])
        self.metrics.deaths(str(cause))
        processing = removal.processing if removal is not None else {}
        if report is not None:
            blamed = {e["key"]: e for e in report["executing"]}
        else:
            # No flight record: trust the scheduler's (heartbeat-late) view of what was
            # executing; failing that, a worker busy with no more tasks than threads.
            guess = removal.executing_guess or (
                processing if len(processing) <= removal.nthreads else {}
            )
            blamed = {k: None for k in guess}
        keys = {s: processing.get(s) for s in blamed}
        for s, key in keys.items():
            if key is None:
                keys[s] = self._find_key(s)
        for s, key in processing.items():
            if s not in blamed:
                self.stats["displaced"] += 1
                self.metrics.displaced()
                pipeline = self.pipelines.get(key)
                if pipeline is not None:
                    self.policy.displaced(pipeline, s)
        worker = death.worker
        host = report["host"] if report is not None else removal.host
        evidence = dict(report["evidence"]) if report is not None else {
            "source": "no death report within the grace timeout"
        }
        if pod is not None:
            evidence.update({k: v for k, v in pod[1].items() if _scalar(v)})
        evidence.setdefault("summary", evidence_summary(evidence, str(cause)))
        when = report["time"] if report is not None else removal.time
        decisions = []
        for s, entry in (blamed or {"": None}).items():
            key = keys.get(s)
            sig = self._death_signature(cause, report, entry, key)
            event = FailureEvent(
                kind=Kind.INFRA.value,
                cause=str(cause),
                shard=s,
                pipeline=(self.pipelines.get(key) or "") if key is not None else "",
                worker=worker,
                host=host,
                signature_id=sig.id,
                signature_title=sig.title,
                evidence=evidence,
                attempt=self.policy.attempt(s) if s else 1,
                time=when,
            )
            example = _example(report, entry, s)
            self.store.add(event, grouping_version=sig.grouping_version, example=example)
            self.metrics.failure(event.kind, event.cause)
            if s and event.pipeline:
                decision = self.policy.record(event)
                if decision is None and key is not None and cause in MEMORY_CAUSES:
                    decision = self._retry_larger(key, event, report)
                if decision is not None:
                    decisions.append(decision)
        for decision in decisions:
            self._abort(decision)

    def _retry_larger(self, key, event, report) -> AbortDecision | None:
        """Killed for memory: retry only on a larger worker, or abort when there is none."""
        if not self._larger_only:
            return None
        limit = report.get("memory_limit") if report is not None else None
        decision = retry_larger(self.scheduler, key, event, limit, self.policy)
        ts = self.scheduler.tasks.get(key)
        if decision is None and limit and ts is not None and ts.worker_restrictions:
            self._resized[key] = limit  # larger workers that join later qualify too
        return decision

    def _death_signature(self, cause, report, entry, key):
        crash = (report or {}).get("crash") or {}
        if cause == Cause.NATIVE_CRASH and crash.get("text"):
            return fingerprint(crash["text"])
        if entry is not None and entry.get("stack"):
            sig = fingerprint_stack(str(cause), [tuple(f) for f in entry["stack"]])
            if any(f.in_app for f in sig.frames):
                return sig
        # No sample, or one taken before the task's own code ran (only Dask's frames):
        # the task's function (its key prefix) stands in for the stack.
        prefix = entry["prefix"] if entry else self._prefix(key)
        return _prefix_signature(str(cause), prefix or "<no task>")

    def _prefix(self, key) -> str:
        ts = self.scheduler.tasks.get(key) if key is not None else None
        return ts.prefix.name if ts is not None else ""

    def _find_key(self, s: str):
        # Rare: a report whose removal never came. Only then scan for the key, and not on
        # a huge graph (a flood of such reports must not cost O(tasks) each).
        if len(self.scheduler.tasks) > 50_000:
            return None
        for key in self.scheduler.tasks:
            if str(key) == s:
                return key
        return None

    # --- task exceptions --------------------------------------------------------------

    def _task_erred(self, key=None, stimulus_id=None, **msg):
        extra = None
        try:
            extra = self._on_task_erred(key, msg)
        except Exception:
            self._internal_error("task-erred")
        self._original_task_erred(key=key, stimulus_id=stimulus_id, **msg)
        if extra is not None:
            self._guard(self._abort, "abort", extra)

    def _on_task_erred(self, key, msg) -> AbortDecision | None:
        ts = self.scheduler.tasks.get(key)
        if ts is None or ts.state != "processing" or ts.run_id != msg.get("run_id"):
            return None
        exception_text = msg.get("exception_text") or ""
        traceback_text = msg.get("traceback_text") or ""
        memory = exception_text.startswith("MemoryError")
        cause = Cause.MEMORY_ERROR if memory else Cause.EXCEPTION
        sig = fingerprint_dask(exception_text, traceback_text)
        shard = str(key)
        pipeline = self.pipelines.get(key) or ""
        worker = msg.get("worker") or ""
        event = FailureEvent(
            kind=kind_of(cause).value,
            cause=cause.value,
            shard=shard,
            pipeline=pipeline,
            worker=worker,
            host=_host_of(worker),
            signature_id=sig.id,
            signature_title=sig.title,
            evidence={"exception": exception_text[:500], "retries_left": ts.retries},
            attempt=self.policy.attempt(shard),
            time=time.time(),
        )
        self.store.add(
            event,
            grouping_version=sig.grouping_version,
            example=scrub(f"{traceback_text}\n{exception_text}"),
        )
        self.metrics.failure(event.kind, event.cause)
        decision = self.policy.record(event) if pipeline else None
        if memory and decision is None:
            # INFRA: a MemoryError is retried like a death, never from the user's retries.
            ts.retries += 1
        return decision

    # --- aborting ---------------------------------------------------------------------

    def _abort(self, decision: AbortDecision) -> None:
        self.stats["aborts"] += 1
        self.metrics.pipeline_aborted()
        scheduler = self.scheduler
        exc = pickle.dumps(decision.exception())
        text = f"PipelineAborted: {decision.message}"
        keys = [
            k
            for k in self.pipelines.keys_of(decision.pipeline)
            if (ts := scheduler.tasks.get(k)) is not None and ts.state in _UNFINISHED
        ]
        self._aborted.update(keys)
        stimulus_id = f"oomguard-abort-{time.time()}"
        recs: dict = {}
        for key in keys:
            ts = scheduler.tasks.get(key)
            if ts is None or ts.state not in _UNFINISHED:
                continue  # erred already as a dependent of an earlier one
            # Only processing -> erred takes a worker; queued/no-worker -> erred do not.
            extra = {"worker": ts.processing_on.address} if ts.processing_on else {}
            recs.update(
                scheduler.transition(
                    key,
                    "erred",
                    exception=exc,
                    exception_text=text,
                    cause=key,
                    stimulus_id=stimulus_id,
                    **extra,
                )
            )
        scheduler.transitions(recs, stimulus_id=stimulus_id)
        logger.error("oomguard: %s", decision.message)
        scheduler.log_event(
            "oomguard", {"action": "pipeline-aborted", "pipeline": decision.pipeline,
                         "shard": decision.shard, "message": decision.message}
        )

    def _persist_pipelines(self, final: bool = False) -> None:
        """Write changed pipeline statuses; forget finished pipelines with no live keys."""
        for name in self.policy.pipelines():
            status = self.policy.status(name)
            if final or self._persisted.get(name) != status:
                self.store.upsert_pipeline(status)
                self._persisted[name] = status
            if status.status != "running" and not self.pipelines.has_live(name):
                self.policy.forget_pipeline(name)
                self._persisted.pop(name, None)

    # --- queries ----------------------------------------------------------------------

    async def _handle_query(self, what: str = "", **filters: Any) -> Any:
        """RPC for `oomguard.Failures` and `oomguard report`: JSON-able rows."""
        store = self.store
        if what == "pipeline":
            name = filters.get("name", "")
            if name in self.policy.pipelines():
                return self.policy.status(name).to_dict()
            row = await asyncio.to_thread(store.pipeline, name)
            return row.to_dict() if row else None
        if what == "pipelines":
            await asyncio.to_thread(store.flush)
            self._persist_pipelines(final=True)
            await asyncio.to_thread(store.flush)
            rows = await asyncio.to_thread(store.pipelines, filters.get("limit", 100))
            return [r.to_dict() for r in rows]
        if what == "stats":
            return self.metrics_snapshot()
        readers = {
            "events": store.events,
            "signatures": store.signatures,
            "shard": store.shard,
            "signature": store.signature,
        }
        if what not in readers:
            raise ValueError(f"unknown oomguard query {what!r}; expected one of "
                             f"{', '.join(sorted(readers) + ['pipeline', 'pipelines', 'stats'])}")
        await asyncio.to_thread(store.flush)
        rows = await asyncio.to_thread(readers[what], **filters)
        if rows is None:
            return None
        if isinstance(rows, list):
            return [r.to_dict() for r in rows]
        return rows.to_dict()

    def metrics_snapshot(self) -> dict:
        return {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.stats.items()
                if k != "latencies"}

    # --- never take the scheduler down ------------------------------------------------

    def _guard(self, fn, where, *args):
        try:
            fn(*args)
        except Exception:
            self._internal_error(where)

    def _internal_error(self, where: str) -> None:
        self.stats["internal_errors"] += 1
        self.metrics.internal_error(where)
        if where not in self._logged:
            self._logged.add(where)
            logger.exception("oomguard scheduler plugin failed in %s (logged once)", where)


@functools.lru_cache(maxsize=4096)
def _prefix_signature(cause: str, prefix: str):
    return fingerprint_stack(cause, [("<task>", None, prefix)])


def _example(report: dict | None, entry: dict | None, shard: str) -> str:
    """The trace kept with a signature: the crash dump, else the last sampled stack."""
    if report is None:
        return ""
    text = (report.get("crash") or {}).get("text")
    if text:
        return scrub(text)
    if entry is not None and entry.get("stack"):
        age = ""
        if entry.get("stack_time"):
            age = f", {max(0.0, report['time'] - entry['stack_time']):.1f} s before the death"
        lines = [f"Last sampled stack of shard {shard}{age} (most recent call last):"]
        lines += [f'  File "{f}", line {n}, in {fn}' for f, n, fn in entry["stack"]]
        return scrub("\n".join(lines))
    return ""


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, str | int | float | bool)


def _host_of(address: str) -> str:
    from distributed.comm import get_address_host

    try:
        return get_address_host(address)
    except Exception:
        return ""
