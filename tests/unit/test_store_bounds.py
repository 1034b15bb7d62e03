"""The failure store's bounds (issue 28, items 4 and 11): a full disk loses no event that
fits and keeps the rest queued until there is room (a real, small tmpfs); the write queue
is capped in bytes, refusing the newest past the cap with one WARNING; signatures are
bounded, the least recently seen going first."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import time

import pytest

from capabilities import require
from oomguard import FailureEvent
from oomguard._store import FailureStore
from oomguard._store.items import ITEM_OVERHEAD, event_item, item_size

T0 = 1_790_000_000.0


def ev(n: int, sig: str = "sig-a", pad: int = 0, t: float | None = None) -> FailureEvent:
    return FailureEvent(
        kind="infra",
        cause="oom_kill",
        shard=f"('load', {n})",
        pipeline="nightly",
        worker=f"tcp://10.0.0.{n % 250}:4000",
        host=f"10.0.0.{n % 250}",
        signature_id=sig,
        signature_title=f"title {sig}",
        evidence={"n": n, "pad": "x" * pad},
        attempt=1,
        time=T0 + n if t is None else t,
    )


def rows(store: FailureStore, sql: str) -> list[tuple]:
    """Straight from the file (read-only), not through the store's reads."""
    conn = sqlite3.connect(f"file:{store.path}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def count(store: FailureStore, table: str) -> int:
    return rows(store, f"SELECT count(*) FROM {table}")[0][0]


def evidence_ns(store: FailureStore) -> list[int]:
    return sorted(json.loads(e)["n"] for (e,) in rows(store, "SELECT evidence FROM events"))


# -- a full disk ------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 32 MiB tmpfs: a real filesystem that really fills up (ENOSPC)."""
    require(os.geteuid() == 0, "mounting a tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32M", "tmpfs", str(mnt)], capture_output=True
    )
    require(done.returncode == 0, f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill_up(directory, leave: int) -> str:
    """Fill the filesystem of `directory`, then free `leave` bytes; the filler's path."""
    filler = os.path.join(directory, "filler")
    # Unbuffered: a buffered file keeps the tail of a short last write and raises ENOSPC
    # again when closed, whenever the free space is not a multiple of the chunk.
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
    with open(filler, "r+b") as f:
        f.truncate(max(0, os.path.getsize(filler) - leave))
    return filler


def test_a_full_disk_writes_what_fits_and_keeps_the_rest_until_there_is_room(small_disk, caplog):
    # A long batch interval: the 4,000 events below go in one batch (flush wakes it).
    store = FailureStore(str(small_disk / "f.sqlite3"), batch_interval=1.0)
    store.full_retry = 0.05
    store.start()
    try:
        assert store.add(ev(0)) and store.flush()
        filler = fill_up(small_disk, 1024 * 1024)
        # 4,000 events of ~1 KiB evidence queued at once: one batch, ~5 MiB, 1 MiB free.
        with caplog.at_level(logging.WARNING, logger="oomguard.store"):
            for n in range(1, 4001):
                assert store.add(ev(n, pad=1000))
            assert not store.flush(timeout=1)  # the disk is full: not all are written
            deadline = time.monotonic() + 30
            # The batch, halved down to what fits (before issue 28: lost whole, so nothing
            # stays pending).
            while (
                not getattr(store, "disk_full", 0)
                and store.pending
                and time.monotonic() < deadline
            ):
                time.sleep(0.05)
            written = store.written
            assert 1 < written < 4001, written  # what fit is written...
            assert store.pending == 4001 - written  # ...and the rest waits, none lost
            assert store.disk_full == 1 and store.write_errors == 0
            full = [r for r in caplog.records if "disk is full" in r.getMessage()]
            assert len(full) == 1, [r.getMessage() for r in caplog.records]
            time.sleep(2.5)  # retries while full (each second) log nothing more
            assert len([r for r in caplog.records if "disk is full" in r.getMessage()]) == 1
            os.unlink(filler)  # room again
            assert store.flush(timeout=30), store.last_error
        assert store.written == 4001 and store.pending == 0 and store.pending_bytes == 0
        assert evidence_ns(store) == list(range(4001))  # each once, none lost
        assert any("room again" in r.getMessage() for r in caplog.records)
    finally:
        store.close()


def test_close_with_the_disk_still_full_says_what_was_lost(small_disk, caplog):
    store = FailureStore(str(small_disk / "f.sqlite3"), batch_interval=0.01)
    store.full_retry = 0.05
    store.start()
    assert store.add(ev(0)) and store.flush()
    fill_up(small_disk, 0)
    for n in range(1, 200):
        store.add(ev(n, pad=4000))
    assert not store.flush(timeout=1)
    with caplog.at_level(logging.ERROR, logger="oomguard.store"):
        store.close(timeout=10)
    assert store.write_errors >= 1 and "still full" in store.last_error


# -- the queue, in bytes ----------------------------------------------------------------


def test_item_size_counts_the_encoded_strings():
    item = event_item(ev(1, pad=10_000), 1, "trace" * 100)
    assert item_size(item) >= 10_000 + 500 + ITEM_OVERHEAD
    assert item_size(("amend", item, None)) > item_size(item)


def test_the_queue_is_capped_in_bytes_refusing_the_newest_with_one_warning(tmp_path, caplog):
    # 1 MiB of queue; ~100 KiB per event: about ten fit, though the item cap is 100,000.
    store = FailureStore(str(tmp_path / "f.sqlite3"), queue_bytes=2**20)
    with caplog.at_level(logging.INFO, logger="oomguard.store"):
        accepted = [store.add(ev(n, pad=100_000)) for n in range(50)]  # not started: queued
        assert 5 <= sum(accepted) <= 10 and accepted[: sum(accepted)] == [True] * sum(accepted)
        assert store.pending_bytes <= 2**20
        assert store.overflow == 50 - sum(accepted)
        warned = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 1 and "write queue is full" in warned[0].getMessage()
        store.start()
        assert store.flush()
        assert store.pending_bytes == 0
        assert store.add(ev(99))  # room again, said once
        assert any("takes events again" in r.getMessage() for r in caplog.records)
    assert store.flush()
    kept = evidence_ns(store)
    assert kept == [*range(sum(accepted)), 99]  # the oldest kept, the newest refused
    store.close()


# -- signature retention ----------------------------------------------------------------


def test_signatures_beyond_max_signatures_go_least_recently_seen_first(tmp_path):
    store = FailureStore(str(tmp_path / "f.sqlite3"), max_signatures=3, batch_interval=0.01)
    store.start()
    try:
        # Seen last at: a 10, b 2, c 30, d 4; then e at 50.
        for n, sig, t in [(1, "a", 1), (2, "b", 2), (3, "c", 3), (4, "a", 10), (5, "c", 30)]:
            assert store.add(ev(n, sig, t=T0 + t))
        assert store.flush()
        assert {i for (i,) in rows(store, "SELECT id FROM signatures")} == {"a", "b", "c"}
        assert store.add(ev(6, "d", t=T0 + 4)) and store.flush()
        assert {i for (i,) in rows(store, "SELECT id FROM signatures")} == {
            "a",
            "c",
            "d",
        }  # b went
        assert store.add(ev(7, "e", t=T0 + 50)) and store.flush()
        assert {i for (i,) in rows(store, "SELECT id FROM signatures")} == {
            "a",
            "c",
            "e",
        }  # then d
        assert store.signature("a").count == 2  # the kept ones keep their counts
        assert store.distinct_counts("b") == {} or not any(store.distinct_counts("b").values())
        assert count(store, "signature_members WHERE signature_id IN ('b', 'd')") == 0
        assert count(store, "events") == 7  # events stay, until max-events
    finally:
        store.close()


def test_a_flood_of_new_signatures_stays_bounded_in_one_batch(tmp_path):
    store = FailureStore(str(tmp_path / "f.sqlite3"), max_signatures=100)
    for n in range(5000):  # queued before start: one batch
        store.add(ev(n, f"s{n}"))
    store.start()
    try:
        assert store.flush()
        assert count(store, "signatures") == 100
        assert {i for (i,) in rows(store, "SELECT id FROM signatures")} == {
            f"s{n}" for n in range(4900, 5000)
        }
        store.close()
        again = FailureStore(store.path, max_signatures=100)  # the count survives a restart
        again.start()
        again.add(ev(9999, "new", t=T0 + 10**6))
        assert again.flush()
        assert count(again, "signatures") == 100
        again.close()
    finally:
        store.close()


def test_the_stores_counts_reach_oomguard_store_errors_total(tmp_path):
    from prometheus_client import CollectorRegistry

    from oomguard._metrics import OomguardMetrics
    from oomguard.scheduler_plugin._setup import _StoreCounts

    metrics, registry = OomguardMetrics(), CollectorRegistry()
    registry.register(metrics)
    store = FailureStore(str(tmp_path / "f.sqlite3"), queue_bytes=2**20)
    counts = _StoreCounts()

    def value(kind):
        return registry.get_sample_value("oomguard_store_errors_total", {"kind": kind})

    assert value("queue_full") == 0.0 and value("disk_full") == 0.0
    for n in range(30):
        store.add(ev(n, pad=100_000))
    counts.sync(store, metrics)
    counts.sync(store, metrics)  # increments, not totals: counted once
    assert value("queue_full") == store.overflow > 0
    store.writer.disk_full = 2  # as the writer counts it
    counts.sync(store, metrics)
    assert value("disk_full") == 2.0
    store.close()
