"""Issue 28, item 4: one report's cost is bounded by the death, not by what it claims.

A report may name 64 executing keys and carry ~100 KiB of evidence. Before the bound each
named key became its own event carrying the whole evidence (63x disk amplification). Now
only keys the scheduler had in processing on that worker count, at most one event per
thread, and the evidence is capped in bytes once per death.
"""

from __future__ import annotations

from oomguard._death import wire
from oomguard._death.build import EXAMPLE, build
from oomguard._decide import DecisionCore, Record, Removal
from oomguard._decide.bounds import EVIDENCE_BYTES
from oomguard._store.items import event_item

WORKER = EXAMPLE.worker


def _amplifying(real: list[str], invented: int = 64) -> dict:
    """A valid report naming `invented` made-up keys after `real`, its evidence as large
    as the schema allows (96 keys of ~750 characters: ~72 KiB)."""
    report = wire.to_wire(build(EXAMPLE))
    stack = [["/app/job.py", i, f"step_{i}"] for i in range(20)]
    keys = real + [f"victim-{i}" for i in range(invented - len(real))]
    report["executing"] = [
        {
            "key": k,
            "prefix": k.split("-")[0],
            "start": 1.0,
            "thread": 1000 + i,
            "stack": stack,
            "stack_time": 1.0,
        }
        for i, k in enumerate(keys)
    ]
    evidence = dict(report["evidence"])
    evidence.update({f"x{i:02d}": "y" * 750 for i in range(96 - len(evidence))})
    report["evidence"] = evidence
    return wire.validate(report)  # what the intake hands the core


def _stored_bytes(records: list[Record]) -> int:
    """What the store would write for these records (its own encoding)."""
    total = 0
    for r in records:
        for event in r.events:
            item = event_item(event, r.grouping_version, r.example)
            total += sum(len(x) for x in item if isinstance(x, str))
    return total


def _core(keys: list[str]) -> DecisionCore:
    c = DecisionCore(allowed_failures=3, grace=5.0)
    c.submitted(keys, keys, {}, now=0.0)
    return c


def test_sixty_four_invented_keys_make_one_bounded_event():
    report = _amplifying(["real-1"])
    assert len(wire.encode(report)) > 64 * 1024  # as large as the demonstration's
    c = _core(["real-1"])
    removal = Removal(WORKER, "node-5", 0.0, {"real-1": "real-1"}, nthreads=1, pid=4242)
    c.removed(removal, now=1.0)
    records = [d for d in c.reported(report, now=1.1) if isinstance(d, Record)]
    assert [e.shard for r in records for e in r.events] == ["real-1"]
    evidence = records[0].death.evidence
    assert evidence["executing_ignored"] == 63  # named, not in processing: counted
    assert evidence["evidence_trimmed"] > 0
    example = len(records[0].example)
    assert _stored_bytes(records) - example <= EVIDENCE_BYTES + 1024


def test_real_keys_beyond_the_threads_are_charged_but_not_each_an_event():
    keys = [f"real-{i}" for i in range(8)]
    report = _amplifying(keys)
    c = _core(keys)
    removal = Removal(WORKER, "node-5", 0.0, {k: k for k in keys}, nthreads=2, pid=4242)
    c.removed(removal, now=1.0)
    out = c.reported(report, now=1.1)
    records = [d for d in out if isinstance(d, Record)]
    assert [e.shard for r in records for e in r.events] == ["real-0", "real-1"]
    assert _stored_bytes(records) - sum(len(r.example) for r in records) <= 2 * (
        EVIDENCE_BYTES + 1024
    )
    # Executing there, past the threads: still charged (never forgiven as displaced).
    assert not any(type(d).__name__ == "Forgive" for d in out)
    assert all(c.budget.undecided(k) == 0 for k in keys)


def test_a_report_whose_removal_never_came_is_one_event():
    report = _amplifying([], invented=64)
    c = _core([])
    assert c.reported(report, now=1.0) == []
    records = [d for d in c.tick(10.0) if isinstance(d, Record)]
    assert len(records) == 1
    assert records[0].death.evidence["evidence_trimmed"] > 0


def test_a_late_report_amends_at_most_its_deaths_threads():
    c = _core([])
    removal = Removal(WORKER, "node-5", 0.0, {}, nthreads=2, pid=4242)
    c.removed(removal, now=1.0)
    lost = [d for d in c.tick(10.0) if isinstance(d, Record)]
    assert [r.death.cause for r in lost] == ["worker_lost"]
    [late] = [d for d in c.reported(_amplifying([]), now=11.0) if isinstance(d, Record)]
    assert len(late.events) == 2 and late.amends is not None


def test_bounds_doctests():
    import doctest

    from oomguard._decide import blame, bounds

    assert doctest.testmod(bounds).failed == 0
    assert doctest.testmod(blame).failed == 0
