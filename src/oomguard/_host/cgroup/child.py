"""Per-worker memory cgroups: where they can go (v1: under our own group; v2: a leaf
sibling when our group holds processes), creating one with a limit, moving a worker into
it, removing it, probing that it can be done, and cleaning up what dead runs left."""

from __future__ import annotations

import errno
import os
import secrets
import time
from collections.abc import Callable

from ..._exceptions import CgroupError
from .counters import MemoryCounters, group_pids, read_memory_counters
from .files import read_text
from .info import CgroupInfo, _self_info


def _write(path: str, value: str) -> None:
    # One write() per value: cgroup files take one value per write call.
    with open(path, "w") as f:
        f.write(value)


def _child_parent(info: CgroupInfo) -> tuple[str | None, str]:
    """Directory under which per-worker groups go, or (None, why not).

    v1: our own group. v2: our own group if it can enable `+memory` for children; v2's "no
    internal processes" rule forbids that while it holds processes (except the real root),
    so then a *leaf sibling* under our parent is used when the parent is delegated to us,
    memory-enabled and writable, e.g. the nanny runs in `/nanny` inside a cgroup namespace.
    """
    if info.version is None or info.path is None:
        return None, info.reason or "no memory cgroup"
    own = info.path
    if info.version == 1:
        return own, ""
    sc, why = read_text(os.path.join(own, "cgroup.subtree_control"))
    if sc is None:
        return None, f"{own}/cgroup.subtree_control: {why}"
    if "memory" in sc.split():
        return own, ""
    is_real_root = not os.path.exists(os.path.join(own, "memory.max"))
    if is_real_root or not group_pids(own):
        try:
            _write(os.path.join(own, "cgroup.subtree_control"), "+memory")
            return own, ""
        except OSError as e:
            own_err = f"cannot enable +memory in {own}/cgroup.subtree_control: {e.strerror}"
    else:
        own_err = (
            f"{own} holds processes, and cgroup v2's no-internal-processes rule forbids "
            "enabling +memory for its children"
        )
    parent = os.path.dirname(own)
    if own != info.memory_root and _may_hold_siblings(parent, info.memory_root):
        psc, _ = read_text(os.path.join(parent, "cgroup.subtree_control"))
        if psc and "memory" in psc.split() and os.access(parent, os.W_OK):
            return parent, ""
    return None, (
        f"{own_err}; nor is its parent {parent} a delegated, memory-enabled, writable group. "
        "Run the nanny in a leaf group (e.g. /nanny) below the root of a cgroup namespace "
        "mounted rw, or below a systemd Delegate=yes unit."
    )


def _may_hold_siblings(parent: str, memory_root: str | None) -> bool:
    # Only where the operator handed the subtree to us: the root of what we can see (a cgroup
    # namespace root, or the host root), or a group systemd marked delegated with the
    # trusted.delegate / user.delegate xattr (systemd 251+). Never a kubelet-managed pod
    # slice: a foreign group there would block its removal.
    if parent == memory_root:
        return True
    for attr in ("trusted.delegate", "user.delegate"):
        try:
            if os.getxattr(parent, attr) == b"1":
                return True
        except OSError:
            continue
    return False


class ChildGroup:
    """A per-worker memory cgroup under our own (v1) or beside it (v2 leaf sibling).

    >>> g = ChildGroup.create("oomguard-w1", 2 * 2**30)   # doctest: +SKIP
    >>> g.add_pid(worker_pid); g.counters().oom_kill        # doctest: +SKIP
    0
    >>> g.remove()                                          # doctest: +SKIP
    True
    """

    def __init__(self, path: str, version: int, home: str) -> None:
        self.path = path
        self.version = version
        self.home = home  # our own group: where remove() moves leftover processes

    def __repr__(self) -> str:
        return f"ChildGroup(path={self.path!r}, version={self.version})"

    @classmethod
    def create(cls, name: str, limit: int | None, *, info: CgroupInfo | None = None) -> ChildGroup:
        """mkdir the group and set `limit` bytes (None: no limit); CgroupError when impossible."""
        if not name or "/" in name or name in (".", ".."):
            raise CgroupError(f"name: {name!r} is not a valid cgroup directory name.")
        if limit is not None and (not isinstance(limit, int) or limit <= 0):
            raise CgroupError(f"limit: {limit!r} must be a positive number of bytes or None.")
        info = info or _self_info()
        parent, why = _child_parent(info)
        if parent is None or info.version is None or info.path is None:
            raise CgroupError(f"Cannot create memory cgroup {name!r}: {why}")
        path = os.path.join(parent, name)
        try:
            os.mkdir(path)
        except FileExistsError:
            raise CgroupError(
                f"Memory cgroup {path} already exists; cleanup_stale() removes empty "
                "left-overs of dead runs."
            ) from None
        except OSError as e:
            raise CgroupError(
                f"Cannot create memory cgroup {path}: {e.strerror}. The cgroup filesystem must "
                "be writable (root, or a delegated subtree; not a read-only container mount)."
            ) from None
        group = cls(path, info.version, info.path)
        if info.version == 2 and not os.path.exists(os.path.join(path, "memory.max")):
            group.remove(timeout=1.0)
            raise CgroupError(f"Memory controller is not enabled for children of {parent}.")
        if limit is not None:
            try:
                group._write_limit(limit)
            except OSError as e:
                group.remove(timeout=1.0)
                raise CgroupError(f"Cannot set memory limit {limit} on {path}: {e}") from None
        return group

    def _write_limit(self, limit: int) -> None:
        if self.version == 1:
            _write(os.path.join(self.path, "memory.limit_in_bytes"), str(limit))
            # memsw caps memory+swap (needs swap accounting); equal to the limit, swap cannot
            # absorb the overflow and hide the OOM. It must be written after the memory limit.
            memsw = os.path.join(self.path, "memory.memsw.limit_in_bytes")
            if os.path.exists(memsw):
                _write(memsw, str(limit))
        else:
            _write(os.path.join(self.path, "memory.max"), str(limit))
            swap = os.path.join(self.path, "memory.swap.max")  # Linux 4.8+, with swap accounting
            if os.path.exists(swap):
                _write(swap, "0")

    def set_move_charge(self, on: bool = True) -> tuple[bool, str]:
        """Ask the kernel to move what a process already charged when it joins this group.

        v1 only: `memory.move_charge_at_immigrate` = 3, its anonymous pages (bit 0) and the
        file pages it maps (bit 1), since RSS counts both. (True, "") when the kernel took
        it; (False, why) otherwise. Never raises.
        """
        if self.version != 1:
            return False, (
                "cgroup v2 never moves charges: what a process charged before it joined "
                "stays with its old group"
            )
        name = "memory.move_charge_at_immigrate"
        path = os.path.join(self.path, name)
        if not os.path.exists(path):
            return False, f"{name}: not found"
        try:
            _write(path, "3" if on else "0")
        except OSError as e:
            if e.errno == errno.EINVAL:
                # Linux 6.13 removed charge moving (deprecated since 6.2): only 0 is taken.
                return False, (
                    f"{name} refused (EINVAL): the kernel no longer moves charges "
                    "(removed in Linux 6.13)"
                )
            return False, f"{name} refused: {e.strerror or e}"
        return True, ""

    def add_pid(self, pid: int) -> None:
        """Move process `pid` (all its threads) into the group; CgroupError when refused."""
        try:
            _write(os.path.join(self.path, "cgroup.procs"), str(int(pid)))
        except OSError as e:
            raise CgroupError(f"Cannot move pid {pid} into {self.path}: {e.strerror}") from None

    def counters(self) -> MemoryCounters:
        return read_memory_counters(self.path, self.version)

    def remove(self, timeout: float = 5.0) -> bool:
        """Move leftover processes out, rmdir; retried until `timeout`. Never raises."""
        deadline = time.monotonic() + timeout
        while True:
            if not os.path.isdir(self.path):
                return True
            for pid in group_pids(self.path):
                for target in (self.home, os.path.dirname(self.path)):
                    try:
                        _write(os.path.join(target, "cgroup.procs"), str(pid))
                        break
                    except OSError:
                        continue  # ESRCH: already gone; EBUSY (v2 inner node): try the next
            try:
                os.rmdir(self.path)
                return True
            except FileNotFoundError:
                return True
            except OSError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.05)


def can_create_child(info: CgroupInfo | None = None) -> tuple[bool, str]:
    """Probe for real: create and remove a throwaway child group.

    >>> can_create_child(CgroupInfo(None, None, None, "no memory controller"))[0]
    False
    """
    name = f"oomguard-probe-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        group = ChildGroup.create(name, None, info=info)
    except CgroupError as e:
        return False, str(e)
    except Exception as e:  # a probe reports, it does not raise
        return False, f"probe failed: {e!r}"
    if not group.remove(timeout=1.0):
        return False, f"probe group {group.path} could not be removed"
    return True, ""


def cleanup_stale(
    prefix: str = "oomguard-",
    info: CgroupInfo | None = None,
    *,
    stale: Callable[[str], bool] | None = None,
) -> int:
    """Remove empty child groups named `prefix*` (left by dead runs); return how many.

    A group still holding a process is left alone, and so is one `stale(name)` says is
    not stale (e.g. a group another nanny has just made for a live PID). Never raises.

    >>> cleanup_stale(info=CgroupInfo(None, None, None, "none"))
    0
    """
    try:
        parent, _ = _child_parent(info or _self_info())
        names = sorted(os.listdir(parent)) if parent else []
    except OSError:
        return 0
    removed = 0
    for name in names:
        path = os.path.join(parent, name)
        if (
            name.startswith(prefix)
            and (stale is None or stale(name))
            and os.path.isdir(path)
            and not group_pids(path)
        ):
            try:
                os.rmdir(path)
                removed += 1
            except OSError:
                pass  # not empty after all, or gone already
    return removed
