"""Ask SLURM about one job (`query`): ``sacct`` where accounting runs, ``scontrol show job``,
and the tail of the job's stderr, each bounded in time and size. Blocking: call it off the
event loop (`asyncio.to_thread`). The parsing is `slurm`'s; this only runs the commands.

A command that is missing, fails, or exceeds its time gives nothing, and the others are
still asked; `query` never raises for what SLURM says or does not say.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import threading
import time
from typing import Any

from .._death import slurm

TIMEOUT = 5.0  # seconds per command; slurmctld answers in milliseconds when it is up
OUTPUT_MAX = 64 * 1024  # bytes read from a command
_SACCT_FIELDS = "JobID,State,Reason,ExitCode,Timelimit,ReqMem"
_JOB_ID = re.compile(r"\d{1,12}(_\d{1,12})?")


def valid_job_id(v: Any) -> bool:
    """A SLURM job id as SLURM_JOB_ID holds it (digits; an array task's ``N_M``)."""
    return isinstance(v, str) and _JOB_ID.fullmatch(v) is not None


def _run(argv: list[str], timeout: float, cap: int = OUTPUT_MAX) -> str | None:
    """The command's stdout (at most `cap` bytes), or None when it is missing, fails or
    runs past `timeout` (then it is killed)."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
        )
    except OSError:
        return None
    timer = threading.Timer(timeout, proc.kill)  # also ends a read or wait past it
    timer.start()
    try:
        out = proc.stdout.read(cap + 1) if proc.stdout is not None else b""
        if len(out) <= cap:
            proc.wait()  # at its end of output: let it exit (a kill now would race it)
    finally:
        timer.cancel()
        if proc.poll() is None:  # past its cap: the rest is never read
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    if proc.returncode != 0 or len(out) > cap:
        return None
    return out.decode("utf-8", "replace")


def _tail(path: str, cap: int = slurm.OUTPUT_TAIL, timeout: float = TIMEOUT) -> str | None:
    """The last `cap` bytes of the job's stderr file, or None. SLURM names the path, the
    job's user makes the file: it is opened without blocking and without following a
    symlink, read only when it is a regular file (a FIFO there would block a thread of the
    event loop's executor for good, a device never ends), and read on a thread of its own
    for `timeout` seconds at most (a hung network filesystem keeps that thread, not the
    caller)."""
    out: list[str | None] = []
    reader = threading.Thread(
        target=lambda: out.append(_read_tail(path, cap)), name="oomguard-slurm-stderr", daemon=True
    )
    reader.start()
    reader.join(timeout)
    return out[0] if out else None


def _read_tail(path: str, cap: int) -> str | None:
    try:
        fd = os.open(
            path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
        )
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        start = max(st.st_size - cap, 0)
        return os.pread(fd, cap, start).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def query(
    job_id: str, step_id: str | None = None, *, timeout: float = TIMEOUT, accounting: bool = True
) -> dict[str, Any]:
    """SLURM's facts of job `job_id` as flat evidence (`slurm.job_facts`), with
    ``slurm_query_seconds``. `accounting` False skips ``sacct`` (no slurmdbd)."""
    if not valid_job_id(job_id):
        return {}
    t0 = time.monotonic()
    acct = None
    if accounting:
        text = _run(
            ["sacct", "-j", job_id, "-X", "-n", "-P", "-o", _SACCT_FIELDS], timeout=timeout
        )
        acct = slurm.parse_sacct(text or "", job_id)
    shown = slurm.parse_scontrol(_run(["scontrol", "show", "job", job_id], timeout) or "")
    if shown.get("job_id") not in (None, job_id):
        shown = {}
    out = None
    path = slurm.stderr_path(shown)
    if path is not None:
        out = slurm.parse_output(_tail(path) or "", job_id)
    facts = slurm.job_facts(job_id, step_id, sacct=acct, scontrol=shown, output=out)
    facts["slurm_query_seconds"] = round(time.monotonic() - t0, 3)
    return facts
