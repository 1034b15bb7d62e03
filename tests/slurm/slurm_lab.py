"""A real single-node SLURM for the tests: Debian's `slurm-wlm` 22.05 and `munge` (`./dev
test` installs them when root with apt-get), every file in a private temporary directory,
the daemons started in the foreground by the tests and stopped after.

    with SlurmLab() as lab:
        job = lab.sbatch("--wrap", "hostname")   # the job id, as str
        lab.wait_state(job, "COMPLETED")

What runs (root only: slurmd must start jobs as their users, and the cgroup plugins write
/sys/fs/cgroup):

- `munged -F` with a fresh 1 KiB key and its own socket (`AuthInfo=socket=...`), so the
  host's munge (if any) is never touched;
- `slurmctld -D` and `slurmd -D` on two free loopback ports (started again on two others
  when a process takes one first; each daemon is seen listening on its own), `SlurmctldHost=localhost`,
  one node named as this host with its real CPUs and memory (`slurmd -C`); partitions
  `lab` (the default), `low` and `high` over it, with `PreemptType=preempt/partition_prio`
  and `PreemptMode=CANCEL`: only a `low` job is preemptable, by a `high` one;
- `ProctrackType=proctrack/cgroup`, `TaskPlugin=task/cgroup` with `CgroupPlugin=cgroup/v1`
  and `ConstrainRAMSpace=yes`: this host is cgroup v1 and we are root in a container whose
  memory hierarchy is writable, so slurmd makes each job's memory group
  (`.../slurm/uid_0/job_N/step_batch`) and the kernel enforces `--mem` there, as on a
  production node; `JobAcctGatherType=jobacct_gather/cgroup` reads the same groups;
- no slurmdbd (no `sacct`): a finished job's state comes from `scontrol show job`, kept
  `MinJobAge=300` seconds, and from the job's output file;
- `KillWait=5`, `OverTimeLimit=0`: a job past its `--time` is SIGTERMed at once and
  SIGKILLed 5 s later (the default grace, 30 s, would only slow the tests).
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time

from labs import Lab, PortTaken, listening_ports, on_free_ports, stop_process

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "squeue", "scancel")
CGROUP_MEMORY = "/sys/fs/cgroup/memory"


def missing() -> str | None:
    """Why the lab cannot run here (None: it can)."""
    absent = [b for b in BINARIES if shutil.which(b) is None]
    if absent:
        return (
            f"no {', '.join(absent)} (Debian's slurm-wlm and munge; ./dev test installs them "
            "when root)"
        )
    if os.geteuid() != 0:
        return "the SLURM lab runs slurmd, which must be root"
    if not os.access(CGROUP_MEMORY, os.W_OK):
        return f"{CGROUP_MEMORY} is not writable (SLURM's cgroup plugins need it)"
    return None


def _node_line() -> str:
    """This host as slurmd sees it: its name, CPUs and memory (`slurmd -C`)."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30).stdout
    words = dict(w.split("=", 1) for w in out.splitlines()[0].split() if "=" in w)
    return (
        f"NodeName={words['NodeName']} NodeAddr=127.0.0.1 CPUs={words['CPUs']} "
        f"RealMemory={words['RealMemory']} State=UNKNOWN"
    )


class SlurmLab(Lab):
    """munged, slurmctld and slurmd on loopback (see the module docstring)."""

    def __init__(self) -> None:
        self.root = tempfile.mkdtemp(prefix="oomguard-slurm-")
        os.chmod(self.root, 0o755)  # jobs write their output here
        self.conf = os.path.join(self.root, "slurm.conf")
        self.socket = os.path.join(self.root, "munge.socket")
        self.node = socket.gethostname()
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = {**os.environ, "SLURM_CONF": self.conf}
        for d in ("ctld", "spool", "munge", "jobs"):
            os.makedirs(os.path.join(self.root, d), exist_ok=True)
        key = os.path.join(self.root, "munge", "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)

    # --- configuration ------------------------------------------------------------------

    def _write_conf(self, ctld_port: int, slurmd_port: int) -> None:
        r = self.root
        conf = f"""\
ClusterName=oomguardlab
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.socket}
CredType=cred/munge
StateSaveLocation={r}/ctld
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
JobAcctGatherType=jobacct_gather/cgroup
JobAcctGatherFrequency=1
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MinJobAge=300
KillWait=5
OverTimeLimit=0
InactiveLimit=0
Waittime=0
MessageTimeout=10
{_node_line()}
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
PartitionName=lab Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
PartitionName=low Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=CANCEL
PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=3 PreemptMode=OFF
"""
        with open(self.conf, "w") as f:
            f.write(conf)
        with open(os.path.join(r, "cgroup.conf"), "w") as f:
            f.write(
                "CgroupPlugin=cgroup/v1\nConstrainCores=no\nConstrainRAMSpace=yes\n"
                "ConstrainSwapSpace=no\nAllowedRAMSpace=100\n"
            )

    # --- the daemons --------------------------------------------------------------------

    def _start(self, name: str, argv: list[str]) -> None:
        log = open(os.path.join(self.root, f"{name}.out"), "ab")
        self.procs[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.root,
            start_new_session=True,
        )  # fmt: skip
        log.close()

    def start(self, timeout: float = 90.0) -> None:
        self.remove_job_groups()  # an earlier lab's, killed before its close
        r = self.root
        self._start(
            "munged",
            ["munged", "-F", "--force", f"--socket={self.socket}",
             f"--key-file={r}/munge/munge.key", f"--log-file={r}/munged.log",
             f"--pid-file={r}/munged.pid", f"--seed-file={r}/munge/seed"],
        )  # fmt: skip
        self._wait(lambda: os.path.exists(self.socket), "munged's socket", 20)
        on_free_ports(lambda ctld, slurmd: self._start_slurm(ctld, slurmd, timeout), count=2)

    def _start_slurm(self, ctld_port: int, slurmd_port: int, timeout: float) -> None:
        """slurmctld and slurmd on these ports, each seen listening on its own; PortTaken
        (both stopped, their logs removed) when one could not bind its port."""
        self._write_conf(ctld_port, slurmd_port)
        self._start("slurmctld", ["slurmctld", "-D", "-c", "-i", "-f", self.conf])
        self._wait(
            lambda: (
                self._listens("slurmctld", ctld_port)
                and self.run(["scontrol", "ping"], check=False).returncode == 0
            ),
            "slurmctld answering scontrol ping",
            timeout,
        )
        self._start("slurmd", ["slurmd", "-D", "-c", "-f", self.conf, "-N", self.node])
        self._wait(
            lambda: self._listens("slurmd", slurmd_port) and self._idle(),
            "the node idle in sinfo",
            timeout,
        )

    def _listens(self, name: str, port: int) -> bool:
        """Whether daemon `name` listens on `port`; PortTaken when it died of a clash."""
        proc = self.procs[name]
        if proc.poll() is not None and "Address already in use" in self.logs():
            for daemon in ("slurmd", "slurmctld"):
                stop_process(self.procs.pop(daemon, None))
            for log in ("slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out"):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(self.root, log))
            raise PortTaken(f"SLURM lab: {name}'s port {port} was taken")
        return port in listening_ports(proc.pid)

    def _idle(self) -> bool:
        out = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False).stdout.split()
        return bool(out) and set(out) == {"idle"}  # one line per partition of the node

    def _wait(self, probe, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not probe():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{', '.join(dead)} exited" if dead else f"waited {timeout:g} s"
                raise RuntimeError(f"SLURM lab: no {what} ({why}):\n{self.logs()}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Cancel the jobs left (slurmd's stop would orphan their slurmstepd), stop the
        daemons, and remove the job groups SLURM could not."""
        if all(p.poll() is None for p in self.procs.values()) and self.procs:
            self._cancel_all()
        for name in ("slurmd", "slurmctld", "munged"):
            stop_process(self.procs.pop(name, None))

    def _cancel_all(self, timeout: float = 30.0) -> None:
        jobs = self.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split()
        if jobs:
            self.run(["scancel", *jobs], check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split():
                return
            time.sleep(0.2)

    def remove_job_groups(self, job: str | None = None) -> list[str]:
        """Remove the empty groups left under this node's `slurm_<node>` trees (every
        controller; only job `job`'s with it); the ones that could not be removed (a
        process still in them).

        With `oomguard.worker.cgroup-limit: true`, a worker's nanny SIGKILLed by slurmstepd
        (time limit, scancel, preemption) cannot remove the memory group it made for its
        worker inside the job's step group, and slurmstepd does not remove a group with a
        child it did not make: the job's tree stays (seen here with SLURM 22.05 on cgroup
        v1). The default makes no such group; the tests check `groups_left` first."""
        left = []
        pattern = f"slurm_{self.node}" + (f"/uid_*/job_{job}" if job else "")
        for top in glob.glob(f"/sys/fs/cgroup/*/{pattern}"):
            for d, _, _ in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
                try:
                    os.rmdir(d)
                except OSError:
                    left.append(d)
        return left

    def job_groups(self, job: str) -> list[str]:
        """Every group of job `job` still under this node's SLURM trees (every controller)."""
        found = []
        for top in glob.glob(f"/sys/fs/cgroup/*/slurm_{self.node}/uid_*/job_{job}"):
            found += [d for d, _, _ in os.walk(top)]
        return sorted(found)

    def groups_left(self, job: str, timeout: float = 20.0) -> list[str]:
        """The groups of an ended job that slurmstepd has not removed after `timeout`
        seconds: none once it cleaned up (call it before `remove_job_groups`, which would
        hide them)."""
        deadline = time.monotonic() + timeout
        while (left := self.job_groups(job)) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left

    def logs(self, tail: int = 3000) -> str:
        out = []
        for name in ("slurmctld.log", "slurmd.log", "munged.log", "slurmctld.out", "slurmd.out"):
            try:
                with open(os.path.join(self.root, name), errors="replace") as f:
                    out.append(f"--- {name}\n{f.read()[-tail:]}")
            except OSError:
                pass
        return "\n".join(out)

    def close(self) -> None:
        self.stop()
        self.remove_job_groups()
        shutil.rmtree(self.root, ignore_errors=True)

    # --- jobs ---------------------------------------------------------------------------

    def run(self, argv: list[str], check: bool = True, timeout: float = 30):
        return subprocess.run(
            argv, capture_output=True, text=True, env=self.env, timeout=timeout, check=check
        )

    def sbatch(self, *args: str) -> str:
        """Submit; the job's id. Its output goes to jobs/<id>.out in the lab's directory."""
        out = os.path.join(self.root, "jobs", "%j.out")
        done = self.run(["sbatch", "--parsable", f"--output={out}", *args])
        return done.stdout.strip().split(";")[0]

    def output(self, job: str) -> str:
        try:
            with open(os.path.join(self.root, "jobs", f"{job}.out"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def show_job(self, job: str) -> str:
        return self.run(["scontrol", "show", "job", job], check=False).stdout

    def state(self, job: str) -> str | None:
        m = re.search(r"\bJobState=(\S+)", self.show_job(job))
        return m.group(1) if m else None

    def wait_state(self, job: str, *states: str, timeout: float = 120.0) -> str:
        """Wait until the job is in one of `states`; that state."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.state(job)
            if s in states:
                return s
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"job {job} is {s}, not {'/'.join(states)} after {timeout:g} s:\n"
                    f"{self.show_job(job)}\n{self.output(job)}\n{self.logs()}"
                )
            time.sleep(0.2)
