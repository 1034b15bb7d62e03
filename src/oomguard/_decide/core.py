"""The decision core: every worker death and task failure in, plain decisions out (pure).

One owner per concern, each in its own module: `runs` (which run a key belongs to),
`pairing` (pairing removals with reports, each death decided once), `blame` (each task's
role in a death), `accounts` (what a failure writes: the death as decided and the events
of the tasks it is blamed on), `budget` (deaths
per key, Dask's bound kept exactly), `memory` and `resize` (after a memory kill: a larger
worker, waited for a while, or an abort), `isolation` (after a memory kill shared by
several tasks: each runs alone), `incidents` (deaths one cause explains, named on each
death; no count changes) and the `FailurePolicy` (per-shard evidence and the abort);
`signatures` names each crash, `environments` where its deaths live, and the words a person
reads come from `oomguard._words`.
The scheduler plugin turns Dask's hooks into calls here and applies the returned
decisions; nothing here touches Dask.

Invariants (tests/unit/test_decide_model.py checks them over random interleavings):
- a key is charged at most one death per removal, and stops (`Stop`) no later than the
  death that takes it past `allowed_failures`, exactly Dask's own bound;
- every removal is decided exactly once (a late report amends it); a death without a
  report is one event, of the shard it names or (several suspects) of none (`blame`);
- a key that may have killed a worker is held until that death is decided, so an abort
  decided from it comes before the key can run again;
- a stopped key never runs again; a run is stopped at most once;
- one suspect runs alone at a time (so at most one per worker), on an able worker when one
  is here, and its worker is given back when it ends, dies, is stopped or forgotten, or
  its hold runs out; a suspect that then dies alone is judged, never queued again;
- once every key is forgotten and every death decided, nothing is left but the span and
  annotation runs kept for more work in their block (`runs.IDLE_RUNS` at most, no keys).
"""

from __future__ import annotations

import time as _time
from collections.abc import Container, Iterable, Mapping
from typing import Any

from .._death.record import Death
from .._models import AbortDecision, FailureEvent, PipelineStatus
from . import accounts
from .accounts import task_record
from .blame import blame, blamed, memory_kill
from .budget import DeathBudget
from .decisions import Decision, Forgive, Hold, Release, Stop
from .environments import EnvironmentTally, slot
from .incidents import Incidents
from .isolation import RUN_ALONE_TIMEOUT, Isolation
from .pairing import Case, DeathPairing, Removal
from .policy import FailurePolicy
from .resize import LargerRetry
from .runs import Run, RunLabel, Runs, ShardKey, collection_name

_RUNNABLE = ("waiting", "processing", "queued", "no-worker")
#: A nanny's stop notice lists at most this many executing keys (`_handlers._stopped_by`):
#: a full list may have left some out, so the others are then not known to be queued.
_SAID_AT_MOST = 16


class DecisionCore:
    """The scheduler side's state machine.

    >>> core = DecisionCore(allowed_failures=3, grace=5.0)
    >>> core.submitted(["f-1"], ["f-1"], {}, now=0.0)
    >>> [type(d).__name__ for d in core.removed(Removal("tcp://a:1", "a", 0.0, {"f-1": "f-1"}), 0.0)]
    ['Hold']
    """

    def __init__(
        self,
        *,
        allowed_failures: int = 3,
        grace: float = 5.0,
        max_shard_infra_failures: int = 3,
        abort_on_repeat_signature: bool = True,
        larger_only: bool = True,
        max_reports: int = 1_000,
        run_alone_timeout: float = RUN_ALONE_TIMEOUT,
    ) -> None:
        self.runs = Runs()
        self.pairing = DeathPairing(grace, max_reports=max_reports)
        self.budget = DeathBudget(allowed_failures)
        self.policy = FailurePolicy(
            max_shard_infra_failures=max_shard_infra_failures,
            abort_on_repeat_signature=abort_on_repeat_signature,
        )
        self.larger_only = larger_only
        self.environments = EnvironmentTally()  # where deaths live: an abort names it
        self.policy.suspects = self.environments.suspects
        self.workers: dict[str, int | None] = {}  # address -> memory limit
        self.held: set = set()
        self.stopped: dict[Any, Stop] = {}  # key -> the Stop that erred it
        self.larger = LargerRetry(self.policy, self.runs)  # retries on a larger worker
        self.incidents = Incidents()
        self.isolation = Isolation(
            self.held,
            self.stopped,
            self.budget,
            self.workers,
            self.larger.resized,
            run_alone_timeout,
        )
        self._now = 0.0
        self.gone: list[RunLabel] = []  # runs that ended (`Runs.ended`): persist, drop
        self._written: dict[RunLabel, PipelineStatus] = {}  # run -> last status written
        self._ended: set = set()  # keys that reached memory or erred
        self.deaths = 0
        self.displaced = 0
        self.aborts = 0

    def configure(
        self,
        *,
        report_grace: float,
        max_shard_infra_failures: int,
        abort_on_repeat_signature: bool,
        larger_only: bool | None = None,
        run_alone_timeout: float | None = None,
    ) -> None:
        """Settings changed while running (`oomguard.install`), each applied by its owner
        (`larger_only`, `run_alone_timeout` None: as it is)."""
        if larger_only is not None:
            self.larger_only = larger_only
        if run_alone_timeout is not None:
            self.isolation.seconds = run_alone_timeout
        self.pairing.grace = report_grace
        self.policy.configure(
            max_shard_infra_failures=max_shard_infra_failures,
            abort_on_repeat_signature=abort_on_repeat_signature,
        )

    # --- graphs and task states (hot path: O(1)) -------------------------------------

    def submitted(
        self,
        tasks: Iterable[Any],
        keys: Iterable[Any],
        annotations: Mapping[str, Mapping[Any, Any]],
        now: float,
        prefixes: Iterable[str] = (),
        client: str = "",
    ) -> None:
        """A graph submission. `prefixes`: task prefixes from its first output key down to a
        root, which name it where no annotation or span does (`runs.collection_name`);
        `client`: who submitted it (a run named by annotation is per client)."""
        name = collection_name(prefixes)
        for run, new in self.runs.observe(tasks, keys, annotations, now, name, client).items():
            self.policy.pipeline_submitted(run.label, new, name=run.name, started=run.started)

    def transition(self, key: Any, start: str, finish: str) -> list[Decision]:
        if finish in ("memory", "erred"):
            run = self.runs.of(key)
            if run is not None and key not in self._ended:
                self._ended.add(key)
                if finish == "memory":
                    self.policy.shard_done(run.label, key)
                else:
                    self.policy.shard_erred(run.label, key, aborted=key in self.stopped)
            return self.isolation.done(key, self._now)
        if finish == "forgotten":
            return self.forget(key)
        if key in self.stopped and finish in ("processing", "no-worker", "queued"):
            # Never runs again: err it where it stands (its run was announced already).
            return [Stop((key,), self.stopped[key].exception)]
        if start == "released" and finish in _RUNNABLE and key in self._ended:
            self._ended.discard(key)  # its result was lost, or the client retried it
            run = self.runs.of(key)
            if run is not None:
                self.policy.shard_reopened(run.label, str(key))
        return []

    def forget(self, key: Any) -> list[Decision]:
        run = self.runs.forget(key)
        if run is not None:
            if key not in self._ended:
                self.policy.shard_forgotten(run.label, key)
            self._runs_ended()
        self._ended.discard(key)
        self.budget.forget(key)
        self.stopped.pop(key, None)
        self.larger.forget(key)
        out = self.isolation.done(key, self._now)
        if key in self.held:  # so the plugin forgets what it saved for the key too
            self.held.discard(key)
            out.append(Release((key,)))
        self.isolation.discard(key)
        return out

    def _runs_ended(self) -> None:
        self.gone += [run.label for run in self.runs.take_ended()]

    def changed_runs(self, final: bool = False) -> list[PipelineStatus]:
        """The statuses to write: of the runs that changed since the last call (of every
        run, `final`), each once; the runs whose keys are all forgotten are let go after
        this last word."""
        policy = self.policy
        names = policy.pipelines() if final else policy.take_dirty()
        gone, self.gone = self.gone, []
        out = []
        for run in dict.fromkeys([*names, *gone]):
            if not policy.has(run):
                continue
            status = policy.status(run)
            if final or self._written.get(run) != status:
                out.append(status)
                self._written[run] = status
        for run in gone:
            policy.forget_pipeline(run)
            self._written.pop(run, None)
        return out

    # --- workers ---------------------------------------------------------------------

    def worker_added(self, address: str, memory_limit: int | None) -> list[Decision]:
        self.workers[address] = memory_limit
        return self.larger.worker_added(address, memory_limit, self.stopped)

    def removed(self, removal: Removal, now: float) -> list[Decision]:
        """An unexpected removal, seen before Dask reschedules the worker's tasks."""
        self._now = now
        if self.workers.pop(removal.worker, None) is not None or removal.memory_limit:
            # A larger worker that is restarting is not "no larger worker": see LargerRetry.
            self.larger.worker_removed(removal.worker, removal.memory_limit, now)
        keys = [k for k in removal.processing.values() if k not in self.stopped]
        self.budget.charge(
            keys,
            {
                removal.processing[s]: n
                for s, n in removal.prior.items()
                if s in removal.processing
            },
        )
        out: list[Decision] = []
        if keys:
            self.held.update(keys)
            out.append(Hold(tuple(keys)))
        out += self.isolation.worker_gone(removal.worker, set(removal.processing.values()), now)
        death = self.pairing.removed(removal, now)
        if death is not None:
            out += self._decide(death)
        return out

    def reported(self, report: Death, now: float) -> list[Decision]:
        self._now = now
        death = self.pairing.reported(report, now)
        return self._decide(death) if death is not None else []

    def clean_exit(
        self,
        worker: str,
        now: float,
        requested: bool,
        pid: int | None = None,
        executing: Iterable[ShardKey] | None = None,
    ) -> list[Decision]:
        """The worker's nanny says it ended with status 0: `requested` (a stopped `dask
        worker`, a closed nanny, a restart) is no death, before or after its removal; unasked
        (a task called `os._exit(0)`) is a death of cause `exit`, as Dask counts it.
        `executing`: the keys the nanny said its worker was executing when stopped."""
        self._now = now
        said = tuple(executing) if executing is not None else None
        death = self.pairing.clean(worker, now, requested, pid, said)
        return self._decide(death) if death is not None else []

    def tick(self, now: float, limit: int | None = None) -> list[Decision]:
        """Decide deaths whose grace ran out, at most `limit` (more on the next call)."""
        self._now = now
        out = self.isolation.tick(now)
        for key, d in self.larger.timed_out(now, self.stopped):
            out += self._abort(d, key)  # no larger worker came back in time
        for death in self.pairing.expired(now, limit):
            out += self._decide(death)
        return out

    def close(self) -> list[Decision]:
        """The plugin is closing: decide what waits, let every held key run."""
        out: list[Decision] = []
        for death in self.pairing.drain():
            out += self._decide(death)
        held = tuple(k for k in self.held if k not in self.stopped)
        self.held.clear()
        out += self.isolation.clear()
        if held:
            out.append(Release(held))
        return [d for d in out if not isinstance(d, Hold)]

    # --- one death -------------------------------------------------------------------

    def _decide(self, case: Case) -> list[Decision]:
        if case.late:
            return self._amend(case)
        if case.clean:
            return self._not_a_death(case)
        self.deaths += 1
        removal = case.removal
        b = blame(case, self.runs.forgotten)
        out: list[Decision] = []
        culprits = {self.runs.name_of(s) for s in b.executing} - {""}
        by = next(iter(culprits)) if len(culprits) == 1 else ""  # whose death took the work
        forgiven = self._displace(b.displaced, None, b.neighbours, by=by)
        self._displace(b.beside, dict.fromkeys(b.beside, True), by=by)  # still charged
        out += self.isolation.displaced(forgiven)  # waited at its gate, or beside a crash
        if forgiven:
            out.append(Forgive(tuple(forgiven)))
        keys = {s: (k if k is not None else self.runs.key(s)) for s, k in b.executing.items()}
        charged = (
            set(removal.processing.values()) - set(forgiven) if removal is not None else set()
        )
        self.budget.decided(
            charged, forgiven, [k for k in keys.values() if k is not None and k not in charged]
        )
        named = {} if b.suspected else keys or {"": None}  # the shards with events
        attempts = {s: self.policy.attempt(s) for s in named if s}
        # A shared memory death, and one of them was to run alone: why it did not.
        alone = self.isolation.why(keys.values()) if b.shared else ""
        at = slot(case.worker, removal.nanny if removal is not None else None)
        env = self.environments.of(at)  # a death no report described: its worker's
        account = accounts.decided(case, b, keys, self.runs.name_of, attempts, alone, env)
        self.environments.died(account.record.death)
        out.append(self.incidents.named(account.record, self._now))
        decisions: list[tuple[AbortDecision, Any]] = []
        if b.suspected:
            # The one event names none of its suspects: each suspect's run counts the death
            # once, no shard's own count moves (Dask's budget still charges each of them).
            runs = {
                r.label for k in keys.values() if k not in self.stopped and (r := self.runs.of(k))
            }
            for label in runs:
                self.policy.death_suspected(label, account.record.events[0])
        for event in account.record.events if named else ():
            key = named[event.shard]
            run = self.runs.of(key) if key is not None else None
            if run is not None and key not in self.stopped:
                d = self.policy.record(event, run=run.label, may_decide=not b.shared)
                if d is None and not b.shared and self.larger_only and memory_kill(case):
                    limit = account.record.death.memory_limit
                    d, resize = self.larger.retry(
                        key, run.label, event, limit, self.workers, self._now
                    )
                    out += resize
                if d is not None:
                    decisions.append((d, key))
            if key is not None and self.budget.over(key) and key not in self.stopped:
                decisions.append((self._over_budget(key, run, event), key))
        for key in charged - set(named.values()):
            # Charged, not named (no report said what ran; several suspects; executing
            # beside the culprit): Dask's bound still holds.
            if self.budget.over(key) and key not in self.stopped:
                run = self.runs.of(key)
                event = account.unblamed(str(key), run.name if run else "")
                decisions.append((self._over_budget(key, run, event), key))
        for d, key in decisions:
            out += self._abort(d, key)
        out += self.isolation.died(charged, keys.values())
        if b.shared:  # the culprit, or each suspect, runs alone: its verdict comes soonest
            first = keys.get(b.likely.shard) if b.likely else None
            for key in self.isolation.queue(keys.values(), first):
                if (run := self.runs.of(key)) is not None:
                    self.policy.isolated(run.label)
        out += self._release_decided(removal)
        return out + self.isolation.next(self._now)

    def _not_a_death(self, death: Case) -> list[Decision]:
        """A removal that was a requested stop: its tasks were only displaced.
        Take back Dask's count and ours, and let them run elsewhere (held until now, as the
        tasks of every removal are until it is decided). Each is counted as it was there:
        executing or queued where its nanny said what ran (or, failing that, the last
        heartbeat saw it executing), else not known."""
        removal = death.removal
        assert removal is not None
        said = death.executing
        if said is not None and len(said) < _SAID_AT_MOST:
            executing = {s: s in said for s in removal.processing}
        else:
            executing = dict.fromkeys([*(said or ()), *removal.executing_guess], True)
        # Stopped keys were never charged nor held at the removal.
        forgiven = self._displace(
            {s: k for s, k in removal.processing.items() if k not in self.stopped}, executing
        )
        self.budget.decided((), forgiven)
        out = self.isolation.displaced(forgiven)
        out += [Forgive(tuple(forgiven))] if forgiven else []
        return out + self._release_decided(removal) + self.isolation.next(self._now)

    def _displace(
        self,
        tasks: dict[ShardKey, Any],
        executing: Mapping[ShardKey, bool] | None = None,
        neighbours: Container = (),
        *,
        by: str = "",
    ) -> list:
        """{str: key} of tasks that were on a dead worker but are not to blame: count them
        displaced, `executing` (str -> bool) or not (absent: not known; None: all queued),
        `neighbours` by a neighbour's crash; `by`: the pipeline of the death's culprit (the
        budget is the caller's). The keys, in order."""
        for s, key in tasks.items():
            self.displaced += 1
            if (run := self.runs.of(key)) is not None:
                ran = executing.get(s) if executing is not None else s in neighbours or False
                lost = by if by and by != run.name else ""
                self.policy.displaced(run.label, s, ran, by_crash=s in neighbours, lost_to=lost)
        return list(tasks.values())

    def _release_decided(self, removal: Removal | None) -> list[Decision]:
        # Keys held for this death run again, unless they wait for isolation, were stopped,
        # or still wait for another undecided death.
        if removal is None:
            return []
        free = []
        for key in removal.processing.values():
            if (
                key in self.held
                and key not in self.stopped
                and not self.isolation.waits(key)
                and self.budget.undecided(key) == 0
            ):
                self.held.discard(key)
                free.append(key)
        return [Release(tuple(free))] if free else []

    def _amend(self, case: Case) -> list[Decision]:
        # Each amended event keeps the attempt of the one it replaces.
        attempts = {t.key: max(1, self.policy.attempt(t.key) - 1) for t in blamed(case)[0]}
        record = accounts.late(case, self.runs.name_of, attempts).record
        self.environments.died(record.death)
        return [self.incidents.named(record, self._now)]

    # --- stopping --------------------------------------------------------------------

    def _over_budget(self, key: Any, run: Run | None, event: FailureEvent) -> AbortDecision:
        label = run.label if run is not None else None
        return self.policy.over_budget(
            label, event, key, self.budget.deaths(key), self.budget.allowed
        )

    def _abort(self, d: AbortDecision, key: Any) -> list[Decision]:
        if key in self.stopped:
            return []
        run = self.runs.of(key)
        exc = d.exception(key, self.budget.allowed)
        if run is None:
            stop = Stop((key,), exc)  # of no run
        else:
            self.runs.close(run)
            self._runs_ended()
            stop = Stop(tuple(run.keys), exc, run.label)
        self.aborts += 1
        for key in stop.keys:
            self.stopped[key] = stop
            self.held.discard(key)
            self.isolation.discard(key)
        return [stop, *self.isolation.after_stop(self._now)]

    # --- memory admission ------------------------------------------------------------

    def memory_waited(self, shard: ShardKey, seconds: float) -> None:
        """A task (its str key) waited `seconds` for host memory before it ran (a worker's
        admission event); counted in its pipeline run's summary."""
        key = self.runs.key(shard)
        run = self.runs.of(key) if key is not None else None
        if run is not None:
            self.policy.memory_waited(run.label, seconds)

    # --- task exceptions -------------------------------------------------------------

    def task_erred(
        self,
        key: Any,
        exception_text: str,
        traceback_text: str,
        worker: str,
        host: str,
        retries: int,
        now: float | None = None,
    ) -> tuple[list[Decision], bool]:
        """A task raised. Returns the decisions, and whether it was a MemoryError (INFRA:
        retried without using the task's own retries)."""
        run = self.runs.of(key)
        shard = str(key)
        pipeline, attempt = run.name if run is not None else "", self.policy.attempt(shard)
        when = now if now is not None else _time.time()
        record = task_record(
            shard, pipeline, worker, host, attempt, when, exception_text, traceback_text, retries
        )
        out: list[Decision] = [record]
        d = None
        if run is not None and key not in self.stopped:
            d = self.policy.record(record.events[0], run=run.label)
        if d is not None:
            out += self._abort(d, key)
        return out, exception_text.startswith("MemoryError") and d is None

    def pipeline_of(self, shard: ShardKey) -> str:
        """The pipeline (run name) of a task key as str, "" when none is known."""
        return self.runs.name_of(shard)
