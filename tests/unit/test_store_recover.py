"""Opening a store that cannot be opened (issue 28, item 10), against real files: a corrupt
store or one from a newer oomguard is moved aside byte for byte with its -wal/-shm and a
fresh one opened in its place; another application's database is left alone; an
unwritable place gives way to a private temporary directory; "fail" raises as before.
(tests/cluster/test_store_recovery.py runs the same under `dask scheduler --preload`.)"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import sqlite3
import stat
import subprocess

import pytest

from capabilities import require
from oomguard import FailureEvent
from oomguard._exceptions import StoreError
from oomguard._store import FailureStore
from oomguard._store.recover import StoreProblem, move_aside, open_store


def ev(n: int) -> FailureEvent:
    return FailureEvent(
        kind="infra",
        cause="oom_kill",
        shard=f"s{n}",
        pipeline="p",
        worker="tcp://10.0.0.1:1",
        host="10.0.0.1",
        signature_id="sig",
        signature_title="t",
        evidence={"n": n},
        time=1.0 + n,
    )


def a_store(path, n: int = 3) -> None:
    store = FailureStore(str(path))
    store.start()
    for i in range(n):
        store.add(ev(i))
    assert store.flush()
    store.close()


def digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def corrupt(path) -> None:
    a_store(path)
    with open(path, "r+b") as f:
        f.seek(100)
        f.write(b"\xa5" * 3996)


def garbage(path) -> None:
    path.write_bytes(b"not a database at all\n" * 100)


def newer(path) -> None:
    a_store(path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()


def files(directory) -> list[str]:
    return sorted(os.listdir(directory))


@pytest.mark.parametrize(
    "spoil, kind",
    [(corrupt, "corrupt"), (garbage, "corrupt"), (newer, "newer_schema")],
    ids=["malformed", "not-sqlite", "newer"],
)
def test_an_unusable_store_is_moved_aside_and_a_fresh_one_opened(tmp_path, spoil, kind):
    path = tmp_path / "f.sqlite3"
    spoil(path)
    before = digest(path)
    with pytest.raises(StoreError):  # as FailureStore.start always did
        FailureStore(str(path)).start()
    store, problem = open_store(str(path))
    try:
        assert isinstance(problem, StoreProblem) and problem.kind == kind
        assert problem.path == problem.used == str(path)
        assert os.path.basename(problem.aside).startswith("f.sqlite3.unreadable-")
        assert digest(problem.aside) == before  # never deleted, never changed
        message = problem.message()
        assert str(path) in message and problem.aside in message and kind in message
        store.add(ev(10))
        assert store.flush() and [e.shard for e in store.events()] == ["s10"]
    finally:
        store.close()
    assert store.path == str(path)


def test_the_wal_and_shm_go_aside_with_their_store(tmp_path):
    path = tmp_path / "f.sqlite3"
    a_store(path)
    wal, shm = b"w" * 100, b"s" * 100  # stand-ins: what matters is that they move with it
    (tmp_path / "f.sqlite3-wal").write_bytes(wal)
    (tmp_path / "f.sqlite3-shm").write_bytes(shm)
    aside = move_aside(str(path))
    assert open(aside + "-wal", "rb").read() == wal
    assert open(aside + "-shm", "rb").read() == shm
    assert files(tmp_path) == sorted(os.path.basename(aside) + s for s in ("", "-wal", "-shm"))


def test_a_name_already_taken_aside_gets_a_counter(tmp_path):
    path = tmp_path / "f.sqlite3"
    first, second = [], []
    for got in (first, second):
        path.write_bytes(b"x")
        got.append(move_aside(str(path)))
    assert first != second and second[0].startswith(first[0])
    assert len(glob.glob(f"{path}.unreadable-*")) == 2


def test_another_applications_database_is_left_alone(tmp_path):
    path = tmp_path / "theirs.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE accounts (id INTEGER)")
    conn.close()
    before = digest(path)
    store, problem = open_store(str(path))
    try:
        assert problem.kind == "foreign" and problem.aside == ""
        assert problem.used != str(path) and store.path == problem.used
        mode = os.stat(os.path.dirname(problem.used)).st_mode
        assert stat.S_IMODE(mode) == 0o700  # private
        assert "private temporary directory" in problem.message()
    finally:
        store.close()
    assert digest(path) == before and files(tmp_path) == ["theirs.db"]


def test_a_place_that_cannot_be_a_directory_gives_a_temporary_store(tmp_path):
    (tmp_path / "file").write_text("x")
    path = tmp_path / "file" / "f.sqlite3"  # its directory is a regular file
    store, problem = open_store(str(path))
    try:
        assert problem.kind == "unwritable" and problem.used == store.path
        store.add(ev(1))
        assert store.flush()
    finally:
        store.close()


def test_a_read_only_filesystem_gives_a_temporary_store(tmp_path):
    require(os.geteuid() == 0, "mounting a read-only tmpfs needs root")
    mnt = tmp_path / "ro"
    mnt.mkdir()
    a_store(tmp_path / "f.sqlite3")
    done = subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mnt)], capture_output=True)
    require(done.returncode == 0, f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    try:
        shutil.move(tmp_path / "f.sqlite3", mnt / "f.sqlite3")  # a store with history...
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)  # ...read-only
        before = digest(mnt / "f.sqlite3")
        store, problem = open_store(str(mnt / "f.sqlite3"))
        try:
            assert problem.kind == "unwritable" and problem.aside == ""
            assert store.path == problem.used and not problem.used.startswith(str(mnt))
        finally:
            store.close()
        assert digest(mnt / "f.sqlite3") == before
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_fail_raises_and_touches_nothing(tmp_path):
    path = tmp_path / "f.sqlite3"
    corrupt(path)
    before = digest(path)
    with pytest.raises(StoreError, match="not a usable SQLite database"):
        open_store(str(path), on_error="fail")
    assert digest(path) == before and glob.glob(f"{path}.unreadable-*") == []


def test_a_good_store_opens_as_it_is(tmp_path):
    path = tmp_path / "f.sqlite3"
    a_store(path)
    store, problem = open_store(str(path), max_events=10)
    try:
        assert problem is None and len(store.events()) == 3 and store.max_events == 10
    finally:
        store.close()
