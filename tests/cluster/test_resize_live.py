"""No retry at the same size, on a real LocalCluster: workers of different memory limits,
each in its own memory cgroup, and real kernel OOM kills.
"""

from __future__ import annotations

import time

import dask
import pytest
from distributed import Client, LocalCluster, Nanny

import oomguard
from cluster_helpers import require_worker_groups, wait_installed

pytestmark = pytest.mark.timeout(300)

MiB = 2**20
SMALL = 400 * MiB
BIG = 1200 * MiB


def hungry(i, nbytes):
    time.sleep(0.5)  # let the sampler record this frame
    block = bytearray(b"x") * nbytes
    return len(block)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require_worker_groups()
    store = tmp_path_factory.mktemp("resize") / "failures.sqlite3"
    with dask.config.set(
        {
            "oomguard.worker.cgroup-limit": "true",
            "oomguard.worker.sample-interval": "100ms",
            "oomguard.scheduler.report-grace-timeout": "3s",
            "distributed.worker.memory.terminate": False,
            # Each test OOM-kills a worker that its nanny restarts; LocalCluster's
            # lost-worker timer from an earlier kill must not close that nanny while the
            # new worker process is still starting on a slow machine.
            "distributed.deploy.lost-worker-timeout": "1h",
        }
    ):
        with (
            LocalCluster(
                n_workers=1,
                threads_per_worker=1,
                processes=True,
                memory_limit=SMALL,
                dashboard_address=":0",
            ) as cl,
            Client(cl) as client,
        ):
            oomguard.install(client, store=str(store))
            wait_installed(client, 1)
            yield cl, client


def _limits(client):
    return {a: w["memory_limit"] for a, w in client.scheduler_info()["workers"].items()}


def test_no_larger_worker_aborts_after_the_first_oom_kill(cluster):
    cl, client = cluster
    with dask.annotate(oomguard_pipeline="too-big"):
        fut = client.submit(hungry, 1, 600 * MiB, key=("hungry", 1), pure=False)
    with pytest.raises(oomguard.PipelineAborted) as info:
        fut.result(timeout=120)
    msg = str(info.value)
    assert "no worker has more than 400 MiB; the shard needed more" in msg, msg
    assert info.value.cause == "oom_kill" and info.value.count == 1
    events = oomguard.Failures(client).shard(("hungry", 1))
    assert [e.cause for e in events] == ["oom_kill"]  # aborted at once, no second kill
    assert oomguard.Failures(client).pipeline("too-big").status == "aborted"


def test_the_retry_goes_to_the_larger_worker_and_succeeds(cluster):
    cl, client = cluster
    spec = dict(cl.new_spec)
    spec["options"] = {**spec["options"], "memory_limit": BIG}
    spec["cls"] = Nanny
    cl.worker_spec["big"] = spec
    cl.sync(cl._correct_state)
    client.wait_for_workers(2, timeout=60)
    wait_installed(client, 2)
    limits = _limits(client)
    small = next(a for a, lim in limits.items() if lim == SMALL)
    big = next(a for a, lim in limits.items() if lim == BIG)
    with dask.annotate(oomguard_pipeline="resized"):
        fut = client.submit(
            hungry,
            2,
            600 * MiB,
            key=("hungry", 2),
            pure=False,
            workers=[small],
            allow_other_workers=True,
        )
    assert fut.result(timeout=120) == 600 * MiB
    events = oomguard.Failures(client).shard(("hungry", 2))
    assert [(e.cause, e.worker) for e in events] == [("oom_kill", small)]
    (where,) = client.who_has(fut)[fut.key]
    assert where == big
    resizes = [m for _, m in client.get_events("oomguard") if m.get("action") == "retry-resize"]
    # Event messages cross msgpack: lists arrive as tuples.
    assert any(m["shard"] == str(("hungry", 2)) and list(m["workers"]) == [big] for m in resizes)
    assert events[0].pipeline == "resized"
    assert oomguard.Failures(client).pipeline("resized").status != "aborted"
