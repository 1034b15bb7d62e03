"""What nannies send the scheduler, checked and counted: death reports and clean-exit
notices.

Trust (`_trust.py`): a report or notice is accepted only for a worker that registered with
a nanny, over a connection from that nanny's host, and a report only when its `nanny` field
is that nanny. Anything else is refused and counted
(`oomguard_reports_rejected_total{reason="unregistered"|"wrong_nanny"|"unknown_sender"}`).
This is as strong as Dask's own model allows without TLS: any client may run code on the
scheduler (`client.run_on_scheduler`) unless the cluster uses TLS with authentication, so
oomguard defends against mistakes and stray senders, not against a client that already
holds the keys. See docs/security.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._exceptions import ReportError
from .._protocol import OVERFLOW, UNKNOWN_SENDER, UNREGISTERED, WORKER_GROUP_PREFIX, WRONG_NANNY
from ._intake import ReportIntake
from ._trust import CGROUP_NANNIES, Bounded, NannyBook, sender_matches

if TYPE_CHECKING:
    from .._death.record import Death
    from .._decide import DeathPairing
    from .._guard import Guard
    from .._metrics import OomguardMetrics

#: The most executing tasks a nanny's stop names (the nanny sends at most this many).
STOPPED_TASKS_MAX = 16


class ReportDesk:
    """Death reports from nannies, from the RPC to the decision core: queued unread
    (`ReportIntake`: decoded and validated on its thread), then believed only from the
    worker's registered nanny, and handed to `decide` on the event loop. Also whom the
    scheduler believes about a notice, and what it counted: reports accepted, refused by
    reason, the latency from each death to its report, and the nannies whose workers run
    in a memory group of their own."""

    reports: int  # death reports accepted (handed to the decision core)
    rejected: dict[str, int]  # reports and notices refused here, by reason
    latencies: list[float]  # seconds from a death to its report, the last 1,000
    intake: ReportIntake | None  # between the RPC and the decision, from `start`

    def __init__(self, nannies: NannyBook, metrics: OomguardMetrics, guard: Guard) -> None:
        self.nannies = nannies
        self.metrics = metrics
        self.guard = guard
        self.reports = 0
        self.rejected = {}
        self.latencies = []
        self.intake = None
        self._cgroup_nannies = Bounded(CGROUP_NANNIES)
        self._pairing: DeathPairing | None = None
        self._decide: Callable[[Death], None] = lambda death: None

    def start(
        self,
        pairing: DeathPairing,
        decide: Callable[[Death], None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """Take reports from now on: `decide` hands a trusted one to the core, whose
        `pairing` waits for them."""
        self._pairing, self._decide = pairing, decide
        self.intake = ReportIntake(self._delivered, room=self._room, matched=pairing.waits)
        self.intake.start(loop)

    def close(self) -> None:
        """Stop the intake's thread (blocking)."""
        if self.intake is not None:
            self.intake.close()

    def submit(self, report: Any, peer: str | None) -> dict[str, Any]:
        """One report as msgpack bytes from `peer`, only queued: the intake decodes and
        validates it (never unpickles); its sender is checked against its worker once it
        is decoded. Refused unread (and counted) when the intake is full or the pairing has
        no room (`_room`): decoding a storm only to drop it starves the loop."""
        if not isinstance(report, bytes | bytearray | memoryview):
            e = ReportError(
                "report", f"expected msgpack bytes, got {type(report).__name__}", "wrong_type"
            )
            self.reject(e)
            return {"status": "rejected", "reason": e.reason, "field": e.field}
        if not self.intake.submit(bytes(report), peer):
            self.refused(OVERFLOW)
            return {"status": OVERFLOW}
        return {"status": "queued"}

    def _delivered(self, results: list) -> None:
        """A batch of decoded reports from the intake thread, on the event loop."""
        for death, arrived, peer in results:
            with self.guard("report"):
                if isinstance(death, ReportError):
                    self.reject(death)
                    continue
                if not self.trusted(peer, death.worker, death.nanny):
                    continue
                self.arrived(death, arrived)
                before = dict(self._pairing.refused)
                self._decide(death)
                self.taken(before, self._pairing.refused)

    def _room(self) -> int | None:
        """How many more death reports the pairing could take (the intake counts those
        it holds against this): none past its cap on unmatched reports, unless a removal
        waits, whose report any of them may be (never refused unread)."""
        pairing = self._pairing
        if pairing.pending_removals():
            return None
        return pairing.max_reports - len(pairing)

    def trusted(self, peer: str | None, worker: Any, nanny: Any = ...) -> bool:
        """Whether `peer` may speak for `worker` (`nanny`: the report's own field; a notice
        has none); a refusal is counted and its reason logged once."""
        reason = self.nannies.check(peer, worker, nanny, sender_matches)
        if reason is None:
            return True
        why = {
            UNKNOWN_SENDER: "not sent from the host of its registered nanny",
            UNREGISTERED: "no such worker registered with a nanny",
            WRONG_NANNY: f"names the nanny {nanny!r}, not the one its worker registered with",
        }[reason]
        field = "nanny" if reason == WRONG_NANNY else "worker"
        self.reject(ReportError(field, f"{worker!r}: {why}", reason))
        return False

    def from_nanny(self, peer: str | None, nanny: Any) -> bool:
        """Whether a message that names `nanny` (not a worker) came from its host."""
        if not isinstance(nanny, str) or not 0 < len(nanny) <= 256:
            return False
        if sender_matches(peer, nanny, nanny):
            return True
        self.reject(ReportError("nanny", f"not sent from the host of {nanny!r}", UNKNOWN_SENDER))
        return False

    def arrived(self, death: Death, arrived: float) -> None:
        """A trusted report: its latency, and whether its worker had a group of its own."""
        latencies = self.latencies
        latencies.append(max(0.0, arrived - death.time))
        del latencies[:-1000]
        self.metrics.report_latency(latencies[-1])
        cgroup_name = (death.cgroup.path if death.cgroup else "").rsplit("/", 1)[-1]
        if cgroup_name.startswith(WORKER_GROUP_PREFIX):
            self._cgroup_nannies.add(self.nannies.nanny_of(death.worker))
            self.metrics.set_cgroup_workers(len(self._cgroup_nannies))

    def taken(self, refused_before: dict[str, int], refused_after: dict[str, int]) -> None:
        """The decision core took a report: accepted, or refused by its pairing (a
        duplicate, no room), which counted it (`DeathPairing.refused`)."""
        reason = next((r for r, n in refused_after.items() if n != refused_before.get(r, 0)), None)
        if reason is None:
            self.reports += 1
        else:
            self.refused(reason)

    def refused(self, reason: str) -> None:
        """A death report refused by the intake or the pairing, which count it (`counts`):
        the metric, and a line in the log for the first of a reason other than overflow."""
        self.metrics.report_rejected(reason)
        if reason != OVERFLOW:
            e = ReportError("report", f"refused ({reason})", reason)
            self.guard.once(
                e.reason, "oomguard: rejected a death report (%s); further ones are counted", e
            )

    def reject(self, e: ReportError) -> None:
        self.rejected[e.reason] = self.rejected.get(e.reason, 0) + 1
        self.metrics.report_rejected(e.reason)
        self.guard.once(
            e.reason, "oomguard: rejected a death report (%s); further ones are counted", e
        )

    def counts(self) -> dict[str, Any]:
        """Death reports so far, each counted once, by what took or refused it: `reports`
        accepted (here), `rejected` by reason (here; a duplicate by the pairing), and
        `overflow`: refused unread by the intake, or past the pairing's cap."""
        refused = dict(self._pairing.refused) if self._pairing is not None else {}
        overflow = refused.pop(OVERFLOW, 0) + (self.intake.overflow if self.intake else 0)
        rejected = dict(self.rejected)
        for reason, n in refused.items():
            rejected[reason] = rejected.get(reason, 0) + n
        return {"reports": self.reports, "rejected": rejected, "overflow": overflow}

    def snapshot(
        self, core: Any, errors: int, removals_refused: int, unguarded: dict[str, str]
    ) -> dict[str, Any]:
        """The scheduler side's counts: reports (`counts`), its own errors, refused
        removals, unguarded nannies, and the decision core's deaths, displaced tasks,
        aborts and what it holds."""
        out = self.counts()
        out["internal_errors"] = errors
        out["removals_refused"] = removals_refused
        if core is not None:
            out.update(unguarded=dict(unguarded))
            out.update(
                deaths=core.deaths,
                displaced=core.displaced,
                aborts=core.aborts,
                held=len(core.held),
                pending_deaths=len(core.pairing),
            )
        return out


def notice(worker: Any, requested: Any, pid: Any, stopped: Any) -> dict[str, Any]:
    """A nanny's clean-exit notice, checked as a report's fields are: its worker (process
    `pid`) ended with status 0, `requested` (close, restart, SIGTERM) or not; `stopped`,
    the nanny's own signal and the tasks its worker was executing ({signal, executing}),
    or None. ReportError naming the field."""
    if not isinstance(worker, str) or not 0 < len(worker) <= 256:
        raise ReportError("worker", "expected a worker address", "wrong_type")
    if not isinstance(requested, bool):
        raise ReportError("requested", "expected true or false", "wrong_type")
    if pid is not None and (type(pid) is not int or pid <= 0):
        raise ReportError("pid", "expected a positive integer", "wrong_type")
    if stopped is not None:
        stopped = _stopped_by(stopped)
    return {"worker": worker, "requested": requested, "pid": pid, "stopped": stopped}


def _stopped_by(v: Any) -> dict:
    """A nanny's `stopped_by` ({signal, executing}), checked as a report's fields are."""
    if not isinstance(v, dict) or set(v) != {"signal", "executing"}:
        raise ReportError("stopped_by", "expected {signal, executing}", "wrong_type")
    sig, keys = v["signal"], v["executing"]
    if not isinstance(sig, str) or not 0 < len(sig) <= 16:
        raise ReportError("stopped_by.signal", "expected a signal name", "wrong_type")
    if not isinstance(keys, (list, tuple)) or len(keys) > STOPPED_TASKS_MAX:
        raise ReportError("stopped_by.executing", "expected at most 16 task keys", "too_large")
    if not all(isinstance(k, str) and len(k) <= 1024 for k in keys):
        raise ReportError("stopped_by.executing", "expected task keys as str", "wrong_type")
    return {"signal": sig, "executing": list(keys)}
