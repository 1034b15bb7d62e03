"""Dask as before (issue 8, part 5): with oomguard loaded, Dask behaves as Dask documents.

Real LocalCluster with nannies. The same workload runs without oomguard, then with it:
the same results, the same final task states, the same user exceptions, retries and
cancellations. Graceful operations (retire_workers, client.restart(), adaptive scale-down)
are never recorded as failures. Removing oomguard gives Dask its allowed-failures back.
"""

from __future__ import annotations

import os
import signal
import time

import dask
import dask.array as da
import dask.bag as db
import pytest
from distributed import Client, KilledWorker, LocalCluster, wait

import oomguard

pytestmark = pytest.mark.timeout(300)


def inc(x):
    return x + 1


def add(x, y):
    return x + y


def boom(x):
    raise KeyError(f"no shard {x}")


def nap(seconds):
    time.sleep(seconds)
    return seconds


def flaky(marker_dir, fails):
    # Raises on its first `fails` attempts.
    raised = len(os.listdir(marker_dir))
    if raised < fails:
        open(os.path.join(marker_dir, f"raised-{raised}"), "w").close()
        raise ValueError(f"attempt {raised} failed")
    return f"ok after {raised}"


def suicide(x):
    time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGKILL)


def _states(client, keys):
    keys = {str(k) for k in keys}
    return client.run_on_scheduler(
        lambda dask_scheduler: sorted(
            (str(k), ts.state) for k, ts in dask_scheduler.tasks.items() if str(k) in keys
        )
    )


def workload(client, tmp, tag):
    """Everything a user sees of a failure-free graph, an exception, retries, a cancel."""
    out = {}
    # Graphs: delayed diamonds, arrays, bags; results and the final states of their tasks.
    values = [dask.delayed(inc)(i, dask_key_name=f"inc-{i}") for i in range(40)]
    pairs = [
        dask.delayed(add)(a, b, dask_key_name=f"add-{i}")
        for i, (a, b) in enumerate(zip(values, values[1:]))
    ]
    total = dask.delayed(sum)(pairs, dask_key_name="total")
    x = da.arange(4_000, chunks=250).reshape(40, 100)
    arr = (x + x.sum(axis=0)).mean(axis=1)
    bag = db.from_sequence(range(200), npartitions=8).map(inc).filter(lambda v: v % 3).sum()
    persisted = client.persist([total, arr, bag])
    wait(persisted)
    keys = [k for p in persisted for k in p.__dask_graph__()]
    out["states"] = _states(client, keys)
    out["results"] = [repr(v) for v in client.compute(persisted, sync=True)]
    out["array"] = client.compute(arr, sync=True).tolist()
    del persisted
    # A user exception: same type, message, status, and where it was raised.
    fut = client.submit(boom, 7, key=f"boom-{tag}")
    exc = fut.exception(timeout=30)
    tb = fut.traceback(timeout=30)
    import traceback

    out["exception"] = (
        type(exc).__name__,
        str(exc),
        fut.status,
        [f.name for f in traceback.extract_tb(tb)][-1],
    )
    # Retries: enough of them succeed; too few fail with the task's own exception.
    for name, retries, fails in (("enough", 2, 2), ("too-few", 1, 2)):
        d = tmp / f"{tag}-{name}"
        d.mkdir()
        f = client.submit(flaky, str(d), fails, retries=retries, key=f"flaky-{tag}-{name}")
        try:
            out[f"retries-{name}"] = ("result", f.result(timeout=60))
        except ValueError as e:
            out[f"retries-{name}"] = ("raised", str(e), f.status)
    # Cancellation of a running task.
    f = client.submit(nap, 30, key=f"nap-{tag}")
    deadline = time.monotonic() + 20
    while f.status == "pending" and not client.processing() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    f.cancel()
    out["cancel"] = (f.status, f.cancelled())
    return out


@pytest.fixture
def cluster():
    with dask.config.set(
        {
            "oomguard.scheduler.report-grace-timeout": "1s",
            "distributed.scheduler.allowed-failures": 1,
        }
    ):
        with (
            LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
            ) as cl,
            Client(cl) as client,
        ):
            yield cl, client


def _oomguard_stats(client):
    return client.run_on_scheduler(
        lambda dask_scheduler: dask_scheduler.plugins["oomguard"].metrics_snapshot()
    )


def test_same_behaviour_with_and_without_oomguard(cluster, tmp_path, record_figures):
    cl, client = cluster
    without = workload(client, tmp_path, "plain")
    oomguard.install(client, store=str(tmp_path / "parity.sqlite3"))
    with_ = workload(client, tmp_path, "oomguard")
    # Keys of the user-exception/retry/cancel tasks carry the tag; compare the rest as is.
    assert with_["states"] == without["states"]
    assert all(state == "memory" for _, state in with_["states"])
    for k in ("results", "array", "exception", "retries-enough", "retries-too-few", "cancel"):
        assert with_[k] == without[k], k
    assert without["retries-enough"] == ("result", "ok after 2")
    assert without["retries-too-few"][0] == "raised"
    assert without["cancel"] == ("cancelled", True)
    # oomguard recorded the user exceptions, and nothing else.
    failures = oomguard.Failures(client)
    time.sleep(1.5)  # past the grace: a death would be decided by now
    events = failures.events()
    assert {e.kind for e in events} == {"user"}
    assert sorted(e.shard for e in events) == sorted(
        ["boom-oomguard"] + ["flaky-oomguard-enough"] * 2 + ["flaky-oomguard-too-few"] * 2
    )
    stats = _oomguard_stats(client)
    assert stats["deaths"] == 0 and stats["aborts"] == 0 and stats["internal_errors"] == 0
    record_figures("parity", graphs_tasks=len(with_["states"]), user_events=len(events))


def test_graceful_operations_are_never_failures(cluster, tmp_path):
    cl, client = cluster
    oomguard.install(client, store=str(tmp_path / "graceful.sqlite3"))
    # client.restart(): every worker restarted on request.
    client.restart()
    client.wait_for_workers(2, timeout=60)
    # Adaptive scale-down: an idle worker retired by Dask's Adaptive.
    adaptive = cl.adapt(minimum=1, maximum=2, interval="200ms", wait_count=2)
    deadline = time.monotonic() + 60
    while len(client.scheduler_info()["workers"]) > 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(client.scheduler_info()["workers"]) == 1
    adaptive.stop()
    cl.scale(2)
    client.wait_for_workers(2, timeout=60)
    # retire_workers while work is in flight: the work completes, nothing failed.
    futs = client.map(nap, [0.2] * 20, pure=False)
    time.sleep(0.5)
    victim = sorted(client.scheduler_info()["workers"])[0]
    client.retire_workers([victim], close_workers=True)
    assert client.gather(futs) == [0.2] * 20
    assert client.submit(inc, 1).result(timeout=30) == 2
    time.sleep(2.0)  # past the grace timeout
    assert oomguard.Failures(client).events() == []
    stats = _oomguard_stats(client)
    assert stats["deaths"] == 0, stats
    assert stats["internal_errors"] == 0


def test_removing_oomguard_restores_dask(cluster, tmp_path):
    cl, client = cluster

    def state(dask_scheduler):
        return {
            "allowed_failures": dask_scheduler.allowed_failures,
            "handlers": sorted(h for h in dask_scheduler.handlers if h.startswith("oomguard")),
            "task_erred": getattr(dask_scheduler.stream_handlers["task-erred"], "__name__", ""),
            "remove_worker": "remove_worker" in vars(dask_scheduler),  # wrapped on the instance
            "unregister": dask_scheduler.handlers["unregister"] == dask_scheduler.remove_worker,
        }

    plain = client.run_on_scheduler(state)
    assert plain["allowed_failures"] == 1 and plain["handlers"] == []
    assert not plain["remove_worker"] and plain["unregister"]
    oomguard.install(client, store=str(tmp_path / "removed.sqlite3"))
    # Dask's count as the user set it: oomguard keeps its bound beside it (_dask_bound.py).
    installed = client.run_on_scheduler(state)
    assert installed["allowed_failures"] == plain["allowed_failures"]
    assert installed["remove_worker"] and installed["unregister"]
    client.unregister_scheduler_plugin("oomguard")
    deadline = time.monotonic() + 5
    while client.run_on_scheduler(state) != plain and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.run_on_scheduler(state) == plain
    # Dask decides deaths again: allowed-failures 1 means the second death raises.
    with pytest.raises(KilledWorker):
        client.submit(suicide, 1, pure=False).result(timeout=120)
