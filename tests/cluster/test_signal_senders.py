"""The sender of a signal that ends a worker is recorded (issues 26 and 39): its name, pid,
uid and command line, in the death's event, however oomguard came to the cluster.

Two deployments, each with a real nanny and worker: `install`, a running LocalCluster
(processes) that `oomguard.install(client)` is called on, the README's notebook path; and
`cli`, a cluster started as `dask scheduler --preload oomguard.scheduler_plugin` and
`dask worker --preload-nanny oomguard.worker_plugin` in their own processes. The signals
come from a real process renamed `chaos-monkey` (prctl; tests/chaos_monkey.py).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

import oomguard
from chaos_monkey import chaos_monkey
from cluster_helpers import oomguard_cluster, wait_for
from oomguard._host.senders import command_line

pytestmark = pytest.mark.timeout(300)

BASE = {
    "oomguard.worker.cgroup-limit": "false",
    "oomguard.worker.sample-interval": "100ms",
    "distributed.scheduler.allowed-failures": 100,
}


def sleepy_task(seconds):
    time.sleep(seconds)
    return seconds


def deployed(how: str, tmp_path, **config):
    """A client of a one-worker cluster with oomguard, deployed `how` ("install", "cli")."""
    config = {**BASE, "oomguard.scheduler.store": str(tmp_path / "s.sqlite3"), **config}
    return oomguard_cluster(how, tmp_path, config)


def _busy_worker(client) -> tuple[str, int, object]:
    """(address, pid, future) of the worker, running a task that sleeps."""
    client.wait_for_workers(1, timeout=60)
    addr = sorted(client.scheduler_info()["workers"])[0]
    pid = client.run(os.getpid, workers=[addr])[addr]
    fut = client.submit(sleepy_task, 60, workers=[addr], pure=False)
    wait_for(lambda: client.processing()[addr], "the task did not start", timeout=30)
    time.sleep(0.5)  # executing, and sampled
    return addr, pid, fut


def _the_sigterm(client, addr: str):
    failures = oomguard.Failures(client)
    (event,) = wait_for(
        lambda: [e for e in failures.events(cause="sigterm") if e.worker == addr],
        lambda: f"no sigterm event for {addr}: {failures.events()}",
        timeout=60,
    )
    return event


@pytest.mark.parametrize("how", ["install", "cli"])
def test_a_sigterm_from_a_named_process_is_recorded_with_its_name_and_pid(tmp_path, how):
    with deployed(how, tmp_path) as client, chaos_monkey() as send:
        addr, pid, fut = _busy_worker(client)
        send(pid)
        event = _the_sigterm(client, addr)
        fut.cancel()
    assert (event.killer, event.killer_how, event.killer_confidence) == (
        "process",
        "signal sender",
        "confirmed",
    )
    me = os.getuid()
    assert event.killer_summary == f"SIGTERM from chaos-monkey (pid {send.pid}, uid {me})"
    ev = event.evidence
    assert (ev["sender_name"], ev["sender_pid"], ev["sender_uid"]) == (
        "chaos-monkey",
        send.pid,
        me,
    )
    # Kept as its program name and a hash of its arguments (sender-cmdline: hashed).
    raw = b"".join(os.fsencode(a) + b"\0" for a in send.argv)
    assert ev["sender_cmdline"] == command_line(raw)
    assert ev["sender_cmdline"].startswith(os.path.basename(send.argv[0]) + " [3 arguments")
    assert "--chaos" not in ev["sender_cmdline"]
    # As before: exit -15 after faulthandler's SIGTERM dump, which names the task's frame.
    assert event.cause == "sigterm" and ev["exitcode"] == -signal.SIGTERM
    assert "sleepy_task" in event.signature_title, event.signature_title


def test_the_full_command_line_when_asked_and_a_restarted_worker_records_too(tmp_path):
    with deployed("install", tmp_path, **{"oomguard.worker.sender-cmdline": "full"}) as client:
        client.restart()  # requested: no death; the new worker records from its start
        client.wait_for_workers(1, timeout=60)
        assert oomguard.Failures(client).events() == []
        with chaos_monkey() as send:
            addr, pid, fut = _busy_worker(client)
            send(pid)
            event = _the_sigterm(client, addr)
            fut.cancel()
    assert event.evidence["sender_pid"] == send.pid
    assert event.evidence["sender_cmdline"].endswith(" --chaos")


def test_senders_not_recorded_when_disabled_and_the_worker_dies_as_before(tmp_path):
    config = {"oomguard.worker.signal-senders": False}
    with deployed("install", tmp_path, **config) as client, chaos_monkey() as send:
        addr, pid, fut = _busy_worker(client)
        send(pid)
        event = _the_sigterm(client, addr)
        fut.cancel()
    assert "sender_pid" not in event.evidence and event.killer == "unknown"
    assert event.evidence["exitcode"] == -signal.SIGTERM
