"""Run the chart's rendered scheduler and worker containers as local processes.

The commands, args and env come from the manifests Helm renders; only what Kubernetes would
supply is filled in (fieldRef/resourceFieldRef env, $(VAR) expansion) and the in-cluster
service name and ports become 127.0.0.1 and port 0: the scheduler binds ports no other
process holds, and writes the ones it got to a scheduler file, which the worker and the
tests read. Then a worker is SIGKILLed and oomguard must report it, and the chart's own
`helm test` script must pass.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from dask.utils import parse_bytes

from chartlib import NAMESPACE, RELEASE, by_kind, container, manifests, render

SCHED, WORKER = f"{RELEASE}-oomguard-scheduler", f"{RELEASE}-oomguard-worker"
BIN = Path(sys.executable).parent

VALUES = {
    # Not in a cluster: no pod lookup (it needs the Kubernetes API).
    "kubernetesLookup": {"enabled": False},
    "worker": {"replicas": 1, "nworkers": 1, "nthreads": 1, "memoryLimit": "2Gi"},
    "oomguard": {"scheduler": {"reportGraceTimeout": "3s", "maxShardInfraFailures": 7}},
}


def kube_env(c: dict, pod_name: str, tmp: Path) -> dict[str, str]:
    """The container's env as the kubelet would set it, on top of this process's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    limits = c.get("resources", {}).get("limits", {})
    for e in c.get("env", []):
        if "value" in e:
            value = e["value"]
        else:
            ref = e["valueFrom"]
            if "fieldRef" in ref:
                value = {"metadata.name": pod_name, "metadata.namespace": NAMESPACE}[
                    ref["fieldRef"]["fieldPath"]
                ]
            else:
                value = str(parse_bytes(limits[ref["resourceFieldRef"]["resource"].split(".")[1]]))
        env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value)
    env.pop("EXTRA_PIP_PACKAGES", None)  # the image's entrypoint would pip-install these
    env["DASK_TEMPORARY_DIRECTORY"] = str(tmp)
    env["DASK_OOMGUARD__WORKER__CRASH_DIR"] = str(tmp / "crash")
    return env


def kube_args(c: dict, env: dict[str, str], subs: dict[str, str]) -> list[str]:
    """The container's args with $(VAR) expanded as Kubernetes does, then localised."""
    args = [
        re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in c["args"]
    ]
    args = [subs.get(a, a) for a in args]
    assert args[0] == "dask"
    return [str(BIN / "dask"), *args[1:]]


def scheduler_file(path: Path, proc: subprocess.Popen, timeout: float = 60) -> dict:
    """What the scheduler wrote to its scheduler file once it listens: its address, and
    in `services` the port its dashboard got."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{proc.args[:3]} exited with {proc.returncode} before listening")
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):  # not written yet, or half written
            time.sleep(0.2)
    pytest.fail(f"no scheduler file {path} within {timeout}s")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("chart-smoke")
    objs = by_kind(manifests(render(VALUES)))
    sched_c = container(objs[("Deployment", SCHED)])
    worker_c = container(objs[("Deployment", WORKER)])
    procs: list[subprocess.Popen] = []
    logs = []

    def launch(name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(tmp_path / f"{name}.log", "wb")
        logs.append(log)
        procs.append(
            subprocess.Popen(
                args,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=tmp_path,
                start_new_session=True,
            )  # fmt: skip
        )
        return procs[-1]

    try:
        sched_env = kube_env(sched_c, f"{SCHED}-5d8c7b9f4-abcde", tmp_path)
        sched_file = tmp_path / "scheduler.json"
        sched_args = kube_args(sched_c, sched_env, {"8786": "0", ":8787": "127.0.0.1:0"})
        sched_args += ["--host", "127.0.0.1", "--scheduler-file", str(sched_file)]
        identity = scheduler_file(sched_file, launch("scheduler", sched_args, sched_env))
        address = identity["address"]
        worker_env = kube_env(worker_c, f"{WORKER}-7c9f6d8b5d-x2k4q", tmp_path)
        worker_args = kube_args(worker_c, worker_env, {f"tcp://{SCHED}:8786": address})
        worker_args += ["--host", "127.0.0.1"]
        launch("worker", worker_args, worker_env)
        yield {
            "port": int(address.rsplit(":", 1)[1]),
            "dashboard": identity["services"]["dashboard"],
            "worker_args": worker_args,
            "worker_env": worker_env,
            "objs": objs,
            "tmp": tmp_path,
        }
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        for log in logs:
            log.close()


def logs(tmp: Path) -> str:
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(tmp.glob("*.log"))
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_rendered_containers_run_oomguard_and_report_a_sigkill(cluster):
    from distributed import Client

    import oomguard

    args = cluster["worker_args"]
    # The rendered worker command, localised: $(POD_NAME) expanded, memory wired from the limit.
    assert args[args.index("--name") + 1] == f"{WORKER}-7c9f6d8b5d-x2k4q"
    assert args[args.index("--memory-limit") + 1] == str(2 * 2**30)
    assert cluster["worker_env"]["OOMGUARD_CONTAINER_MEMORY_LIMIT"] == str(2 * 2**30)

    with Client(f"tcp://127.0.0.1:{cluster['port']}", timeout=60) as client:
        try:
            client.wait_for_workers(1, timeout=60)
        except Exception:
            pytest.fail("no worker joined:\n" + logs(cluster["tmp"]))
        assert client.run_on_scheduler(lambda dask_scheduler: "oomguard" in dask_scheduler.plugins)
        assert all(
            client.run(lambda dask_worker: "oomguard-worker" in dask_worker.plugins).values()
        )
        # The DASK_OOMGUARD__ env the chart generated reached oomguard's config.
        assert (
            client.run_on_scheduler(
                lambda: __import__("dask").config.get(
                    "oomguard.scheduler.max-shard-infra-failures"
                )
            )
            == 7
        )
        (worker,) = client.scheduler_info()["workers"]
        assert client.scheduler_info()["workers"][worker]["memory_limit"] == 2 * 2**30

        future = client.submit(time.sleep, 60, key="smoke-sleep", pure=False)
        deadline = time.monotonic() + 30
        while not client.processing().get(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # let the flight recorder see the task executing
        (pid,) = client.run(os.getpid).values()
        os.kill(pid, signal.SIGKILL)

        failures = oomguard.Failures(client)
        events = []
        deadline = time.monotonic() + 20
        while not events and time.monotonic() < deadline:
            time.sleep(0.5)
            events = failures.events(cause="sigkill")
        assert events, "no sigkill event within 20 s:\n" + logs(cluster["tmp"])
        assert events[0].kind == "infra"
        future.cancel()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_metrics_endpoint_serves_oomguard_metrics(cluster):
    url = f"http://127.0.0.1:{cluster['dashboard']}/metrics"
    body = urllib.request.urlopen(url, timeout=10).read().decode()
    assert "oomguard_" in body, f"no oomguard_ metric at {url} (is the collector registered?)"
    assert re.search(r'oomguard_failures_total\{[^}]*cause="sigkill"[^}]*\} [1-9]', body)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_dashboard_page_from_notes_is_served(cluster):
    url = f"http://127.0.0.1:{cluster['dashboard']}/individual-oomguard"
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_charts_helm_test_pod_passes_against_it(cluster):
    pod = cluster["objs"][("Pod", f"{RELEASE}-oomguard-test")]
    command = pod["spec"]["containers"][0]["command"]
    assert command[:2] == ["python", "-c"]
    script = (
        command[2]
        .replace(f'"{SCHED}"', '"127.0.0.1"')
        .replace("8786", str(cluster["port"]))
        .replace("8787", str(cluster["dashboard"]))
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert "scheduler answers; /metrics has oomguard_ metrics" in done.stdout
