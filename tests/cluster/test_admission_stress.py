"""The host ledger under real concurrency: several processes in one real memory cgroup take
leases, allocate what they leased for real, and the kernel is the judge.

Four processes each take 13 leases (52 in all) of 380-500 MiB in a 1 GiB group with a
64 MiB floor: two leases at once fit barely or not at all, so grants are decided at the
boundary, from RSS readings of processes that are allocating at that moment. Half the leases
leave memory behind for up to 1.2 s after they end, as Dask tasks do: a part kept as the
task's result, or all of it, freed late (held by a reference cycle until the GC runs). No
lease claims that memory; only the group's usage shows it, and a grant made without looking
(the old cold start: "no other lease, so go") runs into it. A grant that counted on memory
that was not there ends in a kernel OOM kill, so the assertion is the kernel's ``oom_kill``
counter: zero. (Not ``memory.failcnt``: on Linux 6.18, v1, it stays 0 through OOM kills.)

Needs root and a writable memory cgroup (skipped otherwise; fails under OOMGUARD_STRICT=1).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from _memgroup import MiB, memory_group, mib
from oomguard._admission.ledger import HostLedger

pytestmark = pytest.mark.timeout(300)

LIMIT = 1024 * MiB
FLOOR = 64 * MiB
PROCESSES = 4
LEASES_EACH = 13
NEED_MIB = (380, 500)  # two at once: 760-1000 MiB, beside a 64 MiB floor in 1 GiB
# What becomes of a lease's memory: freed before the release; a part kept as the task's
# result; or all of it freed late.
FATES = (0.5, 0.25, 0.25)  # freed, result, late
KEEP_MIB = (120, 260)  # a result
LINGER_S = (0.4, 1.2)  # how long a result or a late free outlives the lease
HOLD_S = (0.15, 0.4)
IDLE_S = (0.0, 0.3)  # between two leases of one process
MARGIN = 8 * MiB  # a task allocates a little less than its need (Python's own overhead)

# One worker-like process: take a lease, allocate for real (every page written, in a few
# steps as a load would), hold, free, release; now and then some or all of the memory is
# freed only after the release. Waits for a go byte: it is in the group before it allocates.
CHILD = r"""
import json, random, sys, threading, time
from oomguard._admission.host import CgroupAvailable
from oomguard._admission.ledger import HostLedger

MiB = 2**20
cfg = json.loads(sys.argv[1])
ledger = HostLedger(cfg["ledger"], floor=cfg["floor"], available=CgroupAvailable(cfg["group"]))
rng = random.Random(cfg["seed"])
left_behind = {}  # memory that outlived its lease; a timer drops each


def allocate(n, parts):
    blocks = []
    for i in range(parts):
        size = n // parts if i < parts - 1 else n - (n // parts) * (parts - 1)
        block = bytearray(size)
        block[::4096] = b"\x01" * len(range(0, size, 4096))
        blocks.append(block)
        time.sleep(0.01)
    return blocks


print("ready", flush=True)
sys.stdin.buffer.read(1)
leases = []
for i in range(cfg["leases"]):
    key = f"{cfg['name']}-{i}"
    need = rng.randint(*cfg["need_mib"]) * MiB
    fate = rng.choices(["freed", "result", "late"], cfg["fates"])[0]
    keep = rng.randint(*cfg["keep_mib"]) * MiB if fate == "result" else 0
    refused = []
    adm, waited = ledger.acquire(key, need, timeout=cfg["max_wait"], poll=0.02,
                                 on_wait=refused.append)
    granted = time.time()
    result = allocate(keep, 2) if keep else []
    scratch = allocate(need - cfg["margin"] - keep, 4)
    time.sleep(rng.uniform(*cfg["hold_s"]))
    if fate == "late":
        left_behind[key] = scratch
    elif fate == "result":
        left_behind[key] = result
    del scratch, result
    released = time.time()  # [granted, released] lies within the lease: no false overlap
    ledger.release(key)
    if fate != "freed":
        threading.Timer(rng.uniform(*cfg["linger_s"]), left_behind.pop, (key, None)).start()
    leases.append({"key": key, "need": need, "fate": fate, "cold": adm.cold,
                   "waited": waited if refused else 0.0, "granted": granted,
                   "released": released})
    time.sleep(rng.uniform(*cfg["idle_s"]))
print(json.dumps(leases), flush=True)
"""


def _most_at_once(leases: list[dict]) -> int:
    edges = sorted([(le["granted"], 1) for le in leases] + [(le["released"], -1) for le in leases])
    most = now = 0
    for _, step in edges:  # a release sorts before a grant at the same instant
        now += step
        most = max(most, now)
    return most


def test_concurrent_leases_never_overcommit_a_real_memory_group(
    tmp_path, artifacts_dir, record_property, admission_figures
):
    ledger_path = str(tmp_path / "ledger.json")
    with memory_group("admission-stress", LIMIT) as group:
        procs: list[subprocess.Popen] = []
        try:
            for i in range(PROCESSES):
                cfg = {
                    "ledger": ledger_path,
                    "group": group.path,
                    "floor": FLOOR,
                    "name": f"p{i}",
                    "seed": 16_000 + i,
                    "leases": LEASES_EACH,
                    "need_mib": NEED_MIB,
                    "fates": FATES,
                    "keep_mib": KEEP_MIB,
                    "linger_s": LINGER_S,
                    "hold_s": HOLD_S,
                    "idle_s": IDLE_S,
                    "margin": MARGIN,
                    "max_wait": 90,
                }
                p = subprocess.Popen(
                    [sys.executable, "-c", CHILD, json.dumps(cfg)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
                procs.append(p)
                assert p.stdout.readline() == b"ready\n", p.stderr.read().decode()[-2000:]
                group.add_pid(p.pid)  # after its imports: only its leases' memory is charged
            before = group.counters()
            for p in procs:
                p.stdin.write(b"g")
                p.stdin.flush()
            outcomes = []
            for p in procs:
                out, err = p.communicate(timeout=240)
                lines = out.decode().strip().splitlines()
                outcomes.append(
                    (p.returncode, json.loads(lines[-1]) if lines else [], err.decode()[-1500:])
                )
            after = group.counters()
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()

    leases = [le for _, got, _ in outcomes for le in got]
    waits = [le["waited"] for le in leases if le["waited"] > 0]
    figures = {
        "processes": PROCESSES,
        "leases_granted": len(leases),
        "waits": len(waits),
        "longest_wait_s": round(max(waits, default=0.0), 2),
        "total_wait_s": round(sum(waits), 1),
        "cold_grants": sum(le["cold"] for le in leases),
        "outlived": sum(1 for le in leases if le["fate"] != "freed"),
        "most_leases_at_once": _most_at_once(leases),
        "peak_usage": after.peak,
        "limit": LIMIT,
        "failcnt": None if after.failcnt is None else after.failcnt - (before.failcnt or 0),
        "oom_kill": None if after.oom_kill is None else after.oom_kill - (before.oom_kill or 0),
        "exit_codes": [code for code, _, _ in outcomes],
    }
    line = (
        f"admission stress: {figures['leases_granted']} leases granted to {PROCESSES} "
        f"processes, {figures['waits']} waited (longest {figures['longest_wait_s']} s, "
        f"{figures['total_wait_s']} s in all), {figures['cold_grants']} cold, at most "
        f"{figures['most_leases_at_once']} at once; peak {mib(after.peak)} of {mib(LIMIT)}; "
        f"kernel OOM kills {figures['oom_kill']}"
    )
    print(line)
    admission_figures.append(line)
    for name in ("leases_granted", "waits", "longest_wait_s", "peak_usage", "oom_kill"):
        record_property(f"admission_stress_{name}", figures[name])
    (artifacts_dir / "admission-stress.json").write_text(json.dumps(figures, indent=1))

    assert after.oom_kill is not None, f"no oom_kill counter in {group.path}: {after.missing}"
    assert figures["oom_kill"] == 0, f"the kernel OOM-killed in the group: {line}"
    stderr = "\n".join(err for code, _, err in outcomes if code != 0)
    assert figures["exit_codes"] == [0] * PROCESSES, f"{line}\n{stderr}"
    assert figures["leases_granted"] == PROCESSES * LEASES_EACH, line
    assert HostLedger(ledger_path).leases() == []
    # The run was at the boundary: leases had to wait, and some ran side by side.
    assert figures["waits"] > 0 and figures["most_leases_at_once"] >= 2, line
