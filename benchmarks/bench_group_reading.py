"""Benchmark the nanny's periodic reading of its worker's memory cgroup.

Every sample interval (500 ms by default) each nanny reads its worker's group: the
``oom_kill`` count, ``cgroup.procs`` and whether the worker still runs (/proc/PID/stat and
status). It runs on the nanny's event loop, so its cost is loop time. Measured here on this
process's own memory cgroup with N extra sleeping processes in it (N others: a container
with N processes besides the worker), and the check at a death of whether those N still run.

Since issue 26 each reading also reads the host's MemAvailable and PSI and systemd-oomd's
xattrs on the group and its ancestors (`take_readings`). The two, today's reading
(`_Reading.take`) and the full one, run interleaved in alternating batches, so both see
the same machine; the target is a full reading within 10 % of today's.

    .venv/bin/python benchmarks/bench_group_reading.py
    .venv/bin/python benchmarks/bench_group_reading.py --others 0 10 100 --seconds 1

The figures are µs per reading, the share of one core at 500 ms, and the ratio.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from oomguard._host import cgroup as _cgroup
from oomguard._host.readings import HostMeter, OomdXattrs
from oomguard.worker_plugin._life import _Life, _Reading, take_readings


def _per_call(fn, seconds: float) -> float:
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        n += 1
    return (time.perf_counter() - start) / n


def _interleaved(a, b, seconds: float, batch: int = 100) -> tuple[float, float]:
    """Median seconds per call of `a` and of `b`, in alternating batches of `batch` calls."""
    ta: list[float] = []
    tb: list[float] = []
    deadline = time.perf_counter() + 2 * seconds
    while time.perf_counter() < deadline or len(ta) < 5:
        for fn, out in ((a, ta), (b, tb)):
            start = time.perf_counter()
            for _ in range(batch):
                fn()
            out.append((time.perf_counter() - start) / batch)
    return sorted(ta)[len(ta) // 2], sorted(tb)[len(tb) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--others", type=int, nargs="+", default=[0, 10, 100])
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    info = _cgroup.detect()
    if info.path is None:
        sys.exit(f"no memory cgroup here: {info.reason}")
    print(f"# {' '.join(sys.argv)}")
    print(f"# cgroup v{info.version} {info.path}; sample interval 500 ms")
    meter = HostMeter()
    chain = OomdXattrs(info.path)._chain
    print(f"# PSI {'present' if meter.has_psi else 'absent'}; {len(chain)} groups up to the root")
    print(
        f"{'others':>7} {'today µs':>9} {'full µs':>8} {'ratio':>6} {'% of a core':>12} "
        f"{'death check µs':>15}"
    )
    for n in args.others:
        sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(n)]
        try:
            life = _Life(
                pid=os.getpid(),
                started=time.time(),
                address=None,
                name="bench",
                memory_limit=None,
                cgroup_path=info.path,
                cgroup_version=info.version,
            )
            baseline = len(_cgroup.group_pids(info.path))
            life.oomd_watch = OomdXattrs(info.path)
            take, full = _interleaved(
                lambda: _Reading.take(life),  # noqa: B023 (called here)
                lambda: take_readings(life, meter),  # noqa: B023
                args.seconds,
            )
            reading = _Reading.take(life)
            assert reading is not None and len(reading.others) >= n
            check = _per_call(lambda: reading.facts(time.time()), args.seconds)  # noqa: B023
            print(
                f"{baseline - 1:>7} {take * 1e6:>9.1f} {full * 1e6:>8.1f} {full / take:>6.3f} "
                f"{full / 0.5 * 100:>11.3f}% {check * 1e6:>15.1f}"
            )
        finally:
            for p in sleepers:
                p.kill()
                p.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
