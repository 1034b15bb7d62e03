"""The ledger's promise, checked against a model (hypothesis stateful; issue 16).

Simulated processes share one ledger file and one memory limit. Each acquires leases, and
its tasks allocate and free memory within their needs, release their leases (some keep
their result in memory), drop kept results, or die. A nanny restarts dead workers under
start-up leases it holds itself (spent by the worker it starts, not by the nanny, whose own
memory comes and goes within the floor). Checked against the model's truth, not the
ledger's view of it:

- at every grant, the need plus what live leases may still allocate plus the memory in use
  plus the floor fits in the limit; a cold start (no other live lease) may use the floor;
- after every step, what live leases may still allocate plus the memory in use fits in the
  limit: a task that stays within its need cannot meet the kernel's OOM killer.

The processes are simulated only in what the ledger reads: their RSS and whether they live.
The file, its locking and the decisions are the real ones.
"""

from __future__ import annotations

import itertools

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from oomguard._admission.ledger import HostLedger

MiB = 2**20
LIMIT = 1024 * MiB
FLOOR = 64 * MiB
PIDS = (101, 102, 103, 104)
NANNY = 100
# A refused request mostly gives up (withdraws): a waiting one holds back every later one
# that does not fit beside it, and the model would mostly explore refusals.
WAITS = st.sampled_from((False, False, False, True))


class LedgerModel(RuleBasedStateMachine):
    @initialize(bases=st.lists(st.integers(20, 120), min_size=len(PIDS), max_size=len(PIDS)))
    def start(self, bases):
        import tempfile

        self.path = tempfile.mkdtemp(prefix="oomguard-ledger-model-") + "/ledger.json"
        self.base = {pid: b * MiB for pid, b in zip(PIDS, bases)}
        self.alive = {pid: True for pid in PIDS}
        self.kept = {pid: 0 for pid in PIDS}  # results kept after their lease ended
        self.leases: dict[tuple[int, str], list[int]] = {}  # (pid, key) -> [need, held]
        self.starting: dict[int, list[int]] = {}  # worker pid -> [need, held] (nanny's lease)
        self.waiting: dict[tuple[int, str], int] = {}  # refused and asking again: need
        self.nanny = 30 * MiB
        self.keys = itertools.count()
        self.ledgers = {
            pid: HostLedger(
                self.path,
                floor=FLOOR,
                available=self.available,
                _process=(pid, self._own(pid), self._probe),
            )
            for pid in (*PIDS, NANNY)
        }

    # -- what the ledger reads -------------------------------------------------------

    def rss(self, pid: int) -> int:
        if pid == NANNY:
            return self.nanny
        held = sum(h for (p, _), (_, h) in self.leases.items() if p == pid)
        return self.base[pid] + held + self.kept[pid] + self.starting.get(pid, [0, 0])[1]

    def usage(self) -> int:
        return self.nanny + sum(self.rss(p) for p in PIDS if self.alive[p])

    def available(self) -> int:
        return max(0, LIMIT - self.usage())

    def _own(self, pid):
        return lambda: self.rss(pid)

    def _probe(self, pid, start):
        return (True, self.rss(pid)) if pid == NANNY or self.alive.get(pid) else (False, None)

    # -- steps -----------------------------------------------------------------------

    def _live(self):
        return [k for k in self.leases if self.alive[k[0]]]

    def _check_grant(self, adm, before: int, need: int, others: int) -> None:
        if adm.cold:  # only with no other live lease, and never beyond the limit
            assert adm.others == 0 and others == 0, adm
            assert before + need <= LIMIT, (before, need, adm)
        else:
            assert before + need + FLOOR <= LIMIT, (before, need, adm)

    @rule(pid=st.sampled_from(PIDS), need=st.integers(8, 700), waits=WAITS)
    def acquire(self, pid, need, waits):
        if self.alive[pid]:
            self._ask(pid, f"task-{next(self.keys)}", need * MiB, waits)

    @precondition(lambda self: self.waiting)
    @rule(data=st.data(), waits=WAITS)
    def ask_again(self, data, waits):
        pid, key = data.draw(st.sampled_from(sorted(self.waiting)))
        self._ask(pid, key, self.waiting.pop((pid, key)), waits)

    def _ask(self, pid: int, key: str, need: int, waits: bool) -> None:
        """A request; refused, it either waits (asks again later) or gives up."""
        before = self.unspent() + self.usage()  # the truth, not the ledger's view
        others = len(self._live()) + len(self.starting)
        adm = self.ledgers[pid].try_acquire(key, need)
        if adm.granted:
            self.leases[(pid, key)] = [need, 0]
            self._check_grant(adm, before, need, others)
        elif waits:
            self.waiting[(pid, key)] = need
        else:
            self.ledgers[pid].withdraw(key)

    @rule(pid=st.sampled_from(PIDS), need=st.integers(8, 400))
    def restart(self, pid, need):
        """The nanny leases a dead worker's start-up; the new process starts at once."""
        if self.alive[pid] or pid in self.starting:
            return
        before = self.unspent() + self.usage()
        others = len(self._live()) + len(self.starting)
        adm = self.ledgers[NANNY].try_acquire(f"start-{pid}", need * MiB, elsewhere=True)
        if adm.granted:
            self._check_grant(adm, before, need * MiB, others)
            self.alive[pid], self.base[pid] = True, 0
            self.starting[pid] = [need * MiB, 0]
        else:  # asks again with a new request later
            self.ledgers[NANNY].withdraw(f"start-{pid}")

    @precondition(lambda self: self.starting)
    @rule(data=st.data(), share=st.floats(0.0, 1.0), stays=st.floats(0.0, 1.0))
    def starts_up(self, data, share, stays):
        """A starting worker imports (within its lease), or is up: the nanny releases the
        lease, part of the start-up memory stays as the worker's base."""
        pid = data.draw(st.sampled_from(sorted(self.starting)))
        start = self.starting[pid]
        if data.draw(st.booleans()):
            start[1] += int((start[0] - start[1]) * share)
            return
        del self.starting[pid]
        if self.alive[pid]:
            self.base[pid] = int(start[1] * stays)
        self.ledgers[NANNY].release(f"start-{pid}")

    @rule(mib=st.integers(10, 150))
    def nanny_memory(self, mib):
        """The nanny's own memory (in LocalCluster: the client's and scheduler's too) comes
        and goes outside any lease, within what is left beside the leases and the floor."""
        grown = mib * MiB
        if self.unspent() + self.usage() - self.nanny + grown + FLOOR <= LIMIT:
            self.nanny = grown

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), share=st.floats(0.0, 1.0))
    def allocate(self, data, share):
        lease = self.leases[data.draw(st.sampled_from(sorted(self.leases)))]
        lease[1] += int((lease[0] - lease[1]) * share)  # within its need

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), share=st.floats(0.0, 1.0))
    def free(self, data, share):
        lease = self.leases[data.draw(st.sampled_from(sorted(self.leases)))]
        lease[1] -= int(lease[1] * share)

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), keep=st.booleans())
    def release(self, data, keep):
        pid, key = data.draw(st.sampled_from(sorted(self.leases)))
        _, held = self.leases.pop((pid, key))
        if keep:
            self.kept[pid] += held  # the task's result stays in the worker's memory
        assert self.ledgers[pid].release(key) == self.alive[pid] or not self.alive[pid]

    @rule(pid=st.sampled_from(PIDS))
    def drop_kept(self, pid):
        self.kept[pid] = 0

    @rule(pid=st.sampled_from(PIDS))
    def die(self, pid):
        # OOM-killed or crashed: its memory is gone, its leases die with it.
        self.alive[pid] = False
        for k in [k for k in self.leases if k[0] == pid]:
            del self.leases[k]
        for k in [k for k in self.waiting if k[0] == pid]:
            del self.waiting[k]
        self.kept[pid] = 0
        if pid in self.starting:  # died while starting: the nanny still holds its lease
            self.starting[pid][1] = 0

    # -- the promise -----------------------------------------------------------------

    def unspent(self) -> int:
        tasks = sum(need - held for need, held in (self.leases[k] for k in self._live()))
        return tasks + sum(need - held for need, held in self.starting.values())

    @invariant()
    def within_the_limit(self):
        if hasattr(self, "leases"):
            assert self.unspent() + self.usage() <= LIMIT, (self.usage(), self.leases)


TestLedgerModel = LedgerModel.TestCase
TestLedgerModel.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
