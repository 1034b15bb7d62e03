"""oomguard's exceptions.

OomguardError (Exception)
├── ConfigError (ValueError)          a config value is wrong; names the key
├── ReportError (ValueError)          a death report failed validation; names the field
├── TraceParseError (ValueError)      a trace could not be parsed at all
├── CgroupError (OSError)             a per-worker cgroup was required but cannot be made
├── StoreError (OSError)              a failure store file cannot be used; names the path
├── AdmissionTimeout (TimeoutError)   a task waited past max-wait for host memory
└── ReportFailed                      `oomguard report` cannot read the history: one line
PipelineAborted (Exception)           raised on the client for every task of an aborted
                                      pipeline; carries the shard, cause and evidence
"""

from __future__ import annotations

from typing import Any

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


class PipelineAborted(Exception):
    """Every unfinished task of a pipeline errs with this once one of its shards is a
    deterministic crasher. The message is one paragraph for a person; the fields are for code.
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
    ) -> None:
        super().__init__(message)
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
        )
        return (_rebuild_pipeline_aborted, (self.message, kwargs))

    def __str__(self) -> str:
        return self.message


def _rebuild_pipeline_aborted(message: str, kwargs: dict[str, Any]) -> PipelineAborted:
    return PipelineAborted(message, **kwargs)
