"""The history outlives the scheduler by default (issue 38, point 4): `dask scheduler --preload
oomguard.scheduler_plugin` with no oomguard setting keeps it in ~/.local/state/oomguard, one
file per cluster name; the same command started again with the same name (the same host
and port) continues it: the client API and `oomguard report` with no flag find the death
recorded before the restart. (Before, the file sat in the scheduler's temporary local
directory, which Dask deletes on close.)"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time

import pytest
from distributed import Client

import oomguard
from cluster_helpers import DaskScheduler, dask_worker, wait_for

pytestmark = pytest.mark.timeout(240)


def _env(home) -> dict[str, str]:
    """This environment without any oomguard setting, with `home` as HOME."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DASK_OOMGUARD", "DASK_SCHEDULER_ADDRESS")) and k != "XDG_STATE_HOME"
    }
    return {**env, "HOME": str(home), "DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING": "False"}


def _scheduler(tmp_path, env, name: str, port: int | None = None) -> tuple[DaskScheduler, str]:
    """A scheduler on `port`, or on a free one outside the kernel's ephemeral range (so that
    no outgoing connection takes it before the restart binds it again)."""
    for _ in range(10):
        chosen = port or random.randrange(20_000, 32_000)
        sched = DaskScheduler(tmp_path, env, name=name, port=chosen)
        try:
            return sched, sched.address()
        except AssertionError:
            if port is not None or "already in use" not in sched.text():
                raise
            sched.kill()  # that port was taken: another one
    raise AssertionError("no free port for the scheduler")


def test_a_scheduler_started_again_with_the_same_name_continues_its_history(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = _env(home)
    sched, address = _scheduler(tmp_path, env, "first")
    port = int(address.rsplit(":", 1)[1])
    cluster = f"{socket.gethostname()}:{port}"
    expected = home / ".local" / "state" / "oomguard" / f"{cluster}.sqlite3"
    worker = dask_worker(address, env=env, own_session=True)
    try:
        with Client(address, timeout=60) as client:
            client.wait_for_workers(1, timeout=60)
            wait_for(
                lambda: all(
                    client.run(
                        lambda dask_worker: "oomguard-worker" in dask_worker.plugins
                    ).values()
                ),
                "the worker plugin",
            )
            (pid,) = client.run(os.getpid).values()
            future = client.submit(time.sleep, 600, key="outlives-sleep", pure=False)
            wait_for(lambda: client.processing() and any(client.processing().values()), "the task")
            time.sleep(1.0)  # the flight recorder sees it executing
            os.kill(pid, signal.SIGKILL)
            failures = oomguard.Failures(client)
            (event,) = wait_for(lambda: failures.events(cause="sigkill"), "the sigkill event")
            assert event.shard == "outlives-sleep" and event.cluster == cluster
            future.cancel()
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        sched.stop()
    # The start line said where; the file is in the state directory, and stays there.
    assert f"cluster {cluster!r}" in sched.text() and f"store at {expected}" in sched.text()
    assert expected.exists()

    again, address = _scheduler(tmp_path, env, "again", port=port)
    try:
        with Client(address, timeout=60) as client:
            events = oomguard.Failures(client).events()
            assert [(e.shard, e.cause) for e in events] == [("outlives-sleep", "sigkill")]
        # The command a person runs afterwards, with neither --scheduler nor --store.
        proc = subprocess.run(
            [sys.executable, "-m", "oomguard._cli", "report", "--shard", "outlives-sleep"],
            env={**env, "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert "EVENTS: 1, oldest first" in proc.stdout and "sigkill" in proc.stdout
        assert proc.stderr == (
            f"oomguard report: reading the history of cluster {cluster!r} in "
            f"~/.local/state/oomguard/{cluster}.sqlite3\n"
        )
    finally:
        again.stop()
    assert f"store at {expected}" in again.text()
