"""`oomguard report`: the failure history, from a running scheduler or from a store file.

Three sections: events (one failure of one shard each), signatures (deduplicated crashes
across hosts) and pipelines (where each stands). Tables fit 100 columns; `--json` prints the
rows as `to_dict()` of `FailureEvent`, `SignatureRow` and `PipelineStatus`, so
`FailureEvent.from_dict(row)` gives back what `oomguard.Failures` returns.

Errors are one line on stderr, ``oomguard report: ...``; exit 2 for bad arguments, 1 for a
scheduler that cannot be reached or a store file that cannot be read.

The store file is only read. `FailureStore.start()` on an up-to-date WAL-mode store writes
nothing; it would write (migrate, or switch the journal mode) on an older or non-WAL file,
so such a file is read from a temporary copy. While the WAL holds commits that are not yet
in the main file (a scheduler that is running, or died), a read-only connection stays open
across the store's life, so that closing the store's own connections never checkpoints the
WAL into the main file.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import re
import shutil
import sqlite3
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from typing import Any

from ._causes import Cause, Kind

PROG = "oomguard report"
WIDTH = 100
SECTIONS = ("events", "signatures", "pipelines")
#: The Python API's defaults, so `--json` without `--limit` equals `Failures(client).events()`.
DEFAULT_LIMITS = {"events": 1000, "signatures": 100, "pipelines": 100}

_EPILOG = """\
examples:
  oomguard report --scheduler tcp://scheduler:8786
  oomguard report --store /var/lib/dask/oomguard.sqlite3 --cause oom_kill --since 1h
  oomguard report --scheduler tcp://scheduler:8786 --shard "('load-0a1b', 17)"
  oomguard report --store history.sqlite3 --pipelines --pipeline etl
  oomguard report --store history.sqlite3 --events --json | jq '.events[].evidence'

Filters narrow each section they apply to: --kind, --cause and --since the events (and
--cause, --since the signatures); --pipeline all three; --shard and --signature the events,
and the signatures and pipelines to those the shown events name. --shard alone prints the
shard's whole history oldest first, with evidence; with other filters or --limit, its
newest events. --limit applies to each section (defaults: 1000 events, 100 signatures,
100 pipelines). Times are local unless an ISO time carries an offset.

--json prints one document {"events": [...], "signatures": [...], "pipelines": [...]} (the
sections asked for) whose rows are FailureEvent / SignatureRow / PipelineStatus.to_dict().

exit status: 0 success; 1 the scheduler or the store could not be read; 2 bad arguments.
"""

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d|w)$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class ReportFailed(Exception):
    """Reading the history failed; the message is the one line the user sees."""


# --------------------------------------------------------------------------- arguments


def parse_since(text: str, now: float | None = None) -> float:
    """Seconds since the epoch for `--since`: an ISO time, or a span back from now.

    >>> parse_since("90m", now=10_000.0)
    4600.0
    >>> parse_since("2026-05-01T12:00:00+00:00")
    1777636800.0
    """
    s = text.strip()
    m = _RELATIVE.match(s.lower())
    if m:
        if now is None:
            now = datetime.datetime.now().timestamp()
        return now - float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    try:
        when = datetime.datetime.fromisoformat(s)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an ISO time (2026-05-01T14:00, local unless it has an "
            "offset) nor a span back from now (90s, 30m, 1h, 2d, 1w)"
        ) from None
    return when.timestamp()  # a naive time is local time


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return n


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
        help="print the failure history: events, signatures, pipelines",
        description="Print the failure history a scheduler keeps: failure events, crash\n"
        "signatures and pipeline statuses, from a running scheduler or a store file.",
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
    for name in SECTIONS:
        p.add_argument(f"--{name}", action="store_true", help=f"print the {name} section")
    p.add_argument("--kind", choices=[k.value for k in Kind], help="infra or user")
    causes = [c.value for c in Cause]
    p.add_argument("--cause", choices=causes, metavar="CAUSE", help=", ".join(causes))
    p.add_argument("--pipeline", metavar="NAME")
    p.add_argument("--shard", metavar="KEY", help="a task key as str(key), e.g. \"('load', 7)\"")
    p.add_argument("--signature", metavar="ID")
    p.add_argument("--since", type=parse_since, metavar="WHEN",
                   help="an ISO time, or a span back from now: 30m, 1h, 2d")  # fmt: skip
    p.add_argument("--limit", type=_positive_int, metavar="N", help="rows per section")
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
        from ._api import Failures

        self.failures = Failures(client, timeout=timeout)
        self.events = self.failures.events
        self.shard = self.failures.shard
        self.signatures = self.failures.signatures
        self.pipeline = self.failures.pipeline
        self.pipelines = self.failures.pipelines

    def signature(self, signature_id: str) -> Any:
        from ._models import SignatureRow

        row = self.failures._query("signature", signature_id=signature_id)
        return SignatureRow.from_dict(row) if row else None


@contextlib.contextmanager
def _scheduler_source(address: str, timeout: float) -> Iterator[_SchedulerSource]:
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
            raise ReportFailed(f"cannot reach the scheduler at {address}: {_one_line(e)}") from e
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
        yield source
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close(timeout=timeout)
        for name, log in quiet.items():
            log.setLevel(levels[name])


@contextlib.contextmanager
def _store_source(path: str) -> Iterator[Any]:
    from ._store import FailureStore, StoreError

    try:
        readable, guard_needed = _check_store(path)
    except StoreError as e:
        raise ReportFailed(_one_line(e)) from e
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
            raise ReportFailed(f"cannot copy the failure store {path}: {_one_line(e)}") from e
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
            raise ReportFailed(f"cannot read the failure store {path}: {_one_line(e)}") from e
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
    from ._store import FailureStore, StoreError

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
    from ._store import StoreError, _inspect

    _inspect(path, known)  # read-only; StoreError for not SQLite, another app's, too new
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


# --------------------------------------------------------------------------- rendering


def _one_line(value: Any) -> str:
    return " ".join(str(value).split())


def _clock(t: float) -> str:
    try:
        return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return str(t)


def _cell(value: Any) -> str:
    return _one_line("" if value is None else value)


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def table(headers: list[str], rows: list[list[Any]], *, right: frozenset[int] = frozenset(),
          width: int = WIDTH) -> list[str]:  # fmt: skip
    """Rows under headers, two spaces apart, the widest columns shortened to fit `width`.

    >>> table(["A", "NAME"], [[1, "x" * 200]], right=frozenset({0}), width=20)[1]
    '1  xxxxxxxxxxxxxxxx…'
    """
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    gaps = 2 * (len(headers) - 1)
    while sum(widths) + gaps > width:
        i = max(range(len(widths)), key=lambda j: widths[j])
        if widths[i] <= max(4, len(headers[i])):
            break  # cannot shrink further without losing the headers
        widths[i] -= 1
    lines = []
    for row in [headers] + cells:
        parts = []
        for i, text in enumerate(row):
            text = _fit(text, widths[i])
            parts.append(text.rjust(widths[i]) if i in right else text.ljust(widths[i]))
        lines.append("  ".join(parts).rstrip())
    return lines


def _wrap(text: str, indent: str) -> list[str]:
    return textwrap.wrap(_one_line(text), WIDTH, initial_indent=indent,
                         subsequent_indent=indent, break_on_hyphens=False) or [indent]  # fmt: skip


def _utc_offset() -> str:
    offset = datetime.datetime.now().astimezone().strftime("%z")
    return f"UTC{offset[:3]}:{offset[3:]}" if offset else "local"


def render_events(events: list, *, history: bool) -> list[str]:
    order = "oldest first" if history else "newest first"
    head = f"EVENTS: {len(events)}, {order}, times {_utc_offset()}"
    if not events:
        return [head, "  none"]
    rows = [[_clock(e.time), e.kind, e.cause, e.attempt, e.shard, e.pipeline, e.host,
             e.signature_title] for e in events]  # fmt: skip
    headers = ["TIME", "KIND", "CAUSE", "#", "SHARD", "PIPELINE", "HOST", "SIGNATURE"]
    lines = [head]
    if not history:
        return lines + table(headers, rows, right=frozenset({3}))
    for e, line in zip(events, table(headers, rows, right=frozenset({3}))[1:], strict=True):
        lines.append(line)
        lines.extend(_wrap(f"worker {e.worker or '?'}; signature {e.signature_id or '?'}: "
                           f"{e.signature_title or '?'}", "    "))  # fmt: skip
        summary = e.evidence.get("summary") if isinstance(e.evidence, dict) else None
        if isinstance(summary, str) and summary:
            lines.extend(_wrap(summary, "    "))
        pairs = [f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in e.evidence.items()
                 if k != "summary"]  # fmt: skip
        if pairs:
            lines.extend(_wrap("evidence: " + ", ".join(pairs), "    "))
    return lines


def render_signatures(rows: list) -> list[str]:
    head = f"SIGNATURES: {len(rows)}, most frequent first"
    if not rows:
        return [head, "  none"]
    body = [[s.id, s.count, len(s.hosts), _clock(s.last_seen), ",".join(s.causes), s.title]
            for s in rows]  # fmt: skip
    headers = ["ID", "COUNT", "HOSTS", "LAST SEEN", "CAUSES", "TITLE"]
    return [head] + table(headers, body, right=frozenset({1, 2}))


def render_pipelines(rows: list) -> list[str]:
    head = f"PIPELINES: {len(rows)}, most recently updated first"
    if not rows:
        return [head, "  none"]
    body = [[p.name, p.status, p.shards_done, p.shards_failed, p.shards_aborted,
             p.infra_failures, p.user_failures] for p in rows]  # fmt: skip
    headers = ["NAME", "STATUS", "DONE", "FAILED", "ABORTED", "INFRA", "USER"]
    lines = [head] + table(headers, body, right=frozenset({2, 3, 4, 5, 6}))
    for p in rows:
        if p.summary or p.abort_reason:
            lines.append("")
            lines.extend(_wrap(f"{p.name}: {p.summary}", "  "))
            if p.abort_reason:
                lines.extend(_wrap(p.abort_reason, "    "))
    return lines


# --------------------------------------------------------------------------- the command


def run(args: argparse.Namespace) -> int:
    sections = tuple(s for s in SECTIONS if getattr(args, s)) or SECTIONS
    if args.scheduler is None and args.store is None:
        import dask

        args.scheduler = dask.config.get("scheduler-address", None)
        if not args.scheduler:
            print(f"{PROG}: give --scheduler ADDRESS or --store PATH (or set "
                  "DASK_SCHEDULER_ADDRESS)", file=sys.stderr)  # fmt: skip
            return 2
    try:
        opened = (
            _scheduler_source(args.scheduler, args.timeout)
            if args.scheduler is not None
            else _store_source(args.store)
        )
        with opened as source:
            try:
                data = collect(source, args, sections)
            except ReportFailed:
                raise
            except TimeoutError as e:
                raise ReportFailed(
                    f"the scheduler at {args.scheduler} did not answer within "
                    f"{args.timeout:g} s (try a larger --timeout)"
                ) from e
            except sqlite3.Error as e:
                raise ReportFailed(f"cannot read the failure store {args.store}: "
                                   f"{_one_line(e)}") from e  # fmt: skip
    except ReportFailed as e:
        print(f"{PROG}: {_one_line(e)}", file=sys.stderr)
        return 1
    except Exception as e:  # anything else is still one line, never a traceback
        where = f"the scheduler at {args.scheduler}" if args.scheduler else args.store
        print(f"{PROG}: reading {where} failed: {type(e).__name__}: {_one_line(e)}",
              file=sys.stderr)  # fmt: skip
        return 1
    return _print(data, sections, args)


def _print(data: dict[str, list], sections: tuple[str, ...], args: argparse.Namespace) -> int:
    if args.json:
        doc = {name: [row.to_dict() for row in data[name]] for name in sections}
        text = json.dumps(doc, indent=2)
    else:
        history = shard_history(args)
        blocks = []
        if "events" in data:
            blocks.append(render_events(data["events"], history=history))
        if "signatures" in data:
            blocks.append(render_signatures(data["signatures"]))
        if "pipelines" in data:
            blocks.append(render_pipelines(data["pipelines"]))
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
