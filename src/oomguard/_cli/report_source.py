"""Where `oomguard report` reads the failure history: a running scheduler (the reads of
`oomguard.Failures`, each bounded by a timeout) or a failure store file; and the rows of each
section, filtered as the arguments say. What cannot be read is a ReportFailed: one line.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import sqlite3
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

from .._display import one_line
from .._exceptions import ReportFailed, StoreError

#: The Python API's defaults, so `--json` without `--limit` equals `Failures(client).events()`.
DEFAULT_LIMITS = {
    "incidents": 1000,
    "deaths": 1000,
    "events": 1000,
    "signatures": 100,
    "pipelines": 100,
}


# --------------------------------------------------------------------------- sources


class _SchedulerSource:
    """The reads of `oomguard.Failures`, each bounded by a timeout: of the whole history,
    or of `cluster` (--cluster)."""

    def __init__(self, client: Any, timeout: float, cluster: str | None = None) -> None:
        from .._client.api import Failures

        self.failures = Failures(client, timeout=timeout, fleet=True)
        if cluster is not None:
            self.failures._scope = {"cluster": cluster}
        self.shard = self.failures.shard
        self.pipelines = self.failures.pipelines

    def events(self, **filters: Any) -> Any:
        with warnings.catch_warnings():  # the report says it itself (`unknown_names`)
            warnings.simplefilter("ignore", UserWarning)
            return self.failures.events(**filters)

    def signatures(self, **filters: Any) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return self.failures.signatures(**filters)

    def deaths(self, **filters: Any) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return self.failures.deaths(**filters)

    def incidents(self, **filters: Any) -> Any:
        return self.failures.incidents(**filters)

    def known(self, field: str, value: str) -> tuple[bool, list[str]]:
        answer = self.failures._query("known", field=field, value=value)
        if not isinstance(answer, dict):  # an older oomguard there: assume it is known
            return True, []
        return bool(answer.get("known")), list(answer.get("names") or ())

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
def connected(address: str, timeout: float) -> Iterator[Any]:
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


class _StoreSource:
    """The reads of a FailureStore, of `cluster` only where given (--cluster)."""

    def __init__(self, store: Any, cluster: str | None) -> None:
        self.store = store
        self.cluster = cluster
        self.known = store.known
        self.signature = store.signature  # one signature: its row spans every cluster

    def events(self, **filters: Any) -> Any:
        return self.store.events(cluster=self.cluster, **filters)

    def deaths(self, **filters: Any) -> Any:
        return self.store.deaths(cluster=self.cluster, **filters)

    def incidents(self, **filters: Any) -> Any:
        return self.store.incidents(cluster=self.cluster, **filters)

    def signatures(self, **filters: Any) -> Any:
        return self.store.signatures(cluster=self.cluster, **filters)

    def shard(self, key: str) -> Any:
        return self.store.shard(key, cluster=self.cluster)

    def pipeline(self, name: str) -> Any:
        return self.store.pipeline(name, cluster=self.cluster)

    def pipelines(self, limit: int | None) -> Any:
        return self.store.pipelines(limit, cluster=self.cluster)


def scheduler_source(
    client: Any, address: str, timeout: float, cluster: str | None = None
) -> _SchedulerSource:
    source = _SchedulerSource(client, timeout, cluster)
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
def store_source(path: str, cluster: str | None = None) -> Iterator[Any]:
    """The failure store at `path`, opened to be read, its reads of the whole history or
    of `cluster`; ReportFailed when it cannot be.

    The store file is only read. `FailureStore.start()` on an up-to-date WAL-mode store writes
    nothing; it would write (migrate, or switch the journal mode) on an older or non-WAL file,
    so such a file is read from a temporary copy. While the WAL holds commits that are not yet
    in the main file (a scheduler that is running, or died), a read-only connection stays open
    across the store's life, so that closing the store's own connections never checkpoints the
    WAL into the main file.
    """
    from .._store import FailureStore
    from .._urls import is_postgres

    if is_postgres(path):
        with history_source(path) as reader:
            yield _StoreSource(reader, cluster)
        return
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
        yield _StoreSource(store, cluster)
    finally:
        store.close()  # a guard still open keeps this from checkpointing the WAL
        if guard is not None:
            guard.close()  # read-only: cannot checkpoint either
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)


@contextlib.contextmanager
def history_source(url: str) -> Iterator[Any]:
    """The PostgreSQL history at `url` (every cluster's), read only; ReportFailed, one line
    with the password hidden, when it cannot be read or holds no oomguard history."""
    from .._store.pg import MIGRATIONS, PgReader, check_version, pg_connect
    from .._urls import driver_missing, error_line, redact

    missing = driver_missing()
    if missing is not None:
        raise ReportFailed(missing)
    failed = None
    try:
        with pg_connect(url) as conn:
            version = check_version(conn, url, len(MIGRATIONS))
    except StoreError as e:
        failed = error_line(e, url)
    except Exception as e:
        failed = f"cannot read the history {redact(url)}: {error_line(e, url)}"
    if failed is not None:  # raised here: a driver's error (it may quote the URL) not kept
        raise ReportFailed(failed)
    if version == 0:
        raise ReportFailed(f"no failure history in {redact(url)}: no scheduler wrote to it yet")
    reader = PgReader(url)
    reader.start()
    try:
        yield reader
    finally:
        reader.close()


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
    narrowing = (
        args.kind,
        args.cause,
        args.killer,
        args.pipeline,
        args.signature,
        args.since,
        args.limit,
    )
    return args.shard is not None and all(v is None for v in narrowing)


def collect(source: Any, args: argparse.Namespace, sections: tuple[str, ...]) -> dict[str, list]:
    """The rows of each section (model objects), filtered as the arguments say."""
    out: dict[str, list] = {}
    # The incidents of the deaths shown, when a shard, pipeline or signature narrows them.
    by_deaths = any(v is not None for v in (args.shard, args.pipeline, args.signature))
    if "deaths" in sections or ("incidents" in sections and by_deaths):
        # Every death is infra: --kind user has none. A shard or pipeline in any role.
        out["deaths"] = (
            []
            if args.kind == "user"
            else source.deaths(
                cause=args.cause,
                killer=args.killer,
                pipeline=args.pipeline,
                shard=args.shard,
                signature=args.signature,
                since=args.since,
                limit=args.limit or DEFAULT_LIMITS["deaths"],
            )
        )
    if "incidents" in sections:
        incidents = []
        if args.kind != "user":
            incidents = source.incidents(
                cause=args.cause,
                killer=args.killer,
                since=args.since,
                limit=args.limit or DEFAULT_LIMITS["incidents"],
            )
        if by_deaths:
            shown = {(d.cluster, d.incident or d.id) for d in out["deaths"]}
            incidents = [i for i in incidents if (i.cluster, i.id) in shown]
        out["incidents"] = incidents
    if "deaths" not in sections:
        out.pop("deaths", None)
    need_events = "events" in sections or args.shard is not None or args.signature is not None
    events: list = []
    if need_events:
        if shard_history(args):
            events = source.shard(args.shard)
        else:
            events = source.events(
                kind=args.kind,
                cause=args.cause,
                killer=args.killer,
                pipeline=args.pipeline,
                shard=args.shard,
                signature=args.signature,
                since=args.since,
                limit=args.limit or DEFAULT_LIMITS["events"],
            )
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
                cause=args.cause,
                pipeline=args.pipeline,
                since=args.since,
                limit=args.limit or DEFAULT_LIMITS["signatures"],
            )
    unknown = unknown_names(source, args)
    if unknown:
        out["unknown"] = unknown
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


def unknown_names(source: Any, args: argparse.Namespace) -> list[str]:
    """For --cluster, --pipeline, --signature and --shard that name nothing in the history
    (no event, death, run or signature): one sentence each, with the names there are (for
    a shard: those of the latest events) and the closest one."""
    from .._client.filters import unknown_name

    out = []
    shard = args.shard
    if (
        shard is not None
        and not source.events(shard=shard, limit=1)
        and not source.deaths(shard=shard, limit=1)  # only displaced or queued there
    ):
        shards = [e.shard for e in source.events(limit=DEFAULT_LIMITS["events"])]
        line = unknown_name("--shard", args.shard, "shard", list(dict.fromkeys(shards)))
        out.append(line.replace("=", " ", 1))
    for field, value, what in (
        ("cluster", args.cluster, "cluster"),
        ("pipeline", args.pipeline, "pipeline"),
        ("signature", args.signature, "signature id"),
    ):
        if value is not None:
            found, names = source.known(field, value)
            if not found:
                out.append(unknown_name(f"--{field}", value, what, names).replace("=", " ", 1))
    return out


def read_history(
    source: Any, args: argparse.Namespace, sections: tuple[str, ...]
) -> dict[str, Any]:
    """`collect`, its failures a ReportFailed: one line that names the fix."""
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
        raise ReportFailed(f"cannot read the failure store {args.store}: {one_line(e)}") from e
