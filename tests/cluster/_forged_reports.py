"""Forged death reports, as a hostile or broken client could send them (issue 28).

Each names a made-up worker on this machine and 64 made-up executing keys, with evidence
as large as the schema lets it be: before the issue's bound, one such report became 64
events, each carrying the whole evidence. Sent over Dask's own comms as fire-and-forget
RPC messages (`reply: False`, the cheapest a sender can make them).

Used by tests/cluster/test_report_flood.py and benchmarks/bench_report_flood.py (which
runs it as its own process: `python tests/cluster/_forged_reports.py ADDRESS COUNT RATE`).
"""

from __future__ import annotations

import asyncio
import time

from distributed.comm import connect

from oomguard._death import wire
from oomguard._death.build import example_report
from oomguard._protocol import REPORT_HANDLER


def forged_report(i: int, *, keys: int = 64, evidence_chars: int = 750) -> bytes:
    """Report `i`: its own made-up worker on 127.0.0.1, `keys` invented executing keys,
    the evidence filled to 96 keys of `evidence_chars` characters."""
    report = example_report(
        **{
            "worker": f"tcp://127.0.0.1:{20000 + i % 40000}",
            "nanny": f"tcp://127.0.0.1:{60000 + i % 5000}",
            "pid": 100 + i,
            "time": time.time(),
        }
    )
    stack = [["/app/job.py", n, f"step_{n}"] for n in range(20)]
    report["executing"] = [
        {
            "key": f"victim-{k}",
            "prefix": "victim",
            "start": 1.0,
            "thread": 1000 + k,
            "stack": stack,
            "stack_time": 1.0,
        }
        for k in range(keys)
    ]
    evidence = dict(report["evidence"])
    evidence.update({f"x{n:02d}": "y" * evidence_chars for n in range(96 - len(evidence))})
    report["evidence"] = evidence
    return wire.encode(wire.validate(report))


async def flood(address: str, count: int, rate: float, connections: int = 2, **shape) -> dict:
    """Send `count` forged reports at `rate` per second in all; what was sent, how fast."""
    comms = [await connect(address) for _ in range(connections)]
    payloads = [forged_report(i, **shape) for i in range(min(count, 64))]
    start = time.monotonic()
    sent = 0
    try:
        for i in range(count):
            due = start + i / rate
            if due > time.monotonic():
                await asyncio.sleep(due - time.monotonic())
            data = payloads[i] if i < len(payloads) else forged_report(i, **shape)
            await comms[i % connections].write(
                {"op": REPORT_HANDLER, "report": data, "reply": False}
            )
            sent += 1
    finally:
        for comm in comms:
            await comm.close()
    elapsed = time.monotonic() - start
    return {"sent": sent, "bytes": len(payloads[0]) if payloads else 0, "seconds": elapsed}


def flood_in_thread(address: str, count: int, rate: float, **shape):
    """`flood` on its own event loop in a thread: (thread, result dict filled at its end)."""
    import threading

    result: dict = {}

    def run() -> None:
        result.update(asyncio.run(flood(address, count, rate, **shape)))

    t = threading.Thread(target=run, name="forged-reports", daemon=True)
    t.start()
    return t, result


if __name__ == "__main__":  # python tests/cluster/_forged_reports.py ADDRESS COUNT RATE
    import json
    import sys

    address, count, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    print(json.dumps(asyncio.run(flood(address, count, rate))), flush=True)
