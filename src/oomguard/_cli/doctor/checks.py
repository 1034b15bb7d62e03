"""`oomguard doctor`: what evidence of worker deaths this host lets oomguard collect.

Each check reads a filesystem root (`root="/"`; a fixture tree in tests) and returns
`Check`s: `ok` (collected), `warn` (collected with a caveat, or something else may kill
workers), `no` (not collected). Every `warn` and `no` carries a fix. `diagnose()` runs all:
the cgroup checks (`cgroup`), then the kernel log (here), the userspace killers and the
evidence that names them (`killers`), and the crash directory (here). A check is a
`check.Check`; the wording of layouts and fixes is in `text`.

>>> check_kernel_log("/nonexistent").status
'no'
"""

from __future__ import annotations

import os
import platform
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ... import _private
from ..._host import cgroup as _cgroup
from ..._host.cgroup.files import join_root, read_text
from ..._host.cgroup.info import CgroupInfo
from ..._host.cgroup.kmsg import KMSG_RECORD
from .check import Check
from .text import FIX


@dataclass(frozen=True)
class Diagnosis:
    """Every check, the cgroup layout label (`_doctor_text.LAYOUTS`) and the versions."""

    layout: str
    cgroup_version: int | None
    cgroup_path: str | None
    checks: tuple[Check, ...]
    versions: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "layout": self.layout,
            "cgroup": {"version": self.cgroup_version, "path": self.cgroup_path},
            "checks": [c.to_dict() for c in self.checks],
            "versions": dict(self.versions),
        }


def check_kernel_log(root: str = "/") -> Check:
    """Can /dev/kmsg be opened and read (non-blocking)? It needs CAP_SYSLOG unless
    kernel.dmesg_restrict=0."""
    text, why = read_text(join_root(root, "proc/sys/kernel/dmesg_restrict"))
    restrict = "kernel.dmesg_restrict" + (f"={text.strip()}" if text else f": {why}")
    try:
        fd = os.open(join_root(root, "dev/kmsg"), os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return Check("kernel-log", "no", f"/dev/kmsg: not found ({restrict})", FIX["kmsg-missing"])
    except OSError as e:
        return Check(
            "kernel-log",
            "no",
            f"/dev/kmsg: cannot open: {e.strerror} ({restrict})",
            FIX["kmsg-denied"],
        )
    try:
        os.read(fd, KMSG_RECORD)  # a smaller buffer than one record gets EINVAL
    except (BlockingIOError, BrokenPipeError):
        pass  # EAGAIN: nothing logged yet; EPIPE: records overwritten: both readable
    except OSError as e:
        return Check(
            "kernel-log",
            "no",
            f"/dev/kmsg: cannot read: {e.strerror} ({restrict})",
            FIX["kmsg-denied"],
        )
    finally:
        os.close(fd)
    return Check(
        "kernel-log",
        "ok",
        f"/dev/kmsg is readable ({restrict}): the kernel's OOM-kill lines name the killed PID",
    )


def check_crash_dir(path: str, configured: bool) -> Check:
    """Can a file be made in the crash directory? Created (as the nanny would) if missing,
    then the probe file and the directories made for it are removed."""
    source = "oomguard.worker.crash-dir" if configured else "default crash dir"
    made, head = [], os.path.abspath(path)
    while head and not os.path.exists(head):
        made.append(head)
        head = os.path.dirname(head)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        why = _private.why_not_private(path)  # before the directories made here go
        fd, probe = tempfile.mkstemp(prefix=".oomguard-doctor-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return Check(
            "crash-dir",
            "no",
            f"{path} ({source}) is not writable: "
            f"{e.strerror or e}: reports lose faulthandler stacks and flight records",
            FIX["crash-dir"],
        )
    finally:
        for d in made:
            try:
                os.rmdir(d)
            except OSError:
                break
    if why is not None:
        return Check(
            "crash-dir",
            "no",
            f"{path} ({source}) is not private: {why}; nannies refuse it and use a "
            "private directory instead (each nanny its own, unless $XDG_RUNTIME_DIR is set)",
            FIX["crash-dir-private"],
        )
    return Check(
        "crash-dir",
        "ok",
        f"{path} ({source}) is writable: faulthandler stacks and "
        "flight records of dying workers go there",
    )


def versions() -> dict[str, str]:
    import dask
    import distributed

    from ... import __version__

    return {
        "oomguard": __version__,
        "dask": dask.__version__,
        "distributed": distributed.__version__,
        "python": platform.python_version(),
        "kernel": os.uname().release,
        "host": socket.gethostname(),
    }


def diagnose(
    root: str = "/",
    *,
    crash_dir: str | None = None,
    probe: Callable[[CgroupInfo], tuple[bool, str]] = _cgroup.can_create_child,
) -> Diagnosis:
    """Run every check. `crash_dir`: checked as if configured; None: the configured
    `oomguard.worker.crash-dir`, else the default one."""
    from ... import _config
    from ..._exceptions import ConfigError
    from ..._host.paths import default_crash_dir
    from .cgroup import check_cgroup, host_path
    from .history import check_history
    from .killers import check_killer_evidence, check_oom_killers

    info = _cgroup.detect(root=root)
    try:
        setting = _config.get_choice("worker.cgroup-limit", ("auto", "true", "false"))
    except ConfigError:
        setting = "auto"  # the nanny names the bad value at its start
    job = os.environ.get("SLURM_JOB_ID")
    layout, checks = check_cgroup(root, info=info, probe=probe, setting=setting, slurm_job_id=job)
    checks += [check_kernel_log(root), *check_oom_killers(root)]
    checks += check_killer_evidence(root, info.path)
    checks.append(check_history())
    try:
        configured = crash_dir or _config.get_optional_path("worker.crash-dir")
        checks.append(check_crash_dir(configured or default_crash_dir(), bool(configured)))
    except ConfigError as e:
        checks.append(Check("crash-dir", "no", str(e), FIX["crash-dir"]))
    path = host_path(info.path, root) if info.path else None
    return Diagnosis(layout, info.version, path, tuple(checks), versions())
