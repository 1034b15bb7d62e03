"""The client-side API: `Failures(client)` (`install(client)` is in `install.py`)."""

from __future__ import annotations

import datetime
import warnings
from typing import TYPE_CHECKING, Any

from .._death.record import Death
from .._display import quantity, shorten
from .._models import FailureEvent, Incident, PipelineStatus, SignatureRow
from .._protocol import RESOLVE_HANDLER
from . import filters as _filters
from .results import DeathList, EventList, IncidentList, PipelineList, SignatureList

if TYPE_CHECKING:
    from distributed import Client


#: The default limits, as `oomguard report` has them (its `DEFAULT_LIMITS`).
_EVENTS_LIMIT, _SIGNATURES_LIMIT, _PIPELINES_LIMIT = 1000, 100, 100
_DEATHS_LIMIT = _INCIDENTS_LIMIT = 1000
_KNOWN_SHOWN = 10  # pipeline names a KeyError lists
#: Rows asked for per call; the scheduler may answer fewer (its reply is capped in bytes).
_PAGE_ROWS = 1000


class Failures:
    """Query the failure history a scheduler keeps.

    Lists come back as `DeathList`, `EventList`, `SignatureList` and `PipelineList`: plain
    lists that show as tables in a notebook and have `to_pandas()`. A worker death is one
    row of `deaths()` (with its tasks and their roles), and one count of its signature;
    `events()` has one row per task it is blamed on, each naming it (`FailureEvent.death`). Filters are checked as
    `oomguard report` checks them: a bad one raises ValueError naming it, never ``[]``; a
    pipeline or signature id the history does not have gives ``[]`` with a UserWarning
    naming the known ones and the closest. `client` must be a `distributed.Client` and
    `timeout` positive seconds or None (TypeError / ValueError at once otherwise).

    One store may hold the history of many clusters (each named by its
    ``oomguard.scheduler.cluster-name``). By default the answers are this cluster's: its
    events and pipeline runs, and the signatures it saw, with their counts across every
    cluster (``SignatureRow.clusters`` names them all). ``fleet=True`` answers for the whole
    history.

    >>> failures = oomguard.Failures(client)                  # doctest: +SKIP
    >>> failures                                              # doctest: +SKIP
    <Failures tcp://10.0.3.2:8786 12 events, 3 signatures>
    >>> failures.cluster                                      # doctest: +SKIP
    'etl-nightly'
    >>> oomguard.Failures(client, fleet=True).signatures()[0].clusters  # doctest: +SKIP
    ['etl-nightly', 'etl-backfill']
    >>> failures.deaths(since="1h")                          # doctest: +SKIP
    [<Death 2026-05-01 14:03:07 oom_kill killer=kernel worker=tcp://10.0.3.11:40211 ...>]
    >>> failures.events(cause="oom_kill", since="1h", limit=10)   # doctest: +SKIP
    [<FailureEvent 2026-05-01 14:03:07 oom_kill shard=('load', 17) attempt=2 pipeline=etl ...>]
    >>> failures.pipeline("etl").summary                      # doctest: +SKIP
    'a worker was OOM-killed by the kernel at shard ...'
    """

    #: How long the repr waits for the counts: a repr must not hang a notebook.
    repr_timeout: float = 2.0

    def __init__(self, client: Client, *, timeout: float | None = 60.0, fleet: bool = False):
        # A scheduler without oomguard never answers the query: bound every call.
        self.client = _filters.client(client)
        self.timeout = _filters.timeout(timeout)
        if not isinstance(fleet, bool):
            raise TypeError(f"fleet={fleet!r}: expected True or False")
        self.fleet = fleet
        # What every query adds: nothing (the scheduler answers for its own cluster),
        # {"fleet": True}, or {"cluster": name} (`oomguard report --cluster`).
        self._scope: dict[str, Any] = {"fleet": True} if fleet else {}

    @property
    def cluster(self) -> str:
        """The name of the cluster whose scheduler answers (its
        ``oomguard.scheduler.cluster-name``, or the name oomguard gave it).

        >>> oomguard.Failures(client).cluster                    # doctest: +SKIP
        'etl-nightly'
        """
        return self.client.sync(
            self.client.scheduler.oomguard_query, what="cluster", callback_timeout=self.timeout
        )

    def __repr__(self) -> str:
        """<Failures tcp://10.0.3.2:8786 12 events, 3 signatures>; counts up to the default
        limits of `events()` and `signatures()` ("1000+ events" past that)."""
        try:
            address = shorten(self.client.scheduler.address, 60)
        except Exception:
            address = "(no scheduler)"
        if getattr(self.client, "status", "running") != "running":
            return f"<Failures {address} (client {self.client.status})>"
        if getattr(self.client, "asynchronous", False):
            return f"<Failures {address}>"  # a query would return a coroutine
        timeout = min(self.timeout or self.repr_timeout, self.repr_timeout)
        try:
            events = self._pages("events", _EVENTS_LIMIT + 1, _before, timeout=timeout)
            signatures = self._query("signatures", limit=_SIGNATURES_LIMIT + 1, timeout=timeout)
        except TimeoutError:
            return f"<Failures {address} (no answer in {timeout:g} s: busy, or no oomguard)>"
        except Exception as e:  # a repr never raises
            return f"<Failures {address} (query failed: {type(e).__name__})>"
        if not isinstance(events, list | tuple) or not isinstance(signatures, list | tuple):
            # Dask answers None for a handler it does not have; rows come back as a list
            # in process and as a tuple over TCP (msgpack).
            return f"<Failures {address} (no answer: is oomguard installed?)>"
        counts = [
            _count(len(events), _EVENTS_LIMIT, "event"),
            _count(len(signatures), _SIGNATURES_LIMIT, "signature"),
        ]
        return f"<Failures {address} {', '.join(counts)}>"

    def _query(self, what: str, *, timeout: float | None = None, **filters: Any) -> Any:
        # An unset filter is left out; limit=None is sent (the scheduler caps every reply).
        filters = {k: v for k, v in filters.items() if v is not None or k == "limit"}
        return self.client.sync(
            self.client.scheduler.oomguard_query,
            what=what,
            callback_timeout=self.timeout if timeout is None else timeout,
            **self._scope,
            **filters,
        )

    def _pages(
        self,
        what: str,
        limit: int | None,
        cursor: Any,
        *,
        timeout: float | None = None,
        **filters: Any,
    ) -> list[dict[str, Any]]:
        """Up to `limit` rows (None: every row) of a list query, page by page: the
        scheduler answers at most a page per call (rows and bytes capped there).
        `cursor(page)` gives the filters that ask for the rows after `page`."""
        rows: list[dict[str, Any]] = []
        after: dict[str, Any] = {}
        while True:
            want = _PAGE_ROWS if limit is None else min(_PAGE_ROWS, limit - len(rows))
            page = self._query(what, limit=want, timeout=timeout, **filters, **after)
            if not isinstance(page, list | tuple):
                return page  # no oomguard there: Dask answers None
            if not page:
                return rows
            rows += page
            if limit is not None and len(rows) >= limit:
                return rows
            after = cursor(page)

    def events(
        self,
        *,
        kind: str | None = None,
        cause: str | None = None,
        pipeline: str | None = None,
        shard: Any = None,
        signature: str | None = None,
        since: float | str | datetime.datetime | datetime.timedelta | None = None,
        limit: int | None = _EVENTS_LIMIT,
        killer: str | None = None,
    ) -> EventList:
        """Failure events, newest first, matching every filter given.

        ``kind`` "infra" or "user"; ``cause`` one of `oomguard.Cause`; ``killer`` who ended
        the worker, one of `oomguard.Killer` ("earlyoom", "kernel", ...); ``shard`` a task key
        (or its str); ``since`` seconds since the epoch, a datetime (naive: local), a
        timedelta back from now, or text as ``oomguard report --since`` takes it ("1h",
        "2026-05-01T14:00"); ``limit`` a positive number, or None for every event.

        >>> failures.events(cause="oom_kill", since="1h").to_pandas()   # doctest: +SKIP
        """
        rows = self._pages(
            "events",
            _filters.limit(limit),
            _before,
            kind=_filters.kind(kind),
            cause=_filters.cause(cause),
            pipeline=_filters.text(pipeline, "pipeline"),
            shard=_filters.shard(shard),
            signature=_filters.text(signature, "signature", "a signature id"),
            since=_filters.since(since),
            killer=_filters.killer(killer),
        )
        if not rows:
            self._hint(pipeline=pipeline, signature=signature)
        return EventList((FailureEvent.from_dict(r) for r in rows), "newest first")

    def deaths(
        self,
        *,
        cause: str | None = None,
        killer: str | None = None,
        pipeline: str | None = None,
        shard: Any = None,
        signature: str | None = None,
        worker: str | None = None,
        since: float | str | datetime.datetime | datetime.timedelta | None = None,
        limit: int | None = _DEATHS_LIMIT,
    ) -> DeathList:
        """Worker deaths, one row each, newest first, matching every filter given: each a
        `Death` with its cause, killer, evidence, signature and its tasks, each with its
        role (`Role`: culprit, suspect, displaced, queued) and pipeline. A death is counted
        here once, as in `oomguard_worker_deaths_total` and in its signature's count; task
        exceptions are not deaths (`events(kind="user")`).

        ``shard`` and ``pipeline`` match a death among whose tasks they are, whatever the
        role: a shard displaced by another pipeline's crash finds that death too (its role
        there says so). The other filters are as for `events`.

        >>> [d.cause for d in failures.deaths(pipeline="etl", since="1d")]  # doctest: +SKIP
        ['oom_kill', 'oom_kill']
        >>> failures.deaths()[0].with_role(Role.DISPLACED)     # doctest: +SKIP
        (Task(key="('agg', 3)", ..., role=<Role.DISPLACED: 'displaced'>, pipeline='report'),)
        """
        rows = self._pages(
            "deaths",
            _filters.limit(limit),
            _before,
            cause=_filters.cause(cause),
            killer=_filters.killer(killer),
            pipeline=_filters.text(pipeline, "pipeline"),
            shard=_filters.shard(shard),
            signature=_filters.text(signature, "signature", "a signature id"),
            worker=_filters.text(worker, "worker", "a worker's address"),
            since=_filters.since(since),
        )
        if not rows:
            self._hint(pipeline=pipeline, signature=signature)
        return DeathList((Death.from_dict(r) for r in rows), "newest first")

    def incidents(
        self,
        *,
        cause: str | None = None,
        killer: str | None = None,
        since: float | str | datetime.datetime | datetime.timedelta | None = None,
        limit: int | None = _INCIDENTS_LIMIT,
    ) -> IncidentList:
        """Incidents, newest first: worker deaths one cause explains (several workers of
        one host, SLURM job or node ended at once by one killer), each an `Incident` with
        its id, start and end, number of deaths, hosts, cause, killer and a one-line
        summary; a death alone is an incident of one. Each death names its incident
        (`Death.incident`). Counts do not change: each death of an incident still counts
        once in its signature, its shard's failures and the abort rules.

        ``cause`` and ``killer`` are those of the incident's first death; ``since`` and
        ``limit`` as for `events`.

        >>> failures.incidents(since="1h")[0].summary         # doctest: +SKIP
        'host node-1: 3 workers within 0.4 s, sigkill; SIGKILL from an unknown sender ...'
        >>> [d for d in failures.deaths() if d.incident == _.id]   # doctest: +SKIP
        """
        fetched = [0]

        def next_page(page: list[dict[str, Any]]) -> dict[str, Any]:
            fetched[0] += len(page)
            return {"offset": fetched[0]}

        rows = self._pages(
            "incidents",
            _filters.limit(limit),
            next_page,
            cause=_filters.cause(cause),
            killer=_filters.killer(killer),
            since=_filters.since(since),
        )
        # A new incident between two pages moves the rows: each once.
        rows = list({(r.get("cluster"), r["id"]): r for r in rows}.values())
        return IncidentList((Incident.from_dict(r) for r in rows), "newest first")

    def _unknown(self, field: str, value: str) -> str | None:
        """Why a filter on `field` ("pipeline", "signature") matched nothing, when the
        history has no such name at all; None when it has (other filters narrowed)."""
        try:
            answer = self._query("known", field=field, value=value)
        except Exception:  # a scheduler of an older oomguard: no hint, still the rows
            return None
        if not isinstance(answer, dict) or answer.get("known", True):
            return None
        what = "signature id" if field == "signature" else field
        return _filters.unknown_name(field, value, what, list(answer.get("names") or ()))

    def _hint(self, **names: str | None) -> None:
        # A UserWarning, not an error: a pipeline may simply not have run yet.
        for field, value in names.items():
            if value is not None and (message := self._unknown(field, value)):
                warnings.warn(message + "; nothing matched.", UserWarning, stacklevel=3)

    def signatures(
        self,
        *,
        cause: str | None = None,
        pipeline: str | None = None,
        since: float | str | datetime.datetime | datetime.timedelta | None = None,
        limit: int | None = _SIGNATURES_LIMIT,
    ) -> SignatureList:
        """Crash signatures seen with ``cause`` / in ``pipeline`` / last seen at or after
        ``since`` (as for `events`), most frequent first."""
        fetched = [0]

        def next_page(page: list[dict[str, Any]]) -> dict[str, Any]:
            fetched[0] += len(page)
            return {"offset": fetched[0]}

        # A count that grows between two pages can move a row: each id once.
        rows = self._pages(
            "signatures",
            _filters.limit(limit),
            next_page,
            cause=_filters.cause(cause),
            pipeline=_filters.text(pipeline, "pipeline"),
            since=_filters.since(since),
        )
        rows = list({r["id"]: r for r in rows}.values())
        if not rows:
            self._hint(pipeline=pipeline)
        return SignatureList((SignatureRow.from_dict(r) for r in rows), "most frequent first")

    def signature(self, signature_id: str) -> SignatureRow:
        """One signature by its id, with its counts across every cluster and its state; an
        id an older grouping version gave it finds it too (its `aliases` list them).
        KeyError naming the id, and the ids there are, when the history has none.

        >>> failures.signature("6d4c109d5cf8c83f").state        # doctest: +SKIP
        'regressed'
        """
        sid = _filters.text(signature_id, "signature_id", "a signature id", required=True)
        row = self._query("signature", signature_id=sid)
        if not row:
            raise KeyError(self._unknown("signature", sid) or f"no signature {sid!r} here")
        return SignatureRow.from_dict(row)

    def resolve(self, signature_id: str, note: str = "", *, by: str | None = None) -> SignatureRow:
        """Mark a signature resolved (fixed): from now on a death with it, on any cluster of
        the history, makes it `regressed` and counts in
        `oomguard_signature_regressions_total`. ``note`` says why (at most 2,000
        characters kept), ``by`` who (default: this process's user name). Resolving a
        signature that is resolved and not seen since changes nothing; an old id
        resolves the signature it is now. KeyError naming an id the history does not
        have; PermissionError where the PostgreSQL history's role reads only. The row,
        resolved (docs/reading-a-report.md, "Signature states").

        >>> failures.resolve("6d4c109d5cf8c83f", note="fixed in shardapp 1.4")  # doctest: +SKIP
        <SignatureRow 6d4c109d5cf8c83f 'SIGSEGV in shardapp.core.parse' resolved count=3 ...>
        """
        return self._resolve(signature_id, note, by)[0]

    def _resolve(self, signature_id: str, note: str, by: str | None) -> tuple[SignatureRow, bool]:
        """`resolve`, and whether it changed anything (`oomguard report --resolve`)."""
        sid = _filters.text(signature_id, "signature_id", "a signature id", required=True)
        if not isinstance(note, str):
            raise TypeError(f"note={note!r}: expected text")
        if by is None:
            by = _filters.user_name()
        elif not isinstance(by, str):
            raise TypeError(f"by={by!r}: expected text")
        reply = self.client.sync(
            getattr(self.client.scheduler, RESOLVE_HANDLER),
            signature_id=sid,
            note=note,
            by=by,
            callback_timeout=self.timeout,
        )
        if not isinstance(reply, dict):
            raise RuntimeError(
                "the scheduler did not answer the resolve: is oomguard of this release there?"
            )
        refused, message = reply.get("refused"), str(reply.get("message", ""))
        if refused == "unknown":
            raise KeyError(self._unknown("signature", sid) or message)
        if refused is not None:
            errors = {"permission": PermissionError, "invalid": ValueError}
            raise errors.get(refused, OSError)(message)
        return SignatureRow.from_dict(reply["signature"]), bool(reply.get("changed"))

    def shard(self, key: Any) -> EventList:
        """The failure history of one shard (task key, or its str), oldest first."""
        key = str(key)
        rows = self._pages(
            "shard", None, lambda page: {"after": [page[-1]["time"], page[-1]["id"]]}, key=key
        )
        return EventList(
            (FailureEvent.from_dict(r) for r in rows), f"shard {shorten(key, 60)}, oldest first"
        )

    def pipeline(self, name: str) -> PipelineStatus:
        """The latest run of the pipeline `name`: all that one ``with span(name)`` block
        submitted, every compute in it (docs/getting-started.md, "Name your pipelines").
        KeyError, naming the pipelines there are, when there is none; every run of it:
        ``[p for p in failures.pipelines() if p.name == name]``.

        >>> failures.pipeline("etl").status                  # doctest: +SKIP
        'aborted'
        """
        status = self._find_pipeline(name)
        if status is None:
            raise KeyError(self._no_pipeline(name))
        return status

    def _find_pipeline(self, name: str) -> PipelineStatus | None:
        """`pipeline(name)`, or None (for `oomguard report`, which prints "none")."""
        row = self._query(
            "pipeline", name=_filters.text(name, "name", "a pipeline name", required=True)
        )
        return PipelineStatus.from_dict(row) if row else None

    def _no_pipeline(self, name: str) -> str:
        names = list(dict.fromkeys(p.name for p in self.pipelines(limit=_PIPELINES_LIMIT)))
        if not names:
            return f"no pipeline named {name!r}: the history has no pipeline runs yet."
        shown = ", ".join(repr(n) for n in names[:_KNOWN_SHOWN])
        if len(names) > _KNOWN_SHOWN:
            shown += f" and {len(names) - _KNOWN_SHOWN} more (see pipelines())"
        message = f"no pipeline named {name!r}; known pipelines, most recent first: {shown}."
        close = _filters.closest(name, names)
        if close is not None:
            message += f" Did you mean {close!r}?"
        base, sep, n = name.rpartition("#")
        if sep and n.isdigit() and base in names:
            message += (
                f" Runs of one pipeline share its name and differ in `started`: "
                f"pipeline({base!r}) is the latest run, [p for p in "
                f"failures.pipelines() if p.name == {base!r}] every run."
            )
        return message

    def pipelines(self, limit: int | None = _PIPELINES_LIMIT) -> PipelineList:
        """Pipeline runs, most recently updated first (a name may come more than once)."""
        rows = self._query("pipelines", limit=_filters.limit(limit))
        return PipelineList(
            (PipelineStatus.from_dict(r) for r in rows), "most recently updated first"
        )


def _before(page: list[dict[str, Any]]) -> dict[str, Any]:
    """The cursor of the events (or deaths) after `page` (newest first)."""
    return {"before": [page[-1]["time"], page[-1]["id"]]}


def _count(n: int, cap: int, noun: str) -> str:
    return f"{cap}+ {noun}s" if n > cap else quantity(n, noun)
