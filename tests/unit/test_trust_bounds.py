"""Whom the scheduler side believes (scheduler_plugin/_trust.py) and the caps on its
long-lived maps (issue 28, items 2, 3 and 14)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from oomguard._decide.runs import ANNOTATION, SEEN_NAMES, Runs
from oomguard.scheduler_plugin._actions import DaskActions
from oomguard.scheduler_plugin._reports import ReportDesk
from oomguard.scheduler_plugin._trust import (
    CGROUP_NANNIES,
    LOGGED_ABORTS,
    RECENT_WORKERS,
    Bounded,
    NannyBook,
    dask_removal,
    sender_matches,
)

W, N = "tcp://127.0.0.1:40001", "tcp://127.0.0.1:40000"


def ws(nanny=N):
    return SimpleNamespace(nanny=nanny)


def test_bounded_keeps_the_newest_and_refreshes_on_set():
    b = Bounded(3)
    for k in "abcd":
        b[k] = k
    assert list(dict(b.items())) == ["b", "c", "d"]
    b["b"] = "again"  # the newest now
    b.add("e")
    assert list(dict(b.items())) == ["d", "b", "e"]
    assert len(b) == 3 and b.get("c") is None
    with pytest.raises(ValueError, match="cap"):
        Bounded(0)


def test_a_removal_event_counts_only_for_a_registered_worker_dask_took_out():
    event = {"action": "remove-worker", "worker": W, "processing-tasks": ["k"]}
    state = ws()
    assert dask_removal(event, {W: state}, {})
    assert not dask_removal(event, {W: state}, {W: state})  # still running: published
    assert not dask_removal(event, {}, {})  # never registered, or handled already
    assert not dask_removal({**event, "worker": 7}, {W: state}, {})
    assert not dask_removal({**event, "action": "add-worker"}, {W: state}, {})
    assert not dask_removal("remove-worker", {W: state}, {})


def test_a_report_is_taken_only_from_the_registered_nanny():
    live = {W: ws()}
    book = NannyBook(live.get)
    assert book.check("tcp://127.0.0.1:5555", W, N, sender_matches) is None
    assert book.check("tcp://127.0.0.1:5555", W, ..., sender_matches) is None  # a notice
    assert book.check("tcp://127.0.0.1:5555", W, "tcp://127.0.0.1:1", sender_matches) == (
        "wrong_nanny"
    )
    assert book.check("tcp://10.9.9.9:5555", W, N, sender_matches) == "unknown_sender"
    assert book.check("tcp://127.0.0.1:5555", "tcp://127.0.0.1:9", N, sender_matches) == (
        "unregistered"
    )
    assert book.check("tcp://127.0.0.1:5555", 7, N, sender_matches) == "unregistered"
    live["tcp://127.0.0.1:2"] = ws(nanny=None)  # a worker without a nanny
    assert book.check("tcp://127.0.0.1:5555", "tcp://127.0.0.1:2", None, sender_matches) == (
        "unregistered"
    )


def test_the_nanny_of_a_removed_worker_is_kept_for_its_late_report():
    live = {W: ws()}
    book = NannyBook(live.get, recent=2)
    book.removed(W, live.pop(W))
    assert book.check("tcp://127.0.0.1:5555", W, N, sender_matches) is None
    for port in (1, 2):  # two more removals: the first one's nanny is let go
        book.removed(f"tcp://127.0.0.1:{port}", ws())
    assert book.nanny_of(W) is None and len(book.recent) == 2
    book.removed("tcp://127.0.0.1:3", ws(nanny=""))  # no nanny: nothing to keep
    assert "tcp://127.0.0.1:3" not in book.recent


def test_the_scheduler_maps_have_their_caps():
    desk = ReportDesk(NannyBook(lambda worker: None), None, None)
    assert desk.nannies.recent.cap == RECENT_WORKERS
    assert desk._cgroup_nannies.cap == CGROUP_NANNIES
    actions = DaskActions(None, None, None, None)
    assert actions._logged_aborts.cap == LOGGED_ABORTS
    for run in range(LOGGED_ABORTS + 10):
        actions._logged_aborts.add(f"run-{run}")
    assert len(actions._logged_aborts) == LOGGED_ABORTS
    assert "run-0" not in actions._logged_aborts


def _start(runs: Runs, name: str, n: int) -> str:
    key = f"{name}-{n}"
    (run,) = runs.observe([key], [key], {ANNOTATION: {key: name}}, float(n), client=str(n))
    return run.label


def test_run_names_are_bounded_and_labels_never_repeat():
    runs = Runs(seen_names=3)
    labels = [_start(runs, name, i) for i, name in enumerate("abcdabe")]
    assert len(runs._seen) == 3
    assert len(set(labels)) == len(labels), labels
    assert labels[:4] == ["a", "b", "c", "d"]  # no name dropped before the fourth
    assert all(label.startswith(name) for label, name in zip(labels, "abcdabe"))
    assert SEEN_NAMES == Runs()._seen_names


def test_run_names_bounded_over_many_names():
    runs = Runs(seen_names=50)
    labels = [_start(runs, f"p{i % 200}", i) for i in range(2_000)]
    assert len(runs._seen) == 50
    assert len(set(labels)) == len(labels)
