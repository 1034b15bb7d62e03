"""What the nanny hands `build_report` about the host (issue 26): its last host-memory
reading, the killers on the host, systemd-oomd's xattrs at the reading and after the
death, and the worker's SLURM environment.

No cluster: a real process in a real memory cgroup made by the test stands in for the
worker, as in test_nanny_report.py; `build_report` is replaced by a recorder of its
arguments (ours, not Dask's).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from capabilities import require
from oomguard._death.record import Death
from oomguard._host import cgroup as _cgroup
from oomguard._host.readings import OOMD_KILL, OOMD_OOMS, HostMeter, OomdXattrs
from oomguard.worker_plugin import _reporting
from oomguard.worker_plugin._life import _Life, take_readings
from oomguard.worker_plugin._nanny import OomguardNannyPlugin


@pytest.fixture
def built(monkeypatch):
    calls: list[dict] = []

    def record(seen, max_bytes):
        calls.append(dict(vars(seen)))  # what the nanny saw, as build() gets it
        return Death(cause="sigkill")

    monkeypatch.setattr(_reporting, "build", record)
    return calls


def _worker(env: dict | None = None) -> subprocess.Popen:
    code = "import time; print('up', flush=True); time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
    assert p.stdout.readline() == b"up\n"
    return p


def _plugin(tmp_path) -> OomguardNannyPlugin:
    plugin = OomguardNannyPlugin(crash_dir=str(tmp_path), cgroup_limit="false")
    plugin._resolve_config()
    plugin.reporter.crash_dir = plugin.crash_dir  # as setup() makes it
    return plugin


def test_host_reading_killers_and_environment_reach_the_build(tmp_path, built):
    env = {**os.environ, "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "1"}
    worker = _worker(env)
    try:
        from oomguard._host.readings import slurm_environment

        life = _Life(pid=worker.pid, started=1.0, address="tcp://w:1", name="w", memory_limit=None)
        life.slurm_job = slurm_environment(worker.pid)
        with HostMeter() as meter:
            take_readings(life, meter)
        assert life.host is not None and life.host["available"] > 0
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        with HostMeter() as meter:
            take_readings(life, meter)  # the worker is gone: the last reading stays
        reporter = _plugin(tmp_path).reporter
        reporter.killers = [{"name": "earlyoom", "pid": 999_999_999, "cmdline": "earlyoom"}]
        reporter.build(worker.pid, -9, False, "tcp://w:1", life, 2.0)
    finally:
        worker.kill()
        worker.wait()
    (kw,) = built
    assert kw["host_reading"] is life.host and kw["host_reading"]["time"] < 2e9
    assert set(kw["host_reading"]) == {"time", "total", "available", "psi_some10", "psi_full10"}
    said = kw["slurm_job"].pop("slurm")  # what SLURM says of the job (no SLURM here)
    assert kw["slurm_job"] == {"slurm_job_id": "4242", "slurm_step_id": "1"}
    assert said["slurm_job_id"] == "4242" and said["slurm_query_seconds"] < 30
    # The last periodic scan's earlyoom, gone by the death, is still named.
    assert {"name": "earlyoom", "pid": 999_999_999, "cmdline": "earlyoom"} in kw["killers"]
    assert kw["oomd"] is None  # no cgroup known for this worker


@pytest.fixture
def group():
    ok, reason = _cgroup.can_create_child()
    require(ok, f"no child memory cgroup can be made here: {reason}")
    g = _cgroup.ChildGroup.create(f"oomguard-oomd-{os.getpid()}", None)
    try:
        yield g
    finally:
        for name in os.listxattr(g.path):
            os.removexattr(g.path, name)
        g.remove()


def test_oomd_xattrs_that_move_between_the_reading_and_the_death(tmp_path, built, group):
    worker = _worker()
    try:
        group.add_pid(worker.pid)
        life = _Life(pid=worker.pid, started=1.0, address="tcp://w:1", name="w", memory_limit=None)
        life.cgroup_path, life.cgroup_version = group.path, group.version
        life.oomd_watch = OomdXattrs(group.path)
        with HostMeter() as meter:
            take_readings(life, meter)
        assert life.reading is not None and life.reading.oom_kill == 0
        # As systemd-oomd does when it kills a group: count, then SIGKILL every process.
        os.setxattr(group.path, OOMD_OOMS, b"1")
        os.setxattr(group.path, OOMD_KILL, b"1")
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        _plugin(tmp_path).reporter.build(worker.pid, -9, False, "tcp://w:1", life, 2.0)
    finally:
        worker.kill()
        worker.wait()
    (kw,) = built
    assert kw["oomd"] == {
        "reading": {"ooms": 0, "kill": 0},
        "after": {"ooms": 1, "kill": 1},
        "path": group.path,
    }
