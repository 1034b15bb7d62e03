"""One machine, one name (issue 27, build 4), and what `oomguard.Failures` shows of it.

The scenario: on one machine, a user exception recorded host `127.0.0.1` while a death
recorded `vm` (the nanny's hostname), and the signatures table listed both. Here a real
`dask worker --preload-nanny oomguard.worker_plugin` process (its own nanny process) on
this machine: a task raises, a task kills its worker by SIGKILL (the nanny reports), and
the whole `dask worker` (nanny and worker) is SIGKILLed (no report: worker_lost). Every
event, signature and the gauges name the one hostname, with the worker's address beside
it. And `repr(Failures(client))` over TCP counts the history (it said "no answer: is
oomguard installed?" whenever the rows came back as a tuple).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import dask
import pytest
from distributed import Client, LocalCluster

import oomguard
from cluster_helpers import dask_worker, wait_for

pytestmark = pytest.mark.timeout(240)

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)  # cluster_helpers, which this module imports
PATH = os.environ.get("PYTHONPATH", "")


def boom(x):
    raise KeyError(x)


def die_once(marker):
    time.sleep(0.5)  # in the flight record
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return marker


def nap(seconds):
    time.sleep(seconds)
    return seconds


def _dask_worker(address: str, crash_dir: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "DASK_OOMGUARD__WORKER__CRASH_DIR": crash_dir,
        # The tasks below are this module's functions, pickled by reference.
        "PYTHONPATH": os.pathsep.join(filter(None, [HERE, str(TESTS), PATH])),
    }
    log = open(os.environ.get("DBG_WORKER_LOG", os.devnull), "w")
    return dask_worker(address, env=env, own_session=True, stderr=log)


def test_exceptions_and_deaths_on_one_machine_share_one_host_name(tmp_path):
    hostname = socket.gethostname()
    with (
        dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"}),
        LocalCluster(n_workers=0, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        oomguard.install(client, store=str(tmp_path / "s.sqlite3"), report_grace_timeout="1s")
        worker = _dask_worker(cluster.scheduler_address, str(tmp_path / "crash"))
        failures = oomguard.Failures(client)
        try:
            client.wait_for_workers(1, timeout=60)
            with pytest.raises(KeyError):
                client.submit(boom, 1, key="boom-1").result(timeout=60)
            wait_for(lambda: failures.events(cause="exception"), "the exception's event")
            died = client.submit(die_once, str(tmp_path / "died"), key="die-1")
            wait_for(lambda: failures.events(cause="sigkill"), "the SIGKILL's event", 90)
            died.result(timeout=90)  # retried on the worker its nanny restarted
            fut = client.submit(nap, 60, key="nap-lost", pure=False)
            wait_for(lambda: any(client.processing().values()), "nap-lost did not start")
            time.sleep(1.0)
            os.killpg(worker.pid, signal.SIGKILL)  # nanny and worker: nothing reports
            worker.wait(30)
            lost = wait_for(
                lambda: failures.events(cause="worker_lost"), "the lost worker's event", 90
            )
            fut.cancel()
        finally:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(30)
        events = failures.events()
        assert {e.cause for e in events} == {"exception", "sigkill", "worker_lost"}, events
        assert lost[0].shard == "nap-lost"
        for e in events:
            assert e.host == hostname, (e.cause, e.host, hostname)
            # The address beside the name: which worker on that host.
            assert e.worker.startswith("tcp://"), e
        signatures = failures.signatures()
        assert len(signatures) == 3
        assert all(s.hosts == [hostname] for s in signatures), [s.hosts for s in signatures]
        # The repr over TCP counts the history.
        address = client.scheduler.address
        assert repr(failures) == f"<Failures {address} 3 events, 3 signatures>"


def test_the_repr_counts_the_history_over_tcp(tmp_path):
    # The scenario: the scheduler answers a tuple over TCP; the repr wanted a list and
    # always said "(no answer: is oomguard installed?)".
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        assert client.scheduler.address.startswith("tcp://")
        oomguard.install(client, store=str(tmp_path / "s.sqlite3"))
        failures = oomguard.Failures(client)
        assert repr(failures) == f"<Failures {client.scheduler.address} 0 events, 0 signatures>"
        with pytest.raises(KeyError):
            client.submit(boom, 7).result(timeout=60)
        wait_for(lambda: failures.events(), "the exception's event")
        assert repr(failures) == f"<Failures {client.scheduler.address} 1 event, 1 signature>"
