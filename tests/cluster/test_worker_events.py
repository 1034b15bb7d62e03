"""What only a worker or its nanny may tell the scheduler, on a real cluster (issue 39):

- a worker's host name and SLURM job (`HOST_TOPIC`) and its tasks' memory waits
  (`ADMISSION_TOPIC`) are taken from the worker's own stream only: a client's `log_event`
  naming a worker changes nothing (before, it set the worker's host and SLURM job, whose
  stderr the scheduler then reads);
- "this nanny runs without oomguard" notices, which any connection from that host can send,
  are logged as printable lines and at most `LOG_BURST` a minute (before, 2,000 notices
  wrote 2,000 WARNING lines, newlines included).
"""

from __future__ import annotations

import asyncio
import logging

import dask
import pytest
from distributed import Client, LocalCluster

import oomguard
from cluster_helpers import wait_for
from oomguard._guard import LOG_BURST
from oomguard._protocol import ADMISSION_TOPIC, HOST_TOPIC

pytestmark = pytest.mark.timeout(300)


def _state(worker: str, run: str, dask_scheduler=None) -> tuple:
    plugin = dask_scheduler.plugins["oomguard"]
    p = plugin.core.policy._pipelines.get(run)
    return (
        plugin.workers._hostnames.get(worker),
        plugin.actions.slurm_jobs.job_of(worker),
        p.memory_waits if p is not None else None,
    )


def test_a_client_cannot_speak_for_a_worker(tmp_path):
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        oomguard.install(client, store=str(tmp_path / "history.sqlite3"))
        worker = next(iter(client.scheduler_info()["workers"]))
        with dask.annotate(oomguard_pipeline="etl"):
            future = client.submit(sum, [1, 2], pure=False)
        assert future.result(60) == 3

        def state():
            return client.run_on_scheduler(_state, worker, "etl")

        real_host = wait_for(lambda: state()[0], "the worker's own host event", timeout=60)
        # A client publishes, naming the worker: a host, a SLURM job, a long memory wait.
        client.log_event(
            HOST_TOPIC, {"worker": worker, "host": "forged-host", "slurm_job_id": "4242"}
        )
        client.log_event(
            ADMISSION_TOPIC,
            {"worker": worker, "outcome": "granted", "key": future.key, "waited": 999.0},
        )
        client.run_on_scheduler(lambda: None)  # a round trip after both
        assert state() == (real_host, None, 0)
        # The same messages from the worker itself are taken.
        client.run(
            lambda dask_worker: dask_worker.log_event(
                HOST_TOPIC, {"host": "its-own-name", "slurm_job_id": "77"}
            )
        )
        client.run(
            lambda dask_worker, key=future.key: dask_worker.log_event(
                ADMISSION_TOPIC, {"outcome": "granted", "key": key, "waited": 2.0}
            )
        )
        assert wait_for(lambda: state() == ("its-own-name", ("77", None), 1), state, timeout=60)


def test_unguarded_notices_are_few_and_printable(tmp_path):
    lines: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = lines.append
    logger = logging.getLogger("oomguard.scheduler")
    logger.addHandler(handler)
    try:
        with (
            LocalCluster(
                n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
            ) as cluster,
            Client(cluster) as client,
        ):
            oomguard.install(client, store=str(tmp_path / "history.sqlite3"))

            async def flood(n: int) -> list:
                return await asyncio.gather(
                    *(
                        client.scheduler.oomguard_unguarded(
                            nanny=f"tcp://127.0.0.1:{20000 + i}",
                            reason="setup failed\nINFO - forged line\x1b[2J" + "x" * 2000,
                        )
                        for i in range(n)
                    )
                )

            replies = client.sync(flood, 2000)
            assert all(r == {"status": "ok"} for r in replies)
            held = client.run_on_scheduler(
                lambda dask_scheduler: dask_scheduler.plugins["oomguard"].guard.held_back
            )
    finally:
        logger.removeHandler(handler)
    said = [r.getMessage() for r in lines if "WITHOUT oomguard" in r.getMessage()]
    assert 1 <= len(said) <= LOG_BURST, len(said)
    assert held >= 2000 - LOG_BURST
    for line in said:
        assert "\n" not in line and "\x1b" not in line and "\\x0a" in line
        assert len(line) < 1000
