"""Which memory cgroup a process is in: cgroup v1 or v2, the mount that holds it and its
directory on disk, from /proc/<pid>/cgroup and the mount table. Detected once per process."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass

from .files import join_root, read_text


@dataclass(frozen=True)
class CgroupInfo:
    """Where this process's memory cgroup is. `reason` says why, when it is not available.

    >>> CgroupInfo(None, None, None, "no memory controller").version is None
    True
    """

    version: int | None
    memory_root: str | None
    path: str | None
    reason: str = ""


_OCTAL = re.compile(r"\\([0-7]{3})")


def unescape_mount(field: str) -> str:
    """A mountinfo or /proc/mounts field, its escapes undone."""
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def _mounts(proc: str) -> list[tuple[str, str, str, list[str]]]:
    """(mount root, mount point, fstype, super options) from mountinfo, else /proc/mounts."""
    out = []
    text, _ = read_text(os.path.join(proc, "mountinfo"))
    if text is not None:
        for line in text.splitlines():
            left, sep, right = line.partition(" - ")
            lf, rf = left.split(), right.split()
            if sep and len(lf) >= 5 and len(rf) >= 3:
                out.append((unescape_mount(lf[3]), unescape_mount(lf[4]), rf[0], rf[2].split(",")))
        return out
    # /proc/mounts has no mount-root column: assume the whole hierarchy is mounted.
    text, _ = read_text(os.path.join(os.path.dirname(proc), "mounts"))
    for line in (text or "").splitlines():
        f = line.split()
        if len(f) >= 4:
            out.append(("/", unescape_mount(f[1]), f[2], f[3].split(",")))
    return out


def _relative(cg_path: str, mount_root: str) -> str | None:
    """The cgroup path below a mount whose root is `mount_root`, or None if outside it."""
    if mount_root == "/":
        return cg_path
    if cg_path == mount_root or cg_path.startswith(mount_root.rstrip("/") + "/"):
        return cg_path[len(mount_root.rstrip("/")) :] or "/"
    return None


def detect(pid: int | str = "self", root: str = "/") -> CgroupInfo:
    """Find the memory cgroup of `pid`: version, mount point and directory on disk.

    A v1 line naming `memory` in /proc/<pid>/cgroup wins over the `0::` line (hybrid
    systems have both). The mount point comes from mountinfo, never assumed. Under a cgroup
    namespace the path is `/` and the mount root is `/`, so the group is the mount point.

    >>> detect(root="/nonexistent").reason
    '/proc/self/cgroup: not found'
    """
    proc = join_root(root, f"proc/{pid}")
    text, why = read_text(os.path.join(proc, "cgroup"))
    if text is None:
        return CgroupInfo(None, None, None, f"/proc/{pid}/cgroup: {why}")
    v1_path = v2_path = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "memory" in parts[1].split(","):
            v1_path = parts[2]
        elif parts[0] == "0" and parts[1] == "":
            v2_path = parts[2]
    if v1_path is not None:
        version, cg_path = 1, v1_path
        want = lambda fstype, opts: fstype == "cgroup" and "memory" in opts  # noqa: E731
    elif v2_path is not None:
        version, cg_path = 2, v2_path
        want = lambda fstype, opts: fstype == "cgroup2"  # noqa: E731
    else:
        return CgroupInfo(None, None, None, f"no memory controller in /proc/{pid}/cgroup")
    if "/.." in cg_path or cg_path.startswith(".."):
        # The process sits outside our cgroup namespace; its group is not visible here.
        return CgroupInfo(version, None, None, f"cgroup {cg_path!r} is outside this namespace")
    candidates = [m for m in _mounts(proc) if want(m[2], m[3])]
    if not candidates:
        kind = "cgroup v1 memory" if version == 1 else "cgroup2"
        return CgroupInfo(version, None, None, f"no {kind} mount in /proc/{pid}/mountinfo")
    for mount_root, mount_point, _, _ in candidates:  # noqa: B007 (read after the loop)
        rel = _relative(cg_path, mount_root)
        if rel is not None:
            break
    else:
        return CgroupInfo(version, None, None, f"cgroup {cg_path!r} is not below any mount")
    memory_root = join_root(root, mount_point)
    path = os.path.normpath(join_root(memory_root, rel))
    if version == 2:
        ctl, _ = read_text(os.path.join(memory_root, "cgroup.controllers"))
        if ctl is not None and "memory" not in ctl.split():
            return CgroupInfo(2, memory_root, path, "cgroup v2 without the memory controller")
    if not os.path.isdir(path):
        return CgroupInfo(version, memory_root, None, f"cgroup directory {path} not found")
    return CgroupInfo(version, memory_root, path, "")


@functools.lru_cache(maxsize=1)
def _self_info() -> CgroupInfo:
    # Detected once per process; pass `info=` explicitly to use another.
    return detect()
