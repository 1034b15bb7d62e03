"""What `oomguard doctor` says: each cgroup layout's meaning and each finding's fix.

Kept apart from the checks (`_doctor.py`) so the wording can be read, and changed, whole.
"""

from __future__ import annotations

SHARED = (
    "the nanny and its workers share one memory group: oomguard tells a worker's OOM kill "
    "from another process's by a recent reading of the shared counter and the kernel log"
)

#: The cgroup layout labels, and what each means for the evidence.
LAYOUTS = {
    "v1": "cgroup v1; each worker gets its own memory group, limit and OOM counter",
    "v1-shared": f"cgroup v1, {SHARED}",
    "v2-delegated": "cgroup v2, delegated: each worker gets its own memory group, limit "
    "and OOM counter",
    "v2-shared": f"cgroup v2, {SHARED}",
    "none": "no memory cgroup: an OOM kill is known only from the exit signal and the kernel log",
}

_ONE_WORKER = (
    "or run one worker per container or group (`dask worker --nworkers 1`), so the shared "
    "counter is that worker's"
)

#: The fix for each finding that is not ok, by key.
FIX = {
    "psi": "Boot the kernel with psi=1 (Linux 4.20+; some distributions build it with "
    "CONFIG_PSI_DEFAULT_DISABLED): the memory pressure beside MemAvailable tells a host "
    "that was thrashing from one that was merely full.",
    "xattrs": "Run the nanny as the owner of its cgroup (or root) on a cgroupfs that keeps "
    "user.* xattrs (Linux 5.7+ on cgroup v2): without them a systemd-oomd kill looks like "
    "any other SIGKILL.",
    "sigrec": "Install a dask-oomguard wheel (Linux x86-64 and aarch64 carry the recorder), or "
    "install from the source distribution where a C compiler is found (apt-get install gcc; "
    "pip install --force-reinstall --no-binary dask-oomguard dask-oomguard).",
    "hidepid": "Mount /proc with gid=GROUP (a group the Dask user is in) beside hidepid=, or "
    "run the nanny as root: then it can read the name and command line of the process that "
    "sent a worker's signal and find the killers that root runs.",
    "cgroup": "Run the nanny on Linux with the memory cgroup controller (cgroup v2, or v1 with "
    "the memory hierarchy mounted): its counters are what prove a kernel OOM kill.",
    "memory": "Enable the memory controller for this group: `+memory` in each ancestor's "
    "cgroup.subtree_control (systemd: MemoryAccounting=yes on the unit).",
    "mount": "Per-worker groups need a writable cgroup filesystem: run the nanny on the host as "
    "root or in a systemd unit with Delegate=yes (Docker and Kubernetes mount it read-only "
    f"unless the container is privileged); {_ONE_WORKER}.",
    "per-worker-v1": "Give the nanny a writable v1 memory hierarchy (root on the host, or a "
    f"privileged container); {_ONE_WORKER}.",
    "per-worker-v2": "Delegate a subtree: start the nanny in a leaf group (e.g. /nanny) below "
    "the root of a cgroup namespace mounted read-write, or in a systemd unit with "
    f"Delegate=yes; {_ONE_WORKER}.",
    "processes": "Start the nanny in a leaf group, so this group holds no processes: e.g. the "
    "container's entrypoint runs `mkdir /sys/fs/cgroup/nanny; echo $$ > "
    "/sys/fs/cgroup/nanny/cgroup.procs; echo +memory > /sys/fs/cgroup/cgroup.subtree_control; "
    "exec dask worker ...` (the mount must be read-write).",
    "oom-group": "Run one worker per container (`dask worker --nworkers 1`) and turn on the "
    "scheduler's Kubernetes pod lookup (`oomguard.scheduler.kubernetes.enabled: true`): it "
    "turns worker_lost into oom_kill from the pod's OOMKilled status.",
    "peak": "Upgrade the kernel (memory.peak: Linux 5.19+); until then the report's peak is "
    "the sampled RSS (rss_sampled_bytes), which can miss a short spike.",
    "kmsg-missing": "Containers have no /dev/kmsg unless given one: `docker run --device "
    "/dev/kmsg --cap-add SYSLOG`, or on Kubernetes a hostPath volume for /dev/kmsg and "
    "`securityContext.capabilities.add: [SYSLOG]`.",
    "kmsg-denied": "Give the nanny CAP_SYSLOG (run it as root, `docker run --cap-add SYSLOG`, "
    "or `securityContext.capabilities.add: [SYSLOG]`), or let every user read the kernel log: "
    "`sysctl -w kernel.dmesg_restrict=0`.",
    "history": "Set oomguard.scheduler.store to a file on a disk that outlives a restart "
    "(or a postgresql:// history), or XDG_STATE_HOME to a directory this user can write.",
    "history-setting": "Fix oomguard.scheduler.store where this host's Dask config sets it.",
    "crash-dir": "Set oomguard.worker.crash-dir (DASK_OOMGUARD__WORKER__CRASH_DIR) to a local "
    "directory the nanny's user can write, outside the worker's local directory (the nanny "
    "deletes that before it reads the crash file).",
    "crash-dir-private": "Another user may have made it (the default name is predictable): "
    "set oomguard.worker.crash-dir to a directory of your own with mode 0700, or run where "
    "$XDG_RUNTIME_DIR is set.",
}

#: User-space OOM killers by process name (/proc/<pid>/comm): (what they do, the fix).
KILLERS = {
    "earlyoom": (
        "it sends SIGTERM (SIGKILL below its kill threshold) to the process with the highest "
        "oom_score when available memory and free swap are both low (-m/-s, default 10 %); "
        "no kernel log line, no cgroup counter: oomguard shows these deaths as sigterm (with "
        "the stack faulthandler dumped) or sigkill",
        "Keep the workers' combined --memory-limit below the host's memory minus earlyoom's "
        "-m threshold, so the nanny (memory_terminate) or a per-worker group (oom_kill) acts "
        "first; or steer it by process name with `--avoid REGEX` / `--prefer REGEX`. "
        "`journalctl -u earlyoom` names its victims.",
    ),
    "systemd-oomd": (
        "it SIGKILLs every process of a cgroup under memory pressure or swap use, without "
        "the kernel's OOM killer: no counter moves, no kernel log line: oomguard shows "
        "sigkill, or worker_lost when the nanny shares the killed cgroup",
        "Run Dask in its own unit with a MemoryMax= that fits the host, and "
        "ManagedOOMPreference=omit (or no ManagedOOMMemoryPressure=kill on it or a slice above "
        "it). `journalctl -u systemd-oomd` names the cgroups it killed.",
    ),
    "oomd": (
        "it kills whole cgroups by its rules (SIGKILL), without the kernel's OOM killer: "
        "oomguard shows sigkill, or worker_lost when the nanny's cgroup is killed",
        "Leave the Dask cgroup out of oomd's kill rules, or give Dask a cgroup memory limit "
        "that acts before oomd's thresholds. oomd's log names what it killed.",
    ),
    "nohang": (
        "it sends SIGTERM (SIGKILL when memory keeps falling) to the process with the highest "
        "badness when memory runs low; no kernel log line, no cgroup counter: oomguard shows "
        "these deaths as sigterm or sigkill",
        "Lower the workers' badness in nohang.conf (`@BADNESS_ADJ_RE_NAME` or "
        "`@BADNESS_ADJ_RE_CMDLINE`), or keep the workers' combined --memory-limit below its "
        "thresholds. Its log names its victims.",
    ),
    "kubelet": (
        "it evicts pods when the node runs low on memory (--eviction-hard, default "
        "memory.available<100Mi): SIGTERM from outside the container, then SIGKILL after the "
        "grace period; oomguard names it from the pod's status (Evicted)",
        "Give the worker pods memory requests equal to their limits (Guaranteed QoS) and a "
        "worker --memory-limit below the container limit; `kubectl describe pod` shows the "
        "eviction message.",
    ),
    "slurmd": (
        "SLURM's step daemon (slurmstepd) SIGTERMs a job at its time limit, scancel or "
        "preemption, and its cgroup kills a step past --mem; oomguard names the job from "
        "SLURM_JOB_ID in the worker's environment",
        "Ask for a --time and --mem that fit the run (dask-jobqueue: walltime=, memory=), and "
        "keep the workers' --memory-limit below --mem. `scontrol show job ID` says why it ended.",
    ),
}
