"""A flood of forged death reports beside real deaths (issue 28): what it costs the scheduler.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_report_flood.py
    PYTHONPATH=src .venv/bin/python benchmarks/bench_report_flood.py --forged 1200 --rate 200

A LocalCluster with nannies and oomguard; its workers are SIGKILLed one at a time while
they run a task (`--deaths`), once alone and once while another process floods the
scheduler with forged reports (tests/cluster/_forged_reports.py: each names a made-up
worker on this machine, 64 invented executing keys and ~72 KiB of evidence). Printed for
each arm: the scheduler loop's lag (p50, p99, max; a coroutine sleeping 10 ms at a time),
how much the store grew (bytes, events), how many real deaths were recorded from their
nanny's report with its evidence, and what the intake took and refused.

Main's behaviour cannot run here (one forged report became 64 events with the whole
evidence each: tests/cluster/test_report_flood.py shows 601 MB for 120 of them), so the
comparison is forged flood vs no flood. Exits 1 when a real death was not recorded with
its evidence under the flood.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

from distributed import Client, LocalCluster

import oomguard

REPO = pathlib.Path(__file__).resolve().parent.parent
FORGER = REPO / "tests" / "cluster" / "_forged_reports.py"
GRACE = 5.0


def nap(seconds):
    time.sleep(seconds)
    return seconds


class Lag:
    """Runs on the scheduler's loop: each 10 ms sleep's overshoot."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.stop = False

    async def run(self) -> None:
        while not self.stop:
            t = time.perf_counter()
            await asyncio.sleep(0.010)
            self.lags.append(time.perf_counter() - t - 0.010)


def _p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def _store_bytes(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, f"{path}-wal") if os.path.exists(p))


def _wait(probe, timeout: float, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := probe():
            return value
        time.sleep(interval)
    return probe()


def arm(forged: int, rate: float, deaths: int, workers: int) -> dict:
    store = tempfile.mktemp(suffix=".sqlite3", prefix="oomguard-flood-")
    with (
        LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=":0",
        ) as cl,
        Client(cl) as client,
    ):
        oomguard.install(client, store=store)
        plugin = cl.scheduler.plugins["oomguard"]
        _wait(lambda: len(client.scheduler_info()["workers"]) >= workers, 60)
        time.sleep(2.0)  # worker plugins installed, flight records started
        base = _store_bytes(store)
        lag = Lag()
        running = asyncio.run_coroutine_threadsafe(lag.run(), cl.loop.asyncio_loop)
        flood = None
        if forged:
            flood = subprocess.Popen(
                [sys.executable, str(FORGER), cl.scheduler_address, str(forged), str(rate)],
                stdout=subprocess.PIPE,
                text=True,
            )
        killed: list[tuple[str, str]] = []  # (worker, key)
        start = time.monotonic()
        for i in range(deaths):
            addrs = sorted(client.scheduler_info()["workers"])
            worker = addrs[i % len(addrs)]
            key = f"nap-{i}"
            fut = client.submit(nap, 120, key=key, workers=[worker], pure=False)
            _wait(lambda w=worker: client.processing().get(w), 30)
            time.sleep(1.0)  # sampled by the flight record
            pid = client.run(os.getpid, workers=[worker])[worker]
            os.kill(pid, signal.SIGKILL)
            killed.append((worker, key))
            fut.cancel()
            _wait(lambda w=worker: w not in client.scheduler_info()["workers"], 60)
            _wait(lambda: len(client.scheduler_info()["workers"]) >= workers, 60)
        sent = json.loads(flood.communicate(timeout=300)[0]) if flood is not None else {}

        def settled():
            return not len(plugin.core.pairing) and not plugin.desk.intake.pending()

        failures = oomguard.Failures(client)
        real = {w for w, _ in killed}

        def recorded() -> int:
            events = failures.events(cause="sigkill", limit=None)
            return sum(
                any(
                    e.worker == w
                    and e.shard == k
                    and e.evidence.get("blame") == "flight record"
                    and not e.evidence.get("late_report")
                    for e in events
                )
                for w, k in killed
            )

        _wait(lambda: plugin.core.deaths >= deaths and settled(), 120)
        _wait(lambda: recorded() == len(killed), 30, interval=0.5)
        elapsed = time.monotonic() - start
        lag.stop = True
        running.result(timeout=10)
        events = failures.events(cause="sigkill", limit=None)
        forged_events = sum(e.worker not in real for e in events)
        stats = plugin.metrics_snapshot()
        intake = plugin.desk.intake
        out = {
            "forged_sent": sent.get("sent", 0),
            "forged_bytes_each": sent.get("bytes", 0),
            "seconds": round(elapsed, 1),
            "lag_p50_ms": round(_p(lag.lags, 0.5) * 1e3, 1),
            "lag_p99_ms": round(_p(lag.lags, 0.99) * 1e3, 1),
            "lag_max_ms": round(max(lag.lags, default=0.0) * 1e3, 1),
            "store_growth_bytes": _store_bytes(store) - base,
            "forged_events": forged_events,
            "real_deaths": len(killed),
            "real_recorded_with_evidence": recorded(),
            "intake_accepted": intake.accepted,
            "intake_first": intake.first,
            "intake_limited": intake.limited(),
            "overflow": stats["overflow"],
            "rejected": stats["rejected"],
        }
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(store + suffix):
            os.unlink(store + suffix)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--forged", type=int, default=800, help="forged reports in the flood")
    ap.add_argument("--rate", type=float, default=100.0, help="forged reports per second")
    ap.add_argument("--deaths", type=int, default=4, help="real SIGKILL deaths per arm")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    rows = {
        "no flood": arm(0, args.rate, args.deaths, args.workers),
        "forged flood": arm(args.forged, args.rate, args.deaths, args.workers),
    }
    keys = list(next(iter(rows.values())))
    width = max(len(k) for k in keys)
    print(f"{'':{width}}  " + "  ".join(f"{name:>14}" for name in rows))
    for k in keys:
        print(f"{k:{width}}  " + "  ".join(f"{str(r[k]):>14}" for r in rows.values()))
    flood = rows["forged flood"]
    ok = flood["real_recorded_with_evidence"] == flood["real_deaths"]
    print("every real death recorded with its evidence under the flood:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
