"""Signature states (issue 40): the rules with explicit times, and the store on both
backends (SQLite, and PostgreSQL through a spool and its shipper: tests/pg_lab.py): a
person's resolve, kept with who and why and made safe; resolving twice changes nothing; an
unknown id is a KeyError naming it; a death after the resolve is a regression, found once
by the writer (its time kept, counted), and a death from before it is not; escalating from
the stored deaths' times."""

from __future__ import annotations

import time

import pytest

from oomguard import FailureEvent
from oomguard._death.record import Attribution, Death, Role, Task
from oomguard._store import states as S
from pg_lab import BACKENDS, store_on

T0 = 1_790_000_000.0
H = 3600.0
KERNEL = Attribution("kernel", "kernel log", "confirmed", "the kernel's OOM killer")


# -- the rules, with explicit times -----------------------------------------------------------


@pytest.mark.parametrize(
    "facts, state",
    [
        # First seen 2 h ago: new; 3 days ago: ongoing.
        (dict(first_seen=T0 - 2 * H), "new"),
        (dict(first_seen=T0 - 72 * H), "ongoing"),
        # 6 in the last hour against 24 over the day before (1 an hour): escalating.
        (dict(first_seen=T0 - 72 * H, last_hour=6, before=24), "escalating"),
        # 5 against 48 (2 an hour): 5 < 3 x 2, not escalating.
        (dict(first_seen=T0 - 72 * H, last_hour=5, before=48), "ongoing"),
        # Under the minimum of 5 in the hour, whatever the baseline.
        (dict(first_seen=T0 - 72 * H, last_hour=4, before=0), "ongoing"),
        # A signature 3 h old: its baseline is its own 2 h before the last (1 an hour).
        (dict(first_seen=T0 - 3 * H, last_hour=6, before=2), "escalating"),
        (dict(first_seen=T0 - 3 * H, last_hour=5, before=4), "new"),
        # First seen within the last hour: no rate of its own yet, new.
        (dict(first_seen=T0 - 0.5 * H, last_hour=50, before=0), "new"),
        # Resolved and not seen since; seen since: regressed, whatever the rate.
        (dict(first_seen=T0 - 72 * H, resolved_at=T0 - H), "resolved"),
        (dict(first_seen=T0 - 72 * H, resolved_at=T0 - H, regressed_at=T0 - 60), "regressed"),
        (
            dict(first_seen=T0 - 72 * H, resolved_at=T0 - H, regressed_at=T0 - 60, last_hour=90),
            "regressed",
        ),
        # Resolved again after the regression: resolved.
        (dict(first_seen=T0 - 72 * H, resolved_at=T0 - 10, regressed_at=T0 - 60), "resolved"),
    ],
)
def test_state_rules_with_explicit_times(facts, state):
    assert S.state_of(T0, **facts) == state


def test_the_hourly_baseline_is_over_the_day_or_since_first_seen():
    assert S.hourly(T0, T0 - 72 * H, 48) == 2.0
    assert S.hourly(T0, T0 - 3 * H, 4) == 2.0  # 2 hours before the last one
    assert S.hourly(T0, T0 - 1.2 * H, 3) == 3.0  # at least one hour


# -- the store ----------------------------------------------------------------------------------


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path):
    s = store_on(request, tmp_path)
    s.start()
    yield s
    s.close()


def death(n: int, t: float, signature: str = "sig-a", **kw) -> tuple[Death, list[FailureEvent]]:
    """Death `n` of cluster "c" at `t`, its culprit `load-n` with its event."""
    d = Death(
        id=f"d{n}",
        cluster="c",
        worker=f"tcp://10.0.0.{n % 4}:4000",
        host=f"node-{n % 4}",
        cause="oom_kill",
        time=t,
        tasks=(Task(key=f"load-{n}", prefix="load", role=Role.CULPRIT, pipeline="etl"),),
        killer=KERNEL,
        signature_id=signature,
        signature_title="oom_kill in load",
        evidence={"summary": f"death {n}"},
        **kw,
    )
    event = FailureEvent(
        "infra", "oom_kill", f"load-{n}", "etl", d.worker, d.host, signature,
        d.signature_title, {}, 1, t, killer="kernel", cluster="c", death=d.id,
    )  # fmt: skip
    return d, [event]


def record(store, *deaths, **kw) -> None:
    for d, events in deaths:
        assert store.record(d, events, **kw), store.last_error
    assert store.flush()


def test_a_resolve_keeps_who_and_why_made_safe_and_twice_changes_nothing(store):
    record(store, death(1, T0 + 1), death(2, T0 + 2))
    assert store.signature("sig-a").state == "ongoing"  # first seen long before now
    note = "fixed in shardapp 1.4\x1b[2J" + "x" * 5000
    row, changed = store.resolve("sig-a", note=note, by="alice\nbob", at=T0 + 10)
    assert changed and row.state == "resolved" and row.resolved_at == T0 + 10
    assert row.resolved_by == "alice\\x0abob"  # one printable line
    assert row.resolve_note.startswith("fixed in shardapp 1.4\\x1b[2J")
    assert len(row.resolve_note) < 2100 and "\x1b" not in row.resolve_note
    again, changed = store.resolve("sig-a", note="again", by="carol", at=T0 + 20)
    assert not changed and again.resolved_at == T0 + 10 and again.resolved_by == "alice\\x0abob"
    assert [s.state for s in store.signatures()] == ["resolved"]


def test_resolving_an_unknown_id_names_it(store):
    record(store, death(1, T0 + 1))
    with pytest.raises(KeyError, match="no signature 'nope' in the history"):
        store.resolve("nope", at=T0)
    assert store.signature("sig-a").resolved_at == 0.0


def test_a_death_after_the_resolve_is_one_regression_with_its_time(store):
    record(store, death(1, T0 + 1))
    store.resolve("sig-a", note="fixed", by="alice", at=T0 + 10)
    # A death from before the resolve, stored after it (a late report): no regression.
    record(store, death(2, T0 + 5))
    assert store.signature("sig-a").state == "resolved" and store.regressions == 0
    record(store, death(3, T0 + 30), death(4, T0 + 20))
    record(store, death(5, T0 + 40))
    row = store.signature("sig-a")
    assert (row.state, row.regressed_at, row.regressions) == ("regressed", T0 + 20, 1)
    assert store.regressions == 1  # counted once, however many deaths came back
    assert row.count == 5 and row.resolved_by == "alice"
    # Resolved again: resolved; back again: a second regression.
    row, changed = store.resolve("sig-a", at=T0 + 50)
    assert changed and row.state == "resolved" and row.regressed_at == T0 + 20
    record(store, death(6, T0 + 60))
    row = store.signature("sig-a")
    assert (row.state, row.regressed_at, row.regressions) == ("regressed", T0 + 60, 2)
    assert store.regressions == 2


def test_a_task_exception_after_the_resolve_is_a_regression_too(store):
    record(store, death(1, T0 + 1))
    store.resolve("sig-a", at=T0 + 10)
    exception = FailureEvent(
        "user", "exception", "x-1", "etl", "w", "node-1", "sig-a", "t", {}, 1, T0 + 11
    )
    assert store.add(exception) and store.flush()
    assert store.signature("sig-a").regressed_at == T0 + 11 and store.regressions == 1


def test_escalating_from_the_stored_deaths_times(store):
    now = time.time()
    # Seen 20 h ago, twice since: about 0.1 an hour. Then 6 in the last half hour.
    record(store, death(1, now - 20 * H), death(2, now - 10 * H), death(3, now - 5 * H))
    row = store.signature("sig-a")
    assert (row.state, row.last_hour) == ("new", 0)
    record(store, *(death(10 + i, now - 1800 + i) for i in range(6)))
    row = store.signature("sig-a")
    assert (row.state, row.last_hour) == ("escalating", 6)
    assert row.hourly == pytest.approx(3 / 19, abs=1e-3)
    # Other signatures are not: one seen once, long ago.
    record(store, death(30, now - 200 * H, signature="sig-b"))
    assert store.signature("sig-b").state == "ongoing"
    assert [(s.id, s.state) for s in store.signatures()] == [
        ("sig-a", "escalating"),
        ("sig-b", "ongoing"),
    ]
