"""A multi-host lab on one machine: N "hosts", each with its own IP and hostname, running
a real `dask scheduler` and real `dask worker` nannies that talk over real TCP.

Needs root, iproute2 (`ip`), util-linux (`nsenter`, `unshare`) and bridge support in the
kernel; `Lab.check()` says what is missing (tests turn that into `require(...)`).

What a host is
--------------
- A network namespace ``oomg-<pid>-<host>`` (``<pid>``: the test process, so concurrent
  runs never share a name) whose only interfaces are ``lo`` and ``eth0``: one end of a veth
  pair whose other end (``og<pid><host>``) is a port of the bridge ``og<pid>br`` in the
  test process's namespace. Addresses: ``10.213.N.1/24`` on the bridge (the test process's
  own, for its Client and /metrics requests), ``10.213.N.10`` for the scheduler's host,
  ``10.213.N.11`` and up for the worker hosts; N is picked per run from the subnets no
  interface or route of this machine uses. No namespace has a default route and the bridge
  forwards only among its ports: traffic cannot leave what the lab made.
- Its own hostname: every process is started as
  ``nsenter --net=/var/run/netns/NAME unshare --uts sh -c 'hostname H; exec ...'``, so
  `socket.gethostname()` there is the host's name ("h1"). nsenter, unlike
  ``ip netns exec``, keeps the mount namespace: /sys/fs/cgroup stays the real hierarchy,
  and oomguard's cgroup counters and per-worker memory groups work as on a real host.
- Its own memory cgroup (cgroup v1): ``<the test process's memory group>/oomg-<pid>-<host>``,
  joined by the process before it execs, so oomguard's per-worker groups
  (``oomguard-worker-<pid>``) nest under it and everything the host ever ran is listed
  there. (On cgroup v2 there is no host group; the netns lists the host's processes.)
- Its own directory ``<root>/<host>/``: ``crash/`` (``oomguard.worker.crash-dir``),
  ``memory-ledger.json`` (``oomguard.worker.admission.ledger``), ``work/`` (Dask's
  local directory) and one log file per process, passed as ``DASK_OOMGUARD__...`` and
  ``DASK_DISTRIBUTED__...`` environment variables (Dask config).

Using it
--------
In a test, take the `lab` fixture (``from lab_fixtures import lab_fixture``: five hosts,
"s" and "h1".."h4", built for the test and removed after it). By hand::

    lab = Lab(["s", "h1", "h2", "h3"], root=tmp_path)
    lab.start()                           # sweeps stale oomg-* left by crashed runs first
    try:
        with lab.cluster("s", ["h1", "h2", "h3"], config={...}) as cluster:
            cluster.client                # a Client in the test process, over the bridge
            cluster.ip("h1")              # workers=[cluster.ip("h1")]: run there only
            cluster.worker("h1")          # the address of h1's worker (waits for one)
            cluster.executing_on([...])   # wait until heartbeats show tasks executing
            cluster.metrics()             # the scheduler's /metrics, parsed
            lab.kill_host("h2", "h3")     # every process of both stopped, then SIGKILLed
            cluster.start_nanny("h2")     # the host back, as a supervisor would
            lab.stop_host("h1")           # SIGTERM to its `dask worker`: an orderly stop
            lab.link_down("h3"); lab.link_up("h3")   # a partition: h3's cable unplugged
    finally:
        lab.close()                       # processes, cgroups, namespaces, veths, bridge

`cluster(...)` starts ``dask scheduler --preload oomguard.scheduler_plugin`` in the first
host (its failure store a fresh file per cluster) and one ``dask worker --preload-nanny
oomguard.worker_plugin`` in each of the others (`nworkers` worker processes of one thread,
default 1); `config` is Dask config given to all of them, `scheduler_config` /
`worker_config` to one side only. Everything it started is SIGKILLed at its exit;
`close()` removes everything the lab made, also after a failure, and `Lab.sweep()` (run by
`start()`) removes what a crashed run left behind. docs/multi-host.md says what the
scenarios in tests/hosts found.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

PREFIX = "oomg-"  # network namespaces and host cgroups: oomg-<pid>-<host>
LINK_PREFIX = "og"  # bridge og<pid>br, bridge ports og<pid><host> (IFNAMSIZ: 15 chars)
SUBNETS = "10.213.{}.0/24"  # N in 0..255, the first one free on this machine
SCHEDULER_PORT = 8786
HTTP_PORT = 8787
HERE = pathlib.Path(__file__).resolve().parent
MEMORY_ROOT = "/sys/fs/cgroup/memory"


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2):
    """Poll `predicate` until it returns something true (returned), or fail naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _own_memory_group() -> str | None:
    """The test process's cgroup v1 memory group directory, or None (v2, or none)."""
    try:
        lines = pathlib.Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            group = MEMORY_ROOT + path.rstrip("/")
            return group if os.path.isdir(group) else None
    return None


def _group_pids(group: str) -> set[int]:
    pids: set[int] = set()
    for dirpath, _, files in os.walk(group):
        if "cgroup.procs" in files:
            with contextlib.suppress(OSError):
                text = pathlib.Path(dirpath, "cgroup.procs").read_text()
                pids.update(int(p) for p in text.split())
    return pids


def _remove_group(group: str, timeout: float = 10.0) -> None:
    """rmdir a memory group and its children, innermost first (their processes dead)."""
    deadline = time.monotonic() + timeout
    while os.path.isdir(group):
        for dirpath, _, _ in sorted(os.walk(group), key=lambda w: -len(w[0])):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)
        if os.path.isdir(group):
            if time.monotonic() >= deadline:
                raise RuntimeError(f"cannot remove memory cgroup {group}: {_group_pids(group)}")
            time.sleep(0.1)


def _listening(ip: str, port: int) -> bool:
    try:
        socket.create_connection((ip, port), timeout=2).close()
    except OSError:
        return False
    return True


def _dask_env(config: Mapping[str, Any]) -> dict[str, str]:
    """{"distributed.worker.memory.terminate": False} as environment variables
    (DASK_DISTRIBUTED__WORKER__MEMORY__TERMINATE=False).

    Dask reads each value with ast.literal_eval, falling back to the text."""
    env = {}
    for key, value in config.items():
        name = "DASK_" + key.replace(".", "__").replace("-", "_").upper()
        env[name] = value if isinstance(value, str) else repr(value)
    return env


@dataclass
class Host:
    """One host of the lab; see the module docstring."""

    name: str
    netns: str
    ip: str
    port: str  # its veth's bridge end, in the test process's namespace
    dir: pathlib.Path
    group: str | None  # its memory cgroup (v1), or None
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def crash_dir(self) -> pathlib.Path:
        return self.dir / "crash"

    @property
    def ledger(self) -> pathlib.Path:
        return self.dir / "memory-ledger.json"

    def pids(self) -> set[int]:
        """Every process of this host: in its network namespace or its memory group."""
        out = subprocess.run(
            ["ip", "netns", "pids", self.netns], capture_output=True, text=True, check=False
        ).stdout
        pids = {int(p) for p in out.split()}
        if self.group is not None:
            pids |= _group_pids(self.group)
        return pids - {os.getpid()}


class Lab:
    """N hosts on this machine (see the module docstring). `names[0]` is meant for the
    scheduler; any host can run anything."""

    def __init__(self, names: list[str], root: pathlib.Path | str):
        self.run_id = f"{PREFIX}{os.getpid()}"
        self.bridge = f"{LINK_PREFIX}{os.getpid()}br"
        self.root = pathlib.Path(root)
        self.names = list(names)
        self.hosts: dict[str, Host] = {}
        self.subnet: ipaddress.IPv4Network | None = None
        self.timings: dict[str, float] = {}
        self.clusters = 0  # clusters started: each gets a store of its own
        self.clusters_up: list[float] = []  # seconds each took to start
        self.notes: list[str] = []  # figures a test measured, for the timings summary
        self._parent_group = _own_memory_group()

    # --- what the machine must offer ---------------------------------------------------

    @staticmethod
    def check() -> tuple[bool, str]:
        """(True, "") when a lab can be built here, else (False, what is missing)."""
        if os.geteuid() != 0:
            return False, "the multi-host lab needs root (network namespaces, a bridge)"
        for tool, package in (
            ("ip", "iproute2"),
            ("nsenter", "util-linux"),
            ("unshare", "util-linux"),
            ("hostname", "hostname"),
        ):
            if shutil.which(tool) is None:
                return False, f"no `{tool}` (Debian package {package})"
        probe = f"{LINK_PREFIX}{os.getpid()}pr"
        made = _ip("link", "add", probe, "type", "bridge", check=False)
        if made.returncode != 0:
            return False, f"cannot make a bridge: {made.stderr.strip()}"
        _ip("link", "del", probe, check=False)
        made = _ip("netns", "add", f"{PREFIX}{os.getpid()}-probe", check=False)
        if made.returncode != 0:
            return False, f"cannot make a network namespace: {made.stderr.strip()}"
        _ip("netns", "del", f"{PREFIX}{os.getpid()}-probe", check=False)
        return True, ""

    # --- up and down -------------------------------------------------------------------

    def start(self) -> None:
        t0 = time.monotonic()
        self.sweep()
        self.subnet = self._free_subnet()
        addresses = list(self.subnet.hosts())
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{addresses[0]}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, name in enumerate(self.names):
            self.hosts[name] = self._make_host(name, str(addresses[9 + i]))
        self.timings["network up"] = time.monotonic() - t0

    def _make_host(self, name: str, ip: str) -> Host:
        netns = f"{self.run_id}-{name}"
        port = f"{LINK_PREFIX}{os.getpid()}{name}"
        if len(port) + 1 > 15:  # the peer is port + "p"; Linux caps names at 15 bytes
            raise ValueError(f"host name {name!r} is too long for an interface name")
        directory = self.root / name
        (directory / "crash").mkdir(parents=True, exist_ok=True)
        (directory / "work").mkdir(exist_ok=True)
        group = None
        if self._parent_group is not None:
            group = os.path.join(self._parent_group, netns)
            os.mkdir(group)
        host = Host(name, netns, ip, port, directory, group)
        self.hosts[name] = host  # from here on, close() removes it
        _ip("netns", "add", netns)
        _ip("link", "add", port, "type", "veth", "peer", "name", port + "p")
        _ip("link", "set", port + "p", "netns", netns)
        _ip("link", "set", port, "master", self.bridge, "up")
        _ip("-n", netns, "link", "set", port + "p", "name", "eth0")
        _ip("-n", netns, "addr", "add", f"{ip}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        return host

    def _free_subnet(self) -> ipaddress.IPv4Network:
        used = []
        for line in _ip("-4", "-o", "addr", "show").stdout.splitlines():
            used.append(ipaddress.ip_interface(line.split()[3]).network)
        for line in _ip("-4", "route", "show").stdout.splitlines():
            dest = line.split()[0]
            if dest != "default":
                used.append(ipaddress.ip_network(dest, strict=False))
        start = os.getpid() % 256
        for k in range(256):
            net = ipaddress.ip_network(SUBNETS.format((start + k) % 256))
            if not any(net.overlaps(u) for u in used):
                return net
        raise RuntimeError("no free 10.213.N.0/24 subnet for the lab")

    def close(self) -> None:
        """Kill every process of every host; remove cgroups, namespaces, veths, the bridge.
        Safe to call twice, and after a `start()` that failed half-way."""
        t0 = time.monotonic()
        errors = []
        for host in self.hosts.values():
            try:
                self._kill(host)
            except Exception as e:  # noqa: BLE001 - go on removing the rest, then raise
                errors.append(f"{host.name}: {e!r}")
        for host in self.hosts.values():
            for proc in host.processes:
                with contextlib.suppress(Exception):
                    proc.wait(timeout=10)
            _ip("netns", "del", host.netns, check=False)  # takes its veth pair along
            _ip("link", "del", host.port, check=False)  # the pair, if it never moved
            if host.group is not None:
                try:
                    _remove_group(host.group)
                except RuntimeError as e:
                    errors.append(f"{host.name}: {e}")
        _ip("link", "del", self.bridge, check=False)
        self.hosts.clear()
        self.timings["teardown"] = time.monotonic() - t0
        if errors:
            raise RuntimeError("lab teardown left something behind: " + "; ".join(errors))

    @classmethod
    def sweep(cls) -> list[str]:
        """Remove what labs of dead test processes left (oomg-<pid>-* namespaces and
        cgroups, og<pid>* links); return their names. A live process's lab is left alone."""
        removed = []

        def dead(name: str, prefix: str) -> bool:
            digits = name[len(prefix) :].split("-", 1)[0]
            for end, c in enumerate(digits):
                if not c.isdigit():
                    digits = digits[:end]
                    break
            return digits.isdigit() and not _alive(int(digits))

        for line in _ip("netns", "list", check=False).stdout.splitlines():
            name = line.split()[0] if line.split() else ""
            if name.startswith(PREFIX) and dead(name, PREFIX):
                pids = subprocess.run(
                    ["ip", "netns", "pids", name], capture_output=True, text=True, check=False
                ).stdout.split()
                for pid in pids:
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), signal.SIGKILL)
                _ip("netns", "del", name, check=False)
                removed.append(name)
        for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
            name = line.split(":")[1].strip().split("@")[0]
            if name.startswith(LINK_PREFIX) and dead(name, LINK_PREFIX):
                _ip("link", "del", name, check=False)
                removed.append(name)
        parent = _own_memory_group()
        if parent is not None:
            for name in os.listdir(parent):
                path = os.path.join(parent, name)
                if name.startswith(PREFIX) and os.path.isdir(path) and dead(name, PREFIX):
                    for pid in _group_pids(path):
                        with contextlib.suppress(OSError):
                            os.kill(pid, signal.SIGKILL)
                    with contextlib.suppress(RuntimeError):
                        _remove_group(path)
                    removed.append(path)
        return removed

    # --- running things in a host ----------------------------------------------------

    def run(
        self, host: str, argv: list[str], *, env: Mapping[str, str] | None = None, log: str
    ) -> subprocess.Popen:
        """Start `argv` in `host` (its network namespace, hostname and memory group), its
        output to `<host dir>/<log>.log`, in a session of its own."""
        h = self.hosts[host]
        enter = f'echo $$ > "{h.group}/cgroup.procs" && ' if h.group is not None else ""
        script = enter + 'hostname "$0" && exec "$@"'
        cmd = [
            "nsenter",
            f"--net=/var/run/netns/{h.netns}",
            "--",
            "unshare",
            "--uts",
            "--",
            "sh",
            "-c",
            script,
            h.name,
            *argv,
        ]
        full_env = {**os.environ, **(env or {})}
        with open(h.dir / f"{log}.log", "ab") as out:
            proc = subprocess.Popen(
                cmd,
                env=full_env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=h.dir,
            )
        h.processes.append(proc)
        return proc

    def kill_host(self, *hosts: str) -> list[int]:
        """The hosts die with everything on them, as at a power cut: every process of every
        one of them is stopped (SIGSTOP) before any is killed (SIGKILL), so none sees
        another die and no nanny reports. Returns the PIDs."""
        return self._kill(*(self.hosts[h] for h in hosts))

    def _kill(self, *hosts: Host) -> list[int]:
        stopped: set[int] = set()
        for _ in range(20):  # until nothing new appears (a fork racing the first pass)
            new = set().union(*(h.pids() for h in hosts)) - stopped
            if not new:
                break
            for pid in new:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            stopped |= new
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for host in hosts:
            for proc in host.processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
            wait_for(lambda h=host: not h.pids(), 30, f"the processes of {host.name} to die")
        return sorted(stopped)

    def stop_host(self, host: str, sig: int = signal.SIGTERM) -> None:
        """Send `sig` to what the lab started in `host` (its `dask worker` or `dask
        scheduler`), as an orderly shutdown does (systemd, Kubernetes deleting a pod)."""
        for proc in self.hosts[host].processes:
            if proc.poll() is None:
                proc.send_signal(sig)

    def link_down(self, host: str) -> None:
        """Unplug the host's cable at the bridge: its packets are dropped silently, both
        ways (no reset, no ICMP), as in a network partition."""
        _ip("link", "set", self.hosts[host].port, "down")

    def link_up(self, host: str) -> None:
        _ip("link", "set", self.hosts[host].port, "up")

    # --- a Dask cluster across hosts -------------------------------------------------

    @contextlib.contextmanager
    def cluster(
        self,
        scheduler: str,
        workers: list[str],
        *,
        config: Mapping[str, Any] | None = None,
        scheduler_config: Mapping[str, Any] | None = None,
        worker_config: Mapping[str, Any] | None = None,
        memory_limit: str = "400MiB",
        nworkers: Mapping[str, int] | None = None,
        timeout: float = 180,
    ) -> Iterator[LabCluster]:
        """A scheduler with oomguard in `scheduler`, a nanny with oomguard in each of
        `workers` (`nworkers[host]` worker processes there, default 1, one thread each),
        a Client in the test process. Killed at exit, whatever happened."""
        from distributed import Client

        t0 = time.monotonic()
        s = self.hosts[scheduler]
        address = f"tcp://{s.ip}:{SCHEDULER_PORT}"
        common = {
            **_dask_env(config or {}),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
        }
        started: list[str] = [scheduler]
        self.clusters += 1
        sched = self.run(
            scheduler,
            [
                sys.executable,
                "-m",
                "dask",
                "scheduler",
                "--host",
                s.ip,
                "--port",
                str(SCHEDULER_PORT),
                "--dashboard-address",
                f"{s.ip}:{HTTP_PORT}",
                "--preload",
                "oomguard.scheduler_plugin",
            ],
            env={
                **common,
                **_dask_env(
                    {
                        "temporary-directory": str(s.dir / "work"),
                        "oomguard.scheduler.store": str(
                            s.dir / f"oomguard-{self.clusters}.sqlite3"
                        ),
                        **(scheduler_config or {}),
                    }
                ),
            },
            log="scheduler",
        )
        cluster = LabCluster(
            self,
            address,
            f"http://{s.ip}:{HTTP_PORT}",
            list(workers),
            common,
            dict(worker_config or {}),
            memory_limit,
        )
        try:
            nannies = {}
            for name in workers:
                started.append(name)
                nannies[name] = cluster.start_nanny(name, (nworkers or {}).get(name, 1))
            running = {scheduler: sched, **nannies}
            wait_for(
                lambda: self._alive(running) and _listening(s.ip, SCHEDULER_PORT),
                timeout,
                "the scheduler to listen",
            )
            cluster.client = Client(address, timeout=timeout, set_as_default=False)
            for name in workers:
                n = (nworkers or {}).get(name, 1)
                wait_for(
                    lambda name=name, n=n: self._alive(running) and len(cluster.on(name)) == n,
                    timeout,
                    f"{n} worker(s) on {name}",
                )
            cluster.started = time.monotonic() - t0
            self.clusters_up.append(cluster.started)
            yield cluster
        finally:
            if cluster.client is not None:
                with contextlib.suppress(Exception):
                    cluster.client.close(timeout=10)
            # Workers first: a worker that loses its scheduler closes itself and its nanny.
            self._kill(*(self.hosts[name] for name in reversed(started)))
            for name in started:
                self.hosts[name].processes.clear()

    def _alive(self, processes: Mapping[str, subprocess.Popen]) -> bool:
        """True while every process runs; otherwise fail with the dead one's log."""
        for host, proc in processes.items():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"a process of {host} exited ({proc.returncode}) while "
                    f"the cluster started:\n{self.logs(30)}"
                )
        return True

    def logs(self, lines: int = 40) -> str:
        """The last lines of every process's log, for a failing test's output."""
        out = []
        for host in self.hosts.values():
            for path in sorted(host.dir.glob("*.log")):
                text = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"==== {host.name}/{path.name}\n" + "\n".join(text))
        return "\n".join(out)


@dataclass
class LabCluster:
    """A running cluster of the lab: `client`, and helpers to find workers and metrics."""

    lab: Lab
    address: str
    http: str
    worker_hosts: list[str]
    env: dict[str, str]  # for every process: Dask config and PYTHONPATH
    worker_config: dict[str, Any]
    memory_limit: str
    client: Any = None
    started: float = 0.0

    def start_nanny(self, host: str, nworkers: int = 1) -> subprocess.Popen:
        """`dask worker` with oomguard's nanny preload in `host` (one nanny per worker
        process, as Dask runs them; names `host`, or `host-0`, `host-1`... for several).
        Also to bring a lost host back, as a supervisor would."""
        h = self.lab.hosts[host]
        return self.lab.run(
            host,
            [
                sys.executable,
                "-m",
                "dask",
                "worker",
                self.address,
                "--host",
                h.ip,
                "--name",
                host,
                "--nworkers",
                str(nworkers),
                "--nthreads",
                "1",
                "--memory-limit",
                self.memory_limit,
                "--no-dashboard",
                "--preload-nanny",
                "oomguard.worker_plugin",
                "--local-directory",
                str(h.dir / "work"),
            ],
            env={
                **self.env,
                **_dask_env(
                    {
                        "oomguard.worker.crash-dir": str(h.crash_dir),
                        "oomguard.worker.admission.ledger": str(h.ledger),
                        "temporary-directory": str(h.dir / "work"),
                        **self.worker_config,
                    }
                ),
            },
            log="nanny",
        )

    def ip(self, host: str) -> str:
        """The host's address: as `workers=[ip]` in submit/map, a restriction to whatever
        worker runs on that host now (also after a restart)."""
        return self.lab.hosts[host].ip

    def on(self, host: str) -> list[str]:
        """The addresses of the workers the scheduler has on `host` now."""
        return sorted(a for a, h in self.workers().items() if h == host)

    def worker(self, host: str, timeout: float = 120) -> str:
        """The address of the (first) worker on `host` (waits until one is there)."""
        return wait_for(lambda: next(iter(self.on(host)), None), timeout, f"a worker on {host}")

    def workers(self) -> dict[str, str]:
        """{worker address: host name} of the workers the scheduler has now."""
        by_ip = {h.ip: h.name for h in self.lab.hosts.values()}
        info = self.client.scheduler_info(n_workers=-1)["workers"]
        return {a: by_ip.get(w.get("host"), "?") for a, w in info.items()}

    def metrics(self) -> dict[tuple[str, frozenset], float]:
        """The scheduler's /metrics: {(sample name, frozenset(labels.items())): value}."""
        from prometheus_client.parser import text_string_to_metric_families

        # No proxy: the request must stay on the lab's bridge whatever the environment says.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{self.http}/metrics", timeout=30) as r:
            text = r.read().decode()
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def metric(self, name: str, **labels: str) -> float | None:
        """The sum of the samples of `name` whose labels include `labels` (None: none);
        a label not given is summed over (the deaths' `killer`, say)."""
        want = set(labels.items())
        found = [v for (n, have), v in self.metrics().items() if n == name and want <= have]
        return sum(found) if found else None

    def executing(self) -> dict[str, list[str]]:
        """{worker address: keys the scheduler believes are executing there}: what its last
        heartbeat said, which is what oomguard blames when a worker dies without a report."""

        def read(dask_scheduler):
            return {
                a: sorted(str(ts.key) for ts in ws.executing)
                for a, ws in dask_scheduler.workers.items()
            }

        return self.client.run_on_scheduler(read)

    def stats(self) -> dict:
        """oomguard's counters on the scheduler (deaths decided, pending, held, ...)."""
        return self.client.run_on_scheduler(
            lambda dask_scheduler: dask_scheduler.plugins["oomguard"].metrics_snapshot()
        )

    def executing_on(self, addresses: list[str], n: int = 1, timeout: float = 120) -> dict:
        """Wait until the scheduler's view (the last heartbeats) has `n` tasks executing on
        each of `addresses`; return {address: [keys]}."""

        def look():
            seen = self.executing()
            return all(len(seen.get(a, ())) == n for a in addresses) and {
                a: seen[a] for a in addresses
            }

        return wait_for(look, timeout, f"{n} task(s) executing on each of {addresses}")
