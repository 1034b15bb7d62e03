"""The ledger's promise, checked against a model (hypothesis stateful; issue 16).

Simulated processes share one ledger file and one memory limit. Each acquires leases, and
its tasks allocate and free memory within their needs, release their leases (some keep
their result in memory), drop kept results, or die. Checked against the
model's truth, not the ledger's view of it:

- at every grant, the need plus what live leases may still allocate plus the memory in use
  plus the floor fits in the limit; a cold start (no other live lease) may use the floor;
- after every step, what live leases may still allocate plus the memory in use fits in the
  limit: a task that stays within its need cannot meet the kernel's OOM killer.

The processes are simulated only in what the ledger reads: their RSS and whether they live.
The file, its locking and the decisions are the real ones.
"""

from __future__ import annotations

import itertools

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from oomguard._ledger import HostLedger

MiB = 2**20
LIMIT = 1024 * MiB
FLOOR = 64 * MiB
PIDS = (101, 102, 103, 104)


class LedgerModel(RuleBasedStateMachine):
    @initialize(bases=st.lists(st.integers(20, 120), min_size=len(PIDS), max_size=len(PIDS)))
    def start(self, bases):
        import tempfile

        self.path = tempfile.mkdtemp(prefix="oomguard-ledger-model-") + "/ledger.json"
        self.base = {pid: b * MiB for pid, b in zip(PIDS, bases)}
        self.alive = {pid: True for pid in PIDS}
        self.kept = {pid: 0 for pid in PIDS}  # results kept after their lease ended
        self.leases: dict[tuple[int, str], list[int]] = {}  # (pid, key) -> [need, held]
        self.keys = itertools.count()
        self.ledgers = {pid: HostLedger(self.path, floor=FLOOR, available=self.available,
                                        _process=(pid, self._own(pid), self._probe))
                        for pid in PIDS}

    # -- what the ledger reads -------------------------------------------------------

    def rss(self, pid: int) -> int:
        held = sum(h for (p, _), (_, h) in self.leases.items() if p == pid)
        return self.base[pid] + held + self.kept[pid]

    def usage(self) -> int:
        return sum(self.rss(p) for p in PIDS if self.alive[p])

    def available(self) -> int:
        return max(0, LIMIT - self.usage())

    def _own(self, pid):
        return lambda: self.rss(pid)

    def _probe(self, pid, start):
        return (True, self.rss(pid)) if self.alive.get(pid) else (False, None)

    # -- steps -----------------------------------------------------------------------

    def _live(self):
        return [k for k in self.leases if self.alive[k[0]]]

    @rule(pid=st.sampled_from(PIDS), need=st.integers(8, 700))
    def acquire(self, pid, need):
        if not self.alive[pid]:
            return
        key = f"task-{next(self.keys)}"
        before = self.unspent() + self.usage()  # the truth, not the ledger's view
        adm = self.ledgers[pid].try_acquire(key, need * MiB)
        if adm.granted:
            self.leases[(pid, key)] = [need * MiB, 0]
            if adm.cold:  # only with no other live lease, and never beyond the limit
                assert adm.others == 0 and not self._live()[:-1], adm
                assert before + need * MiB <= LIMIT, (before, need, adm)
            else:
                assert before + need * MiB + FLOOR <= LIMIT, (before, need, adm)

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
        self.kept[pid] = 0

    # -- the promise -----------------------------------------------------------------

    def unspent(self) -> int:
        return sum(need - held for need, held in (self.leases[k] for k in self._live()))

    @invariant()
    def within_the_limit(self):
        if hasattr(self, "leases"):
            assert self.unspent() + self.usage() <= LIMIT, (self.usage(), self.leases)


TestLedgerModel = LedgerModel.TestCase
TestLedgerModel.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
