"""Where a crash lives, in the history: each cluster's workers and their environments (the
baseline), each signature's first environment, and its suspects, found when it is read.

- The baseline: one row per (cluster, slot) in `worker_environments`: a worker's nanny
  (its own address without one), with the environment its latest start said (the host event
  of its worker plugin), at most `WORKERS_KEPT` per cluster, the least recently started
  going first. A cluster's own: slots are its addresses.
- `signatures.first_environment`: the environment of the first death of the signature that
  had one, as the store received them (in a PostgreSQL history: as the clusters' spools sent
  them); kept when that death is gone by retention.
- A signature's suspects (`_death.environment.suspects`): computed from its latest
  `DEATHS_READ` deaths against the baseline of the clusters they died in, each time it is
  read, so it follows every death and every worker start, also after a restart. A store of
  one cluster (a scheduler's own file, a spool) gives that cluster's; a PostgreSQL history,
  the fleet's (every cluster the reader may read). A signature counted fewer than
  `MIN_DEATHS` times cannot have one and costs no query; of a list, the first
  `SUSPECT_ROWS` signatures that can have one get theirs (the list is most frequent
  first): about 2 ms each at most, so a reply of 1,000 rows stays a fraction of a second
  (docs/performance.md). One signature read alone always gets its own.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._death.environment import MIN_DEATHS, Baseline, suspects, values
from .._death.record import Environment
from .._models import SignatureRow
from .._safe_text import safe_name, safe_value

#: Workers kept per cluster: a cluster's slots, far more than one ever has at once.
WORKERS_KEPT = 4096
#: A signature's latest deaths its suspects are found from (the scheduler's tally keeps
#: as many).
DEATHS_READ = 200
#: Signatures of one list whose suspects are found, at most (see the module docstring).
SUSPECT_ROWS = 100
#: The tag of a queued worker environment (`item`), among the writer's items.
ITEM = "worker_environment"

_encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def item(cluster: str, slot: str, environment: Environment, time: float) -> tuple:
    """The queued form of a worker's environment: (ITEM, (cluster, slot, time, JSON))."""
    if not isinstance(environment, Environment):
        raise TypeError(f"expected an Environment, got {type(environment).__name__}")
    if isinstance(time, bool) or not isinstance(time, int | float) or time != time:
        raise TypeError(f"time must be seconds since the epoch, got {time!r}")
    text = _encode(safe_value(dataclasses.asdict(environment), None))
    return (ITEM, (safe_name(cluster), safe_name(slot), float(time), text))


# --------------------------------------------------------------------------- SQLite writes

# A newer start replaces the row (a new seq: AUTOINCREMENT never reuses one); an older one,
# arriving late, is ignored.
_REPLACED = "DELETE FROM worker_environments WHERE cluster = ? AND slot = ? AND time <= ?"
_INSERT = """INSERT OR IGNORE INTO worker_environments (cluster, slot, time, environment)
    VALUES (?, ?, ?, ?)"""
_PRUNE = """DELETE FROM worker_environments WHERE seq IN (SELECT seq FROM worker_environments
    WHERE cluster = ? ORDER BY time DESC, seq DESC LIMIT -1 OFFSET ?)"""
# The first environment of each signature whose first death with one is in this batch (seq
# above :dlast): its earliest such death there.
_FIRST = """UPDATE signatures SET first_environment = (
        SELECT json_extract(d.record, '$.environment') FROM deaths AS d
        WHERE d.signature_id = signatures.id AND d.seq > :dlast
          AND json_type(d.record, '$.environment') = 'object'
        ORDER BY d.time, d.seq LIMIT 1)
    WHERE first_environment = '' AND id IN (SELECT signature_id FROM deaths
        WHERE seq > :dlast AND json_type(record, '$.environment') = 'object')"""


def write(conn: Any, rows: list[tuple]) -> None:
    """Inside the writer's transaction: the workers' environments of a batch (`item`'s
    rows), then each cluster's kept to `WORKERS_KEPT`. A row's `seq` is new with each
    update: what a history's shipper sends after."""
    for cluster, slot, time, text in rows:
        conn.execute(_REPLACED, (cluster, slot, time))
        conn.execute(_INSERT, (cluster, slot, time, text))
    for cluster in {r[0] for r in rows}:
        conn.execute(_PRUNE, (cluster, WORKERS_KEPT))


def first(conn: Any, dlast: int) -> None:
    """Inside the writer's transaction, after the batch's deaths and signatures: the
    signatures' first environments (see the module docstring)."""
    conn.execute(_FIRST, {"dlast": dlast})


# --------------------------------------------------------------------------- reads


@dataclass(frozen=True)
class Sql:
    """One backend's reads: the first environments of `n` signatures (one parameter each),
    a signature's latest deaths (cluster, nanny, worker, environment JSON; the id and a
    limit), and a cluster's baseline (slot, environment JSON; the cluster)."""

    firsts: Callable[[int], str]
    deaths: str
    workers: str


SQLITE = Sql(
    firsts=lambda n: (
        f"SELECT id, first_environment FROM signatures WHERE id IN ({', '.join('?' * n)})"
    ),
    deaths="SELECT cluster, coalesce(json_extract(record, '$.nanny'), ''), worker,"
    " json_extract(record, '$.environment') FROM deaths WHERE signature_id = ?"
    " ORDER BY time DESC LIMIT ?",
    workers="SELECT slot, environment FROM worker_environments WHERE cluster = ?",
)


def attach(
    rows: Sequence[SignatureRow], fetch: Callable[[str, Sequence[Any]], list], sql: Sql
) -> list[SignatureRow]:
    """`rows` with their first environment and suspects; `fetch(sql, args)` runs a query
    of the store (its dialect `sql`)."""
    if not rows:
        return list(rows)
    ids = [r.id for r in rows]
    firsts: dict[str, str] = {}
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        firsts.update(fetch(sql.firsts(len(chunk)), chunk))
    read = _Read(fetch, sql)
    out = []
    room = SUSPECT_ROWS
    for row in rows:
        found: list[dict[str, Any]] = []
        if row.count >= MIN_DEATHS and room > 0:
            room -= 1
            found = read.suspects(row.id)
        env = _loads(firsts.get(row.id))
        out.append(dataclasses.replace(row, first_environment=env, environment_suspects=found))
    return out


class _Read:
    """What one `attach` reads once: each distinct environment's values (its JSON parsed
    once), each cluster's workers, the baseline of each set of clusters (indexed once)."""

    def __init__(self, fetch: Callable[[str, Sequence[Any]], list], sql: Sql) -> None:
        self.fetch = fetch
        self.sql = sql
        self._values: dict[Any, dict[str, str]] = {}  # JSON text -> its values
        self._workers: dict[str, dict[tuple[str, str], dict[str, str]]] = {}  # by cluster
        self._baselines: dict[tuple[str, ...], Baseline] = {}

    def values(self, text: Any) -> dict[str, str]:
        if text not in self._values:
            self._values[text] = values(_loads(text))
        return self._values[text]

    def baseline(self, clusters: tuple[str, ...]) -> Baseline:
        if clusters not in self._baselines:
            for c in clusters:
                if c not in self._workers:
                    rows = self.fetch(self.sql.workers, (c,))
                    self._workers[c] = {(c, slot): self.values(text) for slot, text in rows}
            joined = {k: v for c in clusters for k, v in self._workers[c].items()}
            self._baselines[clusters] = Baseline(joined)
        return self._baselines[clusters]

    def suspects(self, signature_id: str) -> list[dict[str, Any]]:
        deaths = []
        for cluster, nanny, worker, text in self.fetch(
            self.sql.deaths, (signature_id, DEATHS_READ)
        ):
            if its := self.values(text):
                deaths.append(((cluster, nanny or worker), its))
        if not deaths:
            return []
        clusters = tuple(sorted({c for (c, _), _ in deaths}))
        return [s.to_dict() for s in suspects(deaths, self.baseline(clusters))]


def _loads(text: Any) -> dict[str, Any]:
    if not isinstance(text, str) or not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
