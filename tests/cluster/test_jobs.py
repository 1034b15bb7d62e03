"""A job is what the user wrapped (issue 27): one `with distributed.span(...)` block is one
pipeline job, however many computes, graphs and eager steps a dask.dataframe makes of it.

Real LocalCluster with nannies, oomguard installed at runtime, pandas + pyarrow dataframes
(dask-expr), a real SIGKILL of a worker while a task of the first compute executes.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import dask
import dask.array as da
import distributed
import pytest
from distributed import Client, LocalCluster

import oomguard
from _cli_run import report
from cluster_helpers import wait_for, wait_installed

pytestmark = pytest.mark.timeout(300)


def slow(part, marks: str):
    # Say which process runs this partition, then work long enough to be killed mid-task.
    with open(os.path.join(marks, f"{os.getpid()}-{time.monotonic_ns()}"), "w"):
        pass
    time.sleep(1.0)
    return part


@pytest.fixture
def cluster(tmp_path):
    with dask.config.set(
        {
            "oomguard.worker.sample-interval": "100ms",
            "oomguard.scheduler.report-grace-timeout": "3s",
            "distributed.deploy.lost-worker-timeout": "1h",
            "distributed.worker.memory.terminate": False,
        }
    ):
        with (
            LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
            ) as cl,
            Client(cl) as client,
        ):
            oomguard.install(client, store=str(tmp_path / "failures.sqlite3"))
            wait_installed(client)
            yield client


def _kill_first_worker_seen(marks, killed: list) -> None:
    """SIGKILL the first worker process that starts a `slow` partition, 0.5 s into it."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        seen = sorted(os.listdir(marks))
        if seen:
            time.sleep(0.5)  # executing, and its stack sampled
            pid = int(seen[0].split("-")[0])
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            return
        time.sleep(0.02)


def test_a_dataframe_span_is_one_job_that_saw_its_worker_die(cluster, tmp_path, capsys):
    client = cluster
    marks = tmp_path / "marks"
    marks.mkdir()
    # The workload: dask's demo time series (pandas + pyarrow, dask-expr), a slow
    # step so a worker can be killed while a task of the first compute executes.
    ts = dask.datasets.timeseries(
        start="2000-01-01", end="2000-01-07", freq="10s", partition_freq="1d", seed=1
    ).map_partitions(slow, str(marks))
    pdf = ts.compute()  # the answers (before any span: not part of the job)
    for name in os.listdir(marks):
        os.remove(marks / name)
    killed: list[int] = []
    killer = threading.Thread(target=_kill_first_worker_seen, args=(str(marks), killed))
    killer.start()
    with distributed.span("block"):
        means = ts.shuffle("name").groupby("name").x.mean().compute()
        killer.join()
        top = ts.y.max().compute()
    assert killed, "no worker was killed"
    assert means.sort_index().tolist() == pdf.groupby("name").x.mean().sort_index().tolist()
    assert top == pdf.y.max()

    failures = oomguard.Failures(client)
    deaths = wait_for(
        lambda: [e for e in failures.events(pipeline="block") if e.cause == "sigkill"],
        "no sigkill event in pipeline 'block'",
        timeout=30,
        interval=0.2,
    )
    assert len({(e.worker, e.time) for e in deaths}) == 1  # one worker died, once
    # The last keys are released just after .compute() returns: wait for that.
    job = wait_for(
        lambda: (p := failures.pipeline("block")).status != "running" and p,
        lambda: f"the job is still running: {failures.pipeline('block')!r}",
        timeout=30,
        interval=0.2,
    )
    # The whole block is one job: both computes, and the death during the first.
    assert job.status == "succeeded_after_infra_failures", (job.status, job.summary)
    assert job.infra_failures >= 1
    assert "1 worker death (1 sigkill)" in job.summary, job.summary
    runs = [p for p in failures.pipelines() if p.name == "block"]
    assert len(runs) == 1, [(p.status, p.started) for p in runs]

    # A new block of the same name after the first closed is a new job, judged on its own.
    with distributed.span("block"):
        assert ts.x.sum().compute() == pytest.approx(pdf.x.sum())
    again = failures.pipeline("block")
    assert again.started > job.started
    assert again.status == "succeeded", (again.status, again.summary)
    assert len([p for p in failures.pipelines() if p.name == "block"]) == 2
    # Stored as docs/getting-started.md says (issue 41: it said `block#2`): both runs under
    # the name itself, each with its start time; the report answers for the latest.
    store = tmp_path / "failures.sqlite3"
    wait_for(
        lambda: len(_stored_runs(capsys, store)) == 2, lambda: _stored_runs(capsys, store), 30
    )
    assert _stored_runs(capsys, store) == sorted([job.started, again.started])
    rc, out, _ = report(capsys, "--store", store, "--pipeline", "block", "--pipelines", "--json")
    assert rc == 0 and [p["started"] for p in json.loads(out)["pipelines"]] == [again.started]
    rc, _, err = report(capsys, "--store", store, "--pipeline", "block#2")
    assert rc == 3 and "did you mean 'block'?" in err, err


def _stored_runs(capsys, store) -> list[float]:
    """The start times of the runs named "block" that `oomguard report` reads from `store`."""
    rc, out, err = report(capsys, "--store", store, "--pipelines", "--json")
    assert rc == 0, err
    return sorted(p["started"] for p in json.loads(out)["pipelines"] if p["name"] == "block")


def inc(x):
    return x + 1


def double(x):
    return 2 * x


def test_every_kind_of_work_in_one_block_is_one_job(cluster):
    """dask.array, delayed, client.map and submit, and a dataframe's eager step
    (set_index's divisions), each its own graph, keys released between them: one job per
    block; nested spans name theirs outer/inner; the annotation alone, one per client."""
    client = cluster
    df = dask.datasets.timeseries(start="2000-01-01", end="2000-01-03", freq="60s", seed=2)
    with distributed.span("mixed"):
        assert da.ones((40, 40), chunks=10).sum().compute() == 1600
        assert dask.delayed(inc)(1).compute() == 2
        assert client.gather(client.map(inc, range(5))) == [1, 2, 3, 4, 5]
        assert client.submit(double, 4).result() == 8
        assert df.set_index("id").x.count().compute() == len(df)
        with distributed.span("inner"):
            assert da.arange(10, chunks=5).sum().compute() == 45
            assert dask.delayed(double)(3).compute() == 6
    with dask.annotate(oomguard_pipeline="named"):
        assert client.compute(dask.delayed(inc)(10)).result() == 11
        assert client.compute(dask.delayed(double)(10)).result() == 20

    failures = oomguard.Failures(client)
    runs = {}
    for p in failures.pipelines():
        runs.setdefault(p.name, []).append(p)
    assert {name: len(r) for name, r in runs.items()} == {
        "mixed": 1,
        "mixed/inner": 1,
        "named": 1,
    }, {n: [(p.status, p.shards_done) for p in r] for n, r in runs.items()}
    assert all(r[0].status == "succeeded" for r in runs.values())
    # Every graph's shards are counted in the job: more than the last compute alone.
    assert failures.pipeline("mixed").shards_done > 4 + 5 + 1
