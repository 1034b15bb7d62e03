"""A SIGKILL of a worker whose cgroup systemd-oomd counts a kill on names systemd-oomd
(issue 26).

systemd-oomd itself needs systemd as PID 1 and cgroup v2; it does not run here. The test
does what it does on a kill: it increments `user.oomd_ooms` and `user.oomd_kill` on the
worker's real cgroup directory (a per-worker memory group made by oomguard), then SIGKILLs
the worker.
"""

from __future__ import annotations

import os
import signal
import time

import dask
import pytest
from distributed import Client, LocalCluster

import oomguard
from cluster_helpers import require_worker_groups, wait_for
from oomguard._host.cgroup import detect
from oomguard._host.readings import OOMD_KILL, OOMD_OOMS

pytestmark = pytest.mark.timeout(180)


def nap(seconds):
    time.sleep(seconds)


def test_a_kill_counted_in_the_groups_xattrs_is_systemd_oomd(tmp_path):
    require_worker_groups()
    with (
        dask.config.set(
            {
                "oomguard.worker.sample-interval": "100ms",
                "oomguard.worker.cgroup-limit": "true",
                "distributed.deploy.lost-worker-timeout": "1h",
            }
        ),
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cl,
        Client(cl) as client,
    ):
        oomguard.install(client, store=str(tmp_path / "s.sqlite3"))
        addr = next(iter(client.scheduler_info()["workers"]))
        pid = client.run(os.getpid)[addr]
        group = detect(pid).path
        assert group is not None and os.path.basename(group) != ""
        running = client.submit(nap, 60, pure=False)
        wait_for(lambda: client.processing()[addr], "the task did not start")
        time.sleep(0.5)  # readings with the xattrs absent (0)
        os.setxattr(group, OOMD_OOMS, b"1")
        os.setxattr(group, OOMD_KILL, b"1")
        os.kill(pid, signal.SIGKILL)
        failures = oomguard.Failures(client)
        (event,) = wait_for(lambda: failures.events(cause="sigkill"), "no sigkill event", 60)
        running.cancel()
    assert event.evidence["exitcode"] == -signal.SIGKILL
    assert event.evidence.get("oom_kill_delta") in (0, None)
    # Named by the lead's attribution (issue 26) from oomd {"reading": {"kill": 0}, "after":
    # {"kill": 1}} (tests/unit/test_nanny_host_evidence.py shows what reaches `build`).
    assert event.killer == "systemd-oomd"
    assert event.killer_how == "cgroup xattr"
