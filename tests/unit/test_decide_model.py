"""Model-based test of the decision core: thousands of random interleavings of task,
worker and report events, checking the promises oomguard makes in place of Dask's own
`allowed_failures` (see oomguard/_decide/core.py).

The model plays Dask and the nannies: workers run and queue keys, die with or without a
report (early, late, duplicated, never), forged reports arrive, keys finish, err, are
forgotten and resubmitted, oomguard is "installed" after some keys already run. It applies
the core's decisions the way the scheduler plugin does: a held or stopped key is never
started on a worker; a suspect placed to run alone starts only on its worker, and there its
worker's gate (when the worker can hold) lets it begin only once nothing else executes, and
nothing else begin until it ends or the hold runs out.
"""

from __future__ import annotations

import dataclasses

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from oomguard._causes import Killer
from oomguard._death.record import BLAMED, Attribution, Death, Task
from oomguard._decide import (
    IDLE_RUNS,
    DecisionCore,
    EndAlone,
    Forgive,
    Hold,
    Record,
    Release,
    Removal,
    Restrict,
    RunAlone,
    Stop,
    Widen,
)

ALLOWED = 2
GRACE = 5.0
HOLD = 8.0  # run-alone-timeout: a few ticks
KEYS = [f"k-{i}" for i in range(4)] + ["pre-0"]  # pre-*: submitted before install
WORKERS = [f"tcp://w{i}:1" for i in range(3)]
CAUSES = ["sigkill", "oom_kill", "native_crash", "memory_terminate", "sigterm"]
#: What the nanny said of the killer (issue 26): none (an older nanny), a userspace OOM
#: killer whose victim was the host's largest process (a memory death for blame) or not,
#: another process (external).
KILLERS = [
    None,
    ("earlyoom", "signal sender", True),
    ("earlyoom", "signal sender", False),
    ("systemd-oomd", "cgroup xattr", True),
    ("process", "signal sender", False),
]
VOCABULARY = {k.value for k in Killer}


class CoreModel(RuleBasedStateMachine):
    pending = Bundle("pending")  # reports not delivered yet

    @initialize(
        larger_only=st.booleans(),
        limits=st.lists(st.sampled_from([0, 2**30, 2**31]), min_size=3, max_size=3),
        able=st.sets(st.sampled_from(WORKERS)),
    )
    def setup(self, larger_only, limits, able):
        self.core = DecisionCore(
            allowed_failures=ALLOWED, grace=GRACE, larger_only=larger_only, run_alone_timeout=HOLD
        )
        self.now = 0.0
        self.limits = dict(zip(WORKERS, limits))
        self.alive = set(WORKERS)
        self.pid = {w: 1 for w in WORKERS}
        self.running = {w: {} for w in WORKERS}  # worker -> {key: executing?}
        self.submitted: set = set()
        self.held: set = set()
        self.stopped: set = set()
        self.stopped_runs: list[str] = []
        self.done: set = set()
        self.deaths_while_executing = {k: 0 for k in KEYS}
        self.removals = 0
        self.forged = 0
        self.death_records = 0
        self.forged_addresses: set = set()
        self.killer_of: dict = {}  # (worker, time) -> the killer its report named
        # (worker, time) of each death -> (its tasks, the heartbeat's guess), and the events
        # recorded for deaths without a report (issue 27: one each, naming its suspects)
        self.on_dead: dict = {}
        self.unreported: dict = {}
        self.job_of: dict = {}  # span block -> the run (job) its work goes to
        self.saw_death: set = set()  # runs a death was recorded for
        # (worker, time) -> (the task whose thread crashed, the tasks executing beside it)
        self.thread_crashes: dict = {}
        self.able = able  # workers whose plugin can hold (they say so once started)
        self.alone: dict = {}  # key -> (its worker or None, when placed): RunAlone..EndAlone
        self.hold: dict = {}  # worker -> (the suspect its gate holds for, until when)
        for w in WORKERS:
            self.add_worker(w)

    def add_worker(self, w):
        self.apply(self.core.worker_added(w, self.limits[w]))
        if w in self.able:
            self.apply(self.core.isolation.worker_able(w, self.now))

    # --- applying decisions, as the scheduler plugin does ---------------------------

    def apply(self, decisions):
        decisions = list(decisions)
        forgiven = {k for d in decisions if isinstance(d, Forgive) for k in d.keys}
        for d in decisions:
            if isinstance(d, Hold):
                self.held.update(d.keys)
            elif isinstance(d, Release):
                assert not set(d.keys) & self.stopped, "a stopped key was let run again"
                self.held.difference_update(d.keys)
            elif isinstance(d, Stop):
                if d.run:
                    assert d.run not in self.stopped_runs, f"run {d.run} stopped twice"
                    self.stopped_runs.append(d.run)
                self.stopped.update(d.keys)
                self.held.difference_update(d.keys)
                for w in WORKERS:  # released on its worker: Dask no longer has it there
                    for k in d.keys:
                        self.running[w].pop(k, None)
                        self.left(w, k)
            elif isinstance(d, RunAlone):
                assert d.key not in self.stopped, "a stopped key was let run alone"
                assert not self.alone, f"{d.key} placed while {self.alone} runs alone"
                self.check_choice(d)
                self.held.discard(d.key)
                self.alone[d.key] = (d.worker, self.now)
            elif isinstance(d, EndAlone):
                self.alone.pop(d.key, None)
            elif isinstance(d, Record):
                death = d.death
                if death is not None:
                    # One death, one account: its events name it and carry its one
                    # signature, and only the tasks it is blamed on have events.
                    assert d.events, "a death with no event"
                    assert {e.death for e in d.events} == {death.id}
                    assert {e.signature_id for e in d.events} == {death.signature_id}
                    blamed = {t.key for t in death.tasks if t.role in BLAMED}
                    named = {e.shard for e in d.events if e.shard}
                    assert named <= blamed, f"{named - blamed} carries a death not its own"
                    if d.amends is None:
                        self.death_records += 1
                        suspects = d.events[0].evidence.get("suspects", ())
                        for shard in [*blamed, *suspects]:
                            run = self.core.runs.of(self.core.runs.key(shard))
                            if run is not None:
                                self.saw_death.add(run.label)
                for e in d.events:
                    self.event(d, e, forgiven)
            else:
                assert isinstance(d, Forgive | Restrict | Widen)

    def event(self, d, e, forgiven):
        if d.amends is None and e.cause in ("worker_lost", "exit"):
            self.no_report_event(e)
        if e.kind == "infra" and e.cause not in ("memory_error",):
            # Every death names a killer from the vocabulary, and how it is known.
            assert e.killer in VOCABULARY, e.killer
            assert e.killer_confidence in ("confirmed", "likely"), e
            assert e.killer_how and e.killer_summary, e
            said = self.killer_of.get((e.worker, e.time))
            if said is not None and e.cause != "worker_lost":  # lost: no report yet
                assert e.killer == said, (e.killer, said)
        crash = self.thread_crashes.get((e.worker, e.time))
        if crash is not None and e.cause == "native_crash":
            # The dump named the crashing thread: its task alone is blamed, and the
            # tasks beside it are displaced (uncounted), unless the death was
            # already decided without the report (a late report only amends).
            crasher, beside = crash
            assert e.shard == crasher, f"{e.shard} blamed for {crasher}'s crash"
            if d.amends is None:
                assert beside <= forgiven, f"{beside - forgiven} not displaced"

    def check_choice(self, d):
        """The largest able worker here (no limit: the largest), above the limit the key
        died under when it is retried on larger workers; None only when there is none."""
        resized = self.core.larger.resized.get(d.key)
        floor = resized.limit if resized else 0
        fits = {
            w: (not self.limits[w], self.limits[w])
            for w in self.able & self.alive
            if not self.limits[w] or self.limits[w] > floor
        }
        if d.worker is None:
            assert not fits, fits
        else:
            assert d.worker in fits and fits[d.worker] == max(fits.values()), (d, fits)

    def no_report_event(self, e):
        """A death no report described is one event: it names a shard only when that shard
        was the only task there or the only one the last heartbeat saw executing; else it
        lists every task there as a suspect."""
        death = (e.worker, e.time)
        self.unreported[death] = self.unreported.get(death, 0) + 1
        assert self.unreported[death] == 1, f"death {death} recorded twice"
        tasks, guess = self.on_dead[death]
        if e.shard:
            assert [e.shard] in (list(tasks), list(guess)), (e.shard, tasks, guess)
            assert "suspects" not in e.evidence
        elif len(tasks) > 1 and len(guess) != 1:
            assert sorted(e.evidence["suspects"]) == sorted(guess or tasks), e.evidence
        else:
            assert not tasks, (tasks, guess)

    def on_worker(self, key):
        return next((w for w in WORKERS if key in self.running[w]), None)

    def left(self, worker, key):
        """`key` no longer runs on `worker`: a hold for it there ends."""
        if self.hold.get(worker, (None,))[0] == key:
            del self.hold[worker]

    def may_begin(self, key, worker) -> bool:
        """The worker's gate: nothing begins beside the suspect it holds for, and that
        suspect begins only once nothing else executes there."""
        holder = self.hold.get(worker, (None,))[0]
        if holder is None:
            return True
        others = [k for k, ex in self.running[worker].items() if ex and k != key]
        return key == holder and not others

    # --- the world ------------------------------------------------------------------

    @rule(
        keys=st.sets(st.sampled_from(KEYS[:4]), min_size=1),
        span=st.sampled_from(["a", "b"]),
        block=st.integers(0, 2),
    )
    def submit(self, keys, span, block):
        new = [k for k in keys if k not in self.submitted]
        ann = {"span": {k: {"name": (span,), "ids": (f"{span}{block}",)} for k in new}}
        self.core.submitted(new, new, ann, self.now)
        self.submitted.update(new)
        # One block is one job, however many computes (keys forgotten between them) it
        # holds, until that job is aborted: later work in the block is then a new run.
        for k in new:
            label = self.core.runs.of(k).label
            job = self.job_of.get(f"{span}{block}")
            assert job is None or job == label or job in self.stopped_runs, (job, label)
            self.job_of[f"{span}{block}"] = label

    @rule(key=st.sampled_from(KEYS), worker=st.sampled_from(WORKERS), executing=st.booleans())
    def start(self, key, worker, executing):
        # Dask schedules a key that it may run: known, not held, not erred, not running.
        if key.startswith("k") and key not in self.submitted:
            return
        if key in self.held or key in self.stopped or key in self.done:
            return
        if worker not in self.alive or self.on_worker(key) is not None:
            return
        placed, _ = self.alone.get(key, (None, None))
        if placed is not None and worker != placed:
            return  # restricted to the worker it runs alone on
        if key in self.alone and worker in self.able and worker not in self.hold:
            self.hold[worker] = (key, self.now + HOLD)  # its annotation: the gate holds
        self.running[worker][key] = executing and self.may_begin(key, worker)
        self.apply(self.core.transition(key, "waiting", "processing"))

    @rule(key=st.sampled_from(KEYS))
    def begin(self, key):
        """A key queued on its worker (or waiting at its gate) begins, when the gate lets it."""
        w = self.on_worker(key)
        if w is not None and not self.running[w][key] and self.may_begin(key, w):
            self.running[w][key] = True

    @rule(key=st.sampled_from(KEYS), erred=st.booleans())
    def finish(self, key, erred):
        w = self.on_worker(key)
        if w is None or not self.running[w][key]:
            return
        del self.running[w][key]
        self.left(w, key)
        self.done.add(key)
        if erred:
            out, _ = self.core.task_erred(key, "ValueError: no", "", w, "h", 0, self.now)
            self.apply(out)
        self.apply(self.core.transition(key, "processing", "erred" if erred else "memory"))

    @rule(key=st.sampled_from(KEYS))
    def forget(self, key):
        if self.on_worker(key) is not None:
            return
        self.apply(self.core.transition(key, "released", "forgotten"))
        assert key not in self.alone, f"{key} forgotten, its worker still held"
        self.submitted.discard(key)
        self.held.discard(key)
        self.stopped.discard(key)
        self.done.discard(key)
        self.deaths_while_executing[key] = 0

    @rule(
        target=pending,
        key=st.sampled_from(KEYS),
        cause=st.sampled_from(CAUSES),
        report=st.sampled_from(["before", "after", "never"]),
        guess=st.booleans(),
    )
    def kill_where(self, key, cause, report, guess):
        """The key kills the worker it runs on (or a worker dies under it)."""
        worker = self.on_worker(key)
        return self.kill(worker, cause, report, guess) if worker else None

    @rule(
        target=pending,
        key=st.sampled_from(KEYS),
        worker=st.sampled_from(WORKERS),
        cause=st.sampled_from(CAUSES),
        report=st.sampled_from(["before", "after", "never"]),
        guess=st.booleans(),
    )
    def crasher(self, key, worker, cause, report, guess):
        """A task that kills every worker it starts on, whenever Dask lets it start."""
        self.start(key, worker, True)
        return self.kill_where(key, cause, report, guess)

    @rule(
        target=pending,
        keys=st.lists(st.sampled_from(KEYS), min_size=2, max_size=3, unique=True),
        worker=st.sampled_from(WORKERS),
        report=st.sampled_from(["before", "after"]),
        grew=st.sampled_from([None, "one", "even"]),
    )
    def shared_memory_kill(self, keys, worker, report, grew):
        """Tasks that only together exceed the worker's memory; the samples saw one of
        them grow most (`one`: it is the likely culprit), all alike, or nothing."""
        for key in keys:
            self.start(key, worker, True)
        return self.kill(worker, "oom_kill", report, False, grew=grew)

    @rule(
        target=pending,
        worker=st.sampled_from(WORKERS),
        cause=st.sampled_from(CAUSES),
        report=st.sampled_from(["before", "after", "never"]),
        guess=st.booleans(),
        stale=st.booleans(),
        killer=st.sampled_from(KILLERS),
    )
    def kill(
        self, worker, cause, report, guess, stale=False, killer=None, crashed=None, grew=None
    ):
        if worker not in self.alive:
            return None
        self.now += 0.001  # each death its own time: its events are found by (worker, time)
        tasks = self.running[worker]
        executing = [k for k, ex in tasks.items() if ex]
        # A crash whose thread is known is the crasher's death alone: the bound is its own.
        for k in [crashed] if crashed is not None else executing:
            self.deaths_while_executing[k] += 1
        if crashed is not None and not stale:
            self.thread_crashes[(worker, self.now)] = (crashed, set(executing) - {crashed})
        mib = 2**20
        growth = {
            None: dict.fromkeys(executing),
            "one": {k: 900 * mib if i == 0 else 10 * mib for i, k in enumerate(executing)},
            "even": dict.fromkeys(executing, 300 * mib),
        }[grew]
        rep = Death(
            # stale: the nanny had not read the restarted process's address yet, so its
            # report names the address of the process before (same nanny, same pid).
            worker=f"{worker}-before" if stale else worker,
            nanny=f"{worker}-nanny",
            pid=self.pid[worker],
            cause=cause,
            host="h",
            time=self.now,
            memory_limit=self.limits[worker] or None,
            tasks=tuple(
                Task(k, k.split("-")[0], crashed=k == crashed, grew=growth[k]) for k in executing
            ),
        )
        if killer is not None and cause in ("sigterm", "sigkill"):
            name, how, memory = killer
            summary = f"{cause.upper()} from {name}"
            rep = dataclasses.replace(
                rep,
                killer=Attribution(name, how, "confirmed", summary, memory=memory),
                evidence={"killer_memory": memory},
            )
            if not stale:
                self.killer_of[(worker, self.now)] = name
        removal = Removal(
            worker=worker,
            host="h",
            time=self.now,
            processing={k: k for k in tasks},
            executing_guess={k: k for k in executing[:1]} if guess else {},
            nthreads=2,
            pid=self.pid[worker],
            memory_limit=self.limits[worker] or None,
            nanny=f"{worker}-nanny",
        )
        self.on_dead[(worker, self.now)] = (dict(tasks), removal.executing_guess)
        if report == "before":
            self.apply(self.core.reported(rep, self.now))
        self.alive.discard(worker)  # until its nanny restarts it
        self.apply(self.core.removed(removal, self.now))
        self.removals += 1
        self.restart(worker)
        return [rep, False] if report == "after" else None

    @rule(
        target=pending,
        keys=st.lists(st.sampled_from(KEYS), min_size=2, max_size=3, unique=True),
        worker=st.sampled_from(WORKERS),
        pick=st.integers(0, 3),
        report=st.sampled_from(["before", "after"]),
        matched=st.booleans(),
    )
    def thread_crash(self, keys, worker, pick, report, matched):
        """A task segfaults beside others on a worker with 2 threads; the dump names its
        thread (`matched`), or no task's (every executing task is blamed, as before)."""
        for key in keys:
            self.start(key, worker, True)
        executing = [k for k, ex in self.running[worker].items() if ex]
        if worker not in self.alive or not executing:
            return None
        crashed = executing[pick % len(executing)] if matched else None
        return self.kill(worker, "native_crash", report, False, crashed=crashed)

    @rule(
        worker=st.sampled_from(WORKERS),
        requested=st.booleans(),
        notice=st.sampled_from(["before", "after", "never"]),
        guess=st.booleans(),
    )
    def exit_zero(self, worker, requested, notice, guess):
        """The worker ends with status 0: its nanny was asked to stop it (`requested`: a
        SIGTERM, a restart) or it ended itself (a task called `os._exit(0)`), and Dask
        removed it unexpectedly. A lost notice leaves a removal to decide as worker_lost."""
        if worker not in self.alive:
            return
        self.now += 0.001  # each death its own time (see kill)
        tasks = self.running[worker]
        executing = [k for k, ex in tasks.items() if ex]
        death = not (requested and notice != "never")
        if death:  # a requested stop is not one: nothing a task did
            for k in executing:
                self.deaths_while_executing[k] += 1
            self.removals += 1
        removal = Removal(
            worker=worker,
            host="h",
            time=self.now,
            processing={k: k for k in tasks},
            executing_guess={k: k for k in executing[:1]} if guess else {},
            nthreads=2,
            pid=self.pid[worker],
            memory_limit=self.limits[worker] or None,
            nanny=f"{worker}-nanny",
        )
        self.on_dead[(worker, self.now)] = (dict(tasks), removal.executing_guess)
        pid = self.pid[worker]
        if notice == "before":
            self.apply(self.core.clean_exit(worker, self.now, requested, pid))
        self.alive.discard(worker)
        self.apply(self.core.removed(removal, self.now))
        if notice == "after":
            self.now += 0.1
            self.apply(self.core.clean_exit(worker, self.now, requested, pid))
        self.restart(worker)

    def restart(self, worker):
        """The nanny restarts a dead worker under the same address: a new process, whose
        plugin says again that it can hold (if it can)."""
        self.running[worker] = {}
        self.hold.pop(worker, None)
        self.pid[worker] += 1
        self.alive.add(worker)
        self.add_worker(worker)

    @rule(report=st.sampled_from(["before", "after"]))
    def suspect_dies_alone(self, report):
        """The suspect placed to run alone reaches its worker, starts once the tasks running
        there have ended, and still runs out of memory: it is judged on that death (a larger
        worker, an abort, or a plain retry), never queued to run alone again."""
        key = self.core.isolation.isolating
        worker = self.alone.get(key, (None,))[0]
        if worker is None or worker not in self.able:
            return
        self.start(key, worker, True)
        for k, ex in list(self.running[worker].items()):
            if ex and k != key:
                self.finish(k, False)  # what the gate waits for
        self.begin(key)
        if not self.running[worker].get(key):
            return  # not there (held, on its way): nothing to see yet
        assert [k for k, ex in self.running[worker].items() if ex] == [key], "not alone"
        rep = self.kill(worker, "oom_kill", report, False)
        if report == "after":  # the same, once its report arrives
            self.now += 0.001
            rep[1] = True
            self.apply(self.core.reported(rep[0], self.now))
        assert key not in self.core.isolation.suspects, "queued to run alone again"
        assert key != self.core.isolation.isolating, "placed to run alone again"

    @rule(rep=pending, delay=st.sampled_from([0.0, 1.0, 30.0]), copies=st.integers(1, 2))
    def deliver(self, rep, delay, copies):
        if rep is None or rep[1]:
            return
        rep[1] = True  # delivered
        self.tick(delay)
        for _ in range(copies):
            self.apply(self.core.reported(rep[0], self.now))

    @rule(cause=st.sampled_from(CAUSES))
    def forged_report(self, cause):
        # A report for a worker that never died here (a stray or hostile sender).
        self.forged += 1
        address = f"tcp://ghost{self.forged}:1"
        self.forged_addresses.add(address)
        self.apply(
            self.core.reported(
                Death(
                    worker=address,
                    pid=1,
                    cause=cause,
                    host="x",
                    time=self.now,
                    tasks=(Task("k-0", "k"),),
                ),
                self.now,
            )
        )

    @rule(dt=st.sampled_from([0.1, 1.0, 6.0]))
    def tick(self, dt):
        self.now += dt
        for w, (_, until) in list(self.hold.items()):
            if self.now >= until:  # the worker's own bound: others begin beside it again
                del self.hold[w]
        self.apply(self.core.tick(self.now))

    # --- the promises ----------------------------------------------------------------

    @invariant()
    def bounded_deaths(self):
        for k, n in self.deaths_while_executing.items():
            assert n <= ALLOWED + 1, f"{k} was executing in {n} deaths, budget {ALLOWED + 1}"

    @invariant()
    def a_held_key_waits_for_a_reason(self):
        core = self.core
        iso = core.isolation
        for k in core.held:
            assert core.budget.undecided(k) > 0 or iso.waits(k), (
                f"{k} held with nothing to wait for"
            )
        assert not core.held & set(core.stopped)
        if iso.isolating is None and iso.suspects:
            # Isolation only waits for a death still to be decided, or (bounded) for a
            # worker that can hold, never for nothing.
            assert core.budget.undecided(iso.suspects[0]) > 0 or iso.waiting, "isolation stalled"

    @invariant()
    def a_worker_is_held_for_one_suspect_only_while_it_needs_it(self):
        # One suspect runs alone at a time (so at most one per worker), and its worker is
        # given back when it ends, is stopped or forgotten, or the bound runs out (when it
        # dies: once that death is decided, checked in `suspect_dies_alone`).
        assert set(self.alone) <= {self.core.isolation.isolating}, self.alone
        for key, (_, since) in self.alone.items():
            assert key not in self.stopped and key not in self.done, key
            assert self.now - since < HOLD + 0.5, f"{key} held its worker past the bound"

    @invariant()
    def no_key_runs_while_its_death_is_undecided(self):
        # So an abort decided from that death comes before the key can kill again.
        for k, n in self.core.budget._pending.items():
            assert n == 0 or self.on_worker(k) is None, f"{k} runs with an undecided death"

    @invariant()
    def a_job_that_saw_a_death_never_reads_succeeded(self):
        policy = self.core.policy
        for label in self.saw_death:
            if policy.has(label):
                assert policy.status(label).status != "succeeded", policy.status(label)

    @invariant()
    def stopped_keys_stay_stopped(self):
        for k in self.stopped:
            assert self.on_worker(k) is None or k not in self.submitted

    def teardown(self):
        if not hasattr(self, "core"):
            return
        self.tick(GRACE + 1)
        self.tick(GRACE + 1)
        # Each removal and each distinct unmatched report is exactly one decided death.
        assert self.death_records == self.removals + len(self.forged_addresses)
        assert self.core.deaths == self.death_records
        for w in WORKERS:
            self.running[w] = {}
        for k in KEYS:
            self.forget(k)
        self.apply(self.core.close())
        core = self.core
        assert not core.held and not core.stopped and not core.isolation.suspects
        assert core.isolation.isolating is None and not core.isolation.overran and not self.alone
        assert len(core.budget) == 0 and len(core.runs) == 0
        assert len(core.pairing) == 0 and not core.larger.resized
        # Left: the jobs kept for more work in their blocks, at most IDLE_RUNS, no keys.
        kept = {run.label for run in core.runs.idle()}
        assert len(kept) <= IDLE_RUNS
        for run in core.gone:
            core.policy.forget_pipeline(run)
        assert set(core.policy.pipelines()) == kept
        for run in kept:  # every shard of a kept job ended, whatever it went through
            assert core.policy.status(run).status != "running", core.policy.status(run)
        for run in kept:
            core.policy.forget_pipeline(run)
        assert core.policy.tracked_shards() == 0


TestCoreModel = CoreModel.TestCase
TestCoreModel.settings = settings(max_examples=600, stateful_step_count=50, deadline=None)
