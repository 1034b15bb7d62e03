"""cgroup v2 for real: one VM boot runs `scenarios.py` (see there for the layouts), and each
test here asserts the exact cause and evidence `oomguard.Failures` recorded in one layout.

The host kernel has cgroup v1 only (its live tests are in tests/cluster); these need
Debian's qemu-system-x86 and linux-image-amd64 and PyPI's virtme-ng (`./dev` installs them).
"""

from __future__ import annotations

import os
import sys

import pytest

from capabilities import require

sys.path.insert(0, os.path.dirname(__file__))
import vm  # noqa: E402

from conftest import ARTIFACTS, KERNEL_TIMINGS  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]
MiB = 2**20


@pytest.fixture(scope="module")
def results():
    why = vm.missing()
    require(not why, why)
    ARTIFACTS.mkdir(exist_ok=True)
    out, seconds = vm.run(log_path=ARTIFACTS / "kernel-vm.log")
    KERNEL_TIMINGS.append(f"{len(out)} scenarios in one boot: {seconds:.0f} s")
    KERNEL_TIMINGS.extend(f"  {name}: {r.get('seconds')} s" for name, r in out.items())
    return out


def scenario(results, name: str) -> dict:
    result = results.get(name)
    assert result is not None, f"scenario {name} did not run (see artifacts/kernel-vm.log)"
    assert "error" not in result, result["error"]
    return result


def only(events: list[dict]) -> dict:
    assert len(events) == 1, [(e["cause"], e["shard"]) for e in events]
    return events[0]


def test_delegated_subtree_gives_each_worker_its_own_group(results):
    r = scenario(results, "delegated")
    facts, ev = r["facts"], None
    workers = [c for c in facts["children"] if c.startswith("oomguard-worker-")]
    # v2's no-internal-processes rule: the worker groups are siblings of the nanny's leaf.
    assert facts["children"] == sorted(["nanny", *workers]) and len(workers) == 1
    assert facts["worker_group_max"] == 300 * MiB  # the worker's memory_limit
    assert facts["worker_in_group"] and facts["nanny_group_procs"] >= 1
    event = only(r["events"])
    ev = event["evidence"]
    assert event["cause"] == "oom_kill", ev
    assert ev["cgroup_version"] == 2
    assert ev["oom_kill_source"] == "kernel cgroup counter memory.events"
    assert (ev["oom_kill_delta"], ev["oom_kill_since_reading"]) == (1, 1)
    assert ev["peak_source"] == "kernel cgroup counter memory.peak"
    assert ev["peak_scope"] == "worker"
    assert 250 * MiB <= ev["peak_bytes"] <= 300 * MiB + 4 * MiB
    assert ev["limit_bytes"] == 300 * MiB
    # Root in the VM may read /dev/kmsg: the kernel log names the worker's PID.
    assert ev["kernel_log_oom"] is True and ev["oom_confirmed"] is True
    assert facts["group_removed"] is True


def test_delegated_doctor(results):
    doc = scenario(results, "delegated")["doctor"]
    assert doc.get("layout") == "v2-delegated", doc
    checks = {c["name"]: c for c in doc["checks"]}
    assert checks["cgroup.per-worker"]["status"] == "ok", checks


def test_container_attributes_each_death_to_the_right_worker(results):
    r = scenario(results, "container")
    facts = r["facts"]
    # A task's subprocess was OOM-killed first, then worker A, then B was SIGKILLed.
    assert facts["subprocess_returncode"] == -9
    assert (facts["oom_kill_at_start"], facts["oom_kill_after_subprocess"]) == (0, 1)
    assert (facts["oom_kill_after_a"], facts["oom_kill_after_b"]) == (2, 2)

    a = only(r["events_a"])
    ev = a["evidence"]
    assert a["cause"] == "oom_kill", ev
    assert ev["peak_scope"] == "shared"
    assert (ev["oom_kill_last_reading"], ev["oom_kill_since_reading"]) == (1, 1)
    assert ev["group_others"] >= 1 and ev["group_others_gone"] == 0
    # No CAP_SYSLOG in the container: the conclusion rests on the reading alone.
    assert "kernel_log_oom" not in ev
    assert ev["oom_attribution"] == (
        "counted in its shared group, and every other process there still runs"
    )
    assert ev["limit_bytes"] == 600 * MiB

    b = only(r["events_b"])
    ev = b["evidence"]
    assert b["cause"] == "sigkill", ev  # judged against its start, this was oom_kill
    assert (ev["oom_kill_delta"], ev["oom_kill_since_reading"]) == (2, 0)
    assert ev["rule"].startswith("R8")


def test_container_doctor(results):
    doc = scenario(results, "container")["doctor"]
    assert doc.get("layout") == "v2-shared", doc
    checks = {c["name"]: c for c in doc["checks"]}
    assert checks["cgroup.per-worker"]["status"] != "ok"
    assert checks["kernel-log"]["status"] != "ok"


def test_oom_group_kills_the_nanny_too_and_the_worker_is_lost(results):
    r = scenario(results, "oomgroup")
    event = only(r["events"])
    assert event["cause"] == "worker_lost", event["evidence"]
    assert r["facts"]["nanny_returncode"] == -9
    assert r["facts"]["memory_events"]["oom_group_kill"] >= 1


def test_oom_group_doctor(results):
    doc = scenario(results, "oomgroup")["doctor"]
    checks = {c["name"]: c for c in doc["checks"]}
    assert checks["cgroup.oom-group"]["status"] == "warn", checks
