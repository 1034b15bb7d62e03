"""Exactly once, over interleavings: a model-based test of spool -> PostgreSQL history.

Hypothesis drives one scheduler's spool and shipper through random sequences of what
happens to them: events added (task exceptions: no death), deaths recorded with their
events, deaths amended to their real cause (a late report, a pod's verdict), the shipper's
mark lost (killed after the database committed and before the spool recorded it), the
shipper restarted, and the database refusing every connection for a while (a real outage:
the server refuses the database's connections). The spool is the oracle: whenever the
shipper says it is in sync, the history holds exactly the spool's events of this origin
and its deaths, each once, and every signature's count is the number of its deaths plus
its events that have no death.
"""

from __future__ import annotations

import itertools
import shutil
import sqlite3
import tempfile
import urllib.parse

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from oomguard import FailureEvent
from oomguard._death.record import Death, Role, Task
from oomguard._store import FailureStore
from oomguard._store.pg import Shipper, migrate, pg_connect

WORKERS = ("tcp://10.0.0.1:4000", "tcp://10.0.0.2:4000")
SIGNATURES = ("a", "b", "c")
_examples = itertools.count()


def history_machine(admin_url: str, url: str) -> type[RuleBasedStateMachine]:
    database = urllib.parse.urlsplit(url).path.lstrip("/")
    with pg_connect(url) as conn:
        migrate(conn, url)  # the invariant reads the tables before a shipper made them

    def admin(sql: str) -> None:
        with pg_connect(admin_url) as conn:
            conn.autocommit = True
            conn.execute(sql)

    class History(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.tag = f"x{next(_examples)}"  # this example's signatures, apart from others'
            self.dir = tempfile.mkdtemp(prefix="oomguard-model-")
            self.spool = FailureStore(f"{self.dir}/spool.sqlite3", batch_interval=0.01)
            self.spool.start()
            self.shipper = self._shipper()
            self.clock = 1_790_000_000.0
            self.away = False
            self.deaths = 0  # recorded so far: their ids are f"{tag}-d{n}", n < deaths

        def _shipper(self) -> Shipper:
            shipper = Shipper(self.spool, url, "model", batch=7)  # small: many batches
            shipper.start()
            return shipper

        def _event(self, worker: str, cause: str, sig: str, death: str = "") -> FailureEvent:
            self.clock += 1.0
            return FailureEvent(
                "infra", cause, f"s{self.clock:.0f}", "etl", worker, "h1",
                f"{self.tag}-{sig}", "t", {}, time=self.clock, cluster="model", death=death,
            )  # fmt: skip

        def _death(self, n: int, worker: str, cause: str, sig: str, tasks: int):
            """Death n, blamed on `tasks` tasks (each with an event), of signature `sig`."""
            identity = f"{self.tag}-d{n}"
            events = [self._event(worker, cause, sig, identity) for _ in range(tasks)]
            role = Role.CULPRIT if tasks == 1 else Role.SUSPECT
            death = Death(
                id=identity, cluster="model", worker=worker, cause=cause, time=self.clock,
                signature_id=f"{self.tag}-{sig}",
                tasks=tuple(Task(e.shard, role=role, pipeline="etl") for e in events),
            )  # fmt: skip
            return death, events

        @rule(
            worker=st.sampled_from(WORKERS),
            sig=st.sampled_from(SIGNATURES),
            n=st.integers(1, 12),
        )
        def add(self, worker, sig, n):
            for _ in range(n):  # task exceptions: events without a death
                assert self.spool.add(self._event(worker, "exception", sig))

        @rule(
            worker=st.sampled_from(WORKERS),
            cause=st.sampled_from(("worker_lost", "oom_kill")),
            sig=st.sampled_from(SIGNATURES),
            tasks=st.integers(1, 3),
        )
        def die(self, worker, cause, sig, tasks):
            assert self.spool.record(*self._death(self.deaths, worker, cause, sig, tasks))
            self.deaths += 1

        @precondition(lambda self: self.deaths > 0)
        @rule(
            which=st.integers(0, 1000),
            sig=st.sampled_from(SIGNATURES),
            tasks=st.integers(0, 2),
            late=st.booleans(),
        )
        def amend(self, which, sig, tasks, late):
            if late:  # as a report that comes seconds later: the lost death was sent
                assert self.spool.flush()
                self.shipper.sync(timeout=0 if self.away else 30)
            n = which % self.deaths
            death, events = self._death(n, WORKERS[0], "oom_kill", sig, tasks)
            assert self.spool.record(death, events, amend=True)

        @rule()
        def commit(self):
            assert self.spool.flush()

        @precondition(lambda self: not self.away)
        @rule()
        def ship(self):
            assert self.shipper.sync(timeout=30), self.shipper.last_error
            self._same()

        @precondition(lambda self: self.away)
        @rule()
        def ship_while_away(self):
            # Kept, not lost: in sync only when nothing was waiting to be sent.
            if self.shipper.sync(timeout=0.3):
                assert self.shipper.backlog == 0

        @rule(back=st.floats(0, 1))
        def lose_the_mark(self, back):
            """Killed between the database's commit and the spool's mark: the next
            shipper starts from an older mark and sends those events again."""
            assert self.spool.flush()
            self.shipper.close()
            sent = self.shipper._cursor
            conn = sqlite3.connect(self.spool.file, isolation_level=None)
            conn.execute(
                "UPDATE ship_state SET value = ? WHERE key = 'sent'", (str(int(sent * back)),)
            )
            deaths = int(self.shipper.deaths.cursor * back)
            conn.execute("UPDATE ship_state SET value = ? WHERE key = 'deaths_sent'", (deaths,))
            conn.close()
            self.shipper = self._shipper()

        @rule()
        def restart(self):
            self.shipper.close()
            self.shipper = self._shipper()

        @precondition(lambda self: not self.away)
        @rule()
        def outage(self):
            admin(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
            admin(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                f" WHERE datname = '{database}'"
            )
            self.away = True

        @precondition(lambda self: self.away)
        @rule()
        def back(self):
            admin(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
            self.away = False

        @invariant()
        def never_more_than_the_spool_holds(self):
            # Between syncs the history may lag the spool, never lead it: each (origin,
            # local id) at most once (the unique key), and no event the spool never had.
            if self.away:
                return
            with pg_connect(url) as conn:
                n, distinct, top = conn.execute(
                    "SELECT count(*), count(DISTINCT local_id), coalesce(max(local_id), 0)"
                    " FROM events WHERE origin = %s",
                    (self.shipper.origin,),
                ).fetchone()
            assert n == distinct
            # The highest id the spool ever gave (an amend may delete its last events).
            spool = sqlite3.connect(self.spool.file)
            given = spool.execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'")
            assert top <= (given.fetchone() or (0,))[0]
            spool.close()

        def _same(self) -> None:
            spool = {
                e.id: (e.shard, e.cause, e.signature_id, e.death)
                for e in self.spool.events(limit=None)
            }
            spool_deaths = {
                d.id: (d.cause, d.signature_id, tuple(t.key for t in d.tasks))
                for d in self.spool.deaths(limit=None)
            }
            with pg_connect(url) as conn:
                rows = conn.execute(
                    "SELECT local_id, shard, cause, signature_id, death FROM events"
                    " WHERE origin = %s",
                    (self.shipper.origin,),
                ).fetchall()
                deaths = conn.execute(
                    "SELECT id, cause, signature_id, tasks FROM deaths WHERE id LIKE %s",
                    (f"{self.tag}-%",),
                ).fetchall()
                counts = dict(
                    conn.execute(
                        "SELECT id, count FROM signatures WHERE id LIKE %s", (f"{self.tag}-%",)
                    ).fetchall()
                )
            history = {r[0]: tuple(r[1:]) for r in rows}
            assert len(rows) == len(history)  # none twice
            assert history == spool
            history_deaths = {r[0]: (r[1], r[2], tuple(t["key"] for t in r[3])) for r in deaths}
            assert len(deaths) == len(history_deaths) and history_deaths == spool_deaths
            expected = {f"{self.tag}-{s}": 0 for s in SIGNATURES}
            for _, _, sig, death in spool.values():
                expected[sig] += death == ""  # an event with a death counts nothing
            for _, sig, _ in spool_deaths.values():
                expected[sig] += 1  # its death counts once
            assert {k: counts.get(k, 0) for k in expected} == expected

        def teardown(self):
            try:
                if self.away:
                    self.back()
                self.ship()  # everything arrives, once, once the database is back
            finally:
                self.shipper.close()
                self.spool.close()
                shutil.rmtree(self.dir, ignore_errors=True)

    return History


def test_spool_to_history_is_exactly_once_over_any_interleaving(postgres, pg_url):
    run_state_machine_as_test(
        history_machine(postgres.url(), pg_url),
        settings=settings(
            max_examples=15,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )


@pytest.fixture(autouse=True)
def _reopen(postgres, pg_url):
    """A failed example leaves its database refusing connections: open it again."""
    yield
    database = urllib.parse.urlsplit(pg_url).path.lstrip("/")
    with pg_connect(postgres.url()) as conn:
        conn.autocommit = True
        conn.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
