"""The sender of a catchable signal that ends a worker is recorded (issue 26, item 2).

Real LocalCluster with oomguard's nannies, real signals from a real process named
`chaos-monkey`. Until the lead surfaces the sender in the report and FailureEvent, the
tests look at what the nanny hands `build` (`signals`, `nanny_pid`): a spy that
keeps those arguments and calls the real function. `senders_of` is the one place to switch
to the report's fields.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import dask
import pytest
from distributed import Client, LocalCluster

import oomguard
from cluster_helpers import wait_for, wait_installed
from oomguard._death import wire as _wire
from oomguard.worker_plugin import CLEAN_EXIT_HANDLER, REPORT_HANDLER, _reporting

pytestmark = pytest.mark.timeout(240)


def sleepy_task(seconds):
    time.sleep(seconds)
    return seconds


def sleep_in_spawned_process(path, how):
    """A child started the way multiprocessing's spawn does (Dask's workers are daemonic,
    so a task cannot use multiprocessing.Process itself), or with os.posix_spawn."""
    import multiprocessing.util

    argv = ["sleep", "60"]
    if how == "spawnv_passfds":
        pid = multiprocessing.util.spawnv_passfds(b"/bin/sleep", argv, [])
    else:
        pid = os.posix_spawn("/bin/sleep", argv, dict(os.environ))
    with open(path, "w") as f:
        f.write(str(pid))
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def sleep_in_subprocess(path):
    proc = subprocess.Popen(["sleep", "30"])
    with open(path, "w") as f:
        f.write(str(proc.pid))
    return proc.wait()


_MONKEY = """
import ctypes, os, sys
ctypes.CDLL(None).prctl(15, b"chaos-monkey", 0, 0, 0)  # PR_SET_NAME: /proc/PID/comm
print("ready", flush=True)
for line in sys.stdin:  # long-lived: one pid per line, each gets a SIGTERM
    os.kill(int(line), 15)
    print("sent", flush=True)
"""


@contextlib.contextmanager
def chaos_monkey():
    """A long-lived process named chaos-monkey; `send(pid)` has it SIGTERM that pid."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_MONKEY), "--chaos"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"

        def send(pid: int) -> None:
            proc.stdin.write(f"{pid}\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "sent"

        send.pid = proc.pid
        yield send
    finally:
        proc.kill()
        proc.wait()


class _Seen:
    """Reports the scheduler got, and what each nanny passed `build`, by worker pid."""

    def __init__(self):
        self.reports: list[dict] = []
        self.clean: list[tuple] = []
        self.built: dict[int, dict] = {}


@pytest.fixture
def spy(monkeypatch):
    seen = _Seen()
    real = _reporting.build

    def build(what, max_bytes):
        seen.built[what.pid] = {"signals": list(what.signals or ()), "nanny_pid": what.nanny_pid}
        return real(what, max_bytes)

    monkeypatch.setattr(_reporting, "build", build)
    return seen


@contextlib.contextmanager
def _cluster(seen: _Seen, preload: bool = True):
    config = {
        "oomguard.worker.cgroup-limit": "false",
        "oomguard.worker.sample-interval": "100ms",
        "oomguard.worker.signal-senders": True,  # the default, said here
        "distributed.scheduler.allowed-failures": 100,
        "distributed.deploy.lost-worker-timeout": "1h",
    }
    if preload:
        config["distributed.nanny.preload"] = ["oomguard.worker_plugin"]
    with (
        dask.config.set(config),
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        _receive(cluster, seen)
        yield cluster, client


def _receive(cluster, seen: _Seen) -> None:
    """The scheduler hands the nannies' reports to `seen` (not to a scheduler plugin)."""
    cluster.scheduler.handlers[REPORT_HANDLER] = lambda report: seen.reports.append(
        _wire.to_wire(_wire.decode(report))
    )

    def clean_exit(worker, requested=False, pid=None):
        seen.clean.append((worker, requested, pid))
        return {"status": "ok"}

    cluster.scheduler.handlers[CLEAN_EXIT_HANDLER] = clean_exit


def _busy_worker(client) -> tuple[str, int, object]:
    client.wait_for_workers(1, timeout=60)
    addr = sorted(client.scheduler_info()["workers"])[0]
    pid = client.run(os.getpid, workers=[addr])[addr]
    fut = client.submit(sleepy_task, 30, workers=[addr], pure=False)
    wait_for(lambda: client.processing()[addr], "the task did not start", timeout=30)
    time.sleep(0.5)  # executing, and sampled
    return addr, pid, fut


def _report_of(seen: _Seen, pid: int) -> dict:
    wait_for(lambda: any(r["pid"] == pid for r in seen.reports), "no death report", 30)
    (report,) = [r for r in seen.reports if r["pid"] == pid]
    return report


def senders_of(seen: _Seen, report: dict) -> list[dict]:
    """The signals the report says its worker got (today: as passed to `build`)."""
    built = seen.built[report["pid"]]
    assert built["nanny_pid"] == os.getpid()  # LocalCluster's nannies live in this process
    return built["signals"]


def test_sigterm_from_a_named_process_names_it(spy):
    with _cluster(spy) as (cluster, client), chaos_monkey() as send:
        addr, pid, fut = _busy_worker(client)
        sent_at = time.time()
        send(pid)
        report = _report_of(spy, pid)
        (sig,) = senders_of(spy, report)
        assert (sig["signal"], sig["signo"], sig["code"]) == ("SIGTERM", 15, 0)
        assert (sig["pid"], sig["uid"]) == (send.pid, os.getuid())
        assert sig["name"] == "chaos-monkey"
        assert sig["cmdline"].endswith("--chaos") and "\n" not in sig["cmdline"]
        assert sent_at - 1 <= sig["time"] <= time.time()
        # The report names the killer from the signal's sender.
        assert report["killer"] == {
            "name": "process",
            "how": "signal sender",
            "confidence": "confirmed",
            "summary": f"SIGTERM from chaos-monkey (pid {send.pid}, uid {os.getuid()})",
            "memory": False,
        }
        assert report["evidence"]["sender_name"] == "chaos-monkey"
        assert report["evidence"]["sender_cmdline"].endswith("--chaos")
        # As before: exit -15 and faulthandler's SIGTERM dump, with the task's frame in it.
        assert report["cause"] == "sigterm" and report["exitcode"] == -15
        text = (report["crash"] or {}).get("text", "")
        assert "sleepy_task" in text and "most recent call first" in text
        fut.cancel()


def test_requested_restart_is_no_death_and_the_new_worker_records(spy):
    with _cluster(spy) as (cluster, client):
        client.wait_for_workers(1, timeout=60)
        client.restart()
        client.wait_for_workers(1, timeout=60)
        assert spy.reports == [] and spy.clean and all(c[1] for c in spy.clean)
        blocked = client.run(lambda: __import__("oomguard").worker_plugin._signals.blocked_here())
        threads = client.run(lambda: [t.name for t in __import__("threading").enumerate()])
        assert list(blocked.values()) == [True]
        assert "oomguard-signals" in list(threads.values())[0]
        # After the restart, a SIGTERM from this test process is recorded and still kills.
        addr, pid, fut = _busy_worker(client)
        os.kill(pid, signal.SIGTERM)
        report = _report_of(spy, pid)
        (sig,) = senders_of(spy, report)
        assert (sig["pid"], report["exitcode"]) == (os.getpid(), -15)
        fut.cancel()


def test_installed_at_runtime_records_nothing_and_the_worker_dies_as_before(spy):
    with _cluster(spy, preload=False) as (cluster, client):
        oomguard.install(client)
        wait_installed(client, n=1)
        _receive(cluster, spy)  # install() put the scheduler plugin's handlers there
        addr, pid, fut = _busy_worker(client)
        os.kill(pid, signal.SIGTERM)
        report = _report_of(spy, pid)
        assert senders_of(spy, report) == []
        assert report["exitcode"] == -15 and report["cause"] == "sigterm"
        assert any("signal senders: not recorded" in m for m in report["missing"])
        fut.cancel()


@pytest.mark.parametrize("start", ["subprocess", "spawnv_passfds", "posix_spawn"])
def test_a_task_child_gets_the_workers_own_mask(spy, tmp_path, start):
    """A process the task starts (subprocess, multiprocessing's spawn path, posix_spawn)
    does not inherit the blocked signals: a SIGTERM ends it as without oomguard, so
    `Popen.terminate()` and `Pool.terminate()` work (docs/configuration.md,
    oomguard.worker.signal-senders)."""
    with _cluster(spy) as (cluster, client):
        client.wait_for_workers(1, timeout=60)
        path = tmp_path / "child.pid"
        if start == "subprocess":
            fut = client.submit(sleep_in_subprocess, str(path), pure=False)
        else:
            fut = client.submit(sleep_in_spawned_process, str(path), start, pure=False)
        child = int(wait_for(lambda: path.exists() and path.read_text(), "no child", 60))
        status = open(f"/proc/{child}/status").read()
        blocked = int(status.split("SigBlk:")[1].split()[0], 16)
        assert not blocked >> 14 & 1  # SIGTERM (15) is not blocked in the child
        os.kill(child, signal.SIGTERM)
        assert fut.result(timeout=30) == -signal.SIGTERM
        assert spy.reports == []
