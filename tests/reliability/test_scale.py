"""The scale benchmark at a tiny size: every death decided once (issue 14, build 3).

Runs ``benchmarks/bench_scale.py --quick`` shrunk to 40 simulated workers on 5 hosts, 2,000
tasks in 10 pipelines and 10 deaths: a real `dask scheduler` process with oomguard preloaded,
the workers speaking Dask's protocol over TCP, death reports through the plugin's RPC. It
asserts what the benchmark checks, never its timings: one stored event per death, with the
death's cause, shard, host and pipeline (the span's name); the OOM kills under one signature
with their hosts; nothing aborted, refused or lost; every pipeline finished. About 30 s.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_scale.py"
DEATHS = 10


def test_scale_run_decides_each_death_once(tmp_path, record_figures):
    out = tmp_path / "scale.json"
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--quick",
            "--workers",
            "40",
            "--hosts",
            "5",
            "--tasks",
            "2000",
            "--pipelines",
            "10",
            "--deaths",
            str(DEATHS),
            "--task-ms",
            "20",
            "80",
            "--idle",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rounds = json.loads(out.read_text())["rounds"]
    assert [r["arm"] for r in rounds] == ["without", "with"]
    for r in rounds:
        assert r["deaths"] == DEATHS
        assert r["erred"] == 0  # no pipeline aborted or lost: the workload is the same
    check = rounds[1]["check"]
    assert check["problems"] == []
    assert check["events"] == check["deaths"] == check["decided"] == DEATHS
    # Deaths 0 and 9 are the OOM kills (one in five, spread over the hosts); the benchmark
    # checked that their signature's hosts are exactly theirs (no problem reported).
    assert check["causes"] == {"oom_kill": 2, "sigkill": DEATHS - 2}
    assert check["oom_signature"]["count"] == 2
    assert check["reports"] == {"queued": DEATHS}
    assert (check["aborts"], check["overflow"], check["internal_errors"]) == (0, 0, 0)
    assert check["refused"] == {}
    record_figures(
        "scale",
        seconds=round(took, 1),
        events=check["events"],
        deaths=check["deaths"],
        causes=check["causes"],
    )
