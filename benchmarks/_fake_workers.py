"""Thousands of simulated Dask workers and nannies that speak the real protocol over TCP.

For benchmarks of the scheduler side (bench_scale.py). Each `FakeWorker` does what a real
worker does *on the wire* and nothing else:

- registers with the `register-worker` message a real Worker sends (address, name, nanny,
  pid, nthreads=1, memory_limit, Dask's own `get_versions()`, heartbeat metrics), then keeps
  that connection as its batched stream (`BatchedSend`, 2 ms, as a Worker);
- takes `compute-task`, "runs" it for a simulated duration (an asyncio sleep; one at a time,
  in the order received) and answers `task-finished` with the fields of Dask's
  `TaskFinishedMsg`; honours `free-keys`, `cancel-compute` and `steal-request` (answers
  `steal-response` with the state a Worker would report);
- heartbeats over a pooled RPC connection (`heartbeat_worker`, with `executing`) at the
  interval the scheduler asks for.

What it does not do: run the task's code (the run_spec is never unpickled: the connection
is opened with `deserialize=False`), hold or move data (a task's dependencies are taken as
present; no `add-keys`, no `get_data`), listen on its own address (the scheduler never
connects to a worker in these workloads; its stream is the worker's own connection).

A death is what the scheduler sees when a worker process is killed: the stream's TCP
connection is aborted, with no goodbye. `Farm.kill` then (optionally) sends the nanny's
death report through the scheduler's `oomguard_death_report` RPC, built with oomguard's own
`build_report`/`encode`, and restarts the worker ~1 s later under a new port and pid, as a
nanny does.
"""

from __future__ import annotations

import asyncio
import pickle
import random
import time
from collections import OrderedDict
from typing import Any

from dask.utils import key_split
from distributed.batched import BatchedSend
from distributed.comm import connect
from distributed.core import ConnectionPool
from distributed.versions import get_versions

from oomguard._death.build import example_report
from oomguard._death.wire import encode

GiB = 2**30
INT_TYPE = pickle.dumps(int)
#: The last sampled stack of the task whose memory kills share one signature across hosts.
HEAVY_STACK = [
    ("/usr/lib/python3.11/threading.py", 1045, "_bootstrap_inner"),
    ("/opt/venv/lib/python3.11/site-packages/distributed/worker.py", 3001, "apply_function"),
    ("/srv/etl/pipeline.py", 41, "run_shard"),
    ("/srv/etl/transform.py", 88, "explode_rows"),
]


def _metrics() -> dict:
    """What a Worker's `get_metrics()` returns (the keys the scheduler reads)."""
    return {
        "bandwidth": {"total": 100_000_000, "types": {}, "workers": {}},
        "cpu": 0.0,
        "digests_total_since_heartbeat": {},
        "event_loop_interval": 0.02,
        "host_disk_io": {"read_bps": 0.0, "write_bps": 0.0},
        "host_net_io": {"read_bps": 0.0, "write_bps": 0.0},
        "managed_bytes": 0,
        "memory": 80_000_000,
        "num_fds": 20,
        "spilled_bytes": {"disk": 0, "memory": 0},
        "task_counts": {},
        "time": time.time(),
        "transfer": {
            "incoming_bytes": 0,
            "incoming_count": 0,
            "incoming_count_total": 0,
            "outgoing_bytes": 0,
            "outgoing_count": 0,
            "outgoing_count_total": 0,
        },
    }


class NameTaken(RuntimeError):
    """The scheduler still has a worker of this name (the dead one, not yet removed)."""


class FakeWorker:
    """One worker process: `slot` is its nanny (fixed), `gen` counts its restarts."""

    def __init__(self, farm: Farm, slot: int, gen: int) -> None:
        self.farm, self.slot, self.gen = farm, slot, gen
        self.host = slot % farm.hosts
        ip = f"127.0.0.{self.host + 1}"  # one loopback address per host: 50 hosts to Dask
        self.address = f"tcp://{ip}:{10_000 + gen * farm.n + slot}"
        self.nanny = f"tcp://{ip}:{60_000 - slot}"
        self.name = f"worker-{slot}"
        self.pid = 100_000 + gen * farm.n + slot
        self.big = slot % 10 == 9  # a tenth of the workers have twice the memory
        self.memory_limit = 8 * GiB if self.big else 4 * GiB
        self.started = time.time()
        self.queue: OrderedDict[Any, int] = OrderedDict()  # key -> run_id, not started
        self.executing: Any = None
        self.exec_start = 0.0
        self.cancelled = False
        self.dead = False
        self.stream: BatchedSend | None = None
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.heartbeat_interval = 1.0

    def keys(self) -> set:
        return set(self.queue) | ({self.executing} if self.executing is not None else set())

    async def start(self) -> None:
        comm = await connect(self.farm.address, deserialize=False)
        await comm.write(
            {
                "op": "register-worker",
                "reply": False,
                "address": self.address,
                "status": "running",
                "nthreads": 1,
                "name": self.name,
                "now": time.time(),
                "resources": {},
                "memory_limit": self.memory_limit,
                "local_directory": f"/tmp/fake-{self.slot}",
                "services": {},
                "nanny": self.nanny,
                "pid": self.pid,
                "versions": self.farm.versions,
                "metrics": _metrics(),
                "extra": {},
                "stimulus_id": f"worker-connect-{time.time()}",
                "server_id": f"fake-{self.slot}-{self.gen}",
            },
            serializers=["msgpack"],
        )
        response = await comm.read(deserializers=["msgpack"])
        if response.get("status") != "OK":
            await comm.close()
            if "name taken" in str(response.get("message")):
                raise NameTaken(self.name)
            raise RuntimeError(f"registration of {self.address} refused: {response!r}")
        self.heartbeat_interval = response["heartbeat-interval"]
        self.stream = BatchedSend(interval="2ms")
        self.stream.start(comm)
        self._tasks = [asyncio.create_task(f()) for f in (self._read, self._run, self._beat)]
        self._comm = comm

    async def _read(self) -> None:
        try:
            while True:
                msgs = await self._comm.read()
                for msg in msgs if isinstance(msgs, (list, tuple)) else [msgs]:
                    self._handle(msg)
        except (OSError, asyncio.CancelledError):
            return

    def _handle(self, msg: dict) -> None:
        op = msg.get("op")
        if op == "compute-task":
            self.queue[msg["key"]] = msg["run_id"]
            self._wake.set()
        elif op in ("free-keys", "cancel-compute"):
            for key in msg.get("keys") or [msg.get("key")]:
                self.queue.pop(key, None)
                if key == self.executing:
                    self.cancelled = True
        elif op == "steal-request":
            key = msg["key"]
            state = None
            if key in self.queue:
                del self.queue[key]
                state = "ready"  # a Worker releases a ready task and says so
            elif key == self.executing:
                state = "executing"
            self.stream.send(
                {
                    "op": "steal-response",
                    "key": key,
                    "state": state,
                    "stimulus_id": msg["stimulus_id"],
                }
            )
        elif op == "close":
            self.dead = True
        else:
            self.farm.other_ops[op] = self.farm.other_ops.get(op, 0) + 1

    async def _run(self) -> None:
        while not self.dead:
            if not self.queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            key, run_id = self.queue.popitem(last=False)
            self.executing, self.exec_start, self.cancelled = key, time.time(), False
            await asyncio.sleep(self.farm.duration(key))
            self.executing = None
            if self.cancelled or self.dead:
                continue
            stop = time.time()
            self.stream.send(
                {
                    "op": "task-finished",
                    "status": "OK",
                    "key": key,
                    "run_id": run_id,
                    "nbytes": 28,
                    "type": INT_TYPE,
                    "typename": "int",
                    "metadata": {},
                    "thread": 1,
                    "startstops": [{"action": "compute", "start": self.exec_start, "stop": stop}],
                    "stimulus_id": f"task-finished-{stop}",
                }
            )
            self.farm.task_finished()

    async def _beat(self) -> None:
        await asyncio.sleep(self.farm.rng.uniform(0, self.heartbeat_interval))
        while not self.dead:
            executing = (
                {self.executing: time.time() - self.exec_start}
                if self.executing is not None
                else {}
            )
            try:
                r = await self.farm.pool(self.farm.address).heartbeat_worker(
                    address=self.address,
                    now=time.time(),
                    metrics=_metrics(),
                    executing=executing,
                    extensions={},
                )
                self.heartbeat_interval = r.get("heartbeat-interval", self.heartbeat_interval)
            except Exception as e:  # noqa: BLE001 -- counted; the scheduler may be going away
                name = f"heartbeat {type(e).__name__}"
                self.farm.other_ops[name] = self.farm.other_ops.get(name, 0) + 1
            await asyncio.sleep(self.heartbeat_interval)

    def kill(self) -> None:
        """SIGKILL: the connection drops, nothing is said."""
        self.dead = True
        for t in self._tasks:
            t.cancel()
        if self.stream is not None:
            self.stream.abort()


class Farm:
    """`n` fake workers on `hosts` hosts, and the deaths of some of them.

    Deaths happen at progress points: death i when `kill_at[i]` tasks have finished, so
    both arms of an A/B run see the same deaths at the same stage of the workload.
    Death i is on host i % hosts (another, where none of its workers qualifies); one death in `memory_every`, spread over the hosts, is a
    kernel OOM kill of a task whose last sampled stack is `HEAVY_STACK` (one signature
    across hosts), the rest are SIGKILLs. A victim is a worker executing a task that was on no earlier dead worker,
    so no shard is charged twice and no pipeline is aborted: the workload stays the same
    with and without oomguard.
    """

    def __init__(
        self,
        address: str,
        n: int,
        hosts: int,
        kill_at: list[int],
        *,
        reports: bool,
        seed: int,
        memory_every: int = 5,
        duration: tuple[float, float] = (0.02, 0.08),
    ) -> None:
        self.address, self.n, self.hosts = address, n, hosts
        self.kill_at = kill_at
        self.reports = reports
        self.rng = random.Random(seed)
        self.memory_every = memory_every
        self._duration = duration
        self.versions = get_versions()
        # Room for one connection per worker, as each real worker keeps its own: a smaller
        # pool closes and reopens connections whenever the scheduler is slow to answer the
        # heartbeats, which makes the scheduler accept connections no real cluster opens.
        self.pool = ConnectionPool(limit=n + 64, deserializers=["msgpack"])
        self.workers: dict[int, FakeWorker] = {}
        self.finished = 0
        self.deaths: list[dict] = []
        self.touched: set = set()  # keys that were on a dead worker
        self.report_status: dict[str, int] = {}
        self.other_ops: dict[str, int] = {}
        self._background: set[asyncio.Task] = set()
        self._next_try = 0  # finished-task count before which no death is tried again

    def duration(self, key) -> float:
        return self.rng.uniform(*self._duration)

    async def start(self, concurrency: int = 64) -> None:
        await self.pool.start()
        sem = asyncio.Semaphore(concurrency)

        async def one(slot: int) -> None:
            async with sem:
                w = FakeWorker(self, slot, 0)
                await w.start()
                self.workers[slot] = w

        await asyncio.gather(*(one(s) for s in range(self.n)))

    def task_finished(self) -> None:
        self.finished += 1
        if (
            len(self.deaths) < len(self.kill_at)
            and self.finished >= self.kill_at[len(self.deaths)]
            and self.finished >= self._next_try
            and not self.kill()
        ):
            # No worker may die now (each executes a shard that was on a dead worker): try
            # again some tasks later, not after each one (a scan is O(workers x queue)).
            self._next_try = self.finished + 50

    def kill(self) -> bool:
        i = len(self.deaths)
        memory = (i + i // self.hosts) % self.memory_every == 0  # on every host in turn
        now = time.time()
        alive = [
            w
            for w in self.workers.values()
            if not w.dead
            and w.executing is not None
            and now - w.exec_start > 0.005
            and not (memory and w.big)
        ]
        on_host = [w for w in alive if w.host == i % self.hosts]
        # A random worker whose shards never were on a dead one, on the death's host if
        # any (late in the workload a host may be idle); `touched` checked lazily.
        for group in (on_host, alive):
            self.rng.shuffle(group)
            w = next(
                (
                    w
                    for w in group
                    if w.executing not in self.touched and self.touched.isdisjoint(w.queue)
                ),
                None,
            )
            if w is not None:
                break
        else:
            return False  # tried again some finished tasks later
        key = w.executing
        self.touched |= w.keys()
        w.kill()
        del self.workers[w.slot]
        cause = "oom_kill" if memory else "sigkill"
        self.deaths.append(
            {
                "worker": w.address,
                "host": f"host-{w.host:02d}",
                "key": str(key),
                "cause": cause,
                "pid": w.pid,
                "time": now,
            }
        )
        if self.reports:
            report = example_report(
                worker=w.address,
                nanny=w.nanny,
                name=w.name,
                host=f"host-{w.host:02d}",
                pid=w.pid,
                exitcode=-9,
                time=now,
                started=w.started,
                memory_limit=w.memory_limit,
                executing=(
                    {
                        "key": str(key),
                        "prefix": key_split(key),
                        "start": w.exec_start,
                        "thread": 1,
                        "stack": HEAVY_STACK if memory else None,
                        "stack_time": now - 0.2 if memory else None,
                    },
                ),
                crash_text=None,
                cgroup_before=None,
                cgroup_after=None,
                cgroup_path=None,
                cgroup_version=None,
                rss_sampled=None,
                rss_time=None,
                host_memory=None,
                nanny_memory_kill=None,
                kernel_log_victim={"pid": w.pid, "name": "python"} if memory else None,
                requested=False,
                missing=(),
            )
            self._spawn(self._report(encode(report), self.rng.uniform(0.002, 0.020)))
        self._spawn(self._restart(w.slot, w.gen + 1, 1.0))
        return True

    async def _report(self, data: bytes, delay: float) -> None:
        await asyncio.sleep(delay)  # a real nanny reports a few ms after the death
        try:
            r = await self.pool(self.address).oomguard_death_report(report=data)
            status = r.get("status", "?") if isinstance(r, dict) else repr(r)
        except Exception as e:  # noqa: BLE001 -- counted, never raised: the farm goes on
            status = type(e).__name__
        self.report_status[status] = self.report_status.get(status, 0) + 1

    async def _restart(self, slot: int, gen: int, delay: float) -> None:
        await asyncio.sleep(delay)
        for _ in range(120):
            w = FakeWorker(self, slot, gen)
            try:
                await w.start()
            except NameTaken:
                # The scheduler has not removed the dead process yet (its loop is behind):
                # a real worker would fail to start here; this one tries again.
                self.other_ops["restart retried"] = self.other_ops.get("restart retried", 0) + 1
                await asyncio.sleep(0.5)
                continue
            self.workers[slot] = w
            return
        self.other_ops["restart given up"] = self.other_ops.get("restart given up", 0) + 1

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        for w in list(self.workers.values()):
            w.kill()
        await self.pool.close()
