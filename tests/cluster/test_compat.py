"""Dask releases (issue 15): each plugin checks the Dask internals it uses once, at setup, and
logs one line; a release without an essential one leaves Dask's own behaviour alone.

A missing internal is made here by adding one no Dask has to the list the plugin checks:
the fallback is what runs, on a real cluster. `./dev test-matrix` runs this on the oldest
and the newest supported release, where the same check finds everything present.
"""

from __future__ import annotations

import logging
import os
import signal

import dask
import distributed
import pytest
from distributed import Client, LocalCluster

import oomguard
from cluster_helpers import wait_for
from oomguard import _compat

pytestmark = pytest.mark.timeout(180)

LACKING = _compat.Internal(
    "Dask.no_such_internal", lambda obj: False, "nothing here works", essential=True
)


def kill_myself(i: int) -> int:
    os.kill(os.getpid(), signal.SIGKILL)
    return i


def test_every_internal_is_present_on_this_release(caplog, tmp_path):
    version = distributed.__version__
    with caplog.at_level(logging.INFO, logger="oomguard"):
        with (
            LocalCluster(
                n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
            ) as cl,
            Client(cl) as client,
        ):
            oomguard.install(client, store=str(tmp_path / "s.sqlite3"))
            wait_for(
                lambda: "(nanny) on distributed" in caplog.text,
                "no nanny's setup line",
                timeout=30.0,
                interval=0.1,
            )
    for side in ("scheduler", "nanny"):
        line = (
            f"oomguard {oomguard.__version__} ({side}) on distributed {version}: every "
            f"Dask internal it uses is present"
        )
        assert line in caplog.text, caplog.text


def test_a_scheduler_without_an_essential_internal_leaves_dask_alone(
    monkeypatch, caplog, tmp_path
):
    monkeypatch.setattr(_compat, "SCHEDULER", _compat.SCHEDULER + (LACKING,))
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cl,
        Client(cl) as client,
    ):
        scheduler = cl.scheduler
        allowed, erred = scheduler.allowed_failures, scheduler.stream_handlers["task-erred"]
        with caplog.at_level(logging.INFO, logger="oomguard"):
            oomguard.install(client, store=str(tmp_path / "s.sqlite3"))
        assert "no Dask.no_such_internal, so nothing here works" in caplog.text
        # Off: Dask's count and handlers as they were, no store, tasks run as without it.
        assert scheduler.allowed_failures == allowed
        assert scheduler.stream_handlers["task-erred"] is erred
        assert not (tmp_path / "s.sqlite3").exists()
        assert client.submit(sum, [1, 2], pure=False).result(timeout=30) == 3
        assert scheduler.plugins["oomguard"].core is None


def test_a_nanny_without_an_essential_internal_sends_no_report(monkeypatch, caplog, tmp_path):
    # LocalCluster's nannies run in this process, so they check the patched list.
    monkeypatch.setattr(_compat, "NANNY", _compat.NANNY + (LACKING,))
    with dask.config.set(
        {
            "oomguard.scheduler.report-grace-timeout": "2s",
            "distributed.scheduler.allowed-failures": 0,
        }
    ):
        with (
            LocalCluster(
                n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
            ) as cl,
            Client(cl) as client,
        ):
            with caplog.at_level(logging.INFO, logger="oomguard"):
                oomguard.install(client, store=str(tmp_path / "s.sqlite3"))
                wait_for(
                    lambda: "(nanny) on distributed" in caplog.text,
                    "no nanny's setup line",
                    timeout=30.0,
                    interval=0.1,
                )
            assert "no Dask.no_such_internal, so nothing here works" in caplog.text
            [nanny] = cl.workers.values()
            assert getattr(nanny, "_oomguard_nanny_plugin", None) is None
            with distributed.span("unwatched"):
                fut = client.submit(kill_myself, 1, key="unwatched-0", pure=False)
            with pytest.raises(Exception):  # noqa: B017 (whatever Dask raises for the death)
                fut.result(timeout=60)
            # The scheduler side still records the death, from Dask's removal alone.
            failures = oomguard.Failures(client)
            [event] = wait_for(
                lambda: failures.events(cause="worker_lost"),
                "no worker_lost death",
                timeout=30.0,
                interval=0.1,
            )
            assert event.shard == "unwatched-0"
            assert "no death report" in event.evidence["source"]
