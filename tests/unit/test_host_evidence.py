"""The host's side of a death's evidence (issue 26): host memory and PSI, the userspace
killers by process name with earlyoom's thresholds, systemd-oomd's xattrs, SLURM's job id.

Fixture trees under tmp_path stand in for /proc; the xattr tests use a real cgroup
directory made by the test (skipped, via require(), where none can be made).
"""

from __future__ import annotations

import doctest
import os
import subprocess
import sys

import pytest

from capabilities import require
from oomguard._host import oom_killers as _killers
from oomguard._host import readings as _host
from oomguard._host.cgroup import can_create_child, detect

GiB = 2**30
TOTAL = 16 * GiB  # MemTotal of the fixture host
MEMINFO = b"MemTotal:       16777216 kB\nMemFree:  1000 kB\nMemAvailable:    524288 kB\n"
PSI = (
    b"some avg10=12.50 avg60=3.00 avg300=0.50 total=123\n"
    b"full avg10=4.25 avg60=1.00 avg300=0.10 total=45\n"
)


@pytest.mark.parametrize("module", [_host, _killers])
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def _proc(tmp_path, pid, comm, argv, environ=b""):
    d = tmp_path / "proc" / str(pid)
    d.mkdir(parents=True)
    (d / "comm").write_bytes(comm + b"\n")
    (d / "cmdline").write_bytes(b"\0".join(argv) + b"\0")
    (d / "environ").write_bytes(environ)
    return d


def test_host_reading_from_meminfo_and_psi(tmp_path):
    (tmp_path / "proc" / "pressure").mkdir(parents=True)
    (tmp_path / "proc" / "meminfo").write_bytes(MEMINFO + b"Buffers: 1 kB\n" * 200)
    (tmp_path / "proc" / "pressure" / "memory").write_bytes(PSI)
    r = _host.host_reading(str(tmp_path))
    assert (r["total"], r["available"]) == (TOTAL, 512 * 2**20)
    assert (r["psi_some10"], r["psi_full10"]) == (12.5, 4.25)
    assert isinstance(r["time"], float)


def test_host_reading_without_psi_and_with_garbage(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_bytes(b"MemTotal: lots kB\nMemAvailable: 7 kB\n")
    r = _host.host_reading(str(tmp_path))
    assert r["total"] is None and r["available"] == 7 * 1024
    assert r["psi_some10"] is None and r["psi_full10"] is None


def test_host_meter_reads_this_host_again_and_again():
    with _host.HostMeter() as meter:
        first, second = meter.read(), meter.read()
    assert first["total"] == second["total"] > 0
    assert 0 < second["available"] <= second["total"]
    if os.path.exists("/proc/pressure/memory"):
        assert isinstance(second["psi_some10"], float)


# earlyoom 1.7's own arithmetic (main.c, msg.c parse_term_kill_tuple), on a 16 GiB host.
EARLYOOM_CASES = [
    ([], 10.0, 5.0),  # its defaults
    (["-m", "20"], 20.0, 10.0),  # kill defaults to half of term
    (["-m", "15,3"], 15.0, 3.0),
    (["-m", "4,6"], 6.0, 6.0),  # term below kill: raised to kill
    (["-m15"], 15.0, 7.5),  # attached argument
    (["-dm", "15"], 15.0, 7.5),  # after a flag in one word
    (["-M", "1677721"], 10.0, 5.0),  # KiB: 1677721.6 KiB is 10 %
    (["-M", "838860,419430"], 5.0, 2.5),
    (["-m", "3", "-M", "1677721"], 3.0, 1.5),  # both: the lower of each
    (["-M", "838860", "-m", "20,1"], 5.0, 1.0),
    (["-r", "0", "--prefer", "python", "-M", "838860"], 5.0, 2.5),
    (["--avoid=sshd", "-s", "100,100", "-m", "8"], 8.0, 4.0),
    (["-m", "100"], 10.0, 5.0),  # refused by earlyoom (limit 99): not taken
    (["-m", "ten"], 10.0, 5.0),  # trailing garbage: refused
]


@pytest.mark.parametrize("argv, term, kill", EARLYOOM_CASES)
def test_earlyoom_thresholds(argv, term, kill):
    t = _killers.earlyoom_thresholds(argv, TOTAL)
    assert t["term_percent"] == pytest.approx(term, abs=1e-3)
    assert t["kill_percent"] == pytest.approx(kill, abs=1e-3)
    assert t["term_bytes"] == pytest.approx(TOTAL * term / 100, abs=2048)
    assert t["kill_bytes"] == pytest.approx(TOTAL * kill / 100, abs=2048)


def test_earlyoom_swap_and_dryrun():
    t = _killers.earlyoom_thresholds(["-s", "100,100", "--dry"], TOTAL)
    assert (t["swap_term_percent"], t["swap_kill_percent"], t["dryrun"]) == (100, 100, True)
    assert _killers.earlyoom_thresholds(["-S", "1000"], TOTAL)["swap_term_percent"] is None
    unknown = _killers.earlyoom_thresholds(["-M", "1000"], None)
    assert unknown["term_bytes"] is None and unknown["term_percent"] is not None


def test_find_killers_by_process_name(tmp_path):
    _proc(tmp_path, 812, b"earlyoom", [b"/usr/bin/earlyoom", b"-M", b"838860,419430", b"-r", b"0"])
    _proc(tmp_path, 77, b"systemd-oomd", [b"/lib/systemd/systemd-oomd"])
    _proc(tmp_path, 900, b"kubelet", [b"kubelet", b"--node-ip=\x1b[31m10.0.0.1"])
    _proc(tmp_path, 901, b"slurmd", [b"slurmd", b"x" * 5000])
    _proc(tmp_path, 1000, b"python3", [b"python3", b"earlyoom"])  # named otherwise
    (tmp_path / "proc" / "1001").mkdir()  # gone, or hidden: no files
    found = _killers.find_killers(TOTAL, root=str(tmp_path))
    assert [(k["name"], k["pid"]) for k in found] == [
        ("systemd-oomd", 77),
        ("earlyoom", 812),
        ("kubelet", 900),
        ("slurmd", 901),
    ]
    oomd, early, kubelet, slurmd = found
    assert early["cmdline"] == "/usr/bin/earlyoom -M 838860,419430 -r 0"
    assert (early["term_percent"], early["kill_percent"]) == pytest.approx((5.0, 2.5), abs=1e-3)
    assert early["term_bytes"] == 838860 * 1024 and early["dryrun"] is False
    assert oomd["term_bytes"] is None and "term_bytes" in oomd
    assert "\x1b" not in kubelet["cmdline"] and kubelet["cmdline"].endswith("10.0.0.1")
    assert len(slurmd["cmdline"]) == 1024
    assert _killers.find_killers(TOTAL, root=str(tmp_path / "none")) == []


def test_a_killer_gone_by_the_death_stays_named():
    old = [{"name": "earlyoom", "pid": 5}, {"name": "kubelet", "pid": 6}]
    new = [{"name": "kubelet", "pid": 6}, {"name": "slurmd", "pid": 7}]
    merged = _killers.merge_killers(old, new)
    assert [k["pid"] for k in merged] == [6, 7, 5]
    assert _killers.merge_killers(None, None) is None


def test_slurm_environment(tmp_path):
    env = b"HOME=/root\0SLURM_JOB_ID=4242\0SLURM_STEP_ID=0\0PATH=/bin\0"
    _proc(tmp_path, 55, b"python", [b"python"], environ=env)
    _proc(tmp_path, 56, b"python", [b"python"], environ=b"SLURM_JOB_ID=\x07\0")
    assert _host.slurm_environment(55, str(tmp_path)) == {
        "slurm_job_id": "4242",
        "slurm_step_id": "0",
    }
    assert _host.slurm_environment(56, str(tmp_path))["slurm_job_id"] is None
    assert _host.slurm_environment(57, str(tmp_path))["slurm_job_id"] is None


def test_slurm_environment_of_a_real_child():
    env = {**os.environ, "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "3"}
    code = "import time; print('up', flush=True); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
    try:
        # Popen returns once exec began; the kernel sets the new environment's place a
        # moment later (load_elf_binary), so read it once the child runs.
        assert child.stdout.readline() == b"up\n"
        assert _host.slurm_environment(child.pid) == {"slurm_job_id": "77", "slurm_step_id": "3"}
    finally:
        child.kill()
        child.wait()


def test_oomd_xattrs_not_a_cgroup(tmp_path):
    assert _host.oomd_xattrs(str(tmp_path)) == {"ooms": None, "kill": None}
    assert _host.oomd_xattrs(None) == {"ooms": None, "kill": None}


@pytest.fixture
def real_group():
    """A real child cgroup under this process's memory group, with a grandchild."""
    ok, reason = can_create_child()
    require(ok, f"no child memory cgroup can be made here: {reason}")
    parent = os.path.join(detect().path, f"oomguard-xattr-{os.getpid()}")
    child = os.path.join(parent, "worker")
    os.makedirs(child)
    try:
        yield parent, child
    finally:
        for path in (child, parent):
            os.rmdir(path)


def test_oomd_xattrs_summed_over_the_group_and_its_ancestors(real_group):
    parent, child = real_group
    watch = _host.OomdXattrs(child)
    assert watch.read() == {"ooms": 0, "kill": 0}  # readable, never acted on: 0, as systemd
    # As systemd-oomd's increment_oomd_xattr writes them: decimal text.
    os.setxattr(parent, _host.OOMD_OOMS, b"1")
    os.setxattr(parent, _host.OOMD_KILL, b"3")
    os.setxattr(child, _host.OOMD_KILL, b"2")
    assert watch.read() == {"ooms": 1, "kill": 5}
    assert _host.oomd_xattrs(child) == {"ooms": 1, "kill": 5}
    os.setxattr(child, _host.OOMD_KILL, b"garbage")  # unreadable value: left out
    assert watch.read() == {"ooms": 1, "kill": 3}
    for path in (parent, child):
        for name in os.listxattr(path):
            os.removexattr(path, name)
