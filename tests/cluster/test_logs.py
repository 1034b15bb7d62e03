"""What `dask scheduler` and `dask worker` print (issue 12, build 7): oomguard's lines come
with Dask's level and time, the store path at start, one INFO line per classified death
(cause, worker, shard, pipeline, signature), one WARNING per abort.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import distributed
import pytest
from distributed import Client

import oomguard
from cluster_helpers import wait_for

pytestmark = pytest.mark.timeout(240)


def kill_myself(i: int) -> int:
    os.kill(os.getpid(), signal.SIGKILL)
    return i


def _wait_for_scheduler(path, proc, log):
    """The address in the scheduler file, once written; fails at once if the scheduler died."""

    def address():
        if path.exists():
            try:
                return json.loads(path.read_text())["address"]
            except (ValueError, KeyError):
                pass
        assert proc.poll() is None, log.read_text()[-3000:]
        return None

    return wait_for(
        address, lambda: f"not started: {log.read_text()[-3000:]}", timeout=90, interval=0.1
    )


def test_deaths_and_aborts_are_logged_with_dasks_level_and_time(tmp_path):
    store = tmp_path / "f.sqlite3"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),  # this module's tasks
        "DASK_OOMGUARD__SCHEDULER__STORE": str(store),
        "DASK_OOMGUARD__SCHEDULER__REPORT_GRACE_TIMEOUT": "5s",
        "DASK_OOMGUARD__WORKER__CRASH_DIR": str(tmp_path / "crash"),
    }
    s_log, w_log = tmp_path / "scheduler.log", tmp_path / "worker.log"
    sched_file = tmp_path / "scheduler.json"
    procs = []
    try:
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "distributed.cli.dask_scheduler",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--dashboard-address",
                    ":0",
                    "--scheduler-file",
                    str(sched_file),
                    "--preload",
                    "oomguard.scheduler_plugin",
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=open(s_log, "w"),
            )
        )
        address = _wait_for_scheduler(sched_file, procs[0], s_log)
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "distributed.cli.dask_worker",
                    address,
                    "--nthreads",
                    "1",
                    "--no-dashboard",
                    "--preload-nanny",
                    "oomguard.worker_plugin",
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=open(w_log, "w"),
            )
        )
        with Client(address, timeout=60) as client:
            client.wait_for_workers(1, timeout=90)
            with distributed.span("logged"):
                fut = client.submit(kill_myself, 1, pure=False)
            with pytest.raises(oomguard.PipelineAborted):
                fut.result(timeout=180)
            events = oomguard.Failures(client).events()
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGINT)
        for p in reversed(procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    text = s_log.read_text()
    ours = "\n".join(line for line in text.splitlines() if " - oomguard" in line)
    # Dask's own format: "<time> - <logger> - <LEVEL> - <message>".
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - oomguard\.scheduler - "
    # The cluster's name and where it came from (issue 29): here, the scheduler's address.
    assert re.search(
        stamp + r"INFO - oomguard: watching failures of cluster '[^']+:\d+' \(from the "
        r"scheduler's host and port\); store at " + re.escape(str(store)),
        text,
    ), ours
    deaths = re.findall(
        stamp + r"INFO - oomguard: worker (\S+) on \S+ died: (\w+)[^\n]*"
        r"executing shard (\S+) of pipeline 'logged'; signature (\w+)",
        text,
    )
    assert len(deaths) == len(events) >= 2, (deaths, ours)
    assert {d[1] for d in deaths} == {"sigkill"}
    assert {d[2] for d in deaths} == {fut.key}
    assert {d[3] for d in deaths} == {e.signature_id for e in events}
    aborts = re.findall(stamp + r"WARNING - oomguard (aborted|stopped) pipeline 'logged'", text)
    assert len(aborts) == 1, ours
