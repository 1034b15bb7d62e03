"""The README's main command: `oomguard demo` behaves as designed (issue 5)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from oomguard._host import cgroup as _cgroup

pytestmark = pytest.mark.timeout(180)


def test_demo_shows_every_failure_and_the_abort(tmp_path, artifacts_dir):
    html = artifacts_dir / "demo-report.html"
    proc = subprocess.run(
        [sys.executable, "-m", "oomguard._cli", "demo", "--html", str(html)],
        capture_output=True,
        text=True,
        timeout=170,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    out = proc.stdout
    assert proc.returncode == 0, (out, proc.stderr[-3000:])
    memory_cause = "oom_kill" if _cgroup.can_create_child()[0] else "memory_terminate"
    assert f"infra  {memory_cause}" in out
    assert "infra  native_crash" in out
    assert "user   exception" in out
    assert "SIGSEGV in oomguard._cli.demo_run.parse_shard" in out
    assert f"{memory_cause} in oomguard._cli.demo_run.load_shard" in out
    assert "Pipeline 'demo': aborted" in out
    assert "oomguard aborted pipeline 'demo' because shard ('demo', 7) failed 2 times" in out
    if memory_cause == "oom_kill":
        assert "kernel oom_kill counted" in out
    # Deduplicated: the crasher's two deaths are one signature on two workers.
    sig_line = next(
        line for line in out.splitlines() if "oomguard._cli.demo_run.load_shard" in line
    )
    assert sig_line.split()[1:3] == ["2", "2"], sig_line
    page = html.read_text()
    assert "<svg" in page and "oomguard demo report" in page
    assert "Last sampled stack of shard (&#x27;demo&#x27;, 7)" in page  # escaped
