"""Every read of /proc and /sys that oomguard does lives here.

The filesystem root is a parameter (`root="/"`) so tests point it at a fixture tree, the way
psutil's `_pslinux.py` takes `PROCFS_PATH`. Which cgroup version holds the memory
controller is decided once, by `detect()`; everything after that takes the `CgroupInfo`
(or a cgroup directory plus its version), so nothing re-detects per read.

Missing files are not errors: readers return what is there and list what was missing in
`MemoryCounters.missing` ("memory.peak: not found"). Only `ChildGroup.create` and
`ChildGroup.add_pid` raise (`oomguard.CgroupError`), because the caller asked for a group.

The modules: `info` (which cgroup, v1 or v2, which mount: `detect`), `counters` (a group's
counters and processes), `child` (per-worker groups), `proc` (/proc readers for a process
and the host), `kmsg` (the kernel log), `files` (the shared read helpers) and `choice`
(whether each worker gets a group of its own: the setting, and SLURM's job group).

Interface files and where they come from (Documentation/admin-guide/cgroup-v1/memory.rst,
Documentation/admin-guide/cgroup-v2.rst):

- v1 `memory.oom_control` has had `oom_kill_disable`/`under_oom` since 2.6.34; its
  `oom_kill` count appeared in Linux 4.13.
- v2 `memory.events` came with cgroup v2 in 4.5 (`low high max oom`); `oom_kill` was added
  in 4.13 and `oom_group_kill` in 5.17. It counts events in the whole subtree unless the
  hierarchy is mounted with `memory_localevents` (5.2).
- v2 `memory.peak` appeared in 5.19; v2 `memory.swap.max` in 4.8.
- Charges stay where they were made: a process that joins a group brings along only what
  it charges from then on. v1 `memory.move_charge_at_immigrate` moved earlier charges with
  it; Linux 6.2 deprecated that (a warning) and 6.13 removed it (a non-zero write fails with
  EINVAL). v2 never moves charges. So the per-worker group's peak counts only what the
  worker charged after it joined: the nanny moves it in right after the spawn, and says
  how large it already was (`process_rss`).

Example (this machine, cgroup v1):

    >>> info = detect()
    >>> info.version, info.path                              # doctest: +SKIP
    (1, '/sys/fs/cgroup/memory/process_api/e4e5bf...')
    >>> read_memory_counters(info.path, info.version).oom_kill  # doctest: +SKIP
    0
"""

from __future__ import annotations

from .child import ChildGroup, can_create_child, cleanup_stale
from .choice import IN_SLURM_JOB, per_worker_choice, slurm_job_group
from .counters import (
    MemoryCounters,
    group_pids,
    oom_kill_file,
    parse_oom_kill,
    read_memory_counters,
    read_oom_kill,
)
from .files import join_root, read_text
from .info import CgroupInfo, detect, unescape_mount
from .kmsg import KMSG_RECORD, kernel_oom_victims, read_kernel_log
from .proc import host_memory, process_rss, process_running, stat_running

__all__ = [
    "IN_SLURM_JOB",
    "KMSG_RECORD",
    "CgroupInfo",
    "ChildGroup",
    "MemoryCounters",
    "can_create_child",
    "cleanup_stale",
    "detect",
    "group_pids",
    "host_memory",
    "oom_kill_file",
    "parse_oom_kill",
    "per_worker_choice",
    "join_root",
    "kernel_oom_victims",
    "process_rss",
    "process_running",
    "read_kernel_log",
    "read_memory_counters",
    "read_oom_kill",
    "read_text",
    "slurm_job_group",
    "stat_running",
    "unescape_mount",
]
