"""Host-wide memory admission: a task that needs memory waits for it before it runs.

Where it hooks in (distributed 2026.8.0): `BaseWorker.handle_stimulus` turns each `Execute`
instruction into ``self._start_async_instruction(..., self.execute, key, ...)``
(worker_state_machine.py ~3735), looking `execute` up on the instance each time. We shadow
`worker.execute` on the instance with a coroutine that takes a lease from the host ledger,
awaits the original `Worker.execute` (worker.py ~2115), and releases the lease when it
returns. Why there and not in an executor wrapper: the key is in hand (the executor only
receives an opaque `lambda: context.run(_run_task, ...)`), the wait is an `await` on the
event loop instead of a blocked thread, and `Worker.execute` picks its code path by
``"ThreadPoolExecutor" in str(type(e))``, which a wrapper class would have to imitate.

While a task waits it is "executing" to Dask (it holds one of the worker's threads, as it
would when running). Waits are visible as:
- the Prometheus metrics ``oomguard_admission_*`` on the worker's /metrics;
- the event topic ``oomguard-admission`` (``client.get_events("oomguard-admission")``);
- the "oomguard-admission-wait" activity of the task's prefix on Dask's Fine Performance
  Metrics dashboard page (``context_meter``), beside thread-cpu and thread-noncpu.

A wait past ``max-wait`` errs the task with `AdmissionTimeout`, naming need and free bytes.

The ledger's lock is never waited for on the event loop beyond `ledger_file.LOCK_WAIT`
(5 ms): when another process holds it longer (a stopped worker, anything that can open the
file) the request is "not decided now" and the task keeps waiting as if refused, asking
again at the next poll; past ``max-wait`` it errs as above. A release the lock kept out is
applied shortly after (`HostLedger.flush_soon`). Counted in
``oomguard_admission_ledger_busy_total``; bad entries dropped from the file in
``oomguard_admission_ledger_dropped_total``, torn files rebuilt in
``oomguard_admission_ledger_rebuilt_total``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dask.utils import key_split
from distributed.metrics import context_meter
from distributed.worker_state_machine import ExecuteFailureEvent, RescheduleEvent
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from .._admission.config import AdmissionConfig
from .._admission.ledger import Admission
from .._admission.needs import PeakEstimator, need_of
from .._exceptions import AdmissionTimeout
from .._protocol import ADMISSION_TOPIC as EVENT_TOPIC
from .._protocol import ADMISSION_WAIT_METRIC as WAIT_METRIC
from .._units import format_bytes

if TYPE_CHECKING:
    from distributed import Worker

logger = logging.getLogger("oomguard.admission")

_WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)
_REFRESH_S = 5.0  # re-read learned peaks from the ledger at most this often
_RUNNING = ("executing", "long-running")


class AdmissionMetrics(Collector):
    """The worker side's admission metrics, served on the worker's /metrics."""

    def __init__(self) -> None:
        self.ledger = None  # HostLedger: its counters are read at collection
        self.waits = Counter(
            "oomguard_admission_waits_total",
            "Tasks that had to wait for host memory before they could start.",
            registry=None,
        )
        self.wait_seconds = Histogram(
            "oomguard_admission_wait_seconds",
            "How long tasks waited for host memory (only tasks that waited).",
            buckets=_WAIT_BUCKETS,
            registry=None,
        )
        self.timeouts = Counter(
            "oomguard_admission_timeouts_total",
            "Tasks erred because host memory did not free up within max-wait.",
            registry=None,
        )
        self.cold_starts = Counter(
            "oomguard_admission_cold_starts_total",
            "Tasks granted memory kept as the floor, allowed because no other lease was held.",
            registry=None,
        )
        self.leased = Gauge(
            "oomguard_admission_leased_bytes",
            "Host memory leased by this worker's running tasks.",
            registry=None,
        )
        self._all = (self.waits, self.wait_seconds, self.timeouts, self.cold_starts, self.leased)

    def collect(self) -> Iterator[Any]:
        for m in self._all:
            yield from m.collect()
        ledger = self.ledger
        if ledger is None:
            return
        for name, doc, value in (
            (
                "busy",
                "Ledger accesses not made: its lock was held by another process.",
                ledger.busy,
            ),
            ("dropped", "Ledger entries dropped as not an oomguard process's.", ledger.dropped),
            ("rebuilt", "Torn ledger files rebuilt from this process's leases.", ledger.torn),
        ):
            yield CounterMetricFamily(f"oomguard_admission_ledger_{name}", doc, value=value)


@dataclass
class _Running:
    prefix: str
    start_rss: int
    max_rss: int
    alone: bool


class WorkerAdmission:
    """Installed by `OomguardWorkerPlugin.setup` into one worker process."""

    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        self.ledger = config.open_ledger()
        self.estimator = PeakEstimator(min_bytes=config.min_estimate)
        self.metrics = AdmissionMetrics()
        self.metrics.ledger = self.ledger
        self.stats = {
            "leases": 0,
            "waits": 0,
            "waited_s": 0.0,
            "timeouts": 0,
            "cold": 0,
            "errors": 0,
            "peaks": 0,
        }
        self.waits: list[dict] = []  # the last few waits, for tests and debugging
        self._worker: Worker | None = None
        self._original = None
        self._running: dict[Any, _Running] = {}
        self._leases: dict[Any, int] = {}  # key -> bytes leased by this process
        self._refreshed = 0.0
        self._registered = False

    # -- lifecycle ---------------------------------------------------------------------

    def install(self, worker: Worker) -> None:
        self._worker = worker
        self._original = worker.execute
        worker.execute = self.execute  # instance attribute shadows Worker.execute
        try:
            self.estimator.update(self.ledger.refresh())
        except OSError as e:
            logger.warning("oomguard: memory ledger %s unreadable: %s", self.config.ledger, e)
        self._refreshed = time.monotonic()
        try:
            REGISTRY.register(self.metrics)
            self._registered = True
        except ValueError:  # two workers in one process (threads): one set of metrics
            pass

    def uninstall(self, worker: Worker) -> None:
        if worker.__dict__.get("execute") == self.execute:
            del worker.execute
        if self._registered:
            REGISTRY.unregister(self.metrics)
            self._registered = False
        self.ledger.close()  # its descriptors: a worker closed in-process leaves none open

    # -- the sampler feeds peaks -------------------------------------------------------

    def observe(self, rss: int) -> None:
        """Called by the flight recorder's sampler with this process's RSS."""
        for run in list(self._running.values()):
            if rss > run.max_rss:
                run.max_rss = rss

    # -- admission ---------------------------------------------------------------------

    async def execute(self, key, *, stimulus_id: str):
        worker, original = self._worker, self._original
        try:
            ts = worker.state.tasks.get(key)
            need = need_of(key, ts.annotations if ts is not None else None, self._estimates())
        except Exception as e:  # a bad annotation errs the task, naming it
            return _failure(key, worker, e)
        granted = False
        if need is not None:
            try:
                granted = await self._admit(key, need)
                if granted:
                    self._leases[key] = need
                    self.metrics.leased.set(sum(self._leases.values()))
            except AdmissionTimeout as e:
                return _failure(key, worker, e)
            except Exception:
                self._error("admit")  # the ledger failing must not stop the work
            ts = worker.state.tasks.get(key)
            if ts is None or ts.state not in _RUNNING:
                # Cancelled while it waited: hand it back without running it.
                if granted:
                    self._release(key, None)
                return RescheduleEvent(key=key, stimulus_id=f"oomguard-admission-{time.time()}")
        run = self._start(key)
        try:
            return await original(key, stimulus_id=stimulus_id)
        finally:
            peak = self._finish(key, run)
            if granted or peak is not None:
                self._release(key if granted else None, peak)

    def _estimates(self) -> PeakEstimator:
        now = time.monotonic()
        if now - self._refreshed > _REFRESH_S:
            self._refreshed = now
            try:
                self.estimator.update(self.ledger.refresh())
            except Exception:
                self._error("refresh")
        return self.estimator

    async def _admit(self, key, need: int) -> bool:
        skey = str(key)
        adm = self.ledger.try_acquire(skey, need)
        if adm.granted:
            self._granted(need, adm)
            return True
        began = time.monotonic()
        logger.info(
            "oomguard: task %s waits for %s of host memory%s",
            skey,
            format_bytes(need),
            adm.detail(),
        )
        try:
            return await self._wait(key, skey, need, began)
        except BaseException:  # timed out, or the worker closes: stop queueing
            self.ledger.withdraw(skey)
            raise

    async def _wait(self, key, skey: str, need: int, began: float) -> bool:
        delay = 0.01
        while True:
            ts = self._worker.state.tasks.get(key)
            if ts is None or ts.state not in _RUNNING:
                self.ledger.withdraw(skey)
                return False  # cancelled while waiting
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.config.poll)
            adm = self.ledger.try_acquire(skey, need)
            waited = time.monotonic() - began
            if adm.granted:
                self._waited(skey, need, adm, waited, "granted")
                self._granted(need, adm)
                return True
            if waited >= self.config.max_wait:
                self._waited(skey, need, adm, waited, "timeout")
                self.stats["timeouts"] += 1
                self.metrics.timeouts.inc()
                raise AdmissionTimeout(skey, need, adm.free, waited, adm.detail())

    def _granted(self, need: int, adm: Admission) -> None:
        self.stats["leases"] += 1
        if adm.cold:  # granted into the floor: no other lease was held
            self.stats["cold"] += 1
            self.metrics.cold_starts.inc()

    def _waited(self, key: str, need: int, adm: Admission, waited: float, outcome: str) -> None:
        self.stats["waits"] += 1
        self.stats["waited_s"] += waited
        self.metrics.waits.inc()
        self.metrics.wait_seconds.observe(waited)
        context_meter.digest_metric(WAIT_METRIC, waited, "seconds")
        record = {
            "action": "admission-wait",
            "key": key,
            "need": need,
            "free": adm.free,
            "waited": round(waited, 3),
            "outcome": outcome,
            "pid": os.getpid(),
        }
        self.waits = [*self.waits[-99:], record]
        try:
            self._worker.log_event(EVENT_TOPIC, record)
        except Exception:
            self._error("event")

    def _release(self, key, peak: tuple[str, int] | None) -> None:
        try:
            if key is not None:
                self.ledger.release(str(key), peak=peak)
            elif peak is not None:
                self.ledger.record_peak(*peak)
            if peak is not None:
                self.stats["peaks"] += 1
                self.estimator.observe(*peak)
        except Exception:
            self._error("release")
        self.ledger.flush_soon()  # the lock was held elsewhere: release it shortly
        if key is not None and self._leases.pop(key, None) is not None:
            self.metrics.leased.set(sum(self._leases.values()))

    # -- peaks: RSS growth while the task ran alone in this process ----------------------

    def _start(self, key) -> _Running:
        rss = self.ledger.own_rss() or 0
        alone = not self._running
        for other in self._running.values():
            other.alone = False
        run = self._running[key] = _Running(key_split(key), rss, rss, alone)
        return run

    def _finish(self, key, run: _Running) -> tuple[str, int] | None:
        self._running.pop(key, None)
        run.max_rss = max(run.max_rss, self.ledger.own_rss() or 0)
        if not run.alone or run.max_rss <= run.start_rss:
            return None  # shared with other tasks: its own share is unknown
        peak = run.max_rss - run.start_rss
        if peak < self.config.min_estimate or peak <= self.estimator._peaks.get(run.prefix, 0):
            return None  # not news: spare the ledger a write
        return run.prefix, peak

    def _error(self, where: str) -> None:
        self.stats["errors"] += 1
        if self.stats["errors"] == 1:
            logger.exception("oomguard admission failed in %s (logged once)", where)


def _failure(key, worker, exc: BaseException) -> ExecuteFailureEvent:
    ts = worker.state.tasks.get(key)
    now = time.time()
    return ExecuteFailureEvent.from_exception(
        exc,
        key=key,
        run_id=ts.run_id if ts is not None else -1,
        start=now,
        stop=now,
        stimulus_id=f"oomguard-admission-{now}",
    )


def install_admission(worker: Worker, crash_dir: str) -> WorkerAdmission | None:
    """Set up admission in this worker process when enabled; None otherwise."""
    config = AdmissionConfig.from_dask(crash_dir)
    if not config.enabled:
        return None
    admission = WorkerAdmission(config)
    admission.install(worker)
    return admission
