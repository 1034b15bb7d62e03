"""Exactly once, over interleavings: a model-based test of spool -> PostgreSQL history.

Hypothesis drives one scheduler's spool and shipper through random sequences of what
happens to them: events added, worker_lost events amended to their real cause, the
shipper's mark lost (killed after the database committed and before the spool recorded
it), the shipper restarted, and the database refusing every connection for a while (a real
outage: the server refuses the database's connections). The spool is the oracle: whenever
the shipper says it is in sync, the history holds exactly the spool's events of this
origin, each once, and every signature's count is the number of its events there.
"""

from __future__ import annotations

import itertools
import shutil
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

        def _shipper(self) -> Shipper:
            shipper = Shipper(self.spool, url, "model", batch=7)  # small: many batches
            shipper.start()
            return shipper

        def _event(self, worker: str, cause: str, sig: str) -> FailureEvent:
            self.clock += 1.0
            return FailureEvent(
                "infra", cause, f"s{self.clock:.0f}", "etl", worker, "h1",
                f"{self.tag}-{sig}", "t", {}, time=self.clock, cluster="model",
            )  # fmt: skip

        @rule(
            worker=st.sampled_from(WORKERS),
            cause=st.sampled_from(("worker_lost", "oom_kill")),
            sig=st.sampled_from(SIGNATURES),
            n=st.integers(1, 12),
        )
        def add(self, worker, cause, sig, n):
            for _ in range(n):
                assert self.spool.add(self._event(worker, cause, sig))

        @rule(
            worker=st.sampled_from(WORKERS),
            sig=st.sampled_from(SIGNATURES),
            late=st.booleans(),
        )
        def amend(self, worker, sig, late):
            if late:  # as a report that comes seconds later: the lost event was sent
                assert self.spool.flush()
                self.shipper.sync(timeout=0 if self.away else 30)
            assert self.spool.amend(self._event(worker, "oom_kill", sig))

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
            self.spool._conn.execute(
                "UPDATE ship_state SET value = ? WHERE key = 'sent'", (str(int(sent * back)),)
            )
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
            assert top <= max((e.id for e in self.spool.events(limit=None)), default=0)

        def _same(self) -> None:
            spool = {
                e.id: (e.shard, e.cause, e.signature_id) for e in self.spool.events(limit=None)
            }
            with pg_connect(url) as conn:
                rows = conn.execute(
                    "SELECT local_id, shard, cause, signature_id FROM events WHERE origin = %s",
                    (self.shipper.origin,),
                ).fetchall()
                counts = dict(
                    conn.execute(
                        "SELECT id, count FROM signatures WHERE id LIKE %s", (f"{self.tag}-%",)
                    ).fetchall()
                )
            history = {r[0]: tuple(r[1:]) for r in rows}
            assert len(rows) == len(history)  # none twice
            assert history == spool
            expected = {f"{self.tag}-{s}": 0 for s in SIGNATURES}
            for _, _, sig in spool.values():
                expected[sig] += 1
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
