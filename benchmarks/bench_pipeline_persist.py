"""Persisting pipeline runs costs what changed, not what exists.

    .venv/bin/python benchmarks/bench_pipeline_persist.py            # 100,000 live runs
    .venv/bin/python benchmarks/bench_pipeline_persist.py --runs 10000

The scheduler plugin writes run statuses on each 0.5 s tick. Before the decision core it
rebuilt the status of every live pipeline on every tick; now it asks the policy which runs
changed (`take_dirty`). This builds a `DecisionCore` holding N live runs (one key each, N
`with span(...)` blocks), then times one tick's worth of status building both ways while
1 run changes per tick. Prints ms per tick and the ratio.
"""

from __future__ import annotations

import argparse
import time

from oomguard._decide import DecisionCore


def main(n: int, ticks: int) -> None:
    core = DecisionCore()
    for i in range(n):
        key = f"load-{i}"
        core.submitted([key], [key], {"span": {key: {"name": ("etl",), "ids": (f"s{i}",)}}}, 0.0)
    policy = core.policy
    policy.take_dirty()
    every, changed = [], []
    for t in range(ticks):  # interleaved: the two ways see the same machine
        key = f"load-{t}"
        core.transition(key, "processing", "memory")
        start = time.perf_counter()
        for run in policy.take_dirty():
            policy.status(run)
        changed.append(time.perf_counter() - start)
        start = time.perf_counter()
        for run in policy.pipelines():
            policy.status(run)
        every.append(time.perf_counter() - start)
    med = lambda xs: sorted(xs)[len(xs) // 2] * 1e3  # noqa: E731
    print(f"{n} live runs, 1 changed per tick, {ticks} ticks (median ms per tick)")
    print(f"  every run rebuilt : {med(every):9.3f} ms")
    print(
        f"  changed runs only : {med(changed):9.3f} ms   ratio {med(every) / med(changed):,.0f}x"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--ticks", type=int, default=5)
    a = ap.parse_args()
    main(a.runs, a.ticks)
