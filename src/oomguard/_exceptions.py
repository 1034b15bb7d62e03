"""oomguard's exceptions.

OomguardError (Exception)
├── ConfigError (ValueError)          a config value is wrong; names the key
├── ReportError (ValueError)          a death report failed validation; names the field
├── TraceParseError (ValueError)      a trace could not be parsed at all
├── CgroupError (OSError)             a per-worker cgroup was required but cannot be made
├── StoreError (OSError)              a failure store file cannot be used; names the path
├── AdmissionTimeout (TimeoutError)   a task waited past max-wait for host memory
└── ReportFailed                      `oomguard report` cannot read the history: one line
PipelineAborted (distributed.KilledWorker)
                                      raised on the client for every task of an aborted
                                      pipeline; carries the shard, cause and evidence; a
                                      KilledWorker, so `except KilledWorker` catches it
"""

from __future__ import annotations

from typing import Any, NamedTuple

from distributed import KilledWorker

from ._units import format_bytes


class OomguardError(Exception):
    """Base class of oomguard's own errors."""


class ConfigError(OomguardError, ValueError):
    """A configuration value is invalid. The message names the key and the accepted values."""


class ReportError(OomguardError, ValueError):
    """A death report is malformed. `field` names the offending field, `reason` is a short
    machine-readable reason used as a metric label."""

    def __init__(self, field: str, message: str, reason: str = "invalid") -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = reason

    def __reduce__(self):
        return (type(self), (self.field, str(self).split(": ", 1)[-1], self.reason))


class TraceParseError(OomguardError, ValueError):
    """A trace could not be parsed."""


class CgroupError(OomguardError, OSError):
    """A per-worker memory cgroup was required (`cgroup-limit: true`) but cannot be made."""


class StoreError(OomguardError, OSError):
    """The store file cannot be used: not SQLite, corrupt, another application's, or
    written by a newer oomguard. The message names the path; the file is left untouched."""


class AdmissionTimeout(OomguardError, TimeoutError):
    """A task waited past `max-wait` for host memory. Names the need and what was free."""

    def __init__(self, key: str, need: int, free: int, waited: float, detail: str = "") -> None:
        self.key, self.need, self.free, self.waited, self.detail = key, need, free, waited, detail
        super().__init__(
            f"oomguard: task {key} waited {waited:.1f} s for {format_bytes(need)} of host "
            f"memory, but only {format_bytes(max(free, 0))} was free{detail}. Raise "
            "oomguard.worker.admission.max-wait, run fewer memory-heavy tasks per host, or "
            "lower the task's oomguard.memory(...) need."
        )

    def __reduce__(self):
        return (type(self), (self.key, self.need, self.free, self.waited, self.detail))


class ReportFailed(OomguardError):
    """`oomguard report` could not read the history; the message is the one line the user
    sees."""


class LastWorker(NamedTuple):
    """`KilledWorker.last_worker` of a `PipelineAborted`: the last worker whose death
    counted (Dask gives a WorkerState there; code written for Dask reads `.address`)."""

    address: str
    name: str = ""


class PipelineAborted(KilledWorker):
    """Every unfinished task of a pipeline errs with this once one of its shards is a
    deterministic crasher, or was on more dead workers than Dask's allowed-failures. The
    message is one paragraph for a person; the fields are for code.

    It is Dask's `KilledWorker`, so retry logic written for Dask (`except KilledWorker`)
    catches it, with Dask's own fields: `task` (the shard's key), `last_worker` (its
    `.address`) and `allowed_failures`. Where Dask's own bound stopped the task, the message
    starts with the sentence Dask's `KilledWorker` would have said.

    >>> e = PipelineAborted("oomguard aborted ...", shard="('load', 7)", task=("load", 7),
    ...                     last_worker="tcp://10.0.0.5:40000", allowed_failures=3)
    >>> isinstance(e, KilledWorker), e.task, e.last_worker.address, e.allowed_failures
    (True, ('load', 7), 'tcp://10.0.0.5:40000', 3)
    """

    def __init__(
        self,
        message: str,
        *,
        pipeline: str = "",
        shard: str = "",
        cause: str = "",
        count: int = 0,
        signature: str = "",
        evidence: dict[str, Any] | None = None,
        task: Any = None,
        last_worker: str = "",
        allowed_failures: int = 0,
    ) -> None:
        # KilledWorker's own fields live in args: (task, last_worker, allowed_failures).
        super().__init__(
            shard if task is None else task, LastWorker(last_worker), allowed_failures
        )
        self.message = message
        self.pipeline = pipeline
        self.shard = shard
        self.cause = cause
        self.count = count
        self.signature = signature
        self.evidence = dict(evidence or {})

    def __reduce__(self):
        kwargs = dict(
            pipeline=self.pipeline,
            shard=self.shard,
            cause=self.cause,
            count=self.count,
            signature=self.signature,
            evidence=self.evidence,
            task=self.task,
            last_worker=self.last_worker.address,
            allowed_failures=self.allowed_failures,
        )
        return (_rebuild_pipeline_aborted, (self.message, kwargs))

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


def _rebuild_pipeline_aborted(message: str, kwargs: dict[str, Any]) -> PipelineAborted:
    return PipelineAborted(message, **kwargs)
