"""`oomguard report`: the failure history, from a running scheduler or from a store file,
and the memory peaks the workers learned.

Three history sections: events (one failure of one shard each), signatures (deduplicated
crashes across hosts) and pipelines (where each stands); and, on request (`--peaks`), the
peaks: per task prefix, the largest memory growth admission learned, read from the workers'
ledger files through `client.run` (or from one ledger file on this host; `_peaks.py`).
Tables fit the terminal (COLUMNS when set) and never cut a shard, a signature id, a pipeline
name or a task prefix: narrower layouts move them to lines of their own; piped to a file,
nothing is shortened. `--json` prints the rows as `to_dict()` of `FailureEvent`,
`SignatureRow`, `PipelineStatus` and `PeakRow`, so `FailureEvent.from_dict(row)` gives back
what `oomguard.Failures` returns.

Errors are one line on stderr, ``oomguard report: ...``; exit 2 for bad arguments, 1 for a
scheduler that cannot be reached or a store or ledger file that cannot be read.

The store file is only read. `FailureStore.start()` on an up-to-date WAL-mode store writes
nothing; it would write (migrate, or switch the journal mode) on an older or non-WAL file,
so such a file is read from a temporary copy. While the WAL holds commits that are not yet
in the main file (a scheduler that is running, or died), a read-only connection stays open
across the store's life, so that closing the store's own connections never checkpoints the
WAL into the main file.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import logging
import os
import shutil
import sqlite3
import sys
import tempfile
from collections.abc import Iterator
from typing import Any, NamedTuple

from .._client import filters as _filters
from .._admission import peaks as _peaks
from .._causes import Cause, Kind
from .._display import clock, one_line, utc_offset
from .._exceptions import ReportFailed, StoreError
from .._units import format_bytes
from .layout import PROSE_WIDTH, Column, Layout, key_line, lay_out, output_width, wrap

PROG = "oomguard report"
#: The failure history: printed when no section is asked for.
HISTORY = ("events", "signatures", "pipelines")
SECTIONS = (*HISTORY, "peaks")
#: The Python API's defaults, so `--json` without `--limit` equals `Failures(client).events()`.
DEFAULT_LIMITS = {"events": 1000, "signatures": 100, "pipelines": 100}

_EPILOG = """\
examples:
  oomguard report --scheduler tcp://scheduler:8786
  oomguard report --store /var/lib/dask/oomguard.sqlite3 --cause oom_kill --since 1h
  oomguard report --scheduler tcp://scheduler:8786 --shard "('load-0a1b', 17)"
  oomguard report --store history.sqlite3 --pipelines --pipeline etl
  oomguard report --store history.sqlite3 --events --json | jq '.events[].evidence'
  oomguard report --scheduler tcp://scheduler:8786 --peaks
  oomguard report --ledger /tmp/oomguard-1000/memory-ledger.json

Filters narrow each section they apply to (never the peaks): --kind, --cause and --since the events (and
--cause, --since the signatures); --pipeline all three; --shard and --signature the events,
and the signatures and pipelines to those the shown events name. --shard alone prints the
shard's whole history oldest first, with evidence; with other filters or --limit, its
newest events. --limit applies to each section (defaults: 1000 events, 100 signatures,
100 pipelines). Times are local unless an ISO time carries an offset.

Tables fit the terminal's width (or COLUMNS); a shard, signature id, pipeline name or task
prefix is never cut: in a narrow terminal it moves to a line of its own. Piped to a
file or another program, nothing is shortened or moved (COLUMNS=N sets a width).

Without a section flag the report prints events, signatures and pipelines; the peaks only
when asked for (--peaks, or --ledger). --peaks prints the memory peaks admission
learned per task prefix, with an oomguard.memory(...) annotation to size from each: with a
scheduler (--scheduler, or the scheduler-address setting), from the ledger file of every
worker host (read only, through client.run; a host's workers share one file); with --ledger
PATH, from that file; with neither, from this host's ledger, where oomguard's settings here
put it (oomguard.worker.admission.ledger, else <crash-dir>/memory-ledger.json). A failure
store holds no peaks: with --store, --peaks needs --ledger. --ledger alone prints only the
peaks.

--json prints one document {"events": [...], "signatures": [...], "pipelines": [...],
"peaks": [...]} (the sections asked for) whose rows are FailureEvent / SignatureRow /
PipelineStatus.to_dict() and {"prefix", "peak" (bytes), "hosts", "suggested"}.

exit status: 0 success; 1 the scheduler, the store or the ledger could not be read; 2 bad
arguments.
"""



# --------------------------------------------------------------------------- arguments


def parse_since(text: str, now: float | None = None) -> float:
    """Seconds since the epoch for `--since`: an ISO time, or a span back from now, checked
    as `oomguard.Failures` checks `since` (`oomguard._client.filters`).

    >>> parse_since("90m", now=10_000.0)
    4600.0
    >>> parse_since("2026-05-01T12:00:00+00:00")
    1777636800.0
    """
    return _filters.for_argparse(_filters.since, now=now)(text)


def _is_key(value: Any) -> bool:
    # Dask's definition (dask.core.iskey): a str, int or float, or a tuple of keys.
    if type(value) is tuple:
        return all(_is_key(part) for part in value)
    return type(value) in (str, int, float)


def parse_shard(text: str) -> str:
    """`--shard`: a task key as `str(key)` writes it; a tuple written another way (other
    quotes or spacing) is written back as `str(key)` does, so it finds the stored events.

    >>> parse_shard('("load-0a1b",17)')
    "('load-0a1b', 17)"
    >>> parse_shard("load-0a1b")
    'load-0a1b'
    """
    s = text.strip()
    if not s:
        why = "it is empty"
    elif any(ord(c) < 32 or ord(c) == 127 for c in s):
        why = "it holds a control character"
    elif s.startswith(("(", "[")):
        # str() of a tuple key; a str key that begins so is never made by Dask's naming.
        try:
            key = ast.literal_eval(s)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            key = None
        if type(key) is tuple and _is_key(key):
            return str(key)
        why = "it begins like a tuple but is not a tuple of strings and numbers"
    elif s.count("(") != s.count(")") or s.count("[") != s.count("]"):
        why = "its brackets do not pair up, as in a key copied in part"
    else:
        return s
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a task key: {why}; give the key as str(key) writes it, e.g. "
        "\"('load-0a1b', 17)\" or load-0a1b"
    )


def _seconds(text: str) -> float:
    try:
        s = float(text)
    except ValueError:
        s = 0.0
    if not s > 0 or s == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return s


def _usage_error(message: str) -> None:
    print(f"{PROG}: {' '.join(str(message).split())}", file=sys.stderr)
    sys.exit(2)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "report",
        help="print the failure history (events, signatures, pipelines) and learned peaks",
        description="Print the failure history a scheduler keeps: failure events, crash\n"
        "signatures and pipeline statuses, from a running scheduler or a store file; and\n"
        "the memory peaks the workers learned per task prefix (--peaks).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--scheduler", metavar="ADDRESS", help="a running scheduler, e.g. "
                     "tcp://10.0.0.5:8786 (default: Dask's scheduler-address setting, "
                     "DASK_SCHEDULER_ADDRESS)")  # fmt: skip
    src.add_argument("--store", metavar="PATH", help="a failure store file (read only)")
    p.add_argument(
        "--timeout", type=_seconds, default=5.0, metavar="SECONDS",
        help="for the connection to the scheduler and each query (default 5)",
    )  # fmt: skip
    for name in HISTORY:
        p.add_argument(f"--{name}", action="store_true", help=f"print the {name} section")
    p.add_argument("--peaks", action="store_true", help="print the memory peaks learned per "
                   "task prefix, with a suggested oomguard.memory(...) for each")  # fmt: skip
    p.add_argument("--ledger", metavar="PATH", help="read the peaks from this memory ledger "
                   "file (read only; implies --peaks)")  # fmt: skip
    p.add_argument("--kind", choices=[k.value for k in Kind], help="infra or user")
    causes = [c.value for c in Cause]
    p.add_argument("--cause", choices=causes, metavar="CAUSE", help=", ".join(causes))
    p.add_argument("--pipeline", metavar="NAME")
    p.add_argument("--shard", type=parse_shard, metavar="KEY",
                   help="a task key as str(key) writes it, e.g. \"('load', 7)\" or load-0a1b")  # fmt: skip
    p.add_argument("--signature", metavar="ID")
    p.add_argument("--since", type=parse_since, metavar="WHEN",
                   help="an ISO time, or a span back from now: 30m, 1h, 2d")  # fmt: skip
    p.add_argument("--limit", type=_filters.for_argparse(_filters.limit, int, allow_none=False),
                   metavar="N", help="rows per section")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=run)

    # Errors in one line, not argparse's usage block (instance attributes: other
    # subcommands keep the default behaviour).
    p.error = _usage_error  # type: ignore[method-assign]
    parse_known = p.parse_known_args

    def parse_known_args(args=None, namespace=None):
        # The top-level parser would report our unknown arguments with its usage block.
        ns, extras = parse_known(args, namespace)
        if extras:
            _usage_error(f"unrecognized arguments: {' '.join(extras)}")
        return ns, extras

    p.parse_known_args = parse_known_args  # type: ignore[method-assign]
    return p


# --------------------------------------------------------------------------- sources


class _SchedulerSource:
    """The reads of `oomguard.Failures`, each bounded by a timeout."""

    def __init__(self, client: Any, timeout: float) -> None:
        from .._client.api import Failures

        self.failures = Failures(client, timeout=timeout)
        self.events = self.failures.events
        self.shard = self.failures.shard
        self.signatures = self.failures.signatures
        self.pipelines = self.failures.pipelines

    def pipeline(self, name: str) -> Any:
        try:
            return self.failures.pipeline(name)
        except KeyError:  # an unknown name: the report says there is none, as from a store
            return None

    def signature(self, signature_id: str) -> Any:
        from .._models import SignatureRow

        row = self.failures._query("signature", signature_id=signature_id)
        return SignatureRow.from_dict(row) if row else None


@contextlib.contextmanager
def _connected(address: str, timeout: float) -> Iterator[Any]:
    """A Client of the scheduler at `address`, closed on the way out."""
    from distributed import Client
    from distributed.comm import resolve_address

    quiet = {name: logging.getLogger(name) for name in ("distributed", "tornado", "asyncio")}
    levels = {name: log.level for name, log in quiet.items()}
    for log in quiet.values():  # their warnings would add lines to our one-line errors
        log.setLevel(logging.CRITICAL)
    client = None
    try:
        try:
            # A Client that fails on a malformed address hangs 10 s in __del__ at exit.
            resolve_address(address)
            client = Client(address, timeout=timeout, set_as_default=False)
        except Exception as e:
            raise ReportFailed(f"cannot reach the scheduler at {address}: {one_line(e)}") from e
        yield client
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close(timeout=timeout)
        for name, log in quiet.items():
            log.setLevel(levels[name])


def _scheduler_source(client: Any, address: str, timeout: float) -> _SchedulerSource:
    source = _SchedulerSource(client, timeout)
    try:
        # Without the handler Dask logs a warning and answers nothing, or None.
        stats = source.failures._query("stats")
    except TimeoutError:
        stats = None
    if not isinstance(stats, dict):
        raise ReportFailed(
            f"the scheduler at {address} did not answer oomguard's query within "
            f"{timeout:g} s: is oomguard loaded there (dask scheduler --preload "
            "oomguard.scheduler_plugin, or oomguard.install(client))? A busy scheduler "
            "may need a larger --timeout."
        )
    return source


@contextlib.contextmanager
def _store_source(path: str) -> Iterator[Any]:
    from .._store import FailureStore

    try:
        readable, guard_needed = _check_store(path)
    except StoreError as e:
        raise ReportFailed(one_line(e)) from e
    tmpdir = None
    if readable is None:  # FailureStore.start() would write to this file: read a copy
        tmpdir = tempfile.mkdtemp(prefix="oomguard-report-")
        readable = os.path.join(tmpdir, "store.sqlite3")
        try:
            shutil.copyfile(path, readable)
            if os.path.exists(path + "-wal"):
                shutil.copyfile(path + "-wal", readable + "-wal")
        except OSError as e:
            shutil.rmtree(tmpdir, ignore_errors=True)
            raise ReportFailed(f"cannot copy the failure store {path}: {one_line(e)}") from e
    guard = None
    store = FailureStore(readable)
    try:
        try:
            store.start()
            if guard_needed:
                guard = _connect_ro(readable)
                # A read makes it open the WAL and hold its shared lock; an idle connection
                # holds nothing, and the last store connection to close would checkpoint.
                guard.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except (StoreError, sqlite3.Error) as e:
            raise ReportFailed(f"cannot read the failure store {path}: {one_line(e)}") from e
        yield store
    finally:
        store.close()  # a guard still open keeps this from checkpointing the WAL
        if guard is not None:
            guard.close()  # read-only: cannot checkpoint either
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)


def _connect_ro(path: str) -> sqlite3.Connection:
    import pathlib

    uri = pathlib.Path(os.path.abspath(path)).as_uri() + "?mode=ro"
    return sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)


def _check_store(path: str) -> tuple[str | None, bool]:
    """(path, keep a guard) when FailureStore can read `path` without writing to it,
    (None, False) when it must read a copy; StoreError when it is no store at all."""
    from .._store import FailureStore

    if not os.path.exists(path):
        raise StoreError(f"no failure store at {path}: the file does not exist")
    if not os.path.isfile(path):
        raise StoreError(f"{path} is not a file")
    if os.path.getsize(path) == 0:
        raise StoreError(f"{path} is empty, not a failure store")
    known = len(FailureStore.migrations)
    # Read-only connections to a WAL file create its -wal and -shm; only a connection that
    # can write removes them, so remove ours unless the store's own connections will.
    sidecars = [f"{path}-{s}" for s in ("wal", "shm") if not os.path.exists(f"{path}-{s}")]
    result: tuple[str | None, bool] = (None, False)
    try:
        result = _check_sqlite(path, known)
        return result
    finally:
        if result[0] is None:
            for name in sidecars:
                with contextlib.suppress(OSError):
                    os.remove(name)


def _check_sqlite(path: str, known: int) -> tuple[str | None, bool]:
    from .._store import check_file

    # Read-only; StoreError for not SQLite, another app's, too new. It builds a file URI,
    # which needs an absolute path.
    check_file(os.path.abspath(path), known)
    with open(path, "rb") as f:
        header = f.read(100)
    try:
        conn = _connect_ro(path)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise StoreError(f"cannot read the failure store {path}: {e}") from e
    if version == 0:
        raise StoreError(f"{path} is an empty SQLite database, not an oomguard failure store")
    wal_mode = header[18:20] == b"\x02\x02"
    if version < known or not wal_mode:
        return None, False  # start() would migrate it, or switch it to WAL
    wal = path + "-wal"
    return path, os.path.exists(wal) and os.path.getsize(wal) > 0


# --------------------------------------------------------------------------- reading


def shard_history(args: argparse.Namespace) -> bool:
    """`--shard` alone: the whole history of the shard, oldest first (`Failures.shard`)."""
    narrowing = (args.kind, args.cause, args.pipeline, args.signature, args.since, args.limit)
    return args.shard is not None and all(v is None for v in narrowing)


def collect(source: Any, args: argparse.Namespace, sections: tuple[str, ...]) -> dict[str, list]:
    """The rows of each section (model objects), filtered as the arguments say."""
    out: dict[str, list] = {}
    need_events = "events" in sections or args.shard is not None or args.signature is not None
    events: list = []
    if need_events:
        if shard_history(args):
            events = source.shard(args.shard)
        else:
            events = source.events(
                kind=args.kind, cause=args.cause, pipeline=args.pipeline, shard=args.shard,
                signature=args.signature, since=args.since,
                limit=args.limit or DEFAULT_LIMITS["events"],
            )  # fmt: skip
    if "events" in sections:
        out["events"] = events
    by_events = args.shard is not None or args.signature is not None
    if "signatures" in sections:
        if by_events:
            ids = [args.signature] if args.signature is not None else []
            ids += [e.signature_id for e in events if e.signature_id]
            rows = [source.signature(i) for i in dict.fromkeys(ids)]
            out["signatures"] = [r for r in rows if r is not None][: args.limit or None]
        else:
            out["signatures"] = source.signatures(
                cause=args.cause, pipeline=args.pipeline, since=args.since,
                limit=args.limit or DEFAULT_LIMITS["signatures"],
            )  # fmt: skip
    if "pipelines" in sections:
        if args.pipeline is not None or by_events:
            names = [args.pipeline] if args.pipeline is not None else []
            if by_events:
                names += [e.pipeline for e in events if e.pipeline]
            rows = [source.pipeline(n) for n in dict.fromkeys(names)]
            out["pipelines"] = [r for r in rows if r is not None][: args.limit or None]
        else:
            out["pipelines"] = source.pipelines(limit=args.limit or DEFAULT_LIMITS["pipelines"])
    return out


class PeaksRead(NamedTuple):
    """The peaks section: its rows (`_peaks.PeakRow`), where they were read (a ledger path,
    or the scheduler whose workers were asked), the ledgers read, and notes on what was not."""

    rows: list
    source: str
    ledgers: list
    notes: list[str]
    from_workers: bool


def peaks_from_file(path: str) -> PeaksRead:
    """The peaks of one ledger file on this host; ReportFailed when it cannot be read."""
    try:
        ledger = _peaks.read_ledger(path)
    except OSError as e:
        raise ReportFailed(f"cannot read the memory ledger {path}: "
                           f"{e.strerror or one_line(e)}") from e  # fmt: skip
    return PeaksRead(_peaks.merge([ledger]), path, [ledger], _peaks.notes([ledger]), False)


def peaks_from_workers(client: Any, address: str, timeout: float) -> PeaksRead:
    """The peaks of every worker host's ledger, each file read once (`client.run`)."""
    try:
        results = client.run(_peaks.worker_ledger_peaks, on_error="return",
                             callback_timeout=timeout)  # fmt: skip
    except TimeoutError as e:
        raise ReportFailed(f"the workers of the scheduler at {address} did not answer within "
                           f"{timeout:g} s (try a larger --timeout)") from e  # fmt: skip
    ledgers = _peaks.from_workers(results)
    return PeaksRead(_peaks.merge(ledgers), address, ledgers, _peaks.notes(ledgers), True)


# --------------------------------------------------------------------------- rendering
#
# Tables fit the terminal without cutting what a user copies (a shard, a signature id, a
# pipeline name): each table has layouts from the widest to the narrowest, and the first
# whose rows fit is printed. Narrower layouts shorten only the events' signature title
# (SIGNATURES prints it whole) and host, then move keys to lines of their own under the row.


_EVENT_COLUMNS = [
    Column("TIME"), Column("KIND"), Column("CAUSE"), Column("#", right=True),
    Column("SHARD", "shard"), Column("PIPELINE", "pipeline"), Column("HOST", "host"),
    Column("SIGNATURE", "signature"), Column("TITLE", key=False),
]  # fmt: skip
_FIRST = ("TIME", "KIND", "CAUSE", "#")
_EVENT_LAYOUTS = [
    Layout((*_FIRST, "SHARD", "PIPELINE", "HOST", "SIGNATURE", "TITLE"), shorten={"TITLE": 16}),
    Layout((*_FIRST, "SHARD", "PIPELINE", "HOST", "SIGNATURE")),
    Layout((*_FIRST, "SHARD", "PIPELINE", "HOST", "SIGNATURE"), shorten={"HOST": 12}),
    Layout((*_FIRST, "HOST", "SIGNATURE", "TITLE"), below=("SHARD", "PIPELINE"),
           shorten={"TITLE": 16}),
    Layout((*_FIRST, "HOST", "SIGNATURE"), below=("SHARD", "PIPELINE")),
    Layout((*_FIRST, "SIGNATURE"), below=("SHARD", "PIPELINE", "HOST")),
    Layout(_FIRST, below=("SIGNATURE", "SHARD", "PIPELINE", "HOST")),
]  # fmt: skip
#: One shard's history: the shard is in the head line; worker and signature under each row.
_HISTORY_LAYOUTS = [
    Layout((*_FIRST, "PIPELINE", "HOST")),
    Layout((*_FIRST, "HOST"), below=("PIPELINE",)),
    Layout(_FIRST, below=("PIPELINE", "HOST")),
]


def render_events(events: list, *, history: bool, width: int | None = None,
                  shard: str | None = None, empty: list[str] | None = None,
                  titles: str = "") -> list[str]:  # fmt: skip
    """The events section. `empty`: the lines that say why there are none; `titles`: where
    the signature titles are when the table has no room for them."""
    order = "oldest first" if history else "newest first"
    head = [f"EVENTS: {len(events)}, {order}, times {utc_offset()}"]
    if shard is not None and history:
        head = key_line(head[0] + ", shard", shard, width)
    if not events:
        return head + (empty or ["  no events recorded"])
    rows = [[clock(e.time), e.kind, e.cause, e.attempt, e.shard, e.pipeline, e.host,
             e.signature_id, e.signature_title] for e in events]  # fmt: skip
    layouts = _HISTORY_LAYOUTS if history else _EVENT_LAYOUTS
    layout, header, blocks = lay_out(_EVENT_COLUMNS, rows, layouts, width)
    lines = head + header
    for e, block in zip(events, blocks, strict=True):
        lines += block
        if not history:
            continue
        title = one_line(e.signature_title or "?")
        held = (title,) if 4 + len(title) <= min(width or PROSE_WIDTH, PROSE_WIDTH) else ()
        lines += wrap(f"worker {e.worker or '?'}; signature {e.signature_id or '?'}: {title}",
                       width, "    ", hold=held)  # fmt: skip
        summary = e.evidence.get("summary") if isinstance(e.evidence, dict) else None
        if isinstance(summary, str) and summary:
            lines += wrap(summary, width, "    ")
        pairs = [f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in e.evidence.items()
                 if k != "summary"]  # fmt: skip
        if pairs:
            lines += wrap("evidence: " + ", ".join(pairs), width, "    ")
    if not history and "TITLE" not in layout.row and titles:
        lines += wrap(f"(no room for signature titles: {titles})", width, "  ")
    return lines


_SIGNATURE_COLUMNS = [
    Column("ID"), Column("COUNT", right=True), Column("HOSTS", right=True), Column("LAST SEEN"),
    Column("CAUSES", "causes"), Column("TITLE", key=False),
]  # fmt: skip
_SIGNATURE_LAYOUTS = [
    Layout(("ID", "COUNT", "HOSTS", "LAST SEEN", "CAUSES", "TITLE")),
    Layout(("ID", "COUNT", "HOSTS", "LAST SEEN", "CAUSES"), below=("TITLE",)),
    Layout(("ID", "COUNT", "HOSTS", "LAST SEEN"), below=("CAUSES", "TITLE")),
]


def render_signatures(rows: list, *, width: int | None = None,
                      empty: list[str] | None = None) -> list[str]:  # fmt: skip
    head = f"SIGNATURES: {len(rows)}, most frequent first"
    if not rows:
        return [head] + (empty or ["  no signatures recorded"])
    body = [[s.id, s.count, len(s.hosts), clock(s.last_seen), ",".join(s.causes), s.title]
            for s in rows]  # fmt: skip
    _, header, blocks = lay_out(_SIGNATURE_COLUMNS, body, _SIGNATURE_LAYOUTS, width)
    return [head, *header, *(line for block in blocks for line in block)]


_COUNTS = ("DONE", "FAILED", "ABORTED", "INFRA", "USER")
_PIPELINE_COLUMNS = [Column("NAME"), Column("STATUS"),
                     *(Column(h, h.lower(), right=True) for h in _COUNTS)]  # fmt: skip
_PIPELINE_LAYOUTS = [
    Layout(("NAME", "STATUS", *_COUNTS)),
    Layout(("STATUS", *_COUNTS), above=("NAME",)),
    Layout(("STATUS",), above=("NAME",), below=_COUNTS),
]


def render_pipelines(rows: list, *, width: int | None = None,
                     empty: list[str] | None = None) -> list[str]:  # fmt: skip
    head = f"PIPELINES: {len(rows)}, most recently updated first"
    if not rows:
        return [head] + (empty or ["  no pipelines recorded"])
    body = [[p.name, p.status, p.shards_done, p.shards_failed, p.shards_aborted,
             p.infra_failures, p.user_failures] for p in rows]  # fmt: skip
    _, header, blocks = lay_out(_PIPELINE_COLUMNS, body, _PIPELINE_LAYOUTS, width)
    lines = [head, *header, *(line for block in blocks for line in block)]
    for p in rows:
        if p.summary or p.abort_reason:
            lines.append("")
            lines += wrap(f"{p.name}: {p.summary}", width, "  ", hold=(p.name,))
            if p.abort_reason:
                lines += wrap(p.abort_reason, width, "    ", hold=(p.name,))
    return lines


_PEAK_COLUMNS = [Column("PREFIX"), Column("PEAK", right=True), Column("HOSTS", "hosts"),
                 Column("SUGGESTED", "suggested")]  # fmt: skip
#: A long prefix keeps its place in the row longest; the suggestion and hosts move under it.
_PEAK_LAYOUTS = [
    Layout(("PREFIX", "PEAK", "HOSTS", "SUGGESTED")),
    Layout(("PREFIX", "PEAK", "SUGGESTED"), below=("HOSTS",)),
    Layout(("PREFIX", "PEAK"), below=("SUGGESTED", "HOSTS")),
    Layout(("PEAK", "SUGGESTED"), above=("PREFIX",), below=("HOSTS",)),
    Layout(("PEAK",), above=("PREFIX",), below=("SUGGESTED", "HOSTS")),
]


def render_peaks(read: PeaksRead, *, width: int | None = None) -> list[str]:
    """The peaks section: the start-up peak first, then the largest first; notes under it."""
    if read.from_workers:
        hosts = len({lg.host for lg in read.ledgers if lg.path != "?"})
        lines = [f"PEAKS: {len(read.rows)}, largest first, from the memory ledgers of {hosts} "
                 f"worker host{'s' if hosts != 1 else ''}"]  # fmt: skip
    else:
        lines = key_line(f"PEAKS: {len(read.rows)}, largest first, from", read.source, width)
    if read.rows:
        body = [[r.label, format_bytes(r.peak), ",".join(r.hosts), r.suggested]
                for r in read.rows]  # fmt: skip
        _, header, blocks = lay_out(_PEAK_COLUMNS, body, _PEAK_LAYOUTS, width)
        lines += [*header, *(line for block in blocks for line in block)]
        if any(r.suggested for r in read.rows):
            lines += wrap("(SUGGESTED: the peak rounded up to 16 MiB; add a margin for "
                          "larger inputs)", width, "  ")  # fmt: skip
    elif not read.ledgers:
        lines.append("  no workers to ask")
    elif all(lg.missing for lg in read.ledgers):
        where = "no worker host has a memory ledger" if read.from_workers else "no such file"
        lines += wrap(f"no peaks learned yet: {where}", width, "  ")
    elif all(lg.missing or lg.note for lg in read.ledgers):
        lines.append("  no peaks read: see the notes")
    else:
        lines += wrap("no peaks learned yet: a peak is learned from a task that ran alone in its "
                      "worker and grew its memory by at least "
                      "oomguard.worker.admission.min-estimate", width, "  ")  # fmt: skip
    for note in read.notes:
        lines += wrap(f"note: {note}", width, "  ")
    return lines


def _empty(what: str, args: argparse.Namespace, width: int | None) -> list[str]:
    """Why a section has no rows, in words: never a bare "none"."""
    narrowed = any(v is not None for v in (args.kind, args.cause, args.pipeline,
                                           args.signature, args.since))  # fmt: skip
    if args.shard is not None:
        prefix = "  with these filters, no" if narrowed else "  no"
        return key_line(f"{prefix} {what} for shard", args.shard, width)
    return [f"  no {what} match these filters" if narrowed else f"  no {what} recorded"]


# --------------------------------------------------------------------------- the command


def _sections(args: argparse.Namespace) -> tuple[str, ...]:
    """The sections asked for: the history by default; --ledger adds the peaks, and alone
    (no --scheduler, no --store) asks for the peaks only."""
    asked = [s for s in SECTIONS if getattr(args, s)]
    if not asked and (args.ledger is None or args.scheduler or args.store):
        asked = list(HISTORY)
    if args.ledger is not None and "peaks" not in asked:
        asked.append("peaks")
    return tuple(asked)


def run(args: argparse.Namespace) -> int:
    sections = _sections(args)
    history = tuple(s for s in sections if s != "peaks")
    # Where the peaks come from: the --ledger file, the scheduler's workers, or this host.
    workers = "peaks" in sections and args.ledger is None
    if args.scheduler is None and args.store is None and (history or workers):
        import dask

        args.scheduler = dask.config.get("scheduler-address", None) or None
        if args.scheduler is None and history:
            print(f"{PROG}: give --scheduler ADDRESS or --store PATH (or set "
                  "DASK_SCHEDULER_ADDRESS)", file=sys.stderr)  # fmt: skip
            return 2
    ledger = args.ledger
    if workers and args.scheduler is None:
        if args.store is not None:
            _usage_error("--peaks: a failure store holds no memory peaks; give --ledger PATH "
                         "(a memory ledger file on this host) or --scheduler ADDRESS")  # fmt: skip
        workers = False
        try:
            ledger = _peaks.configured_ledger()
        except Exception as e:  # ConfigError: a bad oomguard setting here
            print(f"{PROG}: cannot tell where this host's memory ledger is: {one_line(e)}",
                  file=sys.stderr)  # fmt: skip
            return 1
    data: dict[str, Any] = {}
    try:
        if args.scheduler is not None and (history or workers):
            with _connected(args.scheduler, args.timeout) as client:
                if history:
                    data = _collect(_scheduler_source(client, args.scheduler, args.timeout),
                                    args, history)  # fmt: skip
                if workers:
                    data["peaks"] = peaks_from_workers(client, args.scheduler, args.timeout)
        elif history:
            with _store_source(args.store) as source:
                data = _collect(source, args, history)
        if ledger is not None:
            data["peaks"] = peaks_from_file(ledger)
    except ReportFailed as e:
        print(f"{PROG}: {one_line(e)}", file=sys.stderr)
        return 1
    except Exception as e:  # anything else is still one line, never a traceback
        where = f"the scheduler at {args.scheduler}" if args.scheduler else args.store or ledger
        print(f"{PROG}: reading {where} failed: {type(e).__name__}: {one_line(e)}",
              file=sys.stderr)  # fmt: skip
        return 1
    return _print(data, sections, args)


def _collect(source: Any, args: argparse.Namespace, sections: tuple[str, ...]) -> dict[str, Any]:
    try:
        return collect(source, args, sections)
    except ReportFailed:
        raise
    except TimeoutError as e:
        raise ReportFailed(
            f"the scheduler at {args.scheduler} did not answer within "
            f"{args.timeout:g} s (try a larger --timeout)"
        ) from e
    except sqlite3.Error as e:
        raise ReportFailed(f"cannot read the failure store {args.store}: "
                           f"{one_line(e)}") from e  # fmt: skip


def _print(data: dict[str, Any], sections: tuple[str, ...], args: argparse.Namespace) -> int:
    if args.json:
        doc = {name: [row.to_dict() for row in
                      (data[name].rows if name == "peaks" else data[name])]
               for name in sections}  # fmt: skip
        text = json.dumps(doc, indent=2)
        for note in data["peaks"].notes if "peaks" in data else ():  # the document has rows only
            print(f"{PROG}: note: {one_line(note)}", file=sys.stderr)
    else:
        width = output_width()
        blocks = []
        if "events" in data:
            titles = ("SIGNATURES below" if "signatures" in data
                      else "oomguard report --signatures --signature ID")  # fmt: skip
            blocks.append(render_events(
                data["events"], history=shard_history(args), width=width, shard=args.shard,
                empty=_empty("events", args, width), titles=titles,
            ))  # fmt: skip
        if "signatures" in data:
            blocks.append(render_signatures(data["signatures"], width=width,
                                            empty=_empty("signatures", args, width)))  # fmt: skip
        if "pipelines" in data:
            blocks.append(render_pipelines(data["pipelines"], width=width,
                                           empty=_empty("pipelines", args, width)))  # fmt: skip
        if "peaks" in data:
            blocks.append(render_peaks(data["peaks"], width=width))
        text = "\n\n".join("\n".join(b) for b in blocks)
    try:
        with contextlib.suppress(AttributeError, ValueError):
            sys.stdout.reconfigure(errors="replace")  # type: ignore[union-attr]
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `oomguard report | head`
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
