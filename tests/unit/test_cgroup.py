"""oomguard._host.cgroup against fixture trees (tests/fixtures/cgroup/<layout>/ is a filesystem root)."""

from __future__ import annotations

import os
import pathlib
import shutil

import msgpack
import pytest

from capabilities import require
from oomguard import CgroupError
from oomguard._host import cgroup as _cgroup
from oomguard._host.cgroup import (
    CgroupInfo,
    ChildGroup,
    can_create_child,
    cleanup_stale,
    detect,
    host_memory,
    kernel_oom_victims,
    read_kernel_log,
    read_memory_counters,
)
from oomguard._host.cgroup.child import _child_parent

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "cgroup"
V1_GROUP = "sys/fs/cgroup/memory/process_api/e4e5bfc0c4b75f795c48958c8fe0b101"
K8S_POD = (
    "sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/"
    "kubepods-burstable-pod5f1c7e2a_3b9d_4c0e_9a57_2d1f6b0c8e11.slice"
)
K8S_CTR = (
    K8S_POD
    + "/cri-containerd-"
    + ("8e0f3b1a9c2d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d2e3f4a5b6c7d8e9f.scope")
)


def root(layout: str) -> str:
    return str(FIXTURES / layout)


@pytest.fixture
def tree(tmp_path):
    """A writable copy of a fixture layout, for garbling and deleting files."""

    def copy(layout: str) -> pathlib.Path:
        dest = tmp_path / layout
        shutil.copytree(FIXTURES / layout, dest)
        return dest

    return copy


# ------------------------------------------------------------------------- detect


@pytest.mark.parametrize(
    "layout, version, memory_root, path",
    [
        # hybrid host: the v1 memory line wins over "0::/"
        ("v1-host", 1, "sys/fs/cgroup/memory", V1_GROUP),
        # Docker without a cgroup namespace: mount root is the container's group
        ("v1-docker", 1, "sys/fs/cgroup/memory", "sys/fs/cgroup/memory"),
        # no mountinfo: /proc/mounts, memory mounted somewhere unusual, namespace path "/"
        ("v1-mounts", 1, "cgroup/mem", "cgroup/mem"),
        ("v2-k8s", 2, "sys/fs/cgroup", K8S_CTR),
        # cgroup namespace: "0::/" is the mount point itself
        ("v2-ns", 2, "sys/fs/cgroup", "sys/fs/cgroup"),
        ("v2-delegated", 2, "sys/fs/cgroup", "sys/fs/cgroup/nanny"),
    ],
)
def test_detect_layouts(layout, version, memory_root, path):
    info = detect(root=root(layout))
    assert info == CgroupInfo(
        version, os.path.join(root(layout), memory_root), os.path.join(root(layout), path), ""
    )


def test_detect_v2_without_memory_controller():
    info = detect(root=root("v2-nomem"))
    assert info.version == 2 and "without the memory controller" in info.reason


def test_detect_missing_proc(tmp_path):
    assert detect(root=str(tmp_path)) == CgroupInfo(
        None, None, None, "/proc/self/cgroup: not found"
    )


def test_detect_by_pid_and_missing_mount(tree):
    t = tree("v1-host")
    shutil.copytree(t / "proc/self", t / "proc/1234")
    assert detect(1234, root=str(t)).path == str(t / V1_GROUP)
    (t / "proc/1234/mountinfo").write_text("27 1 254:0 / / rw - ext4 /dev/vda rw\n")
    info = detect(1234, root=str(t))
    assert (info.version, info.path) == (1, None)
    assert "no cgroup v1 memory mount" in info.reason


def test_detect_group_directory_gone(tree):
    t = tree("v2-k8s")
    shutil.rmtree(t / K8S_CTR)
    info = detect(root=str(t))
    assert info.path is None and "not found" in info.reason


def test_detect_process_outside_namespace(tree):
    t = tree("v2-ns")
    (t / "proc/self/cgroup").write_text("0::/../../system.slice/other.service\n")
    assert "outside this namespace" in detect(root=str(t)).reason


def test_detect_no_memory_line(tree):
    t = tree("v1-docker")
    (t / "proc/self/cgroup").write_text("10:cpu,cpuacct:/docker/0123abcd\n")
    assert detect(root=str(t)).reason == "no memory controller in /proc/self/cgroup"


def test_detect_unescapes_mount_points(tree):
    t = tree("v1-mounts")
    (t / "cgroup/mem").rename(t / "cgroup/my mem")
    (t / "proc/mounts").write_text("cgroup /cgroup/my\\040mem cgroup rw,memory 0 0\n")
    assert detect(root=str(t)).path == str(t / "cgroup/my mem")


# ------------------------------------------------------------------------- counters


def test_v1_counters_on_this_machines_layout():
    c = read_memory_counters(os.path.join(root("v1-host"), V1_GROUP), 1)
    assert (c.oom_kill, c.oom, c.oom_group_kill, c.failcnt) == (0, None, None, 0)
    assert (c.peak, c.usage) == (8282112, 7901184)
    assert c.limit is None  # 9223372036854771712 means unlimited
    assert c.missing == ()


def test_v1_counters_after_an_oom_kill():
    c = read_memory_counters(os.path.join(root("v1-host"), V1_GROUP, "oomguard-w1"), 1)
    assert (c.oom_kill, c.failcnt, c.peak, c.limit) == (1, 2196, 64 * 2**20, 64 * 2**20)


def test_v1_old_kernel_without_oom_kill_field():
    c = read_memory_counters(os.path.join(root("v1-docker"), "sys/fs/cgroup/memory"), 1)
    assert c.oom_kill is None and c.limit == 2 * 2**30 and c.failcnt == 17
    assert c.missing == ("memory.oom_control oom_kill: absent or garbled (Linux < 4.13?)",)


def test_v2_counters_k8s():
    c = read_memory_counters(os.path.join(root("v2-k8s"), K8S_CTR), 2)
    assert (c.version, c.oom_kill, c.oom, c.oom_group_kill, c.failcnt) == (2, 2, 3, 0, 412)
    assert (c.peak, c.limit, c.usage) == (4 * 2**30, 4 * 2**30, 3 * 2**30)
    assert c.missing == ()


def test_v2_counters_linux_5_15_without_peak_and_unlimited():
    c = read_memory_counters(os.path.join(root("v2-ns"), "sys/fs/cgroup"), 2)
    assert c.limit is None  # "max"
    assert c.peak is None and c.oom_group_kill is None
    assert c.oom_kill == 0 and c.usage == 100 * 2**20
    assert c.missing == (
        "memory.events oom_group_kill: absent or garbled (Linux < 5.17?)",
        "memory.peak: not found",
    )


def test_garbled_and_missing_files_are_listed_not_raised(tree):
    t = tree("v1-host")
    g = t / V1_GROUP
    (g / "memory.failcnt").write_text("abc\n")
    (g / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill lots\n")
    (g / "memory.max_usage_in_bytes").unlink()
    (g / "memory.limit_in_bytes").write_text("")
    os.mkdir(g / "memory.usage_in_bytes.d")
    (g / "memory.usage_in_bytes").unlink()
    os.rename(g / "memory.usage_in_bytes.d", g / "memory.usage_in_bytes")  # a dir: EISDIR
    c = read_memory_counters(str(g), 1)
    assert (c.oom_kill, c.failcnt, c.peak, c.limit, c.usage) == (None,) * 5
    assert c.missing == (
        "memory.oom_control oom_kill: absent or garbled (Linux < 4.13?)",
        "memory.failcnt: garbled 'abc'",
        "memory.max_usage_in_bytes: not found",
        "memory.limit_in_bytes: garbled ''",
        "memory.usage_in_bytes: unreadable (EISDIR)",
    )


def test_v2_garbled_max_and_events(tree):
    t = tree("v2-k8s")
    g = t / K8S_CTR
    (g / "memory.max").write_text("lots\n")
    (g / "memory.events").write_text("low 0\nhigh\nmax 4 2\noom 1\noom_kill 1\n\x00\x00")
    c = read_memory_counters(str(g), 2)
    assert (c.limit, c.failcnt, c.oom, c.oom_kill) == (None, None, 1, 1)
    assert "memory.max: garbled 'lots'" in c.missing
    assert "memory.events max: absent or garbled" in c.missing


def test_counters_of_a_vanished_group():
    c = read_memory_counters("/nonexistent/oomguard-w9", 2)
    assert c.usage is None and len(c.missing) == 4


def test_to_dict_is_msgpack_plain():
    c = read_memory_counters(os.path.join(root("v2-ns"), "sys/fs/cgroup"), 2)
    d = c.to_dict()
    assert msgpack.unpackb(msgpack.packb(d)) == d
    assert d["missing"] == list(c.missing) and d["version"] == 2


# ------------------------------------------------------------------------- /proc/meminfo


def test_host_memory():
    assert host_memory(root("v2-k8s")) == {"total": 32853740 * 1024, "available": 20102448 * 1024}


def test_host_memory_old_kernel_without_memavailable():
    assert host_memory(root("v1-docker")) == {"total": 8167848 * 1024, "available": None}


def test_host_memory_missing_and_garbled(tmp_path):
    assert host_memory(str(tmp_path)) == {"total": None, "available": None}
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal: x kB\nMemAvailable:\nnonsense\n")
    assert host_memory(str(tmp_path)) == {"total": None, "available": None}


# ------------------------------------------------------------------------- kernel log

MEMCG_6 = (
    "Memory cgroup out of memory: Killed process 5554 (python) total-vm:78308kB, "
    "anon-rss:68224kB, file-rss:5840kB, shmem-rss:0kB, UID:0 pgtables:188kB oom_score_adj:0"
)
GLOBAL_6 = (
    "Out of memory: Killed process 812 (dask worker) total-vm:9000000kB, anon-rss:8000000kB, "
    "file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:16000kB oom_score_adj:0"
)


@pytest.mark.parametrize(
    "text, expected",
    [
        (MEMCG_6, {5554: ("python", 68224 * 1024, "memcg")}),
        (f"[  417.474986] {MEMCG_6}", {5554: ("python", 68224 * 1024, "memcg")}),
        (f"3,1042,417474986,-;{MEMCG_6}", {5554: ("python", 68224 * 1024, "memcg")}),
        (
            f"Jan 01 00:00:00 node kernel: {GLOBAL_6}",
            {812: ("dask worker", 8000000 * 1024, "global")},
        ),
        (
            "Out of memory (oom_kill_allocating_task): Killed process 9 (a) total-vm:1kB, anon-rss:2kB",
            {9: ("a", 2048, "global")},
        ),
        # older 4.x kernels: the scope is on the "Kill process" line, the sizes on the next one
        (
            "Memory cgroup out of memory: Kill process 77 (java) score 998 or sacrifice child\n"
            "Killed process 77 (java) total-vm:4000kB, anon-rss:3000kB, file-rss:12kB, shmem-rss:0kB",
            {77: ("java", 3000 * 1024, "memcg")},
        ),
        (
            "Out of memory: Kill process 78 (java) score 998 or sacrifice child\n"
            "Killed process 78 (java) total-vm:4000kB, anon-rss:3000kB, file-rss:12kB",
            {78: ("java", 3000 * 1024, "global")},
        ),
        # a comm with a parenthesis and no anon-rss
        ("Out of memory: Killed process 5 (a) b) ", {5: ("a) b", None, "global")}),
        ("oom_reaper: reaped process 5554 (python), now anon-rss:0kB, file-rss:0kB", {}),
        ("python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0", {}),
        ("", {}),
    ],
)
def test_kernel_oom_victims_table(text, expected):
    got = kernel_oom_victims(text)
    assert {p: (v["comm"], v["anon_rss"], v["constraint"]) for p, v in got.items()} == expected


def test_kernel_oom_victims_oom_kill_line_gives_memcg_and_constraint():
    text = (
        "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
        "oom_memcg=/a/oomguard-w1,task_memcg=/a/oomguard-w1,task=python,pid=31,uid=0\n"
        "Killed process 31 (python) total-vm:1kB, anon-rss:1kB\n"
        "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,"
        "global_oom,task_memcg=/b,task=x,pid=32,uid=0\n"
        "Killed process 32 (x) total-vm:1kB, anon-rss:1kB\n"
    )
    got = kernel_oom_victims(text)
    assert (got[31]["constraint"], got[31]["memcg"]) == ("memcg", "/a/oomguard-w1")
    assert (got[32]["constraint"], got[32]["memcg"]) == ("global", "/b")


def test_kernel_oom_victims_real_linux_6_18_report():
    text = (FIXTURES / "kmsg-memcg-oom-linux-6.18.txt").read_text()
    assert kernel_oom_victims(text) == {
        5554: {
            "comm": "python",
            "anon_rss": 68224 * 1024,
            "constraint": "memcg",
            "memcg": "/process_api/e4e5bfc0c4b75f795c48958c8fe0b101/oomguard-test-5552-fa72d6-hog",
        }
    }


def test_read_kernel_log_unavailable(tmp_path):
    assert read_kernel_log(root=str(tmp_path)) == ""


def test_read_kernel_log_skips_records_it_cannot_parse(tmp_path):
    # A regular file stands in for /dev/kmsg: one read returns the whole file as one "record".
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kmsg").write_text("garbage without a header\n")
    assert read_kernel_log(root=str(tmp_path)) == ""
    (tmp_path / "dev/kmsg").write_text(f"3,7,2500000,-;{MEMCG_6}\n SUBSYSTEM=memory\n")
    assert read_kernel_log(root=str(tmp_path)) == f"[    2.500000] {MEMCG_6}"
    assert read_kernel_log(since_monotonic=3.0, root=str(tmp_path)) == ""


# ------------------------------------------------------------------------- child groups (v2 logic)


def test_v2_child_parent_leaf_sibling():
    info = detect(root=root("v2-delegated"))
    assert _child_parent(info) == (os.path.join(root("v2-delegated"), "sys/fs/cgroup"), "")


@pytest.mark.parametrize("layout", ["v2-k8s", "v2-ns"])
def test_v2_create_refused_with_a_clear_reason(tree, layout):
    t = tree(layout)
    info = detect(root=str(t))
    with pytest.raises(CgroupError, match="no-internal-processes rule") as e:
        ChildGroup.create("oomguard-w1", 2**30, info=info)
    assert "Run the nanny in a leaf group" in str(e.value)
    ok, why = can_create_child(info)
    assert not ok and "no-internal-processes" in why
    assert cleanup_stale(info=info) == 0


def test_v2_create_enables_memory_when_our_group_has_no_processes(tree):
    t = tree("v2-k8s")
    (t / K8S_CTR / "cgroup.procs").write_text("")
    info = detect(root=str(t))
    assert _child_parent(info) == (str(t / K8S_CTR), "")
    assert (t / K8S_CTR / "cgroup.subtree_control").read_text() == "+memory"


def test_create_rejects_bad_input_naming_the_field():
    info = detect(root=root("v1-host"))
    with pytest.raises(CgroupError, match="^name: '../x'"):
        ChildGroup.create("../x", None, info=info)
    with pytest.raises(CgroupError, match="^limit: -1"):
        ChildGroup.create("oomguard-w1", -1, info=info)


def test_create_without_a_cgroup_explains_why():
    info = CgroupInfo(None, None, None, "/proc/self/cgroup: not found")
    with pytest.raises(CgroupError, match="/proc/self/cgroup: not found"):
        ChildGroup.create("oomguard-w1", 2**30, info=info)
    assert can_create_child(info)[0] is False
    assert cleanup_stale(info=info) == 0


def test_remove_of_a_missing_group_is_true():
    assert ChildGroup("/nonexistent/oomguard-w1", 1, "/nonexistent").remove(timeout=0) is True


def test_v2_leaf_sibling_create_cleans_up_when_memory_is_not_enabled(tree):
    # A fixture tree is not cgroupfs: mkdir makes no memory.max, which is exactly what the
    # kernel shows when the parent does not delegate memory. The group must not be left behind.
    t = tree("v2-delegated")
    info = detect(root=str(t))
    with pytest.raises(CgroupError, match="Memory controller is not enabled"):
        ChildGroup.create("oomguard-w1", 2**30, info=info)
    assert not (t / "sys/fs/cgroup/oomguard-w1").exists()


def test_v2_leaf_sibling_under_a_systemd_delegated_unit(tree):
    t = tree("v2-k8s")
    pod = t / K8S_POD
    assert _child_parent(detect(root=str(t)))[0] is None  # a kubelet pod slice: never
    try:
        os.setxattr(pod, "trusted.delegate", b"1")
        xattrs = ""
    except OSError as e:
        xattrs = f"no trusted.* xattrs on {t}: {e}"
    require(not xattrs, xattrs)
    assert _child_parent(detect(root=str(t))) == (str(pod), "")


def test_cleanup_stale_in_a_fixture_tree(tree):
    t = tree("v1-host")
    group = t / V1_GROUP
    for name in ("oomguard-a", "oomguard-b", "other"):
        (group / name).mkdir()
    (group / "oomguard-b" / "cgroup.procs").write_text("99\n")  # still holds a process
    info = detect(root=str(t))
    # oomguard-w1 has files (a fixture dir is not cgroupfs), so rmdir fails: only -a goes.
    assert cleanup_stale(info=info) == 1
    left = sorted(p.name for p in group.iterdir() if p.is_dir())
    assert left == ["oomguard-b", "oomguard-w1", "other"]


# ------------------------------------------------------------------------- charge moving


def test_v1_move_charge_writes_anon_and_mapped_file_bits(tmp_path):
    group = tmp_path / "oomguard-w1"
    group.mkdir()
    (group / "memory.move_charge_at_immigrate").write_text("0\n")
    g = ChildGroup(str(group), 1, str(tmp_path))
    assert g.set_move_charge() == (True, "")
    # 3 = bit 0 (anonymous pages) + bit 1 (file pages the process maps): RSS is both.
    assert (group / "memory.move_charge_at_immigrate").read_text() == "3"
    assert g.set_move_charge(False) == (True, "")
    assert (group / "memory.move_charge_at_immigrate").read_text() == "0"


def test_move_charge_refusals_say_why(tmp_path):
    group = tmp_path / "oomguard-w1"
    group.mkdir()
    ok, why = ChildGroup(str(group), 1, str(tmp_path)).set_move_charge()
    assert not ok and why.startswith("memory.move_charge_at_immigrate: not found")
    ok, why = ChildGroup(str(group), 2, str(tmp_path)).set_move_charge()
    assert not ok and "cgroup v2 never moves charges" in why
    assert not (group / "memory.move_charge_at_immigrate").exists()


def test_move_charge_einval_names_the_kernel_change(tmp_path, monkeypatch):
    import errno

    from oomguard._host.cgroup import child as _child

    def refuse(path, value):
        raise OSError(errno.EINVAL, "Invalid argument")

    (tmp_path / "memory.move_charge_at_immigrate").write_text("0\n")
    monkeypatch.setattr(_child, "_write", refuse)
    ok, why = ChildGroup(str(tmp_path), 1, str(tmp_path)).set_move_charge()
    assert not ok
    assert "EINVAL" in why and "Linux 6.13" in why


def test_process_rss_from_proc_status(tmp_path):
    from oomguard._host.cgroup import process_rss

    status = tmp_path / "proc" / "42" / "status"
    status.parent.mkdir(parents=True)
    status.write_text("Name:\tpython3\nVmPeak:\t  900 kB\nVmRSS:\t  123456 kB\nRssAnon:\t 1 kB\n")
    assert process_rss(42, root=str(tmp_path)) == 123456 * 1024
    status.write_text("Name:\tzombie\n")  # a zombie has no VmRSS line
    assert process_rss(42, root=str(tmp_path)) is None
    assert process_rss(43, root=str(tmp_path)) is None
    assert process_rss(os.getpid()) > 0


# ---------------------------------------------------------------- the nanny's reading


def _stat(state="S", flags=0x400100, pending=0, comm="python (x) y"):
    # /proc/PID/stat from Linux 6.x with its 52 fields; field 3 state, 9 flags, 31 signal.
    rest = [state, "1", "1", "1", "0", "-1", str(flags)] + ["0"] * 21 + [str(pending)]
    return f"42 ({comm}) " + " ".join(rest + ["0"] * 21) + "\n"


@pytest.mark.parametrize(
    "stat, running",
    [
        (_stat(), True),
        (_stat(state="R", comm="a) b (c"), True),  # a comm with ")" and spaces
        (_stat(state="Z"), False),
        (_stat(state="X"), False),
        (_stat(flags=0x400104), False),  # PF_EXITING: in do_exit()
        (_stat(pending=1 << 8), False),  # SIGKILL pending: the OOM killer has sent it
        (_stat(pending=1 << 14), True),  # SIGTERM pending is no sign of dying
        ("42 (short) S 1\n", False),
    ],
)
def test_process_running_reads_state_flags_and_pending_sigkill(tmp_path, stat, running):
    (tmp_path / "proc" / "42").mkdir(parents=True)
    (tmp_path / "proc" / "42" / "stat").write_text(stat)
    assert _cgroup.process_running(42, root=str(tmp_path)) is running


def test_process_running_on_real_processes():
    import subprocess
    import time

    live = subprocess.Popen(["sleep", "30"])
    done = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 10
        while _cgroup.process_running(done.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _cgroup.process_running(live.pid)
        assert not _cgroup.process_running(done.pid)  # a zombie until waited for
    finally:
        live.kill()
        live.wait()
        done.wait()
    assert not _cgroup.process_running(live.pid)


def test_read_oom_kill_and_group_pids(tmp_path):
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n")
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    (tmp_path / "cgroup.procs").write_text("12\n13\n")
    assert _cgroup.read_oom_kill(str(tmp_path), 2) == 2
    assert _cgroup.read_oom_kill(str(tmp_path), 1) == 5
    assert _cgroup.group_pids(str(tmp_path)) == [12, 13]
    (tmp_path / "memory.events").write_text("oom_kill lots\n")
    assert _cgroup.read_oom_kill(str(tmp_path), 2) is None
