"""Whom the scheduler side believes about a worker's death, and the bounded maps it keeps.

Two things decide a death, and only Dask and the worker's own nanny may say them:

- **The removal.** Dask's `Scheduler.remove_worker` deletes the worker from
  `scheduler.workers` and, in the same step (no `await` between), publishes its
  `remove-worker` event; plugins' `log_event` hooks run inside that call, *before* Dask moves
  the dead worker's tasks. That is the one moment holds can still be applied, which is why
  oomguard reads the event rather than the `remove_worker` plugin hook: the hook runs after
  the tasks were moved and gets neither `expected` nor the processing keys (distributed
  2024.12 to 2026.8 alike). But any client or worker may publish to the topic `"all"` too, so
  an event counts (`dask_removal`) only when it names a worker that registered (oomguard
  holds its `WorkerState`) and is already gone from `scheduler.workers`: only Dask's own
  removal can make both true at the moment its event is seen. The `remove_worker` hook then
  only tidies up after it.
- **The report.** Taken only for a worker that registered with a nanny, with the report's
  `nanny` field equal to that nanny's address, over a connection from that nanny's host
  (`NannyBook.check`). The nanny of a worker that was removed is kept for a while
  (`RECENT_WORKERS`, least recently removed dropped first): a report can arrive before or
  after Dask removes the worker.

Without TLS anyone who can connect can run code on the scheduler (`run_on_scheduler`), so
these checks are against mistakes and misattribution, not against a user who means harm
(docs/security.md, "Whom oomguard trusts").
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from .._protocol import UNKNOWN_SENDER, UNREGISTERED, WRONG_NANNY

#: Workers removed whose nanny is still known, so their late death report is matched.
RECENT_WORKERS = 4_096
#: Nannies counted in `oomguard_cgroup_workers`, least recently reporting dropped first.
CGROUP_NANNIES = 4_096
#: Aborted runs whose abort was announced (logged, counted, published) once.
LOGGED_ABORTS = 4_096


class Bounded:
    """An insertion-ordered map holding at most `cap` entries: setting a key makes it the
    newest, the oldest goes when full.

    >>> b = Bounded(2)
    >>> b["a"] = 1; b["b"] = 2; b["a"] = 3; b["c"] = 4
    >>> list(b.items())
    [('a', 3), ('c', 4)]
    >>> "b" in b, b.get("b")
    (False, None)
    """

    __slots__ = ("_d", "cap")

    def __init__(self, cap: int) -> None:
        if cap < 1:
            raise ValueError(f"cap must be at least 1, got {cap}")
        self.cap = cap
        self._d: OrderedDict[Hashable, Any] = OrderedDict()

    def __setitem__(self, key: Hashable, value: Any) -> None:
        d = self._d
        d[key] = value
        d.move_to_end(key)
        if len(d) > self.cap:
            d.popitem(last=False)

    def add(self, key: Hashable) -> None:
        self[key] = True

    def get(self, key: Hashable, default: Any = None) -> Any:
        return self._d.get(key, default)

    def pop(self, key: Hashable, default: Any = None) -> Any:
        return self._d.pop(key, default)

    def items(self):
        return self._d.items()

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)


def dask_removal(msg: Any, tracked: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """Whether a `remove-worker` event on the topic "all" is Dask's own removal: it names a
    worker that registered (`tracked`: oomguard's address -> WorkerState, emptied as
    removals are handled) and that Dask has already taken out of `live`
    (`scheduler.workers`).

    >>> ws = object()
    >>> dask_removal({"action": "remove-worker", "worker": "tcp://a:1"}, {"tcp://a:1": ws}, {})
    True
    >>> dask_removal({"action": "remove-worker", "worker": "tcp://a:1"}, {"tcp://a:1": ws},
    ...              {"tcp://a:1": ws})  # still running: a client's event
    False
    >>> dask_removal({"action": "remove-worker", "worker": "tcp://b:1"}, {}, {})  # unknown
    False
    """
    if not isinstance(msg, dict) or msg.get("action") != "remove-worker":
        return False
    worker = msg.get("worker")
    return isinstance(worker, str) and worker in tracked and worker not in live


class NannyBook:
    """worker -> the nanny it registered with: live workers through `live` (oomguard's
    WorkerStates), removed ones from a bounded memory of the last `RECENT_WORKERS`."""

    def __init__(self, live: Callable[[str], Any], recent: int = RECENT_WORKERS) -> None:
        self._live = live
        self.recent = Bounded(recent)

    def removed(self, worker: str, ws: Any) -> None:
        """Dask removed `worker` (its WorkerState `ws`): remember its nanny, if any."""
        nanny = getattr(ws, "nanny", None)
        if isinstance(nanny, str) and nanny:
            self.recent[worker] = nanny

    def nanny_of(self, worker: str) -> str | None:
        ws = self._live(worker)
        if ws is not None:
            return ws.nanny or None
        return self.recent.get(worker)

    def check(self, peer: str | None, worker: Any, nanny: Any, matches) -> str | None:
        """None when `peer` may speak for `worker`, else the refusal's reason. `nanny`: the
        report's own `nanny` field (`...` for a notice, which has none). `matches`:
        `sender_matches(peer, worker, nanny)`, whether the peer is on the nanny's host."""
        registered = self.nanny_of(worker) if isinstance(worker, str) else None
        if registered is None:
            return UNREGISTERED
        if nanny is not ... and nanny != registered:
            return WRONG_NANNY
        if not matches(peer, worker, registered):
            return UNKNOWN_SENDER
        return None


def sender_matches(peer: str | None, worker: str, nanny: str | None, local: str = "") -> bool:
    """Whether a connection from `peer` may speak for `worker`, whose nanny is `nanny`.

    The peer's host must be the nanny's (the nanny connects from its own host; its port is
    ephemeral). Whether `nanny` is the worker's registered nanny is `NannyBook.check`'s
    part. In-process connections (`inproc://`) are the scheduler's own.

    >>> sender_matches("tcp://10.0.0.5:53122", "tcp://10.0.0.5:40001", "tcp://10.0.0.5:40000")
    True
    >>> sender_matches("tcp://10.0.0.9:53122", "tcp://10.0.0.5:40001", "tcp://10.0.0.5:40000")
    False
    >>> sender_matches("tcp://127.0.0.1:53122", "tcp://127.9.0.1:4000", None)  # loopback
    True
    """
    if not peer:
        return False
    if peer.startswith("inproc://"):
        return True
    owner = nanny or worker
    host = _host(peer)
    return host != "" and host == _host(owner)


@functools.lru_cache(maxsize=4096)  # per report in a storm: parse each address once
def _host(address: str) -> str:
    import ipaddress

    from distributed.comm import get_address_host

    try:
        host = get_address_host(address)
    except Exception:
        return ""
    try:
        if ipaddress.ip_address(host).is_loopback:  # 127.0.0.0/8 and ::1: this machine
            return "localhost"
    except ValueError:
        pass
    return host
