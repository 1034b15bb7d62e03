"""Benchmark the native signal recorder (issue 39): its cost per signal, and that the task
hot path does not see it.

The recorder (`oomguard._host._sigrec`) runs only when a signal arrives: its handler
writes the sender (si_pid, si_uid, /proc/PID/comm and cmdline read with open/read) into the
flight record, then calls the handler that was there. Nothing else changes, so every path a
task takes (Python code, `os.fork`, `subprocess`, Dask's task execution) should cost the
same with it as without. Each figure is measured with the recorder started and stopped in
alternating batches in this one process, so both see the same machine:

- per signal: `os.kill(getpid(), SIGUSR1)` with a Python handler in place (CPython's C
  trampoline, then the Python function), µs per signal;
- the task paths: a pure-Python loop, `os.fork()` + `waitpid` of a child that exits at once,
  and `subprocess.run(["true"])`;
- Dask: tasks per second through a real worker with a nanny (`LocalCluster`, one worker,
  one thread), oomguard installed with `signal-senders` on and off, interleaved runs.

    .venv/bin/python benchmarks/bench_sigrec.py
    .venv/bin/python benchmarks/bench_sigrec.py --seconds 2 --tasks 2000 --rounds 3

Ratios are with / without (1.00: no difference).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

from oomguard._host import sigrec
from oomguard._host.flight import FlightRecorder


def _interleaved(fn, seconds: float, batch: int, recorder, record) -> tuple[float, float]:
    """Median seconds per call of `fn` without, and with, the recorder (alternating)."""
    without: list[float] = []
    with_: list[float] = []
    deadline = time.perf_counter() + 2 * seconds
    while time.perf_counter() < deadline or len(without) < 5:
        for on, out in ((False, without), (True, with_)):
            if on:
                recorder.start(record)
            start = time.perf_counter()
            for _ in range(batch):
                fn()
            out.append((time.perf_counter() - start) / batch)
            if on:
                recorder.stop()
    return sorted(without)[len(without) // 2], sorted(with_)[len(with_) // 2]


def _python_loop() -> None:
    total = 0
    for i in range(2000):
        total += i * i


def _fork() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def _subprocess() -> None:
    subprocess.run(["true"], check=True)


def _dask(tasks: int, rounds: int) -> None:
    import dask
    from distributed import Client, LocalCluster

    import oomguard

    def run(senders: bool) -> float:
        with (
            tempfile.TemporaryDirectory() as tmp,
            dask.config.set({"oomguard.worker.signal-senders": senders}),
            LocalCluster(
                n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
            ) as cluster,
            Client(cluster) as client,
        ):
            oomguard.install(client, store=os.path.join(tmp, "s.sqlite3"))
            client.wait_for_workers(1)
            client.gather(client.map(abs, range(100)))  # warm
            start = time.perf_counter()
            client.gather(client.map(abs, range(-tasks, 0)))
            return tasks / (time.perf_counter() - start)

    off, on = [], []
    for _ in range(rounds):
        off.append(run(False))
        on.append(run(True))
    off.sort()
    on.sort()
    a, b = off[len(off) // 2], on[len(on) // 2]
    print(f"dask tasks/s (median of {rounds})  without {a:9.0f}  with {b:9.0f}  ratio {b / a:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ok, why = sigrec.available()
    if not ok:
        print(f"no native recorder: {why}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        record = FlightRecorder.create(os.path.join(tmp, "bench.flight"))
        recorder = sigrec.Recorder()
        handled, sent = [], []
        signal.signal(signal.SIGUSR1, lambda *a: handled.append(1))
        me = os.getpid()

        def kill() -> None:
            sent.append(1)
            os.kill(me, signal.SIGUSR1)

        cases = (
            ("signal (os.kill to self, Python handler)", kill, 200),
            ("python loop (2000 iterations)", _python_loop, 200),
            ("os.fork + waitpid", _fork, 20),
            ("subprocess.run(['true'])", _subprocess, 10),
        )
        print(f"{'path':42} {'without µs':>11} {'with µs':>9} {'ratio':>6}")
        for name, fn, batch in cases:
            a, b = _interleaved(fn, args.seconds, batch, recorder, record)
            print(f"{name:42} {a * 1e6:11.2f} {b * 1e6:9.2f} {b / a:6.2f}")
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        record.close()
        print(f"(signals sent {len(sent)}, handled by the Python handler {len(handled)})")
    _dask(args.tasks, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
