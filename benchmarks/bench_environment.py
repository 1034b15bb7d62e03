"""What a worker's environment costs (issue 40): its size on the wire, its reading per worker
start, the packages a death's stack names, the suspects per death and per query.

    .venv/bin/python benchmarks/bench_environment.py            # ~1 min
    .venv/bin/python benchmarks/bench_environment.py --quick    # ~15 s

1. Size: the environment msgpack-encoded (typical: 3 labels and 2 packages; every cap
   full), and a typical segfault report (bench_report.py's) without and with it.
2. Per worker start: `_host.environment.read` (the nanny on its event loop, the worker
   plugin at its setup: once each), the host event's extra bytes.
3. Per death, on the nanny: the crash's stack packages (warm cache; the first lookup of a
   name; the once-per-nanny map of import names), `build` and, on the scheduler, `decode`
   without and with an environment, interleaved (ratios).
4. Per death, on the scheduler: the session's tally (`EnvironmentTally.died`), and the
   suspects an abort reads (200 deaths against 4,096 workers).
5. Per query, a SQLite history of 100 signatures x 200 deaths and 1,000 workers:
   `signatures(limit=100)` with and without environments, interleaved; `signature(id)`.

No target: the figures go to docs/performance.md ("Where a crash lives").
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import msgpack
from bench_report import typical_args

from oomguard import FailureEvent
from oomguard._death.build import EXAMPLE, build
from oomguard._death.environment import stack_packages, stack_paths
from oomguard._death.record import (
    ENV_VALUE_MAX,
    IMAGE_MAX,
    LABEL_NAME_MAX,
    LABELS_MAX,
    PACKAGES_MAX,
    Death,
    Environment,
)
from oomguard._death.wire import decode, encode, to_wire
from oomguard._decide.environments import EnvironmentTally
from oomguard._host.environment import PackageVersions, read
from oomguard._store import FailureStore

TYPICAL = Environment(
    python="3.11.7",
    dask="2026.8.0",
    distributed="2026.8.0",
    oomguard="0.1.0",
    kernel="6.1.0-18-amd64",
    image="ghcr.io/dask/dask:2026.8.0-py3.11",
    labels={"NODE_POOL": "spot", "INSTANCE_TYPE": "m5.2xlarge", "ZONE": "eu-west-1b"},
    packages={"pyarrow": "17.0.0", "pandas": "2.2.3"},
)
FULL = Environment(
    **{f: "9" * ENV_VALUE_MAX for f in ("python", "dask", "distributed", "oomguard", "kernel")},
    image="i" * IMAGE_MAX,
    labels={f"L{i:0{LABEL_NAME_MAX - 1}d}": "v" * ENV_VALUE_MAX for i in range(LABELS_MAX)},
    packages={f"p{i:0{LABEL_NAME_MAX - 1}d}": "1" * ENV_VALUE_MAX for i in range(PACKAGES_MAX)},
)


def per_call(fn: Callable[[], object], seconds: float) -> float:
    """Median microseconds per call over 5 rounds of about `seconds` / 5 each."""
    rounds = []
    for _ in range(5):
        n, t0 = 0, time.perf_counter()
        deadline = t0 + seconds / 5
        while True:
            fn()
            n += 1
            now = time.perf_counter()
            if now >= deadline:
                break
        rounds.append((now - t0) / n * 1e6)
    return statistics.median(rounds)


def interleaved(a: Callable[[], object], b: Callable[[], object], seconds: float, rounds: int = 6):
    """(median µs of a, median µs of b, median of the per-round ratios b / a), A B B A ..."""
    xs, ys = [], []
    for i in range(rounds):
        order = (a, b) if i % 2 == 0 else (b, a)
        got = {f: per_call(f, seconds / rounds) for f in order}
        xs.append(got[a])
        ys.append(got[b])
    return (
        statistics.median(xs),
        statistics.median(ys),
        statistics.median(y / x for x, y in zip(xs, ys)),
    )


def size(e: Environment) -> int:
    return len(msgpack.packb(to_wire(e), use_bin_type=True))


def sizes() -> None:
    print("\n1. size on the wire (msgpack bytes)")
    plain = build(dataclasses.replace(EXAMPLE, **typical_args()))
    with_env = dataclasses.replace(plain, environment=TYPICAL)
    print(f"   environment, typical (3 labels, 2 packages)   {size(TYPICAL):>7,}")
    print(f"   environment, every cap full                    {size(FULL):>7,}")
    a, b = len(encode(plain)), len(encode(with_env))
    print(
        f"   typical segfault report, without / with        {a:>7,} / {b:,} (+{b - a}, x{b / a:.3f})"
    )
    print(f"   smallest report (SIGKILL), without / with      {len(encode(build(EXAMPLE))):>7,} / "
          f"{len(encode(dataclasses.replace(build(EXAMPLE), environment=TYPICAL))):,}")  # fmt: skip


def per_start(seconds: float) -> None:
    print("\n2. per worker start (the nanny's, then the worker plugin's, once each)")
    environ = {**os.environ, "NODE_POOL": "spot", "INSTANCE_TYPE": "m5.2xlarge"}
    labels = ("NODE_POOL", "INSTANCE_TYPE", "ZONE")
    us = per_call(lambda: read(environ, labels), seconds)
    host_event = size(read(environ, labels)) + len(msgpack.packb("environment"))
    print(f"   _host.environment.read                           {us:>8.0f} µs")
    print(f"   the host event's extra bytes                     {host_event:>8,}")


def per_death_nanny(seconds: float) -> None:
    print("\n3. per death, on the nanny and at the scheduler's door")
    args = typical_args()
    # The typical report's stacks are in pkg/ and pyarrow/: make them real installed names.
    text = args["crash_text"].replace("/pkg/", "/pandas/")
    paths = stack_paths(text, args["executing"])
    warm = PackageVersions()
    stack_packages(paths, warm)
    us = per_call(lambda: stack_packages(stack_paths(text, args["executing"]), warm), seconds)
    print(f"   stack packages, names looked up already          {us:>8.1f} µs")
    cold = []
    for name in ("pandas", "pyarrow", "numpy", "msgpack"):
        t0 = time.perf_counter()
        PackageVersions()(name)
        cold.append((time.perf_counter() - t0) * 1e3)
    print(
        f"   the first lookup of a name (4 names, median)     {statistics.median(cold):>8.2f} ms"
    )
    t0 = time.perf_counter()
    importlib.metadata.packages_distributions()
    print(
        f"   the import-name map, once per nanny if needed    {(time.perf_counter() - t0) * 1e3:>8.0f} ms"
    )
    plain = dataclasses.replace(EXAMPLE, **args)
    rich = dataclasses.replace(plain, environment=TYPICAL)
    a, b, r = interleaved(lambda: build(plain), lambda: build(rich), seconds)
    print(f"   build, without / with an environment             {a:>8.0f} / {b:.0f} µs (x{r:.3f})")
    pa, pb = encode(build(plain)), encode(build(rich))
    a, b, r = interleaved(lambda: decode(pa), lambda: decode(pb), seconds)
    print(f"   decode, without / with an environment            {a:>8.0f} / {b:.0f} µs (x{r:.3f})")


def per_death_scheduler(seconds: float) -> None:
    print("\n4. per death, on the scheduler (the session's tally)")
    tally = EnvironmentTally()
    for i in range(4096):
        pool = "spot" if i % 8 == 0 else "ondemand"
        tally.worker(
            f"tcp://10.0.{i // 250}.{i % 250}:4000",
            dataclasses.replace(TYPICAL, labels={**TYPICAL.labels, "NODE_POOL": pool}),
        )
    spot = dataclasses.replace(TYPICAL, labels={**TYPICAL.labels, "NODE_POOL": "spot"})
    n = [0]

    def died() -> None:
        n[0] += 1
        i = (n[0] % 512) * 8
        tally.died(Death(id=f"d{n[0]}", nanny=f"tcp://10.0.{i // 250}.{i % 250}:4000",
                         signature_id="s", environment=spot))  # fmt: skip

    us = per_call(died, seconds)
    print(f"   EnvironmentTally.died                            {us:>8.1f} µs")
    got = tally.suspects("s")
    us = per_call(lambda: tally.suspects("s"), seconds)
    print(
        f"   suspects of 200 deaths, 4,096 workers (an abort) {us / 1e3:>8.2f} ms  {got[0]['name']}={got[0]['value']}"
    )


def per_query(seconds: float, signatures: int, deaths: int) -> None:
    print(f"\n5. per query: {signatures} signatures x {deaths} deaths, 1,000 workers (SQLite)")
    with tempfile.TemporaryDirectory() as tmp:
        store = FailureStore(os.path.join(tmp, "s.sqlite3"), batch_interval=0.05)
        store.start()
        try:
            for i in range(1000):
                pool = "spot" if i % 10 == 0 else "ondemand"
                env = dataclasses.replace(TYPICAL, labels={**TYPICAL.labels, "NODE_POOL": pool})
                store.worker_environment("c", f"n{i}", env, 1.0)
            spot = dataclasses.replace(TYPICAL, labels={**TYPICAL.labels, "NODE_POOL": "spot"})
            for s in range(signatures):
                for k in range(deaths):
                    slot = (k % 100) * 10 if s % 2 == 0 else k % 1000  # half on spot only
                    d = Death(id=f"d{s}-{k}", cluster="c", worker=f"w{slot}", nanny=f"n{slot}",
                              cause="native_crash", time=1.0 + k, signature_id=f"sig{s}",
                              signature_title="SIGSEGV", environment=spot)  # fmt: skip
                    e = FailureEvent("infra", "native_crash", f"k{s}-{k}", "etl", d.worker, "h",
                                     d.signature_id, "SIGSEGV", {}, 1, d.time, cluster="c",
                                     death=d.id)  # fmt: skip
                    store.record(d, [e])
            assert store.flush(600), store.last_error
            a, b, r = interleaved(
                lambda: store.signatures(limit=100, environment=False),
                lambda: store.signatures(limit=100),
                seconds,
            )
            found = sum(bool(row.environment_suspects) for row in store.signatures(limit=100))
            print(
                f"   signatures(limit=100), without / with            {a / 1e3:>8.1f} / {b / 1e3:.1f} ms (x{r:.1f}); {found} with a suspect"
            )
            us = per_call(lambda: store.signature("sig0"), seconds)
            print(f"   signature(id), 200 deaths                        {us / 1e3:>8.2f} ms")
        finally:
            store.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="shorter rounds, a smaller history")
    args = p.parse_args(argv)
    seconds = 1.0 if args.quick else 4.0
    print("$ python benchmarks/bench_environment.py" + (" --quick" if args.quick else ""))
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    sizes()
    per_start(seconds)
    per_death_nanny(seconds)
    per_death_scheduler(seconds)
    per_query(seconds, 20 if args.quick else 100, 200)
    print(f"\nload average at end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
