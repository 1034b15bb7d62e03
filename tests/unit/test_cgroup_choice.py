"""Whether a nanny gives each worker a memory group of its own (`per_worker_choice`): none
by default inside a SLURM job's group, whose tree a group of ours would leave on the node
when SLURM kills the job; the nanny and `oomguard doctor` say why."""

from __future__ import annotations

import doctest
import logging
import pathlib
import shutil

import pytest

from oomguard._cli.doctor.cgroup import check_cgroup
from oomguard._host import cgroup as _cgroup
from oomguard._host.cgroup import choice as _choice
from oomguard._host.cgroup.info import CgroupInfo
from oomguard.worker_plugin import _placement
from oomguard.worker_plugin._nanny import OomguardNannyPlugin

V1_TASK = "/sys/fs/cgroup/memory/slurm/uid_1000/job_12/step_batch/task_0"
V1_NODE = "/sys/fs/cgroup/memory/slurm_node7/uid_0/job_12/step_0/task_3"
V2_TASK = "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_12/step_batch/user/task_0"
K8S = "/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/cri-containerd-8e0f.scope"
FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "cgroup"


@pytest.mark.parametrize(
    ("setting", "job", "group", "choice"),
    [
        # auto: per-worker groups wherever they can be made, but in SLURM's job group.
        ("auto", "12", V1_TASK, "off"),
        ("auto", "12", V1_NODE, "off"),
        ("auto", "12", V2_TASK, "off"),
        ("auto", "12", "/sys/fs/cgroup/memory/slurm/uid_0/job_12", "off"),
        ("auto", None, V1_TASK, "if-possible"),  # no SLURM_JOB_ID: not the nanny's job
        ("auto", "13", V1_TASK, "if-possible"),  # another job's group
        ("auto", "12", "/sys/fs/cgroup/memory/user.slice/job_12", "if-possible"),  # not SLURM's
        ("auto", "12", "/sys/fs/cgroup/memory/job_12/slurm", "if-possible"),  # slurm below it
        ("auto", "12", None, "if-possible"),  # no memory group: the probe says why
        ("auto", "12", K8S, "if-possible"),  # SLURM_JOB_ID inherited outside its group
        ("auto", None, K8S, "if-possible"),
        ("auto", None, "/sys/fs/cgroup/memory", "if-possible"),
        # An explicit choice is kept, in SLURM's group too.
        ("true", "12", V1_TASK, "required"),
        ("true", None, K8S, "required"),
        ("false", "12", V1_TASK, "off"),
        ("false", None, K8S, "off"),
    ],
)
def test_per_worker_choice(setting, job, group, choice):
    assert _cgroup.per_worker_choice(setting, job, group)[0] == choice


def test_why_none_in_a_slurm_job_names_the_job_and_the_fix():
    choice, why = _cgroup.per_worker_choice("auto", "12", V1_TASK)
    assert choice == "off"
    assert why.startswith("inside SLURM job 12: SLURM's job group already bounds the worker")
    assert "outlive a job SLURM kills" in why
    assert "oomguard.worker.cgroup-limit: true" in why


def test_doctests():
    assert doctest.testmod(_choice).attempted and doctest.testmod(_choice).failed == 0


def _probe_must_not_run(*args, **kwargs):
    raise AssertionError("probed for per-worker groups inside a SLURM job's group")


def test_nanny_in_a_slurm_job_makes_no_group_and_says_why(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setattr(_cgroup, "detect", lambda *a, **k: CgroupInfo(1, "/m", V1_TASK))
    monkeypatch.setattr(_cgroup, "can_create_child", _probe_must_not_run)
    monkeypatch.setattr(_placement, "_SAID", set())
    plugin = OomguardNannyPlugin(crash_dir=str(tmp_path), cgroup_limit="auto")
    with caplog.at_level(logging.INFO, logger="oomguard.nanny"):
        plugin.placement.decide()
        # Set up again (the preload, then the scheduler's push): said once.
        OomguardNannyPlugin(crash_dir=str(tmp_path), cgroup_limit="auto").placement.decide()
    assert plugin.placement.use_cgroups is False
    (record,) = [r for r in caplog.records if "per-worker" in r.getMessage()]
    assert record.levelno == logging.INFO
    assert record.getMessage().startswith(
        "oomguard: no per-worker memory cgroups (inside SLURM job 12: SLURM's job group"
    )


def test_nanny_in_a_slurm_job_keeps_an_explicit_true(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setattr(_cgroup, "detect", lambda *a, **k: CgroupInfo(1, "/m", V1_TASK))
    monkeypatch.setattr(_cgroup, "can_create_child", lambda info=None: (True, ""))
    monkeypatch.setattr(_cgroup, "cleanup_stale", lambda *a, **k: 0)
    plugin = OomguardNannyPlugin(crash_dir=str(tmp_path), cgroup_limit="true")
    plugin.placement.decide()
    assert plugin.placement.use_cgroups is True


def test_nanny_outside_slurm_keeps_per_worker_groups_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setattr(_cgroup, "detect", lambda *a, **k: CgroupInfo(2, "/sys/fs/cgroup", K8S))
    monkeypatch.setattr(_cgroup, "can_create_child", lambda info=None: (True, ""))
    monkeypatch.setattr(_cgroup, "cleanup_stale", lambda *a, **k: 0)
    plugin = OomguardNannyPlugin(crash_dir=str(tmp_path), cgroup_limit="auto")
    plugin.placement.decide()
    assert plugin.placement.use_cgroups is True


def _slurm_tree(tmp_path) -> tuple[str, CgroupInfo]:
    """The v1 host fixture with the nanny in SLURM's task group of job 12."""
    root = tmp_path / "v1-host"
    shutil.copytree(FIXTURES / "v1-host", root)
    memory = root / "sys/fs/cgroup/memory"
    task = memory / "slurm/uid_0/job_12/step_batch/task_0"
    task.mkdir(parents=True)
    (task / "memory.max_usage_in_bytes").write_text("0\n")
    return str(root), CgroupInfo(1, str(memory), str(task))


def test_doctor_in_a_slurm_job_says_why_no_per_worker_group(tmp_path):
    root, info = _slurm_tree(tmp_path)
    layout, checks = check_cgroup(
        root, info=info, probe=_probe_must_not_run, setting="auto", slurm_job_id="12"
    )
    assert layout == "v1-shared"
    (per_worker,) = [c for c in checks if c.name == "cgroup.per-worker"]
    assert per_worker.status == "ok", per_worker
    assert per_worker.detail.startswith(
        "no per-worker memory groups (inside SLURM job 12: SLURM's job group already bounds"
    )
    assert [c.status for c in checks] == ["ok"] * len(checks)


def test_doctor_in_a_slurm_job_with_true_probes(tmp_path):
    root, info = _slurm_tree(tmp_path)
    layout, checks = check_cgroup(
        root, info=info, probe=lambda info: (True, ""), setting="true", slurm_job_id="12"
    )
    assert layout == "v1"
    (per_worker,) = [c for c in checks if c.name == "cgroup.per-worker"]
    assert per_worker.detail.startswith("a probe child group was created and removed")
