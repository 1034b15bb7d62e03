"""A real earlyoom kills a real worker, and the death names it (issue 26).

Debian's earlyoom (1.7; `./dev test` installs it when root with apt-get) is started by the
test with `-M` thresholds just below the host's MemAvailable of the moment and `-s 100,100`
(no swap here: memory alone decides). The victim is certain: the task raises its own
`oom_score_adj` to 1000 before earlyoom starts. The task then allocates (and touches) a few
hundred MiB, until MemAvailable is past the threshold.

earlyoom is held (SIGSTOP) while the task allocates and let go (SIGCONT) once the nanny has
read the host's memory low, as it would for a leak that grows over seconds; the moment its
output says "sending SIG... to process" and the worker has that signal, it is stopped again
(and killed after): it can never pick a second process. Its kill line must name the worker's
pid.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.request

import dask
import pytest
from distributed import Client, LocalCluster
from prometheus_client.parser import text_string_to_metric_families

import oomguard
from capabilities import require
from cluster_helpers import wait_for

pytestmark = pytest.mark.timeout(240)

MiB = 2**20
MARGIN = 256 * MiB  # the SIGTERM threshold sits this far below MemAvailable at the start
_KILL_LINE = re.compile(r"sending (SIG\w+) to process (\d+)")


def mem_available() -> int:
    with open("/proc/meminfo", "rb") as f:
        for line in f:
            if line.startswith(b"MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable in /proc/meminfo")


def victim_task(marks: str, target: int, cap: int) -> int:
    """Become earlyoom's victim, wait for the go, allocate until MemAvailable <= target."""
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
    open(os.path.join(marks, "adj"), "w").close()
    while not os.path.exists(os.path.join(marks, "go")):
        time.sleep(0.02)
    held = []
    while mem_available() > target and len(held) * 16 * MiB < cap:
        held.append(b"\x01" * (16 * MiB))  # filled, so every page is touched
    open(os.path.join(marks, "low"), "w").close()
    time.sleep(120)
    return len(held)


def _wait_signalled(pid: int, signo: int, timeout: float = 3.0) -> None:
    """Until `pid` has `signo` pending, or is a zombie or gone (or `timeout` passed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            return
        if status.get("State", "").split()[:1] in (["Z"], ["X"]):
            return
        pending = int(status.get("ShdPnd", "0"), 16) | int(status.get("SigPnd", "0"), 16)
        if pending & (1 << (signo - 1)):
            return
        time.sleep(0.001)


class _Earlyoom:
    """A real earlyoom, its merged output read line by line on a thread; stopped (SIGSTOP)
    the moment it says it sends a signal."""

    def __init__(self, term: int, kill: int) -> None:
        args = ["earlyoom", "-M", f"{term // 1024},{kill // 1024}", "-s", "100,100", "-r", "0"]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        self.lines: list[str] = []
        self.kill: tuple[str, int] | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            m = _KILL_LINE.search(line)
            if m and self.kill is None:
                # earlyoom prints this line, then sends the signal, then waits for its
                # victim to exit (kill.c kill_wait) before it would look for another one.
                _wait_signalled(int(m.group(2)), getattr(signal, m.group(1)))
                self.proc.send_signal(signal.SIGSTOP)  # never a second victim
                self.kill = (m.group(1), int(m.group(2)))
            self.lines.append(line.rstrip())

    def output(self) -> str:
        return "\n".join(self.lines)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._thread.join(10)


@pytest.fixture
def cluster(tmp_path):
    require(shutil.which("earlyoom"), "earlyoom is not installed (./dev test installs it as root)")
    require(os.geteuid() == 0, "earlyoom needs root to kill another user's worker")
    with (
        dask.config.set(
            {
                "oomguard.worker.sample-interval": "100ms",
                # Preloaded: the nanny starts the worker with the signals it records the
                # senders of blocked (oomguard installed at runtime cannot).
                "distributed.nanny.preload": ["oomguard.worker_plugin"],
                "oomguard.worker.signal-senders": True,  # the default, said here
                "distributed.worker.memory.terminate": False,
                "distributed.deploy.lost-worker-timeout": "1h",
            }
        ),
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            memory_limit="3GiB",
            dashboard_address=":0",
        ) as cl,
        Client(cl) as client,
    ):
        oomguard.install(client, store=str(tmp_path / "s.sqlite3"))
        yield client


def _killed_by_earlyoom(client, tmp_path, *, escalate: bool):
    """Run the victim under a real earlyoom; return (the worker's FailureEvent, earlyoom's
    pid, its SIGTERM threshold, the signal and pid of its kill line)."""
    addr = next(iter(client.scheduler_info()["workers"]))
    pid = client.run(os.getpid)[addr]
    marks = tmp_path / "marks"
    marks.mkdir()
    start = mem_available()
    term = start - MARGIN
    # SIGKILL case: both thresholds at once (earlyoom checks the SIGKILL one first);
    # SIGTERM case: the SIGKILL one far below, never reached.
    kill = term if escalate else max(start // 4, term - 4 * 2**30)
    assert kill > 0, f"MemAvailable {start} too small for this test"
    future = client.submit(victim_task, str(marks), term - 64 * MiB, 1536 * MiB, pure=False)
    wait_for(lambda: (marks / "adj").exists(), "the task did not raise its oom_score_adj")
    eo = _Earlyoom(term, kill)
    try:
        wait_for(lambda: "sending SIGTERM when mem" in eo.output(), eo.output, timeout=20)
        eo.proc.send_signal(signal.SIGSTOP)
        (marks / "go").touch()
        wait_for(lambda: (marks / "low").exists(), "the task did not allocate", timeout=60)
        assert mem_available() <= term, "MemAvailable rose again past the threshold"
        time.sleep(0.5)  # several nanny readings (every 100 ms) with the host memory low
        eo.proc.send_signal(signal.SIGCONT)
        wait_for(lambda: eo.kill, lambda: f"earlyoom killed nothing:\n{eo.output()}", 30)
        sent, victim = eo.kill
        assert victim == pid, f"earlyoom picked {victim}, not the worker {pid}:\n{eo.output()}"
        failures = oomguard.Failures(client)
        cause = "sigkill" if escalate else "sigterm"
        events = wait_for(
            lambda: failures.events(cause=cause), lambda: _no_event(client, cause, eo), 60
        )
        return events[0], eo.proc.pid, term, kill, sent
    finally:
        eo.close()
        future.cancel()


def _no_event(client, cause: str, eo: _Earlyoom) -> str:
    events = {t: [m for _, m in ms][-3:] for t, ms in client.get_events().items()}
    return f"no {cause} event; earlyoom:\n{eo.output()}\nscheduler events: {events}"


def _deaths_metric(client, **labels: str) -> float:
    """oomguard_worker_deaths_total{labels} on the scheduler's /metrics."""
    port = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.http_server.port)
    url = f"http://127.0.0.1:{port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "oomguard_worker_deaths_total" and sample.labels == labels:
                return sample.value
    raise AssertionError(f"no oomguard_worker_deaths_total{labels} on {url}")


def test_earlyoom_sigterm_is_named_from_the_signal_sender(cluster, tmp_path):
    event, eo_pid, term, _, sent = _killed_by_earlyoom(cluster, tmp_path, escalate=False)
    assert sent == "SIGTERM"
    assert event.kind == "infra" and event.evidence["signal"] == "SIGTERM"
    assert event.evidence["exitcode"] == -signal.SIGTERM
    # Named from the signal's sender, with the host's memory at the nanny's last reading:
    assert event.killer == "earlyoom"
    assert event.killer_how == "signal sender"
    assert event.killer_confidence == "confirmed"
    assert event.evidence["sender_pid"] == eo_pid
    assert event.evidence["memavailable_bytes"] <= term  # the nanny's last reading
    assert event.killer_summary.startswith(f"SIGTERM from earlyoom (pid {eo_pid}, uid 0) at ")
    assert "MemAvailable" in event.killer_summary
    # The series the chart's OomguardUserspaceOomKills alert counts (tests/monitoring).
    assert _deaths_metric(cluster, cause="sigterm", killer="earlyoom") == 1


def test_earlyoom_sigkill_is_likely_earlyoom_with_the_numbers(cluster, tmp_path):
    event, eo_pid, term, kill, sent = _killed_by_earlyoom(cluster, tmp_path, escalate=True)
    assert sent == "SIGKILL"
    assert event.kind == "infra" and event.evidence["signal"] == "SIGKILL"
    assert event.evidence["exitcode"] == -signal.SIGKILL
    assert event.evidence.get("oom_kill_delta") in (0, None)  # not the kernel
    # Named by the lead's attribution (issue 26): the victim never sees a SIGKILL's sender.
    assert event.killer == "earlyoom"
    assert event.killer_confidence == "likely"
    available = event.evidence["memavailable_bytes"]
    assert 0 < available <= term  # the nanny's last reading, memory low
    assert event.evidence["killer_threshold_signal"] == "SIGKILL"
    threshold = event.evidence["killer_threshold_bytes"]
    assert abs(threshold - term) <= 4096  # earlyoom's own, from its -M
    assert event.evidence["killer_pid"] == eo_pid
    assert "SIGKILL threshold" in event.killer_summary, event.killer_summary
    assert "MemAvailable" in event.killer_summary
