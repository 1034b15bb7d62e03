"""Opening a store that may not open: a diagnostics file must never keep a scheduler from
starting. A file that is corrupt or from a newer oomguard is moved aside (never deleted)
and a fresh store opened in its place; one that cannot be written, or that is another
application's database (left untouched), gives way to a fresh store in a private temporary
directory. `open_store` says what it did in a `StoreProblem`; the caller logs and counts it.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import tempfile
import time
from typing import Any

from .._exceptions import StoreError
from .store import FailureStore

#: What `open_store` does on a problem: "recover" (default) or "fail" (raise, as before).
ON_ERROR = ("recover", "fail")


@dataclasses.dataclass(frozen=True)
class StoreProblem:
    """Why the configured store could not be used, and what is used instead.

    `kind`: "corrupt", "newer_schema", "foreign" or "unwritable"; `path` the configured file;
    `aside` where it was moved ("" when it stayed where it is); `used` the file now in use.
    """

    kind: str
    reason: str
    path: str
    aside: str
    used: str

    def message(self) -> str:
        done = (
            f"it was moved aside to {self.aside} (with its -wal and -shm files)"
            if (self.aside)
            else "it was left where it is"
        )
        if self.used == self.path:
            done += f" and a fresh store was opened at {self.used}"
        else:
            done += (
                f" and this scheduler records into a fresh store in a private temporary "
                f"directory, {self.used}, lost when that directory is cleaned"
            )
        return (
            f"oomguard: the failure store {self.path} cannot be used ({self.kind}: "
            f"{self.reason.rstrip('.')}); {done}. oomguard.scheduler.store-errors: fail "
            "refuses to start instead."
        )


def kind_of(error: BaseException) -> str | None:
    """The problem `error` (from FailureStore.start) shows, or None for one that a fresh
    store would hit too (SQLite without JSON functions)."""
    kind = getattr(error, "kind", None)
    if kind is not None:
        return kind
    if isinstance(error, StoreError):
        return None
    if isinstance(error, sqlite3.OperationalError):
        return "unwritable"  # read-only file or directory, locked by another writer
    if isinstance(error, sqlite3.DatabaseError):
        return "corrupt"  # "database disk image is malformed", "file is not a database"
    if isinstance(error, OSError):
        return "unwritable"  # the directory cannot be created
    return None


def open_store(
    path: str, *, on_error: str = "recover", **options: Any
) -> tuple[FailureStore, StoreProblem | None]:
    """A started FailureStore for `path` (options as FailureStore's), and the problem that
    made it another file, if any. `on_error="fail"` raises the error as FailureStore.start
    does. Blocking file I/O: call it from a thread.

    >>> store, problem = open_store("/var/lib/dask/oomguard.sqlite3", max_events=10**6)
    """
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}.")
    store = FailureStore(path, **options)
    try:
        store.start()
        return store, None
    except Exception as e:
        store.close()
        kind = kind_of(e)
        if on_error == "fail" or kind is None:
            raise
        error = e
    file = os.path.abspath(path)
    reason = str(error).split(". ")[0] or type(error).__name__  # without the advice
    if kind in ("corrupt", "newer_schema"):
        try:
            aside = move_aside(file)
        except OSError as e:
            reason = f"{reason}; moving it aside failed: {e}"
        else:
            store = FailureStore(path, **options)
            try:
                store.start()
                return store, StoreProblem(kind, reason, file, aside, file)
            except Exception as e:
                store.close()
                reason = f"{reason}; a fresh store there failed too: {e}"
                return _in_tmp(kind, reason, file, aside, options)
    return _in_tmp(kind, reason, file, "", options)


def _in_tmp(
    kind: str, reason: str, file: str, aside: str, options: dict[str, Any]
) -> tuple[FailureStore, StoreProblem]:
    # mkdtemp: mode 0700 and a name no one else can predict. Kept after close, so the
    # history can still be read (`oomguard report --store`) until the directory is cleaned.
    used = os.path.join(tempfile.mkdtemp(prefix="oomguard-store-"), os.path.basename(file))
    store = FailureStore(used, **options)
    try:
        store.start()
    except BaseException:
        store.close()
        raise
    return store, StoreProblem(kind, reason, file, aside, used)


def move_aside(file: str) -> str:
    """Rename `file` and its -wal/-shm companions to `<file>.unreadable-<UTC time>` (the
    companions keep their suffix, so SQLite still pairs them); the new name. Never deletes:
    a name already taken gets a counter."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = f"{file}.unreadable-{stamp}"
    n = 1
    while any(os.path.lexists(aside + s) for s in ("", "-wal", "-shm")):
        n += 1
        aside = f"{file}.unreadable-{stamp}-{n}"
    os.rename(file, aside)
    for suffix in ("-wal", "-shm"):
        try:
            os.rename(file + suffix, aside + suffix)
        except FileNotFoundError:
            pass
    return aside
