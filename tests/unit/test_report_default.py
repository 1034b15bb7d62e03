"""The default history (issue 38, point 4): with no `store` setting a scheduler keeps one file
per cluster name in this user's state directory, and `oomguard report` with neither
--scheduler nor --store reads it, saying which; where the state directory cannot be written,
a directory in /tmp instead, with one WARNING."""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
import tempfile
import time

import dask
import pytest

from _cli_run import report
from oomguard import FailureEvent
from oomguard._store import FailureStore, home
from oomguard.scheduler_plugin import _setup


def _history(path: pathlib.Path, cluster: str, shard: str) -> None:
    store = FailureStore(str(path), batch_interval=0.01)
    store.start()
    store.add(
        FailureEvent(
            kind="infra",
            cause="oom_kill",
            shard=shard,
            pipeline="etl",
            worker="tcp://10.0.0.1:4000",
            host="node-a",
            signature_id="sig",
            signature_title="oom_kill in load",
            evidence={},
            attempt=1,
            time=time.time(),
            cluster=cluster,
        )
    )
    assert store.flush(), store.last_error
    store.close()


@pytest.fixture
def no_scheduler(monkeypatch, tmp_path):
    """No scheduler-address setting, and /tmp (the fallback directory) of this test only."""
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with dask.config.set({"scheduler-address": None}):
        yield


def test_no_history_on_this_host_says_where_it_looked(no_scheduler, state_home, capsys):
    rc, out, err = report(capsys, "--events")
    assert (rc, out) == (1, "")
    assert err == (
        f"oomguard report: no failure history on this host (none in {state_home}/oomguard, "
        "where a scheduler with no oomguard.scheduler.store setting keeps it): give "
        "--scheduler ADDRESS or --store PATH (or set DASK_SCHEDULER_ADDRESS)\n"
    )


def test_the_last_written_history_is_read_and_named_with_the_others(
    no_scheduler, state_home, capsys
):
    directory = state_home / "oomguard"
    _history(directory / home.file_name("etl/nightly"), "etl/nightly", "('load', 1)")
    _history(directory / home.file_name("node-3:8786"), "node-3:8786", "('load', 2)")
    old = time.time() - 3600
    for name in os.listdir(directory):  # etl/nightly written an hour ago
        if name.startswith("etl"):
            os.utime(directory / name, (old, old))
    assert [h.cluster for h in home.histories()] == ["node-3:8786", "etl/nightly"]

    rc, out, err = report(capsys, "--events")
    assert rc == 0 and "('load', 2)" in out and "('load', 1)" not in out
    assert err == (
        "oomguard report: reading the history of cluster 'node-3:8786' in "
        f"{directory}/node-3:8786.sqlite3, the last written of 2 on this host; the others: "
        "'etl/nightly' (--cluster NAME reads one)\n"
    )
    rc, out, err = report(capsys, "--events", "--cluster", "etl/nightly")
    assert rc == 0 and "('load', 1)" in out and "('load', 2)" not in out
    assert f"in {directory}/etl%2Fnightly.sqlite3" in err
    # A command oomguard suggests finds its shard in the history written last.
    rc, out, _ = report(capsys, "--shard", "('load', 2)")
    assert rc == 0 and "EVENTS: 1, oldest first" in out


def test_a_cluster_with_no_history_here_exits_3_with_the_names(no_scheduler, state_home, capsys):
    _history(state_home / "oomguard" / "etl.sqlite3", "etl", "('load', 1)")
    rc, out, err = report(capsys, "--cluster", "elt")
    assert (rc, out) == (3, "")
    assert err == (
        "oomguard report: --cluster 'elt' names no cluster with a history on this host; known "
        "clusters, most recent first: 'etl' (did you mean 'etl'?)\n"
    )


def test_the_store_setting_of_this_host_comes_first(no_scheduler, state_home, tmp_path, capsys):
    _history(state_home / "oomguard" / "etl.sqlite3", "etl", "('load', 1)")
    _history(tmp_path / "set.sqlite3", "other", "('load', 9)")
    with dask.config.set({"oomguard.scheduler.store": str(tmp_path / "set.sqlite3")}):
        rc, out, err = report(capsys, "--events")
    assert rc == 0 and "('load', 9)" in out
    assert err == (
        f"oomguard report: reading {tmp_path}/set.sqlite3 (oomguard.scheduler.store here)\n"
    )


def test_the_scheduler_falls_back_to_tmp_with_a_warning(
    no_scheduler, tmp_path, caplog, monkeypatch
):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")  # the state directory cannot be made under a file
    monkeypatch.setenv("XDG_STATE_HOME", str(blocker))
    with caplog.at_level(logging.WARNING, logger="oomguard.scheduler"):
        path = _setup.default_path("etl", spool=False)
    fallback = tmp_path / "tmp" / f"oomguard-{os.geteuid()}" / "history"
    assert path == str(fallback / "etl.sqlite3")
    (warning,) = caplog.records
    assert f"cannot be kept in {blocker}/oomguard: it cannot be made" in warning.message
    assert "set oomguard.scheduler.store" in warning.message
    # ... and the report finds it there.
    _history(pathlib.Path(path), "etl", "('load', 4)")
    assert [h.path for h in home.histories()] == [path]


def test_the_spool_of_a_postgresql_history_sits_apart(state_home):
    history = _setup.default_path("etl", spool=False)
    spool = _setup.default_path("etl", spool=True)
    assert history == f"{state_home}/oomguard/etl.sqlite3"
    assert spool == f"{state_home}/oomguard/spool/etl.sqlite3"
    os.makedirs(os.path.dirname(spool))
    shutil.copyfile(__file__, spool)
    assert home.histories() == []  # a spool is not a history of its own


@pytest.mark.parametrize("name", ["a", "node-3:8786", "etl/nightly", "..", "日本", "x" * 200])
def test_every_cluster_name_has_a_file_of_its_own(name):
    file = home.file_name(name)
    assert "/" not in file and not file.startswith(".") and len(file.encode()) <= 255
    if len(name) < 60:
        assert home.cluster_of(file) == name
    assert home.file_name(name + "y") != file


def test_the_doctor_says_where_the_history_is_and_its_command_reads_it(
    no_scheduler, state_home, capsys
):
    from oomguard._cli.doctor.history import check_history

    _history(state_home / "oomguard" / "etl.sqlite3", "etl", "('load', 1)")
    check = check_history()
    assert check.status == "ok" and check.detail.startswith(f"{state_home}/oomguard: ")
    (command,) = [c for c in check.detail.split("`")[1::2] if c.startswith("oomguard ")]
    rc, out, _ = report(capsys, *command.split()[2:])
    assert rc == 0 and "('load', 1)" in out


def test_the_doctor_warns_where_the_history_would_not_last(no_scheduler, tmp_path, monkeypatch):
    from oomguard._cli.doctor.history import check_history

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "file"))
    check = check_history()
    assert check.status == "warn" and "which a reboot or a cleaned /tmp removes" in check.detail
    assert "oomguard.scheduler.store" in check.fix and "XDG_STATE_HOME" in check.fix
