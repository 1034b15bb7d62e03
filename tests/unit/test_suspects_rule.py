"""The over-representation test (`_death.environment.suspects`, issue 40): its minimum
counts, the ratio and the binomial tail, and the edge cases a fleet has (too few deaths,
every worker in one pool, values missing, one worker dying again and again, a dying worker
the baseline never heard of); and the scheduler's own tally of this session, which an
abort message reads."""

from __future__ import annotations

import math

import pytest

from oomguard._death.environment import (
    ALPHA,
    MIN_DEATHS,
    SUSPECTS_MAX,
    binomial_tail,
    suspects,
    values,
)
from oomguard._death.record import Death, Environment
from oomguard._decide.environments import DEATHS_KEPT, SIGNATURES_KEPT, EnvironmentTally


def pools(*names: str) -> dict[str, dict[str, str]]:
    """A baseline: worker i in pool names[i]."""
    return {f"w{i}": {"NODE_POOL": p} for i, p in enumerate(names)}


def on(*slots: int, pool: str = "spot") -> list[tuple[str, dict[str, str]]]:
    return [(f"w{i}", {"NODE_POOL": pool}) for i in slots]


def found(deaths, workers) -> list[tuple[str, str, int, int, int, int]]:
    return [
        (s.name, s.value, s.deaths, s.of_deaths, s.workers, s.of_workers)
        for s in suspects(deaths, workers)
    ]


def test_only_one_pool_dies():
    workers = pools("spot", "spot", "od", "od", "od")
    assert found(on(0, 1, 0, 1), workers) == [("NODE_POOL", "spot", 4, 4, 2, 5)]


def test_too_few_deaths():
    workers = pools("spot", "spot", *["od"] * 20)
    assert MIN_DEATHS == 3
    assert found(on(0, 1), workers) == []  # however rare the value among the workers
    assert found(on(0, 1, 0), workers) == [("NODE_POOL", "spot", 3, 3, 2, 22)]


def test_every_worker_in_one_pool():
    workers = pools(*["spot"] * 5)
    assert found(on(0, 1, 2, 3, 4, 0, 1), workers) == []


def test_one_worker_dying_again_and_again_is_that_worker_not_its_pool():
    workers = pools("spot", "spot", *["od"] * 8)
    assert found(on(0, 0, 0, 0, 0, 0), workers) == []  # the other spot worker never died
    assert found(on(0, 0, 0, 0, 0, 1), workers) != []


def test_values_missing_count_only_where_they_are_known():
    # Three workers do not set NODE_POOL; three deaths name no NODE_POOL.
    workers = {**pools("spot", "spot", "od", "od", "od", "od"), "x1": {}, "x2": {}, "x3": {}}
    deaths = on(0, 1, 0, 1) + [("x1", {}), ("x2", {}), ("x3", {})]
    assert found(deaths, workers) == [("NODE_POOL", "spot", 4, 4, 2, 6)]


def test_a_dying_worker_the_baseline_lacks_counts_as_its_death_says():
    workers = pools("od", "od", "od", "od")  # the spot workers' host events never came
    got = found([("s0", {"NODE_POOL": "spot"}), ("s1", {"NODE_POOL": "spot"})] * 2, workers)
    assert got == [("NODE_POOL", "spot", 4, 4, 2, 6)]


def test_a_workers_environment_that_changed_since_counts_with_both():
    # The baseline has the workers' latest start, without an image; they died on image 7,
    # which only the deaths name: known of two workers, both with it, so not suspected.
    workers = pools("spot", "spot", "od", "od", "od")
    deaths = [(f"w{i % 2}", {"NODE_POOL": "spot", "image": "etl:7"}) for i in range(4)]
    assert found(deaths, workers) == [("NODE_POOL", "spot", 4, 4, 2, 5)]
    # w1 was on-demand at its latest start but died on spot: a spot worker too.
    workers = pools("spot", "od", "od", "od", "od", "od")
    assert found(on(0, 1, 0, 1), workers) == [("NODE_POOL", "spot", 4, 4, 2, 6)]


def test_no_baseline_no_deaths():
    assert found([], {}) == []
    assert found(on(0, 1, 0, 1), {}) == []  # only the dying workers: the value is everyone's


def test_twice_the_workers_share_is_the_least():
    # Spot is 2 of 4 workers (half); deaths all spot: exactly twice, and p = 1/32.
    workers = pools("spot", "spot", "od", "od")
    assert found(on(0, 1, 0, 1, 0), workers) == [("NODE_POOL", "spot", 5, 5, 2, 4)]
    # 2 of 3: a share of deaths of 1 is 1.5 times it.
    workers = pools("spot", "spot", "od")
    assert found(on(*[0, 1] * 10), workers) == []


def test_chance_must_not_explain_it():
    # 2 spot of 5 workers: 3 of 3 deaths spot would happen by chance 6.4 % of the time.
    workers = pools("spot", "spot", "od", "od", "od")
    assert binomial_tail(3, 3, 0.4) > ALPHA
    assert found(on(0, 1, 0), workers) == []
    assert found(on(0, 1, 0, 1), workers) != []  # 4 of 4: 2.6 %


def test_mixed_deaths_need_twice_the_share_too():
    workers = pools("spot", "spot", *["od"] * 8)  # spot 20 % of the workers
    mixed = on(0, 1, 0, 1, 0, 1) + on(2, 3, 4, 5, pool="od")  # spot 60 % of the deaths
    assert found(mixed, workers) == [("NODE_POOL", "spot", 6, 10, 2, 10)]
    mixed = on(0, 1, 0) + on(2, 3, 4, 5, 6, 7, 8, pool="od")  # 30 %: not twice 20 %
    assert found(mixed, workers) == []


def test_several_suspects_most_telling_first_and_capped():
    workers = {
        f"w{i}": {
            "NODE_POOL": "spot" if i < 3 else "od",
            "kernel": "6.1" if i < 2 else "5.10",
            **{f"L{j}": "a" if i < 2 else "b" for j in range(8)},
        }
        for i in range(12)
    }
    deaths = [(f"w{i % 2}", workers[f"w{i % 2}"]) for i in range(6)]
    got = suspects(deaths, workers)
    assert len(got) == SUSPECTS_MAX
    assert all(s.p <= ALPHA for s in got)
    assert [s.p for s in got] == sorted(s.p for s in got)
    assert "NODE_POOL" not in {s.name for s in got}  # 3 of 12 workers: the less telling


def test_binomial_tail_is_the_sum_it_says():
    for n, p in ((5, 0.3), (20, 0.05), (200, 0.5)):
        for k in (0, 1, n // 2, n):
            exact = sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))
            assert binomial_tail(k, n, p) == pytest.approx(exact, rel=1e-9, abs=1e-300)
    assert binomial_tail(3, 3, 0.0) == 0.0 and binomial_tail(3, 3, 1.0) == 1.0


def test_values_read_from_any_form():
    e = Environment(python="3.11.9", kernel="6.1", labels={"NODE_POOL": "spot", "kernel": "x"})
    assert values(e) == {"python": "3.11.9", "kernel": "6.1", "NODE_POOL": "spot"}
    assert values({"python": 3, "labels": {"A": 1, "B": "b"}}) == {"B": "b"}
    assert values(None) == {} and values("junk") == {}


def test_the_sessions_tally_names_a_lost_workers_environment_and_keeps_bounds():
    tally = EnvironmentTally()
    for i in range(5):
        tally.worker(f"n{i}", Environment(labels={"NODE_POOL": "spot" if i < 2 else "od"}))
    # Deaths no report described carry no environment: the worker's is used.
    for i in range(4):
        tally.died(Death(id=f"d{i}", worker=f"tcp://w{i}", nanny=f"n{i % 2}", signature_id="s"))
    assert [(s["value"], s["deaths"], s["of_workers"]) for s in tally.suspects("s")] == [
        ("spot", 4, 5)
    ]
    # An amend (the same id) replaces its death: still four.
    tally.died(Death(id="d3", nanny="n1", signature_id="s"))
    assert tally.suspects("s")[0]["deaths"] == 4
    # A worker nobody heard of, and no environment: nothing to count.
    tally.died(Death(id="d9", nanny="n99", signature_id="s"))
    assert tally.suspects("s")[0]["deaths"] == 4
    for i in range(DEATHS_KEPT + 10):
        tally.died(Death(id=f"e{i}", nanny="n0", signature_id="t"))
    assert len(tally._deaths["t"]) == DEATHS_KEPT
    for i in range(SIGNATURES_KEPT + 1):
        tally.died(Death(id="x", nanny="n0", signature_id=f"sig{i}"))
    assert len(tally._deaths) == SIGNATURES_KEPT and "s" not in tally._deaths
    assert tally.suspects("s") == []


# --------------------------------------------------------------------------- the core


def _core_with_pools():
    from oomguard._decide import DecisionCore

    core = DecisionCore(
        allowed_failures=10, grace=5.0, max_shard_infra_failures=4, abort_on_repeat_signature=False
    )
    for i in range(5):
        pool = "spot" if i < 2 else "ondemand"
        core.environments.worker(f"tcp://n{i}:1", Environment(labels={"NODE_POOL": pool}))
    return core


def test_an_abort_names_the_pool_its_signatures_deaths_live_in():
    from oomguard._death.record import Task
    from oomguard._decide import Record, Stop
    from oomguard._decide.pairing import Removal

    core = _core_with_pools()
    core.submitted(["k"], ["k"], {}, now=0.0)
    stack = (("/app/etl.py", 3, "load"),)
    stops, records = [], []
    for i in range(4):  # each restart a new address, the same nanny (slot)
        worker, nanny = f"tcp://w{i % 2}:{100 + i}", f"tcp://n{i % 2}:1"
        core.removed(Removal(worker, "h", float(i), {"k": "k"}, nanny=nanny), now=float(i))
        death = Death(
            worker=worker, nanny=nanny, pid=7, cause="sigkill", time=float(i),
            tasks=(Task("k", "k", stack=stack),), environment=Environment(labels={"NODE_POOL": "spot"}),
        )  # fmt: skip
        out = core.reported(death, now=i + 0.1)
        records += [d for d in out if isinstance(d, Record)]
        stops += [d for d in out if isinstance(d, Stop)]
    [stop] = stops
    assert len({r.death.signature_id for r in records}) == 1
    message = stop.exception.message
    assert "NODE_POOL=spot far more often than the cluster's workers do" in message
    assert "(4 of 4 deaths, 2 of 5 workers)" in message
    # Said before what oomguard concludes and what to do.
    assert message.index("Where it lives") < message.index("oomguard treats")


def test_a_death_no_report_described_carries_its_workers_environment():
    from oomguard._decide import Record
    from oomguard._decide.pairing import Removal

    core = _core_with_pools()
    core.removed(Removal("tcp://w0:5", "h", 0.0, {}, nanny="tcp://n0:1"), now=0.0)
    [record] = [d for d in core.tick(now=10.0) if isinstance(d, Record)]
    assert record.death.cause == "worker_lost"
    assert record.death.environment == Environment(labels={"NODE_POOL": "spot"})
    core.removed(Removal("tcp://w9:5", "h", 0.0, {}, nanny="tcp://n9:1"), now=20.0)
    [record] = [d for d in core.tick(now=30.0) if isinstance(d, Record)]
    assert record.death.environment is None  # a worker that never said
