"""A flood of death reports over Dask's own comms, from its own process (the storm test).

    python tests/reliability/_flood.py ADDRESS RATE SECONDS [CONNECTIONS]

Sends valid schema-v1 death reports, each for a distinct (made-up) worker, at RATE per
second in all for SECONDS, over CONNECTIONS Dask comms, as fire-and-forget RPC messages
(`reply: False`, the cheapest a sender can make them). Prints one JSON line: what was sent,
per second, and how long the sends took.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import msgpack
from distributed.comm import connect

from oomguard._death.build import example_report
from oomguard.worker_plugin import REPORT_HANDLER


async def flood(address: str, rate: float, seconds: float, connections: int) -> dict:
    template = example_report(**{"time": time.time()})
    comms = [await connect(address) for _ in range(connections)]
    sent = [0] * connections
    per_second: dict[int, int] = {}
    start = time.monotonic()
    behind = 0.0

    async def sender(i: int) -> None:
        nonlocal behind
        interval = connections / rate
        comm = comms[i]
        n = 0
        while True:
            due = start + n * interval + i * interval / connections
            now = time.monotonic()
            if due - start >= seconds:
                return
            if due > now:
                await asyncio.sleep(due - now)
            else:
                behind = max(behind, now - due)
            seq = n * connections + i
            report = dict(
                template,
                worker=f"tcp://127.255.{seq // 60000 % 250}.{seq % 250}:{1 + seq % 60000}",
                time=time.time(),
            )
            await comm.write(
                {"op": REPORT_HANDLER, "report": msgpack.packb(report), "reply": False}
            )
            n += 1
            sent[i] += 1
            second = int(time.monotonic() - start)
            per_second[second] = per_second.get(second, 0) + 1

    await asyncio.gather(*(sender(i) for i in range(connections)))
    elapsed = time.monotonic() - start
    for comm in comms:
        await comm.close()
    return {
        "sent": sum(sent),
        "elapsed": round(elapsed, 3),
        "rate": round(sum(sent) / elapsed, 1),
        "per_second": [per_second.get(s, 0) for s in range(int(seconds))],
        "max_behind": round(behind, 3),
    }


def main() -> None:
    address, rate, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    connections = int(sys.argv[4]) if len(sys.argv) > 4 else 16
    print(json.dumps(asyncio.run(flood(address, rate, seconds, connections))), flush=True)


if __name__ == "__main__":
    main()
