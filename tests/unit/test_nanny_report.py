"""The nanny's report builder with evidence missing or broken (issue 3).

`Reporter.build` is the part of the nanny that reads files and counters after
a death; it runs here without a cluster, on files we break on purpose.
"""

from __future__ import annotations

import logging
import os

import pytest

from oomguard import CgroupError
from oomguard._death import wire as _wire
from oomguard._guard import Guard
from oomguard._host import cgroup as _cgroup
from oomguard._host.flight import FlightRecorder
from oomguard._host.paths import crash_path, flight_path
from oomguard.worker_plugin._life import _Life
from oomguard.worker_plugin._nanny import OomguardNannyPlugin
from oomguard.worker_plugin._placement import Placement
from oomguard.worker_plugin._reporting import Reporter


def _placement() -> Placement:
    return Placement("auto", Guard(None, logging.getLogger("test")), lambda: False)


def _plugin(tmp_path) -> OomguardNannyPlugin:
    plugin = OomguardNannyPlugin(crash_dir=str(tmp_path), cgroup_limit="false")
    plugin._resolve_config()
    return plugin


def _reporter(tmp_path) -> Reporter:
    return Reporter(None, str(tmp_path), None, Guard(None, logging.getLogger("test")))


def _life(pid, **kw) -> _Life:
    return _Life(pid=pid, started=1.0, address="tcp://w:1", name="w", memory_limit=2**30, **kw)


def test_missing_crash_file_and_flight_record_are_named(tmp_path):
    report = _wire.to_wire(
        _reporter(tmp_path).build(4321, -9, False, "tcp://w:1", _life(4321), 2.0)
    )
    assert report["cause"] == "sigkill"
    missing = " | ".join(report["missing"])
    assert "crash file: not found" in missing
    assert "flight record" in missing
    # Said in the evidence: the empty `executing` is not "nothing ran" (blame.recorded).
    assert report["evidence"]["flight_record"] is False
    _wire.validate(report)  # still a valid report


def test_corrupt_files_and_unreadable_cgroup_still_give_a_report(tmp_path):
    pid = 4322
    with open(crash_path(str(tmp_path), pid), "wb") as f:
        f.write(b"\xff\xfe garbage \x00 not a dump")
    with open(flight_path(str(tmp_path), pid), "wb") as f:
        f.write(b"OOMGFLT1" + b"\x00" * 10)  # right magic, truncated header
    gone = tmp_path / "no-such-cgroup"
    life = _life(pid, cgroup_path=str(gone), cgroup_version=1)
    report = _wire.to_wire(_reporter(tmp_path).build(pid, -11, False, "tcp://w:1", life, 2.0))
    assert report["cause"] == "native_crash"
    missing = " | ".join(report["missing"])
    assert "flight record" in missing
    assert "memory.oom_control" in missing or "memory.limit_in_bytes" in missing
    assert report["evidence"]["signal"] == "SIGSEGV"
    _wire.validate(report)


def test_unknown_exit_code_is_exit_with_what_was_known(tmp_path):
    pid = 4323
    rec = FlightRecorder.create(flight_path(str(tmp_path), pid))
    rec.task_started("('load', 3)", start=1.5)
    rec.close()
    report = _wire.to_wire(
        _reporter(tmp_path).build(pid, 255, False, "tcp://w:1", _life(pid), 2.0)
    )
    assert report["cause"] == "exit"
    assert report["exitcode"] == 255
    assert [e["key"] for e in report["executing"]] == ["('load', 3)"]
    assert report["evidence"]["flight_record"] is True
    assert report["executing"][0]["stack"] is None  # no sample was taken
    assert any("no stack sample" in m for m in report["missing"])
    # The files are gone once read.
    assert not os.path.exists(flight_path(str(tmp_path), pid))


def test_requested_close_is_not_a_failure(tmp_path):
    report = _wire.to_wire(
        _reporter(tmp_path).build(4324, -15, True, "tcp://w:1", _life(4324), 2.0)
    )
    assert report["cause"] == ""


def test_cgroup_limit_true_where_impossible_is_a_startup_error(tmp_path, monkeypatch):
    monkeypatch.setattr(_cgroup, "can_create_child", lambda info=None: (False, "read-only fs"))
    plugin = OomguardNannyPlugin(crash_dir=str(tmp_path), cgroup_limit="true")
    with pytest.raises(CgroupError, match="cgroup-limit is true.*read-only fs"):
        plugin.placement.decide()


def test_cgroup_limit_auto_where_impossible_logs_and_goes_on(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(_cgroup, "can_create_child", lambda info=None: (False, "read-only fs"))
    plugin = OomguardNannyPlugin(crash_dir=str(tmp_path), cgroup_limit="auto")
    with caplog.at_level(logging.INFO, logger="oomguard.nanny"):
        plugin.placement.decide()
    assert plugin.placement.use_cgroups is False
    assert "no per-worker memory cgroups (read-only fs)" in caplog.text


def test_bad_cgroup_limit_value_names_the_key(tmp_path):
    import dask

    with dask.config.set({"oomguard.worker.cgroup-limit": "sometimes"}):
        with pytest.raises(ValueError, match="oomguard.worker.cgroup-limit is 'sometimes'"):
            OomguardNannyPlugin(crash_dir=str(tmp_path))._resolve_config()


def test_install_rejects_an_unknown_setting_by_name():
    from oomguard.scheduler_plugin import OomguardSchedulerPlugin

    with pytest.raises(
        ValueError, match="unknown oomguard scheduler setting 'max-shard-failures'"
    ):
        OomguardSchedulerPlugin(max_shard_failures=2)
    plugin = OomguardSchedulerPlugin(max_shard_infra_failures=2, **{"kubernetes.enabled": False})
    assert plugin.config["max-shard-infra-failures"] == 2


def test_stale_group_predicate_only_takes_dead_worker_pids():
    from oomguard.worker_plugin._placement import _dead_worker_group

    assert _dead_worker_group(f"oomguard-worker-{os.getpid()}") is False  # alive
    assert _dead_worker_group("oomguard-worker-not-a-pid") is False
    assert _dead_worker_group("oomguard-worker-4194303") is True  # above pid_max: dead


# ------------------------------------------------------------------ the worker's own group

MiB = 2**20


class _FakeGroup:
    """A ChildGroup that records what the nanny asked of it; the kernel's answers are set."""

    def __init__(self, name, limit, *, version=1, move_ok=True, refuse_moving_charge=False):
        self.path, self.version, self.limit = f"/cg/{name}", version, limit
        self.move_ok, self.refuse_moving_charge = move_ok, refuse_moving_charge
        self.moving = False
        self.pids: list[int] = []
        self.calls: list[str] = []
        self.removed = False

    def set_move_charge(self, on=True):
        self.calls.append(f"move_charge={on}")
        if self.version == 2:
            return False, "cgroup v2 never moves charges"
        if not self.move_ok:
            return False, "memory.move_charge_at_immigrate refused (EINVAL): gone"
        self.moving = on
        return True, ""

    def add_pid(self, pid):
        self.calls.append(f"add {pid} moving={self.moving}")
        if self.moving and self.refuse_moving_charge:
            # v1 refuses the whole move when the charge does not fit under the limit.
            raise CgroupError(f"Cannot move pid {pid} into {self.path}: Cannot allocate memory")
        self.pids.append(pid)

    def counters(self):
        return _cgroup.MemoryCounters(self.version, self.path, 0, None, None, 0, 0, self.limit, 0)

    def remove(self, timeout=5.0):
        self.removed = True
        return True


def _fake_groups(monkeypatch, **kernel):
    made: list[_FakeGroup] = []

    class Factory:
        @staticmethod
        def create(name, limit):
            g = _FakeGroup(name, limit, **kernel)
            made.append(g)
            return g

    monkeypatch.setattr(_cgroup, "ChildGroup", Factory)
    monkeypatch.setattr(_cgroup, "process_rss", lambda pid: 130 * MiB)
    return made


@pytest.mark.parametrize(
    "kernel, moved, note",
    [
        ({}, True, ""),
        ({"move_ok": False}, False, "refused (EINVAL)"),
        ({"refuse_moving_charge": True}, False, "moved without it"),
        ({"version": 2}, False, "never moves"),
    ],
)
def test_the_worker_is_moved_with_its_charge_where_the_kernel_can(
    tmp_path, monkeypatch, kernel, moved, note
):
    made = _fake_groups(monkeypatch, **kernel)
    placed = _placement().place(77, 600 * MiB)
    (group,) = made
    assert placed.group is group and group.pids == [77] and group.limit == 600 * MiB
    assert group.calls[0] == "move_charge=True"  # set before the PID moves
    facts = placed.facts()
    assert facts == {
        "own_group": True,
        "charge_moved": moved,
        "rss_at_move": 130 * MiB,
        "note": facts["note"],
    }
    assert note in facts["note"]


def test_a_group_that_cannot_take_the_worker_is_removed_and_named(tmp_path, monkeypatch):
    made = _fake_groups(monkeypatch)

    def never(pid):
        raise CgroupError(f"Cannot move pid {pid} into /cg/x: No such process")

    placed = _placement().place
    monkeypatch.setattr(_FakeGroup, "add_pid", lambda self, pid: never(pid))
    result = placed(78, None)
    assert result.group is None and made[0].removed
    assert result.facts()["own_group"] is False
    assert "per-worker cgroup: Cannot move pid 78" in result.missing[0]


def test_the_report_says_what_the_groups_peak_covers(tmp_path):
    placement = {
        "own_group": True,
        "charge_moved": False,
        "rss_at_move": 9 * MiB,
        "note": "memory.move_charge_at_immigrate refused (EINVAL)",
    }
    life = _life(4330, cgroup_path=str(tmp_path / "gone"), cgroup_version=1, placement=placement)
    report = _wire.to_wire(_reporter(tmp_path).build(4330, -9, False, "tcp://w:1", life, 2.0))
    ev = report["evidence"]
    assert (ev["peak_scope"], ev["charge_moved"], ev["rss_at_move_bytes"]) == (
        "worker",
        False,
        9 * MiB,
    )
    assert "before it joined its group" in ev["peak_covers"]
    _wire.validate(report)


def test_a_worker_that_dies_before_it_is_up_is_reported_from_its_group(tmp_path, monkeypatch):
    import asyncio

    from oomguard.worker_plugin._placement import _Placement

    plugin = _plugin(tmp_path)
    lives = []

    async def report(pid, exitcode, requested, address, life, death_time):
        lives.append(life)

    monkeypatch.setattr(plugin.reporter, "report", report)
    group = _FakeGroup("oomguard-worker-91", 150 * MiB)
    plugin.placement.placed = _Placement(
        91, group=group, charge_moved=False, rss_at_move=5 * MiB, before={"oom_kill": 0}
    )

    async def die():
        plugin._on_exit(91, -9, False, None)
        await asyncio.gather(*plugin._tasks)

    asyncio.run(die())
    (life,) = lives
    assert plugin.placement.placed is None
    assert (life.pid, life.cgroup_path, life.cgroup_before) == (91, group.path, {"oom_kill": 0})
    assert life.placement == {
        "own_group": True,
        "charge_moved": False,
        "rss_at_move": 5 * MiB,
        "note": "",
    }
    assert "the worker died before it was up" in life.missing
