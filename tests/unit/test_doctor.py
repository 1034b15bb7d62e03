"""`oomguard doctor` against fixture trees (each cgroup layout, each finding and its fix), its
JSON shape, and on this host for real."""

from __future__ import annotations

import doctest
import json
import os
import pathlib
import shutil
import socket

import dask.config
import pytest

from capabilities import require
from oomguard._cli import main
from oomguard._cli.doctor import (
    cgroup as _doctor_cgroup,
)
from oomguard._cli.doctor import check as _doctor_check
from oomguard._cli.doctor import (
    checks as _doctor,
)
from oomguard._cli.doctor import (
    command as _cli_doctor,
)
from oomguard._cli.doctor.cgroup import check_cgroup
from oomguard._cli.doctor.check import layout_label
from oomguard._cli.doctor.checks import (
    Check,
    check_crash_dir,
    check_kernel_log,
    diagnose,
)
from oomguard._cli.doctor.killers import (
    check_killer_evidence,
    check_oom_killers,
    check_signal_recorder,
)
from oomguard._cli.doctor.text import FIX, KILLERS, LAYOUTS
from oomguard._host import cgroup as _cgroup
from oomguard._host.paths import default_crash_dir

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "cgroup"
K8S_CTR = (
    "/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/"
    "kubepods-burstable-pod5f1c7e2a_3b9d_4c0e_9a57_2d1f6b0c8e11.slice/cri-containerd-"
    "8e0f3b1a9c2d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d2e3f4a5b6c7d8e9f.scope"
)


@pytest.fixture
def tree(tmp_path):
    """A writable copy of a fixture tree: the per-worker probe really mkdirs in it."""

    def copy(layout: str) -> str:
        dst = tmp_path / layout
        shutil.copytree(FIXTURES / layout, dst)
        return str(dst)

    return copy


def must_not_probe(info):
    raise AssertionError("probed a read-only cgroup mount")


def statuses(checks: list[Check]) -> list[tuple[str, str]]:
    return [(c.name, c.status) for c in checks]


# ------------------------------------------------------------------------- cgroup layouts


def test_v1_host_per_worker_groups_by_a_real_probe(tree):
    root = tree("v1-host")
    layout, checks = check_cgroup(root)
    assert layout == "v1"
    assert statuses(checks) == [
        ("cgroup", "ok"),
        ("cgroup.mount", "ok"),
        ("cgroup.per-worker", "ok"),
        ("cgroup.peak", "ok"),
    ]
    assert checks[0].detail == (
        "cgroup v1, memory group /sys/fs/cgroup/memory/process_api/e4e5bfc0c4b75f795c48958c8fe0b101"
    )
    assert checks[1].detail == "/sys/fs/cgroup/memory is mounted read-write"
    group = pathlib.Path(root, "sys/fs/cgroup/memory/process_api/e4e5bfc0c4b75f795c48958c8fe0b101")
    assert not [p for p in group.iterdir() if p.name.startswith("oomguard-probe-")]


def test_v1_mounts_without_mountinfo_reads_proc_mounts(tree):
    layout, checks = check_cgroup(tree("v1-mounts"))
    assert layout == "v1"
    assert checks[1] == Check("cgroup.mount", "ok", "/cgroup/mem is mounted read-write")


def test_v1_docker_read_only_mount_is_shared_and_not_probed(tree):
    layout, checks = check_cgroup(tree("v1-docker"), probe=must_not_probe)
    assert layout == "v1-shared"
    assert statuses(checks) == [
        ("cgroup", "ok"),
        ("cgroup.mount", "warn"),
        ("cgroup.per-worker", "warn"),
        ("cgroup.peak", "ok"),
    ]
    assert checks[1] == Check(
        "cgroup.mount", "warn", "/sys/fs/cgroup/memory is mounted read-only", FIX["mount"]
    )
    assert checks[2].detail.startswith(
        "no per-worker memory groups (the cgroup filesystem at /sys/fs/cgroup/memory is "
        "mounted read-only); the nanny and its workers share one memory group: oomguard tells "
        "a worker's OOM kill from another process's by a recent reading of the shared counter "
        "and the kernel log"
    )
    assert checks[2].fix == FIX["per-worker-v1"] and "--nworkers 1" in checks[2].fix


def test_v2_delegated_with_a_probe_that_succeeds(tree):
    # A fixture is not cgroupfs (mkdir makes no memory.max), so the kernel's yes is stubbed.
    layout, checks = check_cgroup(tree("v2-delegated"), probe=lambda info: (True, ""))
    assert layout == "v2-delegated"
    assert statuses(checks) == [
        ("cgroup", "ok"),
        ("cgroup.memory", "ok"),
        ("cgroup.mount", "ok"),
        ("cgroup.per-worker", "ok"),
        ("cgroup.processes", "ok"),
        ("cgroup.oom-group", "ok"),
        ("cgroup.peak", "ok"),
    ]
    assert checks[0].detail == "cgroup v2, group /sys/fs/cgroup/nanny"
    assert checks[4].detail == (
        "/sys/fs/cgroup/nanny holds 1 process; per-worker groups go beside it, under its "
        "delegated parent"
    )
    assert checks[5].detail == (
        "memory.oom.group not found (Linux < 4.19): an OOM kill takes one process"
    )


def test_v2_delegated_real_probe_reports_the_kernels_refusal(tree):
    layout, checks = check_cgroup(tree("v2-delegated"))
    assert layout == "v2-shared"
    per_worker = checks[3]
    assert per_worker.name == "cgroup.per-worker" and per_worker.status == "warn"
    assert "Memory controller is not enabled for children of" in per_worker.detail
    assert per_worker.fix == FIX["per-worker-v2"]


def test_v2_k8s_container_shares_its_group(tree):
    layout, checks = check_cgroup(tree("v2-k8s"))
    assert layout == "v2-shared"
    assert statuses(checks) == [
        ("cgroup", "ok"),
        ("cgroup.memory", "ok"),
        ("cgroup.mount", "ok"),
        ("cgroup.per-worker", "warn"),
        ("cgroup.processes", "warn"),
        ("cgroup.oom-group", "ok"),
        ("cgroup.peak", "ok"),
    ]
    assert "no-internal-processes" in checks[3].detail
    assert checks[4] == Check(
        "cgroup.processes",
        "warn",
        f"{K8S_CTR} holds 2 processes: cgroup v2's no-internal-processes rule forbids "
        "memory-enabled children",
        FIX["processes"],
    )


def test_v2_namespace_read_only_old_kernel(tree):
    layout, checks = check_cgroup(tree("v2-ns"), probe=must_not_probe)
    assert layout == "v2-shared"
    assert statuses(checks) == [
        ("cgroup", "ok"),
        ("cgroup.memory", "ok"),
        ("cgroup.mount", "warn"),
        ("cgroup.per-worker", "warn"),
        ("cgroup.processes", "warn"),
        ("cgroup.oom-group", "ok"),
        ("cgroup.peak", "no"),
    ]
    assert checks[6] == Check(
        "cgroup.peak", "no", "memory.peak: not found (Linux < 5.19)", FIX["peak"]
    )


def test_v2_oom_group_kills_the_nanny_too():
    layout, checks = check_cgroup(str(FIXTURES / "v2-k8s-oomgroup"), probe=must_not_probe)
    assert layout == "v2-shared"
    oom_group = {c.name: c for c in checks}["cgroup.oom-group"]
    assert oom_group == Check(
        "cgroup.oom-group",
        "warn",
        "memory.oom.group is 1 in /sys/fs/cgroup: an OOM kill at its limit kills the nanny "
        "with its workers: no death report, only worker_lost",
        FIX["oom-group"],
    )
    assert "`oomguard.scheduler.kubernetes.enabled: true`" in oom_group.fix
    assert "`dask worker --nworkers 1`" in oom_group.fix


def test_v2_without_the_memory_controller_is_none():
    layout, checks = check_cgroup(str(FIXTURES / "v2-nomem"), probe=must_not_probe)
    assert layout == "none"
    assert checks == [
        Check("cgroup", "ok", "cgroup v2, group /sys/fs/cgroup"),
        Check("cgroup.memory", "no", "cgroup v2 without the memory controller", FIX["memory"]),
    ]


def test_v2_group_whose_parent_does_not_delegate_memory(tree):
    root = tree("v2-delegated")
    for name in ("memory.current", "memory.events", "memory.max", "memory.peak"):
        os.unlink(os.path.join(root, "sys/fs/cgroup/nanny", name))
    layout, checks = check_cgroup(root, probe=must_not_probe)
    assert layout == "none"
    assert checks[1] == Check(
        "cgroup.memory",
        "no",
        "no memory.current in /sys/fs/cgroup/nanny: its parent does not enable the memory "
        "controller for it",
        FIX["memory"],
    )


def test_no_cgroup_at_all(tmp_path):
    layout, checks = check_cgroup(str(tmp_path), probe=must_not_probe)
    assert (layout, checks) == (
        "none",
        [Check("cgroup", "no", "/proc/self/cgroup: not found", FIX["cgroup"])],
    )


@pytest.mark.parametrize(
    "version,usable,per_worker,label",
    [
        (None, False, False, "none"),
        (1, True, True, "v1"),
        (1, True, False, "v1-shared"),
        (2, True, True, "v2-delegated"),
        (2, True, False, "v2-shared"),
        (2, False, True, "none"),
    ],
)
def test_layout_labels(version, usable, per_worker, label):
    assert layout_label(version, usable, per_worker) == label
    assert label in LAYOUTS


# ------------------------------------------------------------------------- kernel log


def test_kernel_log_readable(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kmsg").write_text("6,1,2500000,-;Memory cgroup out of memory: Killed\n")
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/dmesg_restrict").write_text("1\n")
    assert check_kernel_log(str(tmp_path)) == Check(
        "kernel-log",
        "ok",
        "/dev/kmsg is readable (kernel.dmesg_restrict=1): the kernel's OOM-kill lines name "
        "the killed PID",
    )


def test_kernel_log_missing_in_a_container(tmp_path):
    assert check_kernel_log(str(tmp_path)) == Check(
        "kernel-log",
        "no",
        "/dev/kmsg: not found (kernel.dmesg_restrict: not found)",
        FIX["kmsg-missing"],
    )
    assert "--device /dev/kmsg" in FIX["kmsg-missing"] and "SYSLOG" in FIX["kmsg-missing"]


def test_kernel_log_denied_without_cap_syslog():
    # For real: the same check as user nobody, which lacks CAP_SYSLOG.
    restrict = pathlib.Path("/proc/sys/kernel/dmesg_restrict").read_text().strip()
    require(
        os.geteuid() == 0 and restrict == "1" and os.path.exists("/dev/kmsg"),
        "needs root (to drop to nobody), /dev/kmsg and kernel.dmesg_restrict=1",
    )
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child drops root (and with it CAP_SYSLOG), checks, reports, exits
        try:
            os.setgid(65534)
            os.setuid(65534)
            os.write(write, json.dumps(check_kernel_log().to_dict()).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        out = f.read()
    os.waitpid(pid, 0)
    assert json.loads(out) == {
        "name": "kernel-log",
        "status": "no",
        "detail": "/dev/kmsg: cannot open: Operation not permitted (kernel.dmesg_restrict=1)",
        "fix": FIX["kmsg-denied"],
    }
    assert "CAP_SYSLOG" in FIX["kmsg-denied"] and "kernel.dmesg_restrict=0" in FIX["kmsg-denied"]


# ------------------------------------------------------------------------- user-space OOM killers


def test_oom_killers_found_by_comm(tmp_path):
    for pid, comm in [
        (1, "systemd"),
        (27, "python3"),
        (812, "earlyoom"),
        (900, "systemd-oomd"),
        (901, "earlyoom"),
        (77, "nohang"),
        (78, "oomd"),
    ]:
        (tmp_path / f"proc/{pid}").mkdir(parents=True)
        (tmp_path / f"proc/{pid}/comm").write_text(comm + "\n")
    (tmp_path / "proc/812/cmdline").write_bytes(b"earlyoom\0-m\0008,2\0-r\0003600\0")
    (tmp_path / "proc/meminfo").write_text("MemTotal: 16777216 kB\nMemAvailable: 8 kB\n")
    checks = check_oom_killers(str(tmp_path))
    assert [(c.name, c.status, c.detail.split(":")[0]) for c in checks] == [
        ("oom-killer.nohang", "warn", "nohang is running (pid 77)"),
        ("oom-killer.oomd", "warn", "oomd is running (pid 78)"),
        (
            "oom-killer.earlyoom",
            "warn",
            "earlyoom is running (pid 812, 901), SIGTERM at MemAvailable <= 8 % (1.28 GiB), "
            "SIGKILL <= 2 % (328 MiB)",
        ),
        ("oom-killer.systemd-oomd", "warn", "systemd-oomd is running (pid 900)"),
    ]
    by_name = {c.name: c for c in checks}
    earlyoom = by_name["oom-killer.earlyoom"]
    assert "oomguard shows these deaths as sigterm" in earlyoom.detail
    assert "`--avoid REGEX`" in earlyoom.fix and "`--prefer REGEX`" in earlyoom.fix
    assert "ManagedOOMPreference=omit" in by_name["oom-killer.systemd-oomd"].fix
    assert "worker_lost" in by_name["oom-killer.systemd-oomd"].detail
    assert "@BADNESS_ADJ_RE_NAME" in by_name["oom-killer.nohang"].fix
    assert all(c.fix == KILLERS[c.name.split(".", 1)[1]][1] for c in checks)


def test_no_oom_killer_in_a_container():
    assert check_oom_killers(str(FIXTURES / "v2-k8s-oomgroup")) == [
        Check(
            "oom-killer",
            "ok",
            "none running (earlyoom, systemd-oomd, oomd, nohang, kubelet, slurmd)",
        )
    ]


def test_kubelet_and_slurmd_are_named(tmp_path):
    for pid, comm in [(5, "kubelet"), (6, "slurmd")]:
        (tmp_path / f"proc/{pid}").mkdir(parents=True)
        (tmp_path / f"proc/{pid}/comm").write_text(comm + "\n")
    checks = {c.name: c for c in check_oom_killers(str(tmp_path))}
    assert "Evicted" in checks["oom-killer.kubelet"].detail
    assert "SLURM_JOB_ID" in checks["oom-killer.slurmd"].detail
    assert "scontrol show job" in checks["oom-killer.slurmd"].fix


def test_killer_evidence_on_a_fixture_host(tmp_path):
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/mountinfo").write_text(
        "22 1 0:5 / /proc rw,nosuid - proc proc rw,hidepid=invisible\n"
    )
    checks = {c.name: c for c in check_killer_evidence(str(tmp_path), str(tmp_path / "none"))}
    assert checks["killer-evidence.psi"].status == "warn"
    assert checks["killer-evidence.psi"].fix == FIX["psi"]
    assert checks["killer-evidence.xattrs"].status == "warn"
    assert "hidepid=invisible" in checks["killer-evidence.proc"].detail
    assert checks["killer-evidence.proc"].fix == FIX["hidepid"]


def test_a_missing_signal_recorder_says_how_to_get_it(monkeypatch):
    from oomguard._host import sigrec

    monkeypatch.setattr(sigrec, "_sigrec", None)
    check = check_signal_recorder()
    assert (check.status, check.fix) == ("no", FIX["sigrec"])
    assert "not installed" in check.detail and "pip install" in check.fix


def test_killer_evidence_on_this_host():
    info = _cgroup.detect()
    checks = {c.name: c for c in check_killer_evidence("/", info.path)}
    psi = os.path.exists("/proc/pressure/memory")
    assert checks["killer-evidence.psi"].status == ("ok" if psi else "warn")
    # ./dev test builds the native recorder in place.
    assert checks["killer-evidence.signal-senders"].status == "ok"
    if info.path is not None and os.geteuid() == 0:
        assert checks["killer-evidence.xattrs"].status == "ok"


# ------------------------------------------------------------------------- crash directory


def test_crash_dir_made_probed_and_left_as_found(tmp_path):
    path = tmp_path / "a" / "b"
    check = check_crash_dir(str(path), configured=True)
    assert check == Check(
        "crash-dir",
        "ok",
        f"{path} (oomguard.worker.crash-dir) is writable: faulthandler stacks and flight "
        "records of dying workers go there",
    )
    assert list(tmp_path.iterdir()) == []  # a/ and a/b/ made for the probe, then removed
    path.mkdir(parents=True)
    assert check_crash_dir(str(path), configured=False).status == "ok"
    assert list(path.iterdir()) == []  # the probe file is gone, the directory stays


def test_crash_dir_not_writable(tmp_path):
    (tmp_path / "file").write_text("")
    path = tmp_path / "file" / "crash"  # below a regular file: ENOTDIR, also for root
    assert check_crash_dir(str(path), configured=False) == Check(
        "crash-dir",
        "no",
        f"{path} (default crash dir) is not writable: Not a directory: reports lose "
        "faulthandler stacks and flight records",
        FIX["crash-dir"],
    )
    assert "oomguard.worker.crash-dir" in FIX["crash-dir"]


def test_crash_dir_another_user_could_write_is_named_not_private(tmp_path):
    path = tmp_path / "crash"
    path.mkdir()
    path.chmod(0o777)  # as another user on the host could have made it first
    check = check_crash_dir(str(path), configured=True)
    assert check.status == "no"
    assert check.detail.startswith(
        f"{path} (oomguard.worker.crash-dir) is not private: it is writable by its group or "
        "others (mode 0777); nannies refuse it"
    )
    assert check.fix == FIX["crash-dir-private"]
    link = tmp_path / "link"
    link.symlink_to(path)
    path.chmod(0o700)
    assert "is not private: it is a symlink" in check_crash_dir(str(link), False).detail


def test_diagnose_reads_the_configured_crash_dir(tmp_path):
    no_probe = lambda info: (False, "not probed")  # noqa: E731
    with dask.config.set({"oomguard.worker.crash-dir": str(tmp_path)}):
        crash = diagnose(str(tmp_path), probe=no_probe).checks[-1]
    assert crash.detail.startswith(f"{tmp_path} (oomguard.worker.crash-dir) is writable")
    crash = diagnose(str(tmp_path), probe=no_probe).checks[-1]
    assert crash.detail.startswith(f"{default_crash_dir()} (default crash dir) is writable")
    with dask.config.set({"oomguard.worker.crash-dir": 5}):
        crash = diagnose(str(tmp_path), probe=no_probe).checks[-1]
    assert crash == Check(
        "crash-dir",
        "no",
        "oomguard.worker.crash-dir is 5; expected a path or null.",
        FIX["crash-dir"],
    )


# ------------------------------------------------------------------------- the whole report


def test_every_finding_that_is_not_ok_has_a_fix(tree, tmp_path):
    for layout in ("v1-docker", "v2-k8s", "v2-ns", "v2-nomem", "v2-k8s-oomgroup"):
        d = diagnose(tree(layout), crash_dir=str(tmp_path / "crash"))
        for c in d.checks:
            assert c.status in ("ok", "warn", "no")
            assert (c.fix == "") == (c.status == "ok"), (layout, c)


def test_json_shape(tmp_path, capsys):
    with dask.config.set({"oomguard.worker.crash-dir": str(tmp_path)}):
        assert main(["doctor", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == ["layout", "cgroup", "checks", "versions"]
    assert doc["layout"] in LAYOUTS
    assert list(doc["cgroup"]) == ["version", "path"]
    assert doc["checks"] and all(
        list(c) == ["name", "status", "detail", "fix"] for c in doc["checks"]
    )
    names = [c["name"] for c in doc["checks"]]
    assert names[0] == "cgroup" and names[-1] == "crash-dir" and "kernel-log" in names
    assert any(n == "oom-killer" or n.startswith("oom-killer.") for n in names)
    v = doc["versions"]
    assert list(v) == ["oomguard", "dask", "distributed", "python", "kernel", "host"]
    assert v["host"] == socket.gethostname() and v["kernel"] == os.uname().release


def test_bad_usage_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["doctor", "--bogus"])
    assert e.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_doctests():
    for module in (_doctor, _doctor_cgroup, _doctor_check, _cli_doctor):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


# ------------------------------------------------------------------------- this host, for real


def test_this_host(capsys):
    info = _cgroup.detect()
    require(
        os.geteuid() == 0 and info.version == 1,
        "the live facts below are this machine's: cgroup v1, running as root",
    )
    d = diagnose()
    by_name = {c.name: c for c in d.checks}
    assert (d.layout, d.cgroup_version, d.cgroup_path) == ("v1", 1, info.path)
    assert by_name["cgroup.per-worker"].status == "ok"
    assert not [p for p in os.listdir(info.path) if p.startswith("oomguard-probe-")]
    assert by_name["kernel-log"].status == "ok"  # root has CAP_SYSLOG
    assert by_name["crash-dir"].status == "ok"
    assert main(["doctor"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"oomguard doctor on {socket.gethostname()}: Linux ")
    assert lines[1] == f"cgroup layout: v1 ({LAYOUTS['v1']})"
    assert lines[2].split()[:2] == ["ok", "cgroup"]
    assert lines[-1].endswith(" no") and lines[-1].count(",") == 2
