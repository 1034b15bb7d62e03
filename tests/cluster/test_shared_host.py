"""Two Unix users on one host (issue 28, item 1): user A pre-creates user B's default crash
dir, world-writable, full of symlinks to B's own files. B's ordinary cluster (`dask
scheduler --preload`, `dask worker --preload-nanny`, run as B) must refuse that directory
with one WARNING, write nothing through A's links, and still report a worker's death with
its evidence. Runs as root: creates the two users with `useradd`, removes them after.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest
from distributed import Client

import oomguard
from capabilities import require
from cluster_helpers import wait_for, wait_nannies_running

pytestmark = pytest.mark.timeout(300)

VICTIM = "B's own file, not to be overwritten\n"


@pytest.fixture
def two_users():
    require(
        os.geteuid() == 0 and shutil.which("useradd") and shutil.which("setpriv"),
        "two Unix users need root, useradd and setpriv",
    )
    names = [f"og28{c}{os.getpid() % 100000}" for c in "ab"]
    made = []
    try:
        for name in names:
            subprocess.run(
                ["useradd", "--no-create-home", "--shell", "/bin/sh", name],
                check=True,
                capture_output=True,
            )
            made.append(name)
        yield [pwd.getpwnam(name) for name in names]
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True)


def _hidden(paths):
    """{directory others cannot enter: {the child on the way to a needed path}}."""
    hidden: dict[str, set[str]] = {}
    for path in paths:
        path = os.path.realpath(path)
        parts = path.strip("/").split("/")
        for i in range(len(parts) - 1):
            here = "/" + "/".join(parts[:i])
            if not os.stat(here).st_mode & 0o001:
                hidden.setdefault(here, set()).add(parts[i])
    return hidden


def _as_user(user, argv, stash):
    """`argv` run as `user`; where the interpreter lies under a directory only root may
    enter (/root here), in a private mount namespace that opens just that path."""
    run = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups"]
    needed = [sys.base_prefix, sys.prefix, os.path.dirname(oomguard.__file__), os.getcwd()]
    hidden = _hidden(needed)
    if not hidden:
        return [*run, "--", *argv]
    require(shutil.which("unshare"), "the interpreter is under a private directory")
    script = []
    for n, (directory, children) in enumerate(sorted(hidden.items())):
        keep = os.path.join(stash, str(n))
        os.makedirs(keep, exist_ok=True)
        script += [f"mount --bind '{directory}' '{keep}'"]
        script += [f"mount -t tmpfs -o mode=0755 tmpfs '{directory}'"]
        for child in sorted(children):
            script += [f"mkdir -p '{directory}/{child}'"]
            script += [f"mount --bind '{keep}/{child}' '{directory}/{child}'"]
    script += [f'exec {" ".join(run)} -- "$@"']
    unshare = ["unshare", "-m", "--propagation", "private"]
    return [*unshare, "sh", "-ec", " && ".join(script), "sh", *argv]


def _start(user, argv, env, log, stash, cwd):
    return subprocess.Popen(
        _as_user(user, argv, stash),
        env=env,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=open(log, "w"),
    )


def test_another_users_crash_dir_is_refused_and_nothing_written_through_it(two_users):
    a, b = two_users
    base = tempfile.mkdtemp(prefix="oomguard-shared-host-")
    procs: list[subprocess.Popen] = []
    try:
        os.chmod(base, 0o755)
        shared = os.path.join(base, "tmp")  # the host's /tmp, for both users
        os.mkdir(shared)
        os.chmod(shared, 0o1777)
        home = os.path.join(base, "home-b")
        os.mkdir(home, 0o700)
        os.chown(home, b.pw_uid, b.pw_gid)
        victims = {}
        for what in ("crash", "flight", "ledger"):
            victims[what] = os.path.join(home, f"precious-{what}.txt")
            with open(victims[what], "w") as f:
                f.write(VICTIM)
            os.chown(victims[what], b.pw_uid, b.pw_gid)
        # User A makes B's default crash dir first, world-writable, with links into B's
        # files for every PID B's worker may get, and for the memory ledger.
        crash_dir = os.path.join(shared, f"oomguard-{b.pw_uid}")
        subprocess.run(
            ["setpriv", f"--reuid={a.pw_uid}", f"--regid={a.pw_gid}", "--init-groups", "--"]
            + ["sh", "-c", f"mkdir '{crash_dir}' && chmod 0777 '{crash_dir}'"],
            check=True,
            cwd="/",
        )
        assert os.stat(crash_dir).st_uid == a.pw_uid
        with open("/proc/sys/kernel/pid_max") as f:
            pid_max = int(f.read())
        links = [("memory-ledger.json", victims["ledger"])]
        for pid in range(2, pid_max + 1):
            links += [(f"{pid}.crash", victims["crash"]), (f"{pid}.flight", victims["flight"])]
        for name, target in links:
            path = os.path.join(crash_dir, name)
            os.symlink(target, path)
            os.lchown(path, a.pw_uid, a.pw_gid)

        env = {k: v for k, v in os.environ.items() if not k.startswith(("DASK_", "XDG_", "TMP"))}
        env.update(
            HOME=home,
            TMPDIR=shared,
            PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
            DASK_OOMGUARD__SCHEDULER__STORE=os.path.join(home, "failures.sqlite3"),
            DASK_OOMGUARD__SCHEDULER__REPORT_GRACE_TIMEOUT="5s",
        )
        sched_file = os.path.join(home, "scheduler.json")
        s_log, w_log = os.path.join(base, "scheduler.log"), os.path.join(base, "worker.log")
        python = sys.executable
        procs.append(
            _start(
                b,
                [python, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1"]
                + ["--port", "0", "--dashboard-address", ":0", "--scheduler-file", sched_file]
                + ["--preload", "oomguard.scheduler_plugin"],
                env,
                s_log,
                base,
                home,
            )
        )

        def address():
            assert procs[0].poll() is None, open(s_log).read()[-3000:]
            try:
                with open(sched_file) as f:
                    return json.load(f)["address"]
            except (OSError, ValueError, KeyError):
                return None

        addr = wait_for(address, lambda: open(s_log).read()[-3000:], timeout=90, interval=0.1)
        procs.append(
            _start(
                b,
                [python, "-m", "distributed.cli.dask_worker", addr, "--nthreads", "1"]
                + ["--no-dashboard", "--preload-nanny", "oomguard.worker_plugin"],
                env,
                w_log,
                base,
                home,
            )
        )
        with Client(addr, timeout=60) as client:
            client.wait_for_workers(1, timeout=90)
            wait_nannies_running(client)
            (pid,) = client.run(os.getpid).values()
            fut = client.submit(os.kill, pid, signal.SIGKILL, pure=False)
            failures = oomguard.Failures(client)
            events = wait_for(
                lambda: [e for e in failures.events() if e.cause == "sigkill"],
                lambda: f"no death event; worker log:\n{open(w_log).read()[-3000:]}",
                timeout=120,
                interval=0.5,
            )
            fut.cancel()
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGINT)
        for p in reversed(procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        try:
            logs = {}
            for name in ("scheduler.log", "worker.log"):
                try:
                    with open(os.path.join(base, name)) as f:
                        logs[name] = f.read()
                except OSError:
                    logs[name] = ""
            contents = {}
            for what, path in locals().get("victims", {}).items():
                with open(path, "rb") as f:
                    contents[what] = f.read()
        finally:
            shutil.rmtree(base, ignore_errors=True)
    # Nothing of B's was written through A's links.
    sizes = {what: len(data) for what, data in contents.items()}
    assert contents == dict.fromkeys(("crash", "flight", "ledger"), VICTIM.encode()), sizes
    # One clear line: the directory refused, its owner named, the private one used instead.
    refused = [
        line
        for line in logs["worker.log"].splitlines()
        if f"oomguard: not using crash dir {crash_dir}: it is owned by uid {a.pw_uid}" in line
    ]
    assert len(refused) == 1, logs["worker.log"][-3000:]
    assert "WARNING" in refused[0] and "using the private directory" in refused[0]
    # The death still reported, with the flight record's evidence: the task it ran.
    # (Its retry on the restarted worker then fails: that PID is gone.)
    assert [e.shard for e in events] == [fut.key], events
