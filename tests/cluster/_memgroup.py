"""A fresh memory cgroup for one test, and the figures tests report about it.

`memory_group` skips (through `capabilities.require`) where a group cannot be made: not
root, no memory controller, a read-only cgroup mount. The group is removed on the way out,
whatever happened; a process still in it is moved back to the test's own group first.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator

from capabilities import require
from oomguard._host.cgroup import ChildGroup, can_create_child, detect, group_pids

MiB = 2**20


@contextlib.contextmanager
def memory_group(purpose: str, limit: int, *, v1_only: bool = False) -> Iterator[ChildGroup]:
    """A new memory cgroup limited to `limit` bytes, removed at the end."""
    require(os.geteuid() == 0, "not root: cannot create memory cgroups")
    info = detect()
    require(info.version is not None, f"no memory cgroup: {info.reason}")
    if v1_only:
        # Moving a running process (the test itself) in and out of a group is simple only
        # on v1; v2's no-internal-processes rule makes the way back depend on the host.
        require(info.version == 1, f"cgroup v{info.version} here; this test needs v1")
    ok, why = can_create_child(info)
    require(ok, f"memory cgroups cannot be made here: {why}")
    group = ChildGroup.create(
        f"oomguard-{purpose}-{os.getpid()}-{secrets.token_hex(3)}", limit, info=info
    )
    try:
        yield group
    finally:
        removed = group.remove(timeout=15.0)
    assert removed, f"could not remove {group.path}"  # only when nothing else failed


def leave(group: ChildGroup) -> None:
    """Move this process back to the group it came from (a no-op when it is not in `group`)."""
    if os.getpid() in group_pids(group.path):
        with open(os.path.join(group.home, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))


def mib(nbytes: int | None) -> str:
    return "n/a" if nbytes is None else f"{nbytes / MiB:.0f} MiB"
