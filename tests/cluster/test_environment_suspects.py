"""Where a crash lives (issue 40), on a real cluster: five workers behind real nannies
(a `SpecCluster`), each with its own environment (`Nanny(env=...)`): two in the node pool
"spot", three in "ondemand", named by `oomguard.worker.labels`. Only the spot pool crashes
(a real segfault, reached through a site-packages frame: toolz), first once on one spot
worker, then every time on the other until its pipeline is aborted.

What a user relies on: every death carries its worker's environment (its label, the
versions, the package its crash's stack names); the signature names NODE_POOL=spot as its
suspect (deaths on 2 of 5 workers, all spot) in the API, `oomguard report` and the
dashboard's detail, with its first environment; the abort message says so; and a client's
host event naming a worker does not change the environment that worker is counted with.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import platform

import dask
import distributed
import pytest
from distributed import Client, Nanny, Scheduler, SpecCluster

import oomguard
from _cli_run import report
from cluster_helpers import wait_for, wait_installed
from oomguard._death.record import Environment
from oomguard._death.wire import to_wire
from oomguard._protocol import ENVIRONMENT_FIELD, HOST_TOPIC

pytestmark = pytest.mark.timeout(400)

POOLS = {"s0": "spot", "s1": "spot", "o0": "ondemand", "o1": "ondemand", "o2": "ondemand"}


def read_shard(marker: str, crashes: int) -> str:
    """Segfault on the first `crashes` attempts (counted in the file `marker`), in a C
    function called through toolz (a frame of an installed package on the stack)."""
    from toolz.functoolz import compose

    with open(marker, "a+") as f:
        f.seek(0)
        attempt = len(f.read()) + 1
        f.write(".")
    if attempt <= crashes:
        compose(ctypes.string_at, int)(0)  # string_at(int(0)), from toolz's __call__
    return f"read after {attempt - 1} crashes"


def spec() -> dict:
    workers = {}
    for name, pool in POOLS.items():
        # Each spot worker has a resource of its own: a task that needs it runs there.
        resources = {f"only-{name}": 1} if pool == "spot" else {}
        options = {"nthreads": 1, "env": {"NODE_POOL": pool}, "resources": resources}
        workers[name] = {"cls": Nanny, "options": options}
    return workers


@pytest.fixture
def client(tmp_path):
    with (
        dask.config.set(
            {
                "oomguard.worker.labels": ["NODE_POOL"],
                "oomguard.worker.sample-interval": "100ms",
                "distributed.scheduler.allowed-failures": 10,
            }
        ),
        SpecCluster(
            workers=spec(), scheduler={"cls": Scheduler, "options": {"dashboard_address": ":0"}}
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(len(POOLS), timeout=120)
        oomguard.install(
            client,
            store=str(tmp_path / "history.sqlite3"),
            max_shard_infra_failures=4,
            abort_on_repeat_signature=False,  # each restart is another worker: count instead
        )
        wait_installed(client, len(POOLS))
        yield client


def test_the_crashing_pool_is_the_suspect(client, tmp_path, capsys):
    with distributed.span("warmup"):
        once = client.submit(
            read_shard, str(tmp_path / "once"), 1, resources={"only-s1": 1}, pure=False
        )
    assert once.result(timeout=240) == "read after 1 crashes"
    with distributed.span("etl"):
        always = client.submit(
            read_shard, str(tmp_path / "always"), 99, resources={"only-s0": 1}, pure=False
        )
    with pytest.raises(oomguard.PipelineAborted) as aborted:
        always.result(timeout=300)
    message = " ".join(str(aborted.value).split())
    assert "NODE_POOL=spot far more often than the cluster's workers do" in message, message
    assert "2 of 5 workers)" in message

    failures = oomguard.Failures(client)
    wait_for(
        lambda: failures._query("stats").get("pending_deaths") == 0,
        lambda: f"deaths still undecided: {failures._query('stats')}",
        timeout=120,
    )
    deaths = failures.deaths()
    assert len(deaths) == 5 and {d.cause for d in deaths} == {"native_crash"}, deaths
    (signature,) = {d.signature_id for d in deaths}
    toolz = importlib.metadata.version("toolz")
    for d in deaths:
        env = d.environment
        assert env.labels == {"NODE_POOL": "spot"}, d
        assert (env.python, env.distributed) == (
            platform.python_version(),
            distributed.__version__,
        )
        assert env.kernel == os.uname().release
        assert env.packages == {"toolz": toolz}  # the crash's stack, dask's own left out
    assert len({d.nanny for d in deaths}) == 2  # the two spot workers, restarts and all

    row = next(s for s in failures.signatures() if s.id == signature)
    (suspect,) = row.environment_suspects
    assert (suspect["name"], suspect["value"]) == ("NODE_POOL", "spot")
    assert (
        suspect["deaths"],
        suspect["of_deaths"],
        suspect["workers"],
        suspect["of_workers"],
    ) == (
        5,
        5,
        2,
        5,
    )
    assert row.first_environment["labels"] == {"NODE_POOL": "spot"}
    assert row.first_environment["packages"] == {"toolz": toolz}

    # The history's reader says the same, from the file; the dashboard's detail too.
    def detail(dask_scheduler, signature=signature):
        from oomguard.scheduler_plugin._dashboard_data import read_detail

        plugin = dask_scheduler.plugins["oomguard"]
        plugin.store.flush()
        return read_detail(plugin.store, signature)

    text = client.run_on_scheduler(detail)
    assert "suspects           NODE_POOL=spot (5 of 5 deaths, 2 of 5 workers)" in text
    assert f"packages toolz {toolz}" in text

    # A client cannot say what a worker runs on: its host events are not the worker's own.
    # Counted by nanny (a slot), not by the live workers: s0's nanny may still be
    # restarting its worker after the abort.
    nannies = {name: client.cluster.workers[name].address for name in POOLS}
    o0 = next(a for a, w in client.scheduler_info()["workers"].items() if w["name"] == "o0")
    forged = Environment(labels={"NODE_POOL": "forged"})
    client.log_event(HOST_TOPIC, {"host": "x", "worker": o0, ENVIRONMENT_FIELD: to_wire(forged)})
    # Client.log_event returns once the scheduler published it to its plugins' hooks.
    assert any(m.get("host") == "x" for _, m in client.get_events(HOST_TOPIC))

    def pools(dask_scheduler, nannies=nannies):
        tally = dask_scheduler.plugins["oomguard"].core.environments
        return {name: tally.of(nanny).labels["NODE_POOL"] for name, nanny in nannies.items()}

    assert client.run_on_scheduler(pools) == POOLS

    # `oomguard report` on the history's file, as it is now.
    rc, out, _ = report(
        capsys, "--store", tmp_path / "history.sqlite3", "--signatures", "--signature", signature
    )
    lines = " ".join(out.split())
    assert rc == 0
    assert f"{signature} suspects: NODE_POOL=spot (5 of 5 deaths, 2 of 5 workers)" in lines
    assert "NODE_POOL=spot; packages toolz" in lines
