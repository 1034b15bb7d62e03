"""One death, one account (issue 38), on a real cluster: 2 workers x 2 threads behind real
nannies, and worker deaths of three kinds, each a task's first attempt (its retry succeeds):
a segfault while a task of another, healthy pipeline runs on the other thread of the same
worker, an `os._exit(3)`, and a SIGKILL the task sends itself while a task of its own
pipeline runs beside it (a death of two suspects: two events, one death). Tasks that must
share a worker need a resource only the first worker offers.

Dask's own unexpected `remove-worker` events are the truth. The deaths `Failures.deaths()`
lists, the sum of their signatures' counts, `oomguard_worker_deaths_total` on the
scheduler's /metrics and the dashboard's death count all equal it, and no task of the
healthy pipeline carries the crasher's signature: it was displaced, and says so.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

import dask
import distributed
import pytest
from distributed import Client, LocalCluster

import oomguard
from _accounts import counted_once_everywhere
from cluster_helpers import wait_installed
from oomguard._death.record import Role

pytestmark = pytest.mark.timeout(400)


def calm(running: str, released: str) -> str:
    """Run until `released` exists (at most a minute), saying where it runs: a file named
    by this process's pid in the directory `running`."""
    open(os.path.join(running, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(released) and time.monotonic() < deadline:
        time.sleep(0.05)
    return "calm done"


def first_time(marker: str) -> bool:
    """True on the first call for `marker` (a file), False after: a task's first attempt."""
    try:
        with open(marker, "x"):
            return True
    except FileExistsError:
        return False


def die_beside_calm(running: str, released: str, how: str) -> str:
    """On its first attempt, once a `calm` task runs in this very process (both executing,
    both in the flight record), end the process `how`; on its retry, finish."""
    if first_time(released + ".attempt"):
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(running, str(os.getpid()))):
            assert time.monotonic() < deadline, "calm never ran beside it"
            time.sleep(0.05)
        time.sleep(0.5)  # both tasks in the flight record's next sample
        open(released, "w").close()  # calm's retry will not wait
        if how == "segfault":
            ctypes.string_at(0)
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(30)
    return f"{how} done"


def exit_three(marker: str) -> str:
    if first_time(marker):
        os._exit(3)
    return "exit done"


async def pair_here(n: int, dask_worker) -> None:
    await dask_worker.set_resources(pair=n)


def one_worker_offers_the_pair(client: Client) -> None:
    """Tasks that need the resource "pair" run on the first worker only."""
    first, *others = sorted(client.scheduler_info()["workers"])
    client.run(pair_here, 2, workers=[first])
    if others:
        client.run(pair_here, 0, workers=others)


@pytest.fixture
def client(tmp_path):
    with (
        dask.config.set(
            {
                "oomguard.worker.sample-interval": "100ms",
                "oomguard.scheduler.report-grace-timeout": "20s",
                "distributed.deploy.lost-worker-timeout": "300s",
            }
        ),
        LocalCluster(
            n_workers=2,
            threads_per_worker=2,
            processes=True,
            resources={"pair": 2},
            dashboard_address=":0",
        ) as cl,
        Client(cl) as client,
    ):
        oomguard.install(client, store=str(tmp_path / "f.sqlite3"))
        wait_installed(client, 2)
        yield client


def test_each_death_is_counted_once_everywhere_as_dask_counts_it(client, tmp_path):
    pair = {"pure": False, "resources": {"pair": 1}}
    running, crashed, killed = (tmp_path / "running", tmp_path / "crashed", tmp_path / "killed")
    running.mkdir()
    one_worker_offers_the_pair(client)
    with distributed.span("healthy"):
        healthy = client.submit(calm, str(running), str(crashed), key="healthy-calm", **pair)
    with distributed.span("crash"):
        crasher = client.submit(
            die_beside_calm, str(running), str(crashed), "segfault", key="crash-segv", **pair
        )
    assert crasher.result(timeout=240) == "segfault done"
    assert healthy.result(timeout=240) == "calm done"  # displaced, retried, finished
    with distributed.span("exits"):
        exits = client.submit(exit_three, str(tmp_path / "exit"), key="exit-3", pure=False)
    assert exits.result(timeout=240) == "exit done"
    one_worker_offers_the_pair(client)  # the workers that died came back with it
    with distributed.span("kills"):
        sleeper = client.submit(calm, str(running), str(killed), key="kill-sleeper", **pair)
        kills = client.submit(
            die_beside_calm, str(running), str(killed), "sigkill", key="kill-9", **pair
        )
    assert kills.result(timeout=240) == "sigkill done"
    assert sleeper.result(timeout=240) == "calm done"

    failures = oomguard.Failures(client)
    # Every removal decided (each death paired with its nanny's report, or its grace ran
    # out), and counted once in the API, the signatures, /metrics and the dashboard.
    deaths = counted_once_everywhere(client)
    assert len(deaths) >= 3, deaths
    causes = sorted(d.cause for d in deaths)
    assert {"native_crash", "exit", "sigkill"} <= set(causes), causes
    signatures = {s.id: s for s in failures.signatures()}

    # The SIGKILL: nothing says which of the two did it, both suspects, one death.
    (kill,) = failures.deaths(cause="sigkill")
    assert {t.key: t.role for t in kill.tasks} == {
        "kill-9": Role.SUSPECT,
        "kill-sleeper": Role.SUSPECT,
    }
    assert sorted(e.shard for e in failures.events(cause="sigkill")) == [
        "kill-9",
        "kill-sleeper",
    ]
    # The segfault: its culprit blamed, the healthy task beside it only displaced.
    (segv,) = failures.deaths(cause="native_crash")
    assert segv.role_of("crash-segv") is Role.CULPRIT
    assert segv.role_of("healthy-calm") is Role.DISPLACED
    assert [d.id for d in failures.deaths(pipeline="healthy")] == [segv.id]
    assert all(e.signature_id != segv.signature_id for e in failures.events(pipeline="healthy"))
    assert failures.events(shard="healthy-calm") == []
    crash = signatures[segv.signature_id]
    assert "healthy" not in crash.pipelines and "healthy-calm" not in crash.shards
    # Each death's events name it, and only the tasks it is blamed on have one.
    for d in deaths:
        blamed = {t.key for t in d.tasks if t.role in (Role.CULPRIT, Role.SUSPECT)}
        events = [e for e in failures.events(limit=None) if e.death == d.id]
        assert events and all(e.signature_id == d.signature_id for e in events), d
        assert {e.shard for e in events} <= blamed | {""}, (d, events)
