"""`oomguard doctor`'s cgroup checks: which memory cgroup, how it is mounted, whether each
worker can have a group of its own, and which of the kernel's interface files are there.

Every check reads below `root` (a fixture tree in tests); paths are shown as the host sees
them. The probe for per-worker groups is `_cgroup.can_create_child`, which really creates and
removes a throwaway child group.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..._host import cgroup as _cgroup
from ..._host.cgroup.files import join_root, read_text
from ..._host.cgroup.info import CgroupInfo, unescape_mount
from .check import Check, layout_label
from .text import FIX, SHARED


def host_path(path: str, root: str) -> str:
    """A path below `root` as the host sees it.

    >>> host_path("/tmp/tree/sys/fs/cgroup", "/tmp/tree"), host_path("/sys/fs/cgroup", "/")
    ('/sys/fs/cgroup', '/sys/fs/cgroup')
    """
    rel = os.path.relpath(path, root)
    return "/" if rel == "." else "/" + rel


def _mount_options(info: CgroupInfo, root: str) -> tuple[str, list[str]]:
    """(mount point, per-mount options) of the cgroup mount holding the group; ("", []).

    mountinfo's sixth field holds the per-mount options ("ro" for a read-only bind, as
    container runtimes mount cgroupfs); /proc/mounts, the fallback, merges both kinds. The
    last mount on a point wins: it hides the earlier ones.
    """
    found: tuple[str, list[str]] = ("", [])
    text, _ = read_text(join_root(root, "proc/self/mountinfo"))
    if text is not None:
        for line in text.splitlines():
            f = line.partition(" - ")[0].split()
            if len(f) >= 6 and join_root(root, unescape_mount(f[4])) == info.memory_root:
                found = unescape_mount(f[4]), f[5].split(",")
        return found
    text, _ = read_text(join_root(root, "proc/mounts"))
    for line in (text or "").splitlines():
        f = line.split()
        if len(f) >= 4 and join_root(root, unescape_mount(f[1])) == info.memory_root:
            found = unescape_mount(f[1]), f[3].split(",")
    return found


def check_cgroup(
    root: str = "/",
    *,
    info: CgroupInfo | None = None,
    probe: Callable[[CgroupInfo], tuple[bool, str]] = _cgroup.can_create_child,
    setting: str = "auto",
    slurm_job_id: str | None = None,
) -> tuple[str, list[Check]]:
    """(layout label, checks) for the memory cgroup of this process.

    `probe` really creates and removes a child group (`_cgroup.can_create_child`); it is not
    called when the cgroup mount is read-only, where it could only fail, nor where a nanny
    would make no per-worker group (`setting`, `oomguard.worker.cgroup-limit`, false, or
    `auto` in SLURM's group of job `slurm_job_id`: `_cgroup.per_worker_choice`).
    """
    info = info or _cgroup.detect(root=root)
    v = info.version
    if info.path is None:
        return "none", [Check("cgroup", "no", info.reason, FIX["cgroup"])]
    group = host_path(info.path, root)
    checks = [Check("cgroup", "ok", f"cgroup v{v}, {'memory ' if v == 1 else ''}group {group}")]
    if v == 2:
        # memory.current exists in every memory-enabled group but the real root (whose
        # cgroup.controllers detect() has read).
        why = info.reason
        current = os.path.join(info.path, "memory.current")
        if not why and info.path != info.memory_root and not os.path.exists(current):
            why = (
                f"no memory.current in {group}: its parent does not enable the memory "
                "controller for it"
            )
        if why:
            return "none", [*checks, Check("cgroup.memory", "no", why, FIX["memory"])]
        checks.append(Check("cgroup.memory", "ok", f"memory controller enabled in {group}"))
    point, opts = _mount_options(info, root)
    read_only = "ro" in opts
    choice, off = _cgroup.per_worker_choice(setting, slurm_job_id, group)
    if choice == "off":
        # Nothing to make: a read-only mount is no finding.
        mode = "read-only" if read_only else "read-write"
        checks.append(
            Check(
                "cgroup.mount",
                "ok",
                f"{point} is mounted {mode}" if point else "its mount was not found",
            )
        )
        per = f"no per-worker memory groups ({off}); {SHARED}"
        checks.append(Check("cgroup.per-worker", "ok", per))
        checks += _v2_checks(info.path, group, False) if v == 2 else _v1_checks(info.path)
        return layout_label(v, True, False), checks
    if read_only:
        checks.append(Check("cgroup.mount", "warn", f"{point} is mounted read-only", FIX["mount"]))
        per_worker, why = False, f"the cgroup filesystem at {point} is mounted read-only"
    else:
        mounted = f"{point} is mounted read-write" if point else "its mount was not found"
        checks.append(Check("cgroup.mount", "ok", mounted))
        per_worker, why = probe(info)
    if per_worker:
        checks.append(
            Check(
                "cgroup.per-worker",
                "ok",
                "a probe child group was created and removed: each worker gets "
                "its own memory group, limit and OOM counter",
            )
        )
    else:
        checks.append(
            Check(
                "cgroup.per-worker",
                "warn",
                f"no per-worker memory groups ({why}); {SHARED}",
                FIX[f"per-worker-v{v}"],
            )
        )
    checks += _v2_checks(info.path, group, per_worker) if v == 2 else _v1_checks(info.path)
    return layout_label(v, True, per_worker), checks


def _v1_checks(path: str) -> list[Check]:
    if os.path.exists(os.path.join(path, "memory.max_usage_in_bytes")):
        return [Check("cgroup.peak", "ok", "memory.max_usage_in_bytes: the kernel's peak")]
    return [Check("cgroup.peak", "no", "memory.max_usage_in_bytes: not found", FIX["peak"])]


def _v2_checks(path: str, group: str, per_worker: bool) -> list[Check]:
    out = []
    text, _ = read_text(os.path.join(path, "cgroup.procs"))
    n = len((text or "").split())
    procs = f"{n} process" + ("es" if n != 1 else "")
    # The no-internal-processes rule spares the real root, which has no memory.max.
    if not n or not os.path.exists(os.path.join(path, "memory.max")):
        out.append(Check("cgroup.processes", "ok", f"{group} may have memory-enabled children"))
    elif per_worker:
        out.append(
            Check(
                "cgroup.processes",
                "ok",
                f"{group} holds {procs}; "
                "per-worker groups go beside it, under its delegated parent",
            )
        )
    else:
        out.append(
            Check(
                "cgroup.processes",
                "warn",
                f"{group} holds {procs}: "
                "cgroup v2's no-internal-processes rule forbids memory-enabled "
                "children",
                FIX["processes"],
            )
        )
    text, why = read_text(os.path.join(path, "memory.oom.group"))
    if text is not None and text.strip() == "1":
        out.append(
            Check(
                "cgroup.oom-group",
                "warn",
                f"memory.oom.group is 1 in {group}: an "
                "OOM kill at its limit kills the nanny with its workers: no death "
                "report, only worker_lost",
                FIX["oom-group"],
            )
        )
    else:
        state = f"is {text.strip()}" if text is not None else f"{why} ({_since(path, '4.19')})"
        out.append(
            Check(
                "cgroup.oom-group",
                "ok",
                f"memory.oom.group {state}: an OOM kill takes one process",
            )
        )
    if os.path.exists(os.path.join(path, "memory.peak")):
        out.append(Check("cgroup.peak", "ok", "memory.peak: the kernel's peak"))
    else:
        out.append(
            Check(
                "cgroup.peak",
                "no",
                f"memory.peak: not found ({_since(path, '5.19')})",
                FIX["peak"],
            )
        )
    return out


def _since(path: str, linux: str) -> str:
    # Why an interface file is missing: an older kernel, or the real root, which has none.
    real_root = not os.path.exists(os.path.join(path, "memory.max"))
    return "the root group has none" if real_root else f"Linux < {linux}"
