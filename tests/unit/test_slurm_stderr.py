"""The tail of a SLURM job's stderr, read by the scheduler for a lost worker (issue 39):
SLURM names the path (`StdErr=`) and the job's user makes the file, so it is read only when
it is a regular file, never through a symlink, never waiting on a FIFO or a device, and for
a bounded size and time. Before, a plain `open` of a FIFO there blocked a thread of the
scheduler's default executor for good."""

from __future__ import annotations

import os
import stat
import threading
import time

from oomguard._death import slurm
from oomguard._lookups import slurm_job
from oomguard._lookups.slurm_job import _tail, query


def test_a_fifo_a_device_and_a_symlink_are_not_read(tmp_path):
    fifo = tmp_path / "job.err"
    os.mkfifo(fifo)
    real = tmp_path / "real.err"
    real.write_text("slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2026-01-01T00:00:00 ***\n")
    link = tmp_path / "link.err"
    link.symlink_to(real)
    t0 = time.monotonic()
    assert _tail(str(fifo)) is None  # a plain open() never returned here
    assert _tail("/dev/zero") is None  # a device: never read, however endless
    assert _tail(str(link)) is None  # SLURM's path is the file, not a link to another one
    assert _tail(str(tmp_path / "missing.err")) is None
    assert time.monotonic() - t0 < 5
    assert "CANCELLED" in _tail(str(real))


def test_only_the_tail_is_read(tmp_path):
    big = tmp_path / "big.err"
    with open(big, "wb") as f:
        f.truncate(4 * 2**30)  # a sparse 4 GiB file: only its last bytes are read
        f.seek(-6, os.SEEK_END)
        f.write(b"\nlast\n")
    text = _tail(str(big))
    assert len(text) == slurm.OUTPUT_TAIL and text.endswith("\nlast\n")


def test_a_read_that_hangs_gives_up_at_its_time(monkeypatch, tmp_path):
    """A hung network filesystem keeps the reading thread, never the caller."""
    release = threading.Event()
    monkeypatch.setattr(slurm_job, "_read_tail", lambda path, cap: release.wait(30) and "late")
    t0 = time.monotonic()
    assert _tail(str(tmp_path / "x"), timeout=0.3) is None
    assert time.monotonic() - t0 < 5
    release.set()


def test_a_job_whose_stderr_is_a_fifo_is_still_described(tmp_path, monkeypatch):
    """`query` end to end with SLURM's `scontrol` answering for a job whose StdErr= is a
    FIFO (a stand-in script on PATH prints what slurmctld 22.05 prints)."""
    fifo = tmp_path / "worker-7.err"
    os.mkfifo(fifo)
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.parent.mkdir()
    scontrol.write_text(
        "#!/bin/sh\n"
        "echo 'JobId=7 JobName=dask-worker JobState=TIMEOUT Reason=TimeLimit "
        f"ExitCode=0:15 TimeLimit=00:01:00 StdErr={fifo}'\n"
    )
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{scontrol.parent}{os.pathsep}{os.environ['PATH']}")
    done: list[dict] = []
    reader = threading.Thread(
        target=lambda: done.append(query("7", accounting=False)), daemon=True
    )
    reader.start()
    reader.join(30)
    assert done, "query blocked on the FIFO"
    assert done[0]["slurm_state"] == "TIMEOUT"
