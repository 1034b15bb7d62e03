"""Plain records: failure events, signature rows, shard histories and pipeline statuses.

They know nothing of I/O or Dask. Each serialises to a JSON-able dict (`to_dict`) and back
(`from_dict`), so the CLI's `--json`, the store and the Python API agree on one shape.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

T = TypeVar("T", bound="_Record")


class _Record:
    _list_fields: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[T], d: dict[str, Any]) -> T:
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        kwargs = {k: v for k, v in d.items() if k in names}
        for name in cls._list_fields:
            if name in kwargs and kwargs[name] is not None:
                kwargs[name] = list(kwargs[name])
        return cls(**kwargs)


@dataclass(frozen=True)
class FailureEvent(_Record):
    """One failure of one shard: a worker death blamed on it, or an exception it raised.

    kind      "infra" | "user"
    cause     see `oomguard.Cause`
    shard     the task key, as `str(key)`
    pipeline  the span or annotation that names the pipeline (see docs/configuration.md)
    signature_id / signature_title   the deduplicated crash signature
    evidence  plain data naming its sources, e.g. {"oom_kill_delta": 1, "source": ...}
    attempt   1 for the shard's first failure, 2 for its second, ...
    time      seconds since the epoch, when the failure happened
    """

    kind: str
    cause: str
    shard: str
    pipeline: str
    worker: str
    host: str
    signature_id: str
    signature_title: str
    evidence: dict[str, Any] = field(default_factory=dict)
    attempt: int = 1
    time: float = 0.0
    id: int | None = None  # assigned by the store


@dataclass(frozen=True)
class SignatureRow(_Record):
    """One deduplicated signature across every host of the cluster."""

    _list_fields: ClassVar[tuple[str, ...]] = (
        "hosts",
        "workers",
        "shards",
        "pipelines",
        "causes",
    )

    id: str
    title: str
    grouping_version: int
    count: int
    first_seen: float
    last_seen: float
    hosts: list[str] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)
    shards: list[str] = field(default_factory=list)
    pipelines: list[str] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)
    example: str = ""  # a normalised trace, paths scrubbed


@dataclass(frozen=True)
class PipelineStatus(_Record):
    """Where a pipeline stands.

    status  "running" | "succeeded" | "succeeded_after_infra_failures" | "failed" | "aborted"
    summary one plain sentence naming the layer that failed
    started when this run of the pipeline began, seconds since the epoch; with the name it
            tells runs apart (0.0: not known, as for runs stored before oomguard had runs)
    """

    name: str
    status: str
    shards_done: int
    shards_failed: int
    shards_aborted: int
    infra_failures: int
    user_failures: int
    summary: str
    abort_reason: str = ""
    started: float = 0.0
