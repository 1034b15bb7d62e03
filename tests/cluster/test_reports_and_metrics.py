"""Malformed death reports are refused and counted; /metrics shows the truth (issues 4, 5)."""

from __future__ import annotations

import os
import pickle
import re
import signal
import time
import urllib.request

import dask
import distributed
import msgpack
import pytest
from distributed import Client, LocalCluster, rpc

import oomguard
from oomguard._death import build as _build
from oomguard._host import cgroup as _cgroup
from oomguard.worker_plugin import REPORT_HANDLER

pytestmark = pytest.mark.timeout(180)


def nap(seconds):
    time.sleep(seconds)
    return seconds


def boom(x):
    raise KeyError(x)


def _valid_report(**over):
    report = _build.example_report(**{"time": time.time()})
    report.update(over)
    return report


class Marker:
    """Unpickling this would create a file: proof the scheduler never loads pickles."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _metric(text, name, **labels):
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"^([a-z_]+)(\{([^}]*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = ",".join(sorted((m.group(3) or "").split(","))) if m.group(3) else ""
        if got == want:
            return float(m.group(4))
    raise AssertionError(f"{name}{{{want}}} not in /metrics")


@pytest.fixture
def cluster(tmp_path):
    with dask.config.set({"oomguard.worker.sample-interval": "100ms"}):
        with (
            LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
            ) as cl,
            Client(cl) as client,
        ):
            oomguard.install(client, store=str(tmp_path / "s.sqlite3"))
            yield cl, client


def test_malformed_reports_are_rejected_and_counted(cluster, tmp_path):
    cl, client = cluster
    marker = tmp_path / "unpickled"
    cases = {
        "wrong_type": msgpack.packb(_valid_report(pid="not a pid")),
        "missing_field": msgpack.packb({k: v for k, v in _valid_report().items() if k != "host"}),
        "too_large": msgpack.packb(
            _valid_report(crash={"signal": "SIGSEGV", "text": "x" * 10_000_000})
        ),
        "schema_version": msgpack.packb(_valid_report(schema=99)),
        "undecodable": b"\xc1\xff garbage \x00\x01",
        "pickled": pickle.dumps(Marker(str(marker))),
    }

    async def send_all():
        async with rpc(cl.scheduler_address) as s:
            out = {}
            for name, payload in cases.items():
                out[name] = await getattr(s, REPORT_HANDLER)(report=payload)
            out["not_bytes"] = await getattr(s, REPORT_HANDLER)(report={"cause": "sigkill"})
            return out

    answers = client.sync(send_all)
    # The handler only queues bytes; a thread validates them and counts each refusal.
    assert answers["not_bytes"] == {
        "status": "rejected",
        "reason": "wrong_type",
        "field": "report",
    }
    assert all(answers[name] == {"status": "queued"} for name in cases), answers

    def rejected():
        return client.run_on_scheduler(
            lambda dask_scheduler: dask_scheduler.plugins["oomguard"].metrics_snapshot()
        )["rejected"]

    deadline = time.monotonic() + 10
    while sum(rejected().values()) < 7 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rejected() == {
        "wrong_type": 2,
        "missing_field": 1,
        "too_large": 1,
        "schema_version": 1,
        "undecodable": 1,
        "pickled": 1,
    }
    assert not marker.exists(), "a pickled report was loaded"
    # The scheduler is fine and still computes.
    assert client.submit(nap, 0.01).result(timeout=30) == 0.01
    stats = client.run_on_scheduler(
        lambda dask_scheduler: dask_scheduler.plugins["oomguard"].metrics_snapshot()
    )
    assert stats["internal_errors"] == 0
    # A valid report for an unknown worker is accepted (recorded once the grace expires).
    ok = client.sync(_send_one, cl.scheduler_address, msgpack.packb(_valid_report()))
    assert ok == {"status": "queued"}


async def _send_one(address, payload):
    async with rpc(address) as s:
        return await getattr(s, REPORT_HANDLER)(report=payload)


def test_metrics_after_real_failures(cluster):
    cl, client = cluster
    addr = sorted(client.scheduler_info()["workers"])[0]
    pid = client.run(os.getpid, workers=[addr])[addr]
    with distributed.span("metrics"):
        running = client.submit(nap, 30, key="nap-0", workers=[addr], pure=False)
        bad = client.submit(boom, 1, key="boom-0", pure=False)
    time.sleep(1.0)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(KeyError):
        bad.result(timeout=30)
    failures = oomguard.Failures(client)
    deadline = time.monotonic() + 20
    while not failures.events(cause="sigkill") and time.monotonic() < deadline:
        time.sleep(0.1)
    running.cancel()
    client.sync(_send_one, cl.scheduler_address, msgpack.packb(_valid_report(schema=7)))
    port = cl.scheduler.http_server.port

    def scrape():
        url = f"http://127.0.0.1:{port}/metrics"
        return urllib.request.urlopen(url, timeout=10).read().decode()

    # Gauges are recounted from the store every 2 s.
    deadline = time.monotonic() + 15
    while _metric(scrape(), "oomguard_signatures") < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    text = scrape()
    assert _metric(text, "oomguard_signatures") == 2  # the SIGKILL and the KeyError
    assert _metric(text, "oomguard_signature_max_hosts") == 1
    assert _metric(text, "oomguard_worker_deaths_total", cause="sigkill", killer="unknown") == 1
    # cgroup-limit auto: where per-worker cgroups can be made, the dead worker had one.
    assert _metric(text, "oomguard_cgroup_workers") == int(_cgroup.can_create_child()[0])
    assert _metric(text, "oomguard_failures_total", kind="infra", cause="sigkill") == 1
    assert _metric(text, "oomguard_failures_total", kind="user", cause="exception") == 1
    assert _metric(text, "oomguard_failures_total", kind="infra", cause="oom_kill") == 0
    assert _metric(text, "oomguard_reports_rejected_total", reason="schema_version") == 1
    assert _metric(text, "oomguard_report_latency_seconds_count") == 1
    assert _metric(text, "oomguard_report_latency_seconds_sum") < 5
    assert _metric(text, "oomguard_pipeline_aborts_total") == 0
    assert _metric(text, "oomguard_internal_errors_total", where="transition") == 0
    # No task keys or signature ids as label values.
    assert "nap-0" not in text and "boom-0" not in text
