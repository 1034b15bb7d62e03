"""The lists `oomguard.Failures` returns: plain lists of records (index, iterate, compare
and pickle them as before) that show themselves as tables in a notebook (`_repr_html_`, as
pandas and xarray do), one record per line in a REPL, and become a DataFrame with
`to_pandas()`.

>>> events = failures.events(cause="oom_kill")       # doctest: +SKIP
>>> events                                            # doctest: +SKIP
[<FailureEvent 2026-05-01 14:03:07 oom_kill shard=('load', 17) attempt=2 pipeline=etl ...>,
 <FailureEvent 2026-05-01 13:41:52 oom_kill shard=('load', 17) pipeline=etl ...>]
>>> events.to_pandas().groupby("worker").size()     # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, NamedTuple

from .._death.record import BLAMED, Death, Role
from .._display import cell, clock, html_table, quantity, utc_offset
from .._models import FailureEvent, Incident, PipelineStatus, SignatureRow
from .._words import suspects_phrase

#: A REPL shows at most this many records of a list (the first and the last ones)...
REPR_ROWS = 20
REPR_HEAD, REPR_TAIL = 10, 5
#: ...and a notebook this many rows of a table.
HTML_ROWS = 50


class Column(NamedTuple):
    header: str
    value: Callable[[Any], Any]
    width: int | None = None  # cut in the middle past this many characters
    numeric: bool = False
    prose: bool = False  # a sentence: wraps, cut at its end


class _Table(list):
    """A list of one kind of record that shows itself as a table."""

    noun: ClassVar[str]
    record: ClassVar[type]
    columns: ClassVar[tuple[Column, ...]]
    times: ClassVar[tuple[str, ...]]  # fields in seconds since the epoch (0: not known)

    def __init__(self, rows: Iterable[Any] = (), order: str = "") -> None:
        super().__init__(rows)
        self.order = order  # e.g. "newest first", said in the table's caption

    def __getitem__(self, index):
        item = super().__getitem__(index)
        return type(self)(item, self.order) if isinstance(index, slice) else item

    def __repr__(self) -> str:
        if len(self) <= REPR_ROWS:
            shown = [repr(r) for r in self]
        else:
            head = list.__getitem__(self, slice(REPR_HEAD))
            tail = list.__getitem__(self, slice(-REPR_TAIL, None))
            left = len(self) - REPR_HEAD - REPR_TAIL
            shown = [*map(repr, head), f"... {left} more ...", *map(repr, tail)]
        return "[" + ",\n ".join(shown) + "]"

    def caption(self) -> str:
        parts = [quantity(len(self), self.noun)]
        if self.order:
            parts.append(self.order)
        if self.times:
            parts.append(f"times {utc_offset()}")
        return ", ".join(parts)

    def _repr_html_(self) -> str:
        rows = [
            [cell(c.value(r), c.width, numeric=c.numeric, prose=c.prose) for c in self.columns]
            for r in list.__getitem__(self, slice(HTML_ROWS))
        ]
        return html_table(
            self.caption(),
            [c.header for c in self.columns],
            rows,
            more=max(0, len(self) - HTML_ROWS),
            empty=f"no {self.noun}s",
            numeric=[i for i, c in enumerate(self.columns) if c.numeric],
        )

    def to_pandas(self):
        """A DataFrame, one row per record, one column per field; times as UTC datetimes
        (NaT where not known).

        >>> failures.events().to_pandas().groupby("cause").size()   # doctest: +SKIP
        """
        try:
            import pandas as pd
        except ImportError:
            raise ImportError(
                f"{type(self).__name__}.to_pandas() needs pandas: pip install pandas"
            ) from None
        names = [f.name for f in dataclasses.fields(self.record)]
        frame = pd.DataFrame([r.to_dict() for r in self], columns=names)
        for name in self.times:
            seconds = pd.to_numeric(frame[name], errors="coerce")
            frame[name] = pd.to_datetime(seconds.where(seconds > 0), unit="s", utc=True)
        return frame


def _summary(e: FailureEvent) -> str:
    summary = e.evidence.get("summary") if isinstance(e.evidence, dict) else None
    return summary if isinstance(summary, str) else ""


def _joined(values: list[str]) -> str:
    return ", ".join(str(v) for v in values)


class EventList(_Table):
    """Failure events: `Failures.events()` (newest first), `Failures.shard()` (oldest first)."""

    noun = "failure event"
    record = FailureEvent
    times = ("time",)
    columns = (
        Column("time", lambda e: clock(e.time)),
        Column("kind", lambda e: e.kind),
        Column("cause", lambda e: e.cause),
        Column("attempt", lambda e: e.attempt, numeric=True),
        Column("shard", lambda e: e.shard, 60),
        Column("pipeline", lambda e: e.pipeline, 40),
        Column("worker", lambda e: e.worker, 40),
        Column("signature", lambda e: e.signature_id, 24),
        Column("title", lambda e: e.signature_title, 60),
        Column("summary", _summary, 300, prose=True),
    )


def blamed(d: Death) -> str:
    """The tasks a death is blamed on: its culprit, or its suspects."""
    return ", ".join(t.key for t in d.tasks if t.role in BLAMED)


def tasks_by_role(d: Death, roles: tuple[Role, ...] = tuple(Role)) -> str:
    """A death's tasks of `roles`, counted, with their pipelines:
    "1 culprit (etl); 2 displaced (report); 1 queued"."""
    parts = []
    for role in roles:
        tasks = d.with_role(role)
        n = len(tasks) + d.more.get(role.value, 0)
        if n:
            pipelines = ", ".join(sorted({t.pipeline for t in tasks if t.pipeline}))
            parts.append(f"{n} {role.value}" + (f" ({pipelines})" if pipelines else ""))
    return "; ".join(parts)


class DeathList(_Table):
    """Worker deaths: `Failures.deaths()`, newest first, one row per death."""

    noun = "worker death"
    record = Death
    times = ("time",)
    columns = (
        Column("time", lambda d: clock(d.time)),
        Column("cause", lambda d: d.cause),
        Column("killer", lambda d: d.killer.name if d.killer else ""),
        Column("worker", lambda d: d.worker, 40),
        Column("blamed", blamed, 80),
        Column("pipelines", lambda d: _joined(sorted({t.pipeline for t in d.tasks} - {""})), 40),
        Column("without blame", lambda d: tasks_by_role(d, (Role.DISPLACED, Role.QUEUED)), 80),
        Column("signature", lambda d: d.signature_id, 24),
        Column("title", lambda d: d.signature_title, 60),
        Column("summary", lambda d: _summary(d), 300, prose=True),
    )


class IncidentList(_Table):
    """Incidents: `Failures.incidents()`, newest first, one row per incident."""

    noun = "incident"
    record = Incident
    times = ("start", "end")
    columns = (
        Column("start", lambda i: clock(i.start)),
        Column("deaths", lambda i: i.deaths, numeric=True),
        Column("place", lambda i: i.place, 40),
        Column("cause", lambda i: i.cause),
        Column("killer", lambda i: i.killer),
        Column("hosts", lambda i: _joined(i.hosts), 40),
        Column("id", lambda i: i.id, 24),
        Column("summary", lambda i: i.summary, 300, prose=True),
    )


def related(s: SignatureRow) -> str:
    """A signature's related ones: "9f1c2e (same crash site), ..."."""
    return ", ".join(f"{r.get('id', '?')} ({r.get('why', '')})" for r in s.related)


class SignatureList(_Table):
    """Crash signatures: `Failures.signatures()`, most frequent first."""

    noun = "signature"
    record = SignatureRow
    times = ("first_seen", "last_seen", "resolved_at", "regressed_at")
    columns = (
        Column("id", lambda s: s.id, 24),
        Column("state", lambda s: s.state),
        Column("title", lambda s: s.title, 60),
        Column("count", lambda s: s.count, numeric=True),
        Column("last hour", lambda s: s.last_hour, numeric=True),
        Column("hosts", lambda s: _joined(s.hosts), 40),
        Column("causes", lambda s: _joined(s.causes), 40),
        Column("pipelines", lambda s: _joined(s.pipelines), 40),
        Column("first seen", lambda s: clock(s.first_seen)),
        Column("last seen", lambda s: clock(s.last_seen)),
        # The values its deaths have much more often than the workers (NODE_POOL=spot).
        Column("suspects", lambda s: suspects_phrase(s.environment_suspects), 120, prose=True),
        Column("related", related, 80),
    )


class PipelineList(_Table):
    """Pipeline runs: `Failures.pipelines()`, most recently updated first."""

    noun = "pipeline run"
    record = PipelineStatus
    times = ("started",)
    columns = (
        Column("name", lambda p: p.name, 40),
        Column("status", lambda p: p.status),
        Column("started", lambda p: clock(p.started)),
        Column("done", lambda p: p.shards_done, numeric=True),
        Column("failed", lambda p: p.shards_failed, numeric=True),
        Column("aborted", lambda p: p.shards_aborted, numeric=True),
        Column("infra", lambda p: p.infra_failures, numeric=True),
        Column("user", lambda p: p.user_failures, numeric=True),
        Column("summary", lambda p: p.summary, 300, prose=True),
        Column("abort reason", lambda p: p.abort_reason, 300, prose=True),
    )
