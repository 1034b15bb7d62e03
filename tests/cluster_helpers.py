"""Waits and set-up shared by the tests that run real clusters.

Not a tests/cluster/conftest.py: tests/kernel imports the root conftest by its bare name
(`from conftest import ...`), which a second conftest.py would shadow. Here, beside
capabilities.py, every test folder can import it (`from cluster_helpers import wait_for`).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from capabilities import require
from oomguard._host.cgroup import CgroupInfo, can_create_child

T = TypeVar("T")


def wait_for(
    probe: Callable[[], T],
    what: str | Callable[[], str],
    timeout: float = 60.0,
    interval: float = 0.05,
) -> T:
    """Call `probe` every `interval` seconds until it returns something truthy; return that.

    After `timeout` seconds fail with `what` (a callable gives the text then, to show the
    state that was waited on). The probe runs at least once, even with a timeout of 0.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = what() if callable(what) else what
            raise AssertionError(f"{text} (waited {timeout:g} s)")
        time.sleep(interval)


def wait_installed(client, n: int = 2, timeout: float = 60.0) -> None:
    """Wait until `n` workers run oomguard's worker plugin (installed at runtime)."""

    def installed() -> bool:
        got = client.run(lambda dask_worker: "oomguard-worker" in dask_worker.plugins)
        return len(got) >= n and all(got.values())

    wait_for(installed, "worker plugins were not installed", timeout, interval=0.1)


def wait_nannies_running(client, n: int = 1, timeout: float = 60.0) -> None:
    """Wait until `n` nannies have finished starting. A worker registers before its nanny's
    start returns; one killed in between fails the nanny's start ("nanny-start-failed"),
    and `dask worker` exits instead of restarting it."""

    def running() -> bool:
        got = client.run(lambda dask_worker: dask_worker.status.name, nanny=True)
        return len(got) >= n and set(got.values()) == {"running"}

    wait_for(running, "nannies did not finish starting", timeout, interval=0.05)


def require_worker_groups(info: CgroupInfo | None = None) -> None:
    """Skip the test (fail it under OOMGUARD_STRICT=1) where per-worker memory cgroups
    cannot be made: a real probe, `can_create_child`."""
    ok, reason = can_create_child(info)
    require(ok, f"per-worker memory cgroups cannot be made here: {reason}")


def dask_worker(
    address: str,
    *,
    nthreads: int = 1,
    env: Mapping[str, str] | None = None,
    own_session: bool = False,
    stderr=subprocess.DEVNULL,
) -> subprocess.Popen:
    """A real `dask worker` (one nanny, one worker) with oomguard's nanny preload, as a user
    starts one. `own_session`: its own process group, so that nanny and worker can be
    killed together (a lost host)."""
    dask_cli = os.path.join(os.path.dirname(sys.executable), "dask")
    return subprocess.Popen(
        [dask_cli, "worker", address, "--nworkers", "1", "--nthreads", str(nthreads)]
        + ["--no-dashboard", "--preload-nanny", "oomguard.worker_plugin"],
        env=dict(env) if env is not None else None,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        start_new_session=own_session,
    )


class DaskScheduler:
    """A real `dask scheduler --preload oomguard.scheduler_plugin` in its own process, as a
    user starts one (`env` carries its oomguard config); its log in `log`.

        sched = DaskScheduler(tmp_path, env)
        with Client(sched.address()) as client: ...
        sched.kill()  # SIGKILL: no close, no flush
    """

    def __init__(
        self, directory, env: Mapping[str, str], name: str = "scheduler", port: int = 0
    ) -> None:
        self.log = directory / f"{name}.log"
        self.file = directory / f"{name}.json"
        self.file.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
             "--port", str(port), "--dashboard-address", ":0", "--scheduler-file",
             str(self.file), "--preload", "oomguard.scheduler_plugin"],
            env=dict(env), stdout=subprocess.DEVNULL, stderr=open(self.log, "w"),
        )  # fmt: skip

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def address(self, timeout: float = 90.0) -> str:
        import json

        def address() -> str | None:
            if self.file.exists():
                try:
                    return json.loads(self.file.read_text())["address"]
                except (ValueError, KeyError):
                    pass
            assert self.proc.poll() is None, f"the scheduler exited: {self.text()[-3000:]}"
            return None

        return wait_for(address, lambda: self.text()[-3000:], timeout, interval=0.1)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGINT, as Ctrl-C: the scheduler closes (and its plugin with it)."""
        if self.proc.poll() is None:
            self.proc.send_signal(2)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def dask_env(config: Mapping[str, object]) -> dict[str, str]:
    """This environment with `config` ({"oomguard.worker.sample-interval": "100ms"}) as the
    DASK_... variables a `dask scheduler` or `dask worker` reads its config from, and this
    interpreter's path (so that the test modules' tasks can be unpickled there)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}  # the tests' tasks
    for key, value in config.items():
        env["DASK_" + key.upper().replace(".", "__").replace("-", "_")] = str(value)
    return env


@contextlib.contextmanager
def cli_cluster(directory, config: Mapping[str, object], *, workers: int = 1):
    """A cluster started as a user starts one: `dask scheduler --preload
    oomguard.scheduler_plugin` and `dask worker --preload-nanny oomguard.worker_plugin`
    (one nanny and one single-threaded worker each), `config` in their environment.
    Yields a connected Client; everything is stopped after."""
    from distributed import Client

    env = dask_env(config)
    sched = DaskScheduler(directory, env)
    procs = []
    try:
        address = sched.address()
        procs = [dask_worker(address, env=env, own_session=True) for _ in range(workers)]
        with Client(address, timeout=60) as client:
            client.wait_for_workers(workers, timeout=90)
            wait_nannies_running(client, workers)
            yield client
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, 9)
            except ProcessLookupError:
                pass
            p.wait()
        sched.stop()


@contextlib.contextmanager
def oomguard_cluster(how: str, directory, config: Mapping[str, object]):
    """A client of a one-worker cluster (a nanny, one thread) with oomguard, deployed `how`:
    "install", a running LocalCluster (processes) that `oomguard.install(client)` is called
    on (the README's notebook path); "cli", `cli_cluster` (the preloads, as `dask
    scheduler` and `dask worker` take them). `config` is set for both."""
    import dask
    from distributed import Client, LocalCluster

    import oomguard

    if how == "cli":
        with cli_cluster(directory, config) as client:
            yield client
        return
    assert how == "install", how
    with (
        dask.config.set(dict(config)),
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        oomguard.install(client)
        wait_installed(client, n=1)
        yield client
