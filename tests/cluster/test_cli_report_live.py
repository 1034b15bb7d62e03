"""`oomguard report --scheduler`: a real scheduler with oomguard, a real task error, read back
by the command in a subprocess; and the one-line failures for schedulers it cannot use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import dask
import dask.utils
import distributed
import pytest
from distributed import Client, LocalCluster

import oomguard
from cluster_helpers import wait_installed
from oomguard import FailureEvent

pytestmark = pytest.mark.timeout(180)
MiB = 2**20


def bad_parse(x):
    raise ValueError(f"cannot parse block {x}")


def oomguard_report(
    *argv: str, timeout: float = 60, columns: int | None = None
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run(
        [sys.executable, "-m", "oomguard._cli", "report", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("oomguard report: "), (
        proc.stderr
    )
    return proc.stderr


def test_report_reads_a_running_scheduler(tmp_path):
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        address = cluster.scheduler_address

        # Before oomguard is installed the scheduler never answers the query: one line.
        err = _one_line_error(oomguard_report("--scheduler", address, "--timeout", "2"))
        assert "is oomguard loaded there" in err

        oomguard.install(client, store=str(tmp_path / "failures.sqlite3"))
        with distributed.span("etl"):
            fut = client.submit(bad_parse, 7, key="parse-7")
        with pytest.raises(ValueError, match="cannot parse block 7"):
            fut.result(timeout=60)
        failures = oomguard.Failures(client)
        deadline = time.monotonic() + 30
        while not failures.events(shard="parse-7") and time.monotonic() < deadline:
            time.sleep(0.1)

        proc = oomguard_report("--scheduler", address, "--json")
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        assert list(doc) == ["incidents", "deaths", "events", "signatures", "pipelines"]
        assert doc["deaths"] == []  # an exception is no worker death
        events = [FailureEvent.from_dict(row) for row in doc["events"]]
        assert events == failures.events()
        (user,) = [e for e in events if e.shard == "parse-7"]
        assert (user.kind, user.cause, user.pipeline) == ("user", "exception", "etl")
        assert "ValueError" in user.signature_title
        assert "cannot parse block 7" in user.evidence["exception"]
        assert user.signature_id in {s["id"] for s in doc["signatures"]}
        assert "etl" in {p["name"] for p in doc["pipelines"]}

        for columns in (80, 160):
            proc = oomguard_report("--scheduler", address, "--shard", "parse-7", columns=columns)
            assert proc.returncode == 0, proc.stderr
            assert "EVENTS: 1, oldest first, times" in proc.stdout
            assert "parse-7" in proc.stdout and " exception " in proc.stdout
            assert user.signature_id in proc.stdout and "etl" in proc.stdout
            assert "cannot parse block 7" in proc.stdout
            assert max(len(line) for line in proc.stdout.splitlines()) <= columns

        # A shard no event has is named, as an unknown --pipeline is (issue 41).
        proc = oomguard_report("--scheduler", address, "--shard", "parse-8")
        assert (proc.returncode, proc.stdout) == (3, ""), proc.stderr
        assert proc.stderr == (
            "oomguard report: --shard 'parse-8' names no shard in the history; known shards, "
            "most recent first: 'parse-7' (did you mean 'parse-7'?)\n"
        )

        proc = oomguard_report("--scheduler", address, "--shard", "('parse', 7")
        assert (proc.returncode, proc.stdout) == (2, "")
        assert proc.stderr.startswith("oomguard report: argument --shard: ")
        assert proc.stderr.count("\n") == 1


def test_report_fails_fast_with_nothing_listening():
    start = time.monotonic()
    err = _one_line_error(oomguard_report("--scheduler", "tcp://127.0.0.1:1"))
    assert time.monotonic() - start < 20  # default --timeout 5 s, plus interpreter start
    assert "cannot reach the scheduler at tcp://127.0.0.1:1" in err


def test_report_refuses_a_malformed_address():
    err = _one_line_error(oomguard_report("--scheduler", "nonsense::"))
    assert "nonsense::" in err


def hold_memory(nbytes: int) -> int:
    block = bytearray(b"x") * nbytes  # touched, so resident: RSS grows by nbytes
    time.sleep(1.5)  # the worker samples its RSS every 0.5 s
    return len(block)


def test_report_peaks_shows_what_the_workers_learned(tmp_path):
    """A task that ran alone under admission leaves its prefix's peak in the workers' ledger
    (a path only their config names); `--peaks` reads it back through the scheduler, once for
    the host's two workers, with an annotation no smaller than the peak."""
    import socket

    from oomguard._admission.peaks import suggested

    ledger = tmp_path / "memory-ledger.json"
    with (
        dask.config.set(
            {
                "distributed.nanny.preload": ["oomguard.worker_plugin"],
                "oomguard.worker.cgroup-limit": "false",
                "oomguard.worker.admission.ledger": str(ledger),
                "oomguard.worker.admission.min-estimate": "16 MiB",
            }
        ),
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        wait_installed(client, 2)
        address = cluster.scheduler_address
        assert client.submit(hold_memory, 100 * MiB, key="peaks-probe-1").result(60) == 100 * MiB
        learned = json.loads(ledger.read_text())["peaks"]["peaks-probe"]
        assert 95 * MiB <= learned <= 200 * MiB, learned

        proc = oomguard_report("--scheduler", address, "--peaks", "--json")
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        doc = json.loads(proc.stdout)
        assert list(doc) == ["peaks"]
        (row,) = [r for r in doc["peaks"] if r["prefix"] == "peaks-probe"]
        assert row == {
            "prefix": "peaks-probe",
            "peak": learned,
            "hosts": [socket.gethostname()],
            "suggested": suggested(learned),
        }
        size = row["suggested"].split('"')[1]
        assert learned <= dask.utils.parse_bytes(size) < learned + 16 * MiB

        proc = oomguard_report("--scheduler", address, "--peaks", columns=80)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        lines = proc.stdout.splitlines()
        assert lines[0] == (
            f"PEAKS: {len(doc['peaks'])}, largest first, from the memory ledgers of 1 worker host"
        )
        (line,) = [ln for ln in lines if ln.startswith("peaks-probe ")]
        assert oomguard._units.format_bytes(learned) in line
        assert row["suggested"] in proc.stdout
        assert max(map(len, lines)) <= 80

        # The history sections stay the default: no peaks unless asked for.
        oomguard.install(client, store=str(tmp_path / "failures.sqlite3"))
        proc = oomguard_report("--scheduler", address, "--json")
        assert proc.returncode == 0, proc.stderr
        sections = ["incidents", "deaths", "events", "signatures", "pipelines"]
        assert list(json.loads(proc.stdout)) == sections
