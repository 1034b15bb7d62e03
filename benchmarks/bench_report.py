"""Benchmark death-report validation the way the scheduler receives reports.

A typical report: 2 executing tasks with 30-frame stacks, a 6 KB faulthandler dump, v2
cgroup counters before and after. Also a report built from a 10 MB dump and 1,000 tasks,
capped to the default 256 KiB (the worst a nanny can send), and hostile payloads.

    .venv/bin/python benchmarks/bench_report.py              # ~2 s per row
    .venv/bin/python benchmarks/bench_report.py --seconds 0.3

Target: >= 1,000 typical reports/s through decode() (bytes in, a validated Death out) on one
core: a 1,000-worker cluster dying in the same second. Exits 1 when it is missed.
"""

from __future__ import annotations

import argparse
import dataclasses
import pickle
import sys
import time
from collections.abc import Callable

from oomguard._death.build import EXAMPLE, build
from oomguard._death.wire import decode, encode, to_wire, validate
from oomguard._exceptions import ReportError

TARGET_DECODE_PER_S = 1_000


def _counters(oom_kill: int, peak: int) -> dict:
    return {
        "version": 2,
        "path": "/sys/fs/cgroup/kubepods/pod1/worker-0",
        "oom_kill": oom_kill,
        "oom": oom_kill,
        "oom_group_kill": 0,
        "failcnt": None,
        "peak": peak,
        "limit": 2**31,
        "usage": 2**20,
        "missing": [],
    }


def _dump(threads: int, frames: int) -> str:
    blocks = ["Fatal Python error: Segmentation fault\n"]
    for t in range(threads):
        head = "Current thread" if t == 0 else "Thread"
        lines = [f"{head} 0x00007f1c2a3b{t:04x} (most recent call first):"]
        lines += [
            f'  File "/opt/conda/lib/python3.11/site-packages/pkg/module_{i}.py", line {i} in f_{i}'
            for i in range(frames)
        ]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _tasks(n: int, frames: int) -> list[dict]:
    return [
        {
            "key": f"('read-parquet-{i:032x}', {i})",
            "prefix": "read-parquet",
            "start": 1_760_000_000.0 + i,
            "thread": 139_000_000 + i,
            "stack": [
                (f"/opt/conda/lib/python3.11/site-packages/pyarrow/m{j}.py", j, f"fn_{j}")
                for j in range(frames)
            ],
            "stack_time": 1_760_000_001.0,
        }
        for i in range(n)
    ]


def typical_args() -> dict:
    text = _dump(threads=4, frames=18)
    assert 5_500 <= len(text) <= 6_500, len(text)  # "a 6 KB crash dump"
    return {
        "exitcode": -11,
        "executing": _tasks(2, 30),
        "crash_text": text,
        "cgroup_before": _counters(0, 2**20),
        "cgroup_after": _counters(0, 2**30),
        "cgroup_path": "/sys/fs/cgroup/kubepods/pod1/worker-0",
        "cgroup_version": 2,
        "rss_sampled": 2**30,
        "rss_time": 1_760_000_000.5,
        "host_memory": {"total": 2**36, "available": 2**34},
    }


def rate(fn: Callable[[], object], seconds: float) -> tuple[float, float]:
    """(calls per second, microseconds per call) over about `seconds`."""
    n, t0 = 0, time.perf_counter()
    deadline = t0 + seconds
    while True:
        for _ in range(20):
            fn()
        n += 20
        now = time.perf_counter()
        if now >= deadline:
            return n / (now - t0), (now - t0) / n * 1e6


def _rejects(data: bytes) -> Callable[[], None]:
    def go() -> None:
        try:
            decode(data)
        except ReportError:
            return
        raise AssertionError("accepted a hostile payload")

    return go


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=2.0, help="time per row")
    args = p.parse_args(argv)

    def seen(**fields):
        return dataclasses.replace(EXAMPLE, **fields)

    typical = build(seen(**typical_args()))
    typical_bytes, typical_wire = encode(typical), to_wire(typical)
    huge_args = {
        **typical_args(),
        "crash_text": _dump(threads=100, frames=1000) * 4,
        "executing": _tasks(1000, 100),
    }
    huge = build(seen(**huge_args))
    huge_bytes, huge_wire = encode(huge), to_wire(huge)
    assert decode(typical_bytes) == typical and decode(huge_bytes) == huge

    rows = [
        ("validate(dict), typical", len(typical_bytes), lambda: validate(typical_wire)),
        ("decode(bytes), typical", len(typical_bytes), lambda: decode(typical_bytes)),
        ("encode, typical", len(typical_bytes), lambda: encode(typical)),
        ("build, typical", len(typical_bytes), lambda: build(seen(**typical_args()))),
        ("validate(dict), capped worst case", len(huge_bytes), lambda: validate(huge_wire)),
        ("decode(bytes), capped worst case", len(huge_bytes), lambda: decode(huge_bytes)),
        (
            "build, 10 MB dump + 1000 tasks",
            len(huge_bytes),
            lambda: build(seen(**huge_args)),
        ),
        ("decode rejects a pickle", 0, _rejects(pickle.dumps(typical_wire))),
        ("decode rejects 256 KiB of garbage", 0, _rejects(bytes(range(256)) * 1024)),
    ]
    print(f"$ python benchmarks/bench_report.py --seconds {args.seconds}")
    print(f"{'operation':<40} {'report bytes':>12} {'per second':>12} {'us each':>10}")
    results = {}
    for name, size, fn in rows:
        per_s, us = rate(fn, args.seconds)
        results[name] = per_s
        print(f"{name:<40} {size or '-':>12} {per_s:>12,.0f} {us:>10.1f}")
    ok = results["decode(bytes), typical"] >= TARGET_DECODE_PER_S
    verdict = "met" if ok else "MISSED"
    print(f"target: decode(bytes), typical >= {TARGET_DECODE_PER_S:,}/s: {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
