"""Runs *inside* the VM that `vm.py` boots: real cgroup v2 layouts, real kernel OOM kills.

Each scenario sets up one layout under /sys/fs/cgroup, starts a real `dask worker
--preload-nanny oomguard.worker_plugin` in it against a scheduler with oomguard, kills
workers for real, and prints one line ``OOMGUARD-KERNEL {json}`` with what
`oomguard.Failures` recorded and what `oomguard doctor --json` said there. The host side
(`test_kernel.py`) asserts on those lines; nothing is asserted here.

The VM runs under software emulation (~20x slower than the host), so the nanny's workers
come from a fork server (``multiprocessing-method: forkserver``: Dask is imported once per
nanny process, in the server, not once per worker) and memory limits are small. Not plain
``fork``: it forks the nanny's threaded process, and once in four runs a worker forked
beside a second nanny of the same ``dask worker`` hung before it started (a lock held by
another thread at the fork); the fork server is single-threaded.

Layouts (what users run):

- ``delegated``: a writable subtree marked delegated (systemd ``Delegate=yes`` sets the
  ``trusted.delegate`` xattr), the nanny in a leaf ``nanny`` below it: per-worker groups.
- ``container``: the nanny and 2 workers in one group with ``memory.max``, seen through a
  cgroup namespace with cgroupfs mounted read-only (``0::/``), as in a Kubernetes pod.
- ``oomgroup``: the same with ``memory.oom.group=1`` (the kubelet's default on cgroup v2):
  the kernel kills the nanny with its worker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

CG = "/sys/fs/cgroup"
MiB = 2**20
PY = sys.executable
TIMEOUT = 900  # seconds for anything to happen under emulation, beside other work

NANNY_ENV = {
    "DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD": "forkserver",
    # The kernel must do the killing, not the nanny's own memory monitor.
    "DASK_DISTRIBUTED__WORKER__MEMORY__TERMINATE": "False",
    "DASK_DISTRIBUTED__WORKER__MEMORY__PAUSE": "False",
    "DASK_DISTRIBUTED__WORKER__MEMORY__SPILL": "False",
    "DASK_DISTRIBUTED__WORKER__MEMORY__TARGET": "False",
    "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "300s",
    "DASK_DISTRIBUTED__COMM__TIMEOUTS__TCP": "300s",
}


def log(*args) -> None:
    print(f"[scenario {time.monotonic():8.1f}]", *args, file=sys.stderr, flush=True)


def write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def events_of(group: str) -> dict[str, int]:
    return {
        k: int(v)
        for k, v in (line.split() for line in read(f"{group}/memory.events").splitlines())
    }


def in_group(group: str, argv: list[str], *, container: bool) -> list[str]:
    """argv run inside `group`; with `container`, as a container runtime runs it: behind a
    cgroup namespace whose cgroupfs is mounted read-only, without CAP_SYSLOG (no kernel log)."""
    inner = argv
    if container:
        inner = [
            "unshare",
            "--cgroup",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            "umount -l /sys/fs/cgroup && mount -t cgroup2 -o ro cgroup2 /sys/fs/cgroup && "
            # /dev/kmsg takes CAP_SYSLOG, or the deprecated CAP_SYS_ADMIN: a container has neither.
            'exec setpriv --bounding-set -syslog,-sys_admin "$@"',
            "sh",
            *argv,
        ]
    return ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh", *inner]


def doctor(group: str, *, container: bool) -> subprocess.Popen:
    """`oomguard doctor --json` where the nanny runs, started now and read with
    `doctor_result`. Once per layout, beside the nanny's start: each Python start costs tens
    of seconds under emulation, and the VM's second vCPU is idle while the nanny imports
    Dask (its text is the same checks, `render_text`). Read before a kill, so that it is
    not in the group when the kernel picks a victim there."""
    argv = [PY, "-m", "oomguard._cli", "doctor", "--json"]
    return subprocess.Popen(
        in_group(group, argv, container=container),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def doctor_result(proc: subprocess.Popen) -> dict:
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    try:
        return json.loads(out)
    except ValueError:
        return {"error": (out + err)[-2000:]}


def start_nanny(address: str, group: str, *, nworkers: int, memory_limit: int, container: bool):
    argv = [
        PY,
        "-m",
        "distributed.cli.dask_worker",
        address,
        "--nworkers",
        str(nworkers),
        "--nthreads",
        "1",
        "--memory-limit",
        str(memory_limit),
        "--no-dashboard",
        "--preload-nanny",
        "oomguard.worker_plugin",
        "--death-timeout",
        "900",
    ]
    env = {**os.environ, **NANNY_ENV}
    return subprocess.Popen(in_group(group, argv, container=container), env=env)


def wait_for(what: str, predicate, timeout: float = TIMEOUT, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(every)


# ------------------------------------------------------------------ tasks run on workers


def allocate(nbytes: int) -> int:
    """Touch `nbytes` of anonymous memory (every page written)."""
    data = b"\1" * nbytes
    time.sleep(60)  # only reached if the kernel did not kill us
    return len(data)


def allocate_in_subprocess(nbytes: int) -> int:
    """A task whose child process is OOM-killed; the task itself survives."""
    code = f"import time; x = b'\\1' * {nbytes}; time.sleep(60)"
    return subprocess.run([sys.executable, "-S", "-c", code]).returncode


def sleep_with_flag(path: str) -> None:
    with open(path, "w"):
        pass
    time.sleep(900)


def worker_pid() -> int:
    return os.getpid()


# ------------------------------------------------------------------ the scenarios


def failures_for(client, worker: str, timeout: float = TIMEOUT) -> list[dict]:
    from oomguard import Failures

    def found():
        rows = [e.to_dict() for e in Failures(client).events(limit=None)]
        return [r for r in rows if r["worker"] == worker]

    return wait_for(f"a failure event for {worker}", found, timeout, every=2.0)


def workers_and_pids(client, n: int) -> dict[str, int]:
    client.wait_for_workers(n, timeout=TIMEOUT)
    return client.run(worker_pid)


def delegated(client, address: str) -> dict:
    base = f"{CG}/deleg"
    os.makedirs(f"{base}/nanny")
    os.setxattr(base, "trusted.delegate", b"1")  # what systemd's Delegate=yes marks
    write(f"{base}/cgroup.subtree_control", "+memory")
    limit = 300 * MiB
    doc = doctor(f"{base}/nanny", container=False)
    nanny = start_nanny(address, f"{base}/nanny", nworkers=1, memory_limit=limit, container=False)
    try:
        ((worker, pid),) = workers_and_pids(client, 1).items()
        report = doctor_result(doc)
        group = f"{base}/oomguard-worker-{pid}"
        facts = {
            "children": sorted(n for n in os.listdir(base) if os.path.isdir(f"{base}/{n}")),
            "worker_group_max": int(read(f"{group}/memory.max")),
            "worker_in_group": str(pid) in read(f"{group}/cgroup.procs").split(),
            "nanny_group_procs": len(read(f"{base}/nanny/cgroup.procs").split()),
        }
        future = client.submit(allocate, 600 * MiB, pure=False)
        events = failures_for(client, worker)
        facts["group_removed"] = bool(
            wait_for("the worker's group removed", lambda: not os.path.exists(group), 60)
        )
        facts["future"] = future.status
        return {
            "events": events,
            "facts": facts,
            "doctor": report,
        }
    finally:
        stop(nanny)


def container(client, address: str) -> dict:
    ctr = f"{CG}/ctr"
    os.makedirs(ctr)
    write(f"{ctr}/memory.max", str(600 * MiB))
    doc = doctor(ctr, container=True)
    nanny = start_nanny(address, ctr, nworkers=2, memory_limit=2**30, container=True)
    try:
        pids = workers_and_pids(client, 2)
        report = doctor_result(doc)
        (a, _), (b, pid_b) = sorted(pids.items())
        facts: dict = {"oom_kill_at_start": events_of(ctr)["oom_kill"]}
        # 1. Long before: a task's subprocess on worker B is OOM-killed; B lives on.
        rc = client.submit(allocate_in_subprocess, 900 * MiB, workers=[b], pure=False).result()
        facts["subprocess_returncode"] = rc
        facts["oom_kill_after_subprocess"] = events_of(ctr)["oom_kill"]
        time.sleep(5)
        # 2. Worker A is OOM-killed by the kernel.
        client.submit(allocate, 900 * MiB, workers=[a], allow_other_workers=False, pure=False)
        events_a = failures_for(client, a)
        facts["oom_kill_after_a"] = events_of(ctr)["oom_kill"]
        time.sleep(5)
        # 3. Worker B is SIGKILLed by hand while running a task.
        flag = "/tmp/oomguard-kernel-b-running"
        client.submit(sleep_with_flag, flag, workers=[b], allow_other_workers=False, pure=False)
        wait_for("B's task to start", lambda: os.path.exists(flag))
        os.kill(pid_b, signal.SIGKILL)
        events_b = failures_for(client, b)
        facts["oom_kill_after_b"] = events_of(ctr)["oom_kill"]
        return {
            "events_a": events_a,
            "events_b": events_b,
            "facts": facts,
            "doctor": report,
        }
    finally:
        stop(nanny)


def oomgroup(client, address: str) -> dict:
    grp = f"{CG}/grp"
    os.makedirs(grp)
    write(f"{grp}/memory.max", str(500 * MiB))
    write(f"{grp}/memory.oom.group", "1")
    doc = doctor(grp, container=True)
    nanny = start_nanny(address, grp, nworkers=1, memory_limit=2**30, container=True)
    try:
        ((worker, _),) = workers_and_pids(client, 1).items()
        report = doctor_result(doc)  # memory.oom.group: it would die with the worker
        client.submit(allocate, 800 * MiB, pure=False)
        events = failures_for(client, worker)
        facts = {
            "nanny_returncode": nanny.wait(60),
            "memory_events": events_of(grp),
        }
        return {"events": events, "facts": facts, "doctor": report}
    finally:
        stop(nanny)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


SCENARIOS = {"delegated": delegated, "container": container, "oomgroup": oomgroup}


def main(names: list[str]) -> int:
    import dask
    from distributed import Client, LocalCluster

    write(f"{CG}/cgroup.subtree_control", "+memory")
    dask.config.set(
        {
            "oomguard.scheduler.report-grace-timeout": "30s",
            "distributed.comm.timeouts.connect": "300s",
            "distributed.comm.timeouts.tcp": "300s",
            "distributed.scheduler.worker-ttl": None,
        }
    )
    for name in names or list(SCENARIOS):
        started = time.monotonic()
        result: dict = {"scenario": name}
        try:
            with (
                LocalCluster(
                    n_workers=0,
                    dashboard_address=":0",
                    host="127.0.0.1",
                    scheduler_kwargs={"preload": ["oomguard.scheduler_plugin"]},
                ) as cluster,
                Client(cluster) as client,
            ):
                result.update(SCENARIOS[name](client, cluster.scheduler_address))
        except Exception as e:  # reported to the host, which fails the scenario's test
            import traceback

            result["error"] = "".join(traceback.format_exception(e))[-4000:]
        result["seconds"] = round(time.monotonic() - started, 1)
        print("OOMGUARD-KERNEL " + json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
