"""Host-wide memory admission with real processes: a real memory cgroup and kernel OOM
kills, a SIGKILLed lease holder, and Dask workers waiting for memory.

The cgroup tests need root and a writable cgroup v1/v2 memory hierarchy (skipped otherwise;
fail under OOMGUARD_STRICT=1). Every group is removed in a `finally`.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time

import dask
import pytest
from distributed import Client, LocalCluster

import oomguard
from capabilities import require
from cluster_helpers import wait_installed
from oomguard._admission.ledger import HostLedger
from oomguard._host.cgroup import ChildGroup, can_create_child

pytestmark = pytest.mark.timeout(240)

MiB = 2**20
LIMIT = 1024 * MiB  # the parent group the three processes share
NEED = int(0.4 * LIMIT)

# One task: wait for a go byte (so it is in the group before it allocates), take a lease
# when told to, touch NEED bytes, hold them, and say what happened as one JSON line.
TASK = """
import json, sys, time
ledger_path, cgroup, need, admit, hold, key = sys.argv[1:7]
need, admit, hold = int(need), admit == "1", float(hold)
from oomguard._admission.host import CgroupAvailable
from oomguard._admission.ledger import HostLedger
ledger = HostLedger(ledger_path, floor=64 * 2**20, available=CgroupAvailable(cgroup))
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.buffer.read(1)
waited = 0.0
began = time.time()
if admit:
    adm, waited = ledger.acquire(key, need, timeout=60, poll=0.05)
start = time.time()
block = bytearray(b"x") * need
time.sleep(hold)
stop = time.time()
del block
if admit:
    ledger.release(key)
print(json.dumps({"key": key, "waited": waited, "start": start, "stop": stop}), flush=True)
"""


@pytest.fixture
def group():
    require(os.geteuid() == 0, "not root: cannot create memory cgroups")
    ok, why = can_create_child()
    require(ok, f"memory cgroups cannot be made here: {why}")
    g = ChildGroup.create(f"oomguard-admission-{os.getpid()}-{secrets.token_hex(3)}", LIMIT)
    try:
        yield g
    finally:
        assert g.remove(timeout=10.0), f"could not remove {g.path}"


def _run_three(group, ledger_path, admit):
    procs = []
    try:
        for i in range(3):
            p = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    TASK,
                    ledger_path,
                    group.path,
                    str(NEED),
                    "1" if admit else "0",
                    "1.5",
                    f"task-{i}",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            procs.append(p)
            assert p.stdout.readline() == b"ready\n"
            group.add_pid(p.pid)
        for p in procs:
            p.stdin.write(b"g")
            p.stdin.flush()
        results = []
        for p in procs:
            out, _ = p.communicate(timeout=120)
            line = out.decode().strip().splitlines()
            results.append((p.returncode, json.loads(line[-1]) if line else None))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_without_admission_the_kernel_kills_one(group, tmp_path):
    before = group.counters().oom_kill
    results = _run_three(group, str(tmp_path / "ledger.json"), admit=False)
    codes = [code for code, _ in results]
    assert -signal.SIGKILL in codes, codes
    assert group.counters().oom_kill > before


def test_with_admission_all_finish_and_the_waits_are_recorded(group, tmp_path):
    before = group.counters().oom_kill
    results = _run_three(group, str(tmp_path / "ledger.json"), admit=True)
    assert [code for code, _ in results] == [0, 0, 0], results
    assert group.counters().oom_kill == before
    runs = [r for _, r in results]
    # At most two ran at once (0.8 of the limit); the third waited for one to finish.
    waited = [r for r in runs if r["waited"] > 0.5]
    assert len(waited) >= 1, runs
    for r in waited:
        assert any(o["stop"] <= r["start"] + 0.5 for o in runs if o is not r), runs
    assert HostLedger(str(tmp_path / "ledger.json")).leases() == []


HOLDER = """
import sys, time
from oomguard._admission.ledger import HostLedger
ledger = HostLedger(sys.argv[1], available=lambda: 2**30)
assert ledger.try_acquire("holder", 2**30).granted
print("held", flush=True)
time.sleep(120)
"""

WAITER = """
import json, sys, time
from oomguard._admission.ledger import HostLedger
ledger = HostLedger(sys.argv[1], available=lambda: 2**30)
print("waiting", flush=True)
adm, waited = ledger.acquire("waiter", 2**29, timeout=60, poll=0.05)
print(json.dumps({"waited": waited, "others": adm.others, "at": time.time()}), flush=True)
"""


def test_a_sigkilled_holders_lease_is_reclaimed(tmp_path):
    path = str(tmp_path / "ledger.json")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, path], stdout=subprocess.PIPE)
    waiter = None
    try:
        assert holder.stdout.readline() == b"held\n"
        waiter = subprocess.Popen([sys.executable, "-c", WAITER, path], stdout=subprocess.PIPE)
        assert waiter.stdout.readline() == b"waiting\n"
        time.sleep(1.0)
        assert waiter.poll() is None, "the waiter did not wait"
        killed_at = time.time()
        os.kill(holder.pid, signal.SIGKILL)
        out, _ = waiter.communicate(timeout=30)
        got = json.loads(out)
        assert got["waited"] >= 1.0
        assert got["at"] - killed_at < 2.0  # proceeded as soon as the lease was reclaimed
        assert got["others"] == 0  # the dead holder's lease is gone: nothing else holds one
        assert waiter.returncode == 0
    finally:
        for p in (holder, waiter):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


# ---------------------------------------------------------------- Dask workers


def needs_a_lot(x):
    return x


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    ledger = str(tmp_path_factory.mktemp("admission") / "ledger.json")
    with dask.config.set(
        {
            "distributed.nanny.preload": ["oomguard.worker_plugin"],
            "oomguard.worker.cgroup-limit": "false",
            "oomguard.worker.admission.ledger": ledger,
            "oomguard.worker.admission.max-wait": "4s",
            "oomguard.worker.admission.floor": "0",
        }
    ):
        with (
            LocalCluster(
                n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
            ) as cluster,
            Client(cluster) as client,
        ):
            wait_installed(client, 1, timeout=30)
            yield client, ledger


def _hold_everything(ledger_path):
    # This test process holds a lease of 1 GiB it has not spent, so a worker's task needing
    # all of the host's available memory but 512 MiB cannot start until it is released.
    ledger = HostLedger(ledger_path)
    assert ledger.try_acquire("test-holder", 2**30).granted
    return ledger


def _nearly_everything() -> int:
    return oomguard._admission.host.host_available() - 2**29


def test_a_dask_task_waits_for_memory_and_the_wait_is_visible(dask_cluster):
    client, ledger_path = dask_cluster
    ledger = _hold_everything(ledger_path)
    everything = _nearly_everything()
    try:
        with oomguard.memory(everything):
            fut = client.submit(needs_a_lot, 1, key="needs-a-lot-1")
        time.sleep(1.5)
        assert fut.status == "pending"  # waiting for memory, not running
        assert any(k == "needs-a-lot-1" for _, k, _ in ledger.leases()) is False
    finally:
        ledger.release("test-holder")
    assert fut.result(timeout=30) == 1
    events = [msg for _, msg in client.get_events("oomguard-admission")]
    mine = [e for e in events if e["key"] == "needs-a-lot-1"]
    assert mine and mine[0]["outcome"] == "granted" and mine[0]["waited"] >= 1.0
    assert mine[0]["need"] == everything
    stats = client.run(lambda dask_worker: dask_worker.plugins["oomguard-worker"]._admission.stats)
    (st,) = stats.values()
    assert st["waits"] >= 1 and st["leases"] >= 1
    # The Fine Performance Metrics dashboard gets the wait as an activity of the prefix.
    digests = client.run(
        lambda dask_worker: {
            str(k): v for k, v in dask_worker.digests_total.items() if "oomguard" in str(k)
        }
    )
    (d,) = digests.values()
    assert any("needs-a-lot" in k and "oomguard-admission-wait" in k for k in d), d
    metrics = client.run(
        lambda dask_worker: __import__("prometheus_client").generate_latest().decode()
    )
    (text,) = metrics.values()
    assert "oomguard_admission_waits_total" in text


def test_a_wait_past_max_wait_errs_naming_need_and_free(dask_cluster):
    client, ledger_path = dask_cluster
    ledger = _hold_everything(ledger_path)
    everything = _nearly_everything()
    try:
        with oomguard.memory(everything):
            fut = client.submit(needs_a_lot, 2, key="needs-a-lot-2")
        with pytest.raises(TimeoutError) as info:
            fut.result(timeout=60)
    finally:
        ledger.release("test-holder")
    msg = str(info.value)
    assert "needs-a-lot-2" in msg and "waited" in msg and "was free" in msg
    assert oomguard._units.format_bytes(everything) in msg


def test_tasks_without_a_need_never_touch_the_ledger(dask_cluster):
    client, ledger_path = dask_cluster
    ledger = _hold_everything(ledger_path)
    try:
        assert client.submit(needs_a_lot, 3, key="plain-3").result(timeout=30) == 3
    finally:
        ledger.release("test-holder")
