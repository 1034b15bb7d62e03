"""What the scheduler side knows of each worker: Dask's record of it until its removal is
handled, the machine it runs on, its nanny (also a while after its removal), and the
nannies whose worker runs without oomguard."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._safe_text import safe_name
from ._setup import address_host, is_loopback, own_hostname
from ._trust import Bounded, NannyBook, dask_removal

if TYPE_CHECKING:
    from distributed.scheduler import WorkerState

    from .._guard import Guard
    from .._metrics import OomguardMetrics

logger = logging.getLogger("oomguard.scheduler")

#: Machines (IP -> hostname) remembered for naming workers that died before they spoke.
MACHINES_KEPT = 4096
#: Nannies kept as running their worker without oomguard (pruned to the live ones on
#: each tick); the least recently told go first.
UNGUARDED_KEPT = 4096
#: Bytes of a nanny's reason kept, as one printable line.
REASON_BYTES = 512


class Workers:
    """The workers oomguard saw register, by address.

    `states` keeps each one's `WorkerState` until its removal is handled: Dask deletes it
    from `scheduler.workers` before oomguard reads it. `host_name` names the machine of a
    worker the one way every event does.
    """

    def __init__(self, metrics: OomguardMetrics, guard: Guard) -> None:
        self.metrics = metrics
        self.guard = guard
        self.states: dict[str, WorkerState] = {}
        self.nannies = NannyBook(self.states.get)
        self.unguarded: dict[str, str] = {}  # nanny -> why its worker runs without oomguard
        self._hostnames: dict[str, str] = {}  # address -> the hostname its worker plugin sent
        self._machines = Bounded(MACHINES_KEPT)  # IP -> the hostname a worker there sent

    def added(self, address: str, ws: WorkerState) -> None:
        self.states[address] = ws

    def removed(self, address: str) -> tuple[WorkerState, str] | None:
        """Dask removed `address`: its `WorkerState` and the name of its machine (None when
        it was never seen or was handled already). Its nanny is remembered a while, for its
        late report."""
        ws = self.states.pop(address, None)
        if ws is None:
            return None
        host = self._hostnames.pop(address, None) or self.host_name(address)
        self.nannies.removed(address, ws)
        return ws, host or ws.host or address_host(address)

    def take_removal(
        self, msg: dict[str, Any], live: Mapping[str, Any]
    ) -> tuple[WorkerState, str] | None:
        """The worker a `remove-worker` event names, when it is Dask's own removal of a
        worker that registered (`_trust.dask_removal`; `live`: `scheduler.workers`): its
        `WorkerState` and machine (`removed`). None for any other event."""
        if not dask_removal(msg, self.states, live):
            return None
        return self.removed(msg["worker"])

    def host_event(self, msg: dict[str, Any]) -> bool:
        """A worker's hostname, from its worker plugin's setup (Dask sets `worker` to the
        sender's address for a worker's event; a label only, it decides nothing). Whether
        it was taken."""
        worker, host = msg.get("worker"), msg.get("host")
        if not (
            isinstance(worker, str)
            and worker in self.states
            and isinstance(host, str)
            and 0 < len(host) <= 255
            and host.isprintable()
            and not any(c.isspace() for c in host)
        ):
            return False
        self._hostnames[worker] = host
        self._machines[address_host(worker)] = host
        return True

    def host_name(self, address: str) -> str:
        """The one name of a worker's machine in events: the hostname its worker plugin
        sent (the name its nanny's death reports carry), else for a worker that died before
        its plugin spoke the one another worker at its IP sent, or this machine's for a
        loopback IP, else its IP."""
        ip = address_host(address)
        name = self._hostnames.get(address) or self._machines.get(ip)
        return name or (own_hostname() if is_loopback(ip) else ip)

    def unguarded_nanny(self, nanny: str, reason: Any) -> None:
        """A nanny whose oomguard setup failed (on-setup-error: warn): its worker runs
        without oomguard. Counted while a worker of that nanny is here. Any connection from
        the nanny's host can say so: one printable line each, at most `Guard.limited`'s
        lines a minute, and at most UNGUARDED_KEPT nannies kept."""
        reason = safe_name(reason, REASON_BYTES)
        nannies = self.unguarded
        if nanny not in nannies:
            self.guard.limited(
                "unguarded",
                "oomguard: the nanny %s runs its worker WITHOUT oomguard: %s",
                safe_name(nanny),
                reason,
            )
        nannies.pop(nanny, None)
        nannies[nanny] = reason
        while len(nannies) > UNGUARDED_KEPT:
            del nannies[next(iter(nannies))]  # the least recently told
        self.metrics.set_unguarded_nannies(len(nannies))

    def prune_unguarded(self, live: set[str]) -> None:
        """Nannies are counted as unguarded while a worker of theirs (`live` nannies) is
        here."""
        if not self.unguarded:
            return
        for nanny in [n for n in self.unguarded if n not in live]:
            del self.unguarded[nanny]
        self.metrics.set_unguarded_nannies(len(self.unguarded))


def admission_wait(msg: Any) -> tuple[str, float] | None:
    """(task key, seconds) of a worker's admission event: its task waited for host memory
    and then ran. Sent by workers: checked, never trusted; None for anything else.

    >>> admission_wait({"outcome": "granted", "key": "load-1", "waited": 2.5})
    ('load-1', 2.5)
    """
    if not isinstance(msg, dict) or msg.get("outcome") != "granted":
        return None
    key, waited = msg.get("key"), msg.get("waited")
    if (
        isinstance(key, str)
        and isinstance(waited, (int, float))
        and not isinstance(waited, bool)
        and 0 <= waited < 1e7
    ):
        return key, float(waited)
    return None
