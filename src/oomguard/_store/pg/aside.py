"""Rows the PostgreSQL history refuses, set aside so that every other row goes through.

A batch is one transaction: one row PostgreSQL refuses as data (an integer past its range,
text it cannot hold, a name past an index's row size) fails all of it. Before, the shipper
retried the events one by one and sent the batch's runs with the next batch, which failed
again for good: one bad run name stopped every later run. Now a refused batch is sent
again in halves, and each half that is refused in halves again, down to single rows
(`split`): every row the history takes arrives, in O(k log n) transactions for k refused
rows of n. A row refused alone is set aside: it stays in the scheduler's spool, is never
sent again, and is recorded in the history's `set_aside` table (what `oomguard doctor
--store` shows), counted in `oomguard_history_set_aside_total{kind}`, logged once per
kind, and returned by the `Shipper.sync()` that waited for it.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..._protocol import SET_ASIDE_KINDS as KINDS
from ..._safe_text import safe_name

logger = logging.getLogger("oomguard.store")

#: Set-aside rows a shipper keeps in memory for `sync()` (the history's table has them all).
KEPT = 1000
#: Characters of PostgreSQL's reason kept.
REASON_MAX = 512


@dataclass(frozen=True)
class SetAside:
    """One row the history refused. `item`: the spool's event id, the run as
    "name@started", the signature id of an example, the spool's id of a deletion."""

    kind: str
    item: str
    reason: str
    cluster: str = ""
    time: float = 0.0

    def __str__(self) -> str:
        where = f" of cluster {self.cluster!r}" if self.cluster else ""
        return f"{self.kind} {self.item}{where}: {self.reason}"


class Synced:
    """What `Shipper.sync()` found: true when the spool's commits at the call are in the
    history, each row sent or set aside; `set_aside` names those set aside meanwhile.

    >>> done = Synced(True, (SetAside("run", "etl@1.0", "value too long"),))
    >>> bool(done), [str(s) for s in done.set_aside]
    (True, ['run etl@1.0: value too long'])
    """

    __slots__ = ("done", "set_aside")

    def __init__(self, done: bool, set_aside: Sequence[SetAside] = ()) -> None:
        self.done = done
        self.set_aside = tuple(set_aside)

    def __bool__(self) -> bool:
        return self.done

    def __repr__(self) -> str:
        return f"Synced({self.done}, set_aside={len(self.set_aside)})"


class Book:
    """The rows one shipper set aside: counted by kind, the latest KEPT kept, the first of
    each kind logged (at ERROR, naming `history` and `spool`)."""

    def __init__(self, history: str, spool: str) -> None:
        self.history, self.spool = history, spool
        self.counts = dict.fromkeys(KINDS, 0)
        self.total = 0  # ever set aside by this shipper
        self._latest: collections.deque[SetAside] = collections.deque(maxlen=KEPT)
        self._lock = threading.Lock()

    def add(self, rows: Sequence[SetAside]) -> None:
        with self._lock:
            for a in rows:
                if not self.counts[a.kind]:
                    logger.error(
                        "oomguard: the history %s refused %s; it is set aside (kept in the "
                        "spool %s, not sent again) and every other row goes through. Further "
                        "ones are counted (oomguard_history_set_aside_total) and shown by "
                        "`oomguard doctor --store URL`",
                        self.history,
                        a,
                        self.spool,
                    )
                self.counts[a.kind] += 1
                self.total += 1
                self._latest.append(a)

    def since(self, total: int) -> list[SetAside]:
        """The rows set aside after `total` had been (the latest KEPT of them at most)."""
        with self._lock:
            new = min(self.total - total, len(self._latest))
            return list(self._latest)[len(self._latest) - new :]


def split(
    rows: Sequence[Any],
    send: Callable[[Sequence[Any]], None],
    refused: tuple[type[BaseException], ...],
    rollback: Callable[[], None],
) -> list[tuple[Any, BaseException]]:
    """Send `rows`, which were refused together, in halves down to single rows; the rows
    refused alone, each with its error. `send` is one transaction; `rollback` follows a
    refusal. Any other error propagates (the history is away: the caller retries all)."""
    out: list[tuple[Any, BaseException]] = []

    def halves(part: Sequence[Any]) -> None:
        mid = len(part) // 2
        for half in (part[:mid], part[mid:]):
            try:
                send(half)
            except refused as e:
                rollback()
                if len(half) == 1:
                    out.append((half[0], e))
                else:
                    halves(half)

    if len(rows) == 1:
        try:
            send(rows)
        except refused as e:
            rollback()
            out.append((rows[0], e))
    elif rows:
        halves(rows)
    return out


def record(kind: str, item: Any, reason: str, cluster: str) -> SetAside:
    """A set-aside row as kept and shown: every text safe, the reason one bounded line."""
    return SetAside(
        kind, safe_name(item, 256), safe_name(reason, REASON_MAX), safe_name(cluster), time.time()
    )


def run_item(row: Sequence[Any]) -> str:
    """A spool's pipelines row (cluster, name, started, ...) as a set-aside item."""
    return f"{row[1]}@{row[2]!r}"
