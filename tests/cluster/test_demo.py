"""The README's main command: `oomguard demo` behaves as designed (issue 5)."""

from __future__ import annotations

import os
import pathlib
import shlex
import shutil
import subprocess
import sys

import pytest

from _cli_run import suggested_commands
from oomguard._host import cgroup as _cgroup

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """One `oomguard demo --html` run (its process, its HTML page, its environment), with
    HOME and XDG_STATE_HOME in a directory of its own."""
    tmp = tmp_path_factory.mktemp("demo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    env.update(PYTHONUNBUFFERED="1", HOME=str(tmp), XDG_STATE_HOME=str(tmp / "state"))
    html = tmp / "demo-report.html"
    proc = subprocess.run(
        [sys.executable, "-m", "oomguard._cli", "demo", "--html", str(html)],
        capture_output=True,
        text=True,
        timeout=170,
        env=env,
    )
    return proc, html, env


def test_demo_shows_every_failure_and_the_abort(demo, artifacts_dir):
    proc, html, _ = demo
    shutil.copyfile(html, artifacts_dir / "demo-report.html")
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


def test_the_commands_the_demo_suggests_work_after_it_ended(demo):
    # Issue 41: the demo's suggestion, `oomguard report --shard "('demo', 7)"`, exited 2
    # ("give --scheduler ADDRESS or --store PATH") once the demo's cluster was gone.
    proc, _, env = demo
    assert proc.returncode == 0, proc.stderr[-3000:]
    commands = suggested_commands(proc.stdout)
    assert "oomguard report --shard \"('demo', 7)\"" in commands  # the abort message's
    store = str(pathlib.Path(env["XDG_STATE_HOME"]) / "oomguard" / "oomguard-demo.sqlite3")
    assert f"oomguard report --store {store} --shard \"('demo', 7)\"" in commands  # the demo's
    script = pathlib.Path(sys.executable).with_name("oomguard")
    for command in commands:
        argv = shlex.split(command)
        done = subprocess.run(
            [str(script), *argv[1:]], capture_output=True, text=True, timeout=120, env=env
        )
        assert done.returncode == 0, (command, done.stderr)
        assert "EVENTS: 2, oldest first" in done.stdout, (command, done.stdout)
        assert "('demo', 7)" in done.stdout and "oom" in done.stdout, (command, done.stdout)
