"""Settings that apply or refuse (issue 12, build 1): never accepted and silently ignored."""

from __future__ import annotations

import logging

import pytest
from distributed import Client, LocalCluster

import oomguard
from oomguard._exceptions import ConfigError


@pytest.fixture
def preloaded(tmp_path):
    # oomguard already runs on the scheduler, as with `dask scheduler --preload`.
    with (
        LocalCluster(
            n_workers=0,
            processes=False,
            dashboard_address=":0",
            scheduler_kwargs={"preload": ["oomguard.scheduler_plugin"]},
        ) as cl,
        Client(cl) as client,
    ):
        yield cl.scheduler.plugins["oomguard"], client


def test_install_on_a_running_oomguard_applies_its_settings_and_says_which(preloaded):
    plugin, client = preloaded
    assert plugin.core.larger_only is True
    changed = oomguard.install(
        client, memory_retry_larger_only=False, max_shard_infra_failures=3
    )  # 3 is the default: no change
    assert changed == {"memory-retry-larger-only": (True, False)}
    assert plugin.core.larger_only is False
    assert oomguard.install(client, memory_retry_larger_only=False) == {}


@pytest.mark.parametrize(
    "setting, value, words",
    [
        (
            "memory_retry_larger_only",
            "abc",
            "oomguard.scheduler.memory-retry-larger-only is 'abc'; expected true or false",
        ),
        ("max_shard_infra_failures", 0, "max-shard-infra-failures is 0; it must be at least 1"),
        ("report_grace_timeout", "soon", "report-grace-timeout is 'soon'; expected a duration"),
        ("no_such_thing", 1, "unknown oomguard scheduler setting 'no-such-thing'"),
    ],
)
def test_a_bad_value_is_refused_naming_the_key_and_nothing_changes(
    preloaded, setting, value, words
):
    plugin, client = preloaded
    before = dict(plugin.settings)
    with pytest.raises(ConfigError) as info:
        oomguard.install(client, **{setting: value})
    assert words in str(info.value) and "\n" not in str(info.value)
    assert plugin.settings == before


def test_a_setting_fixed_while_running_is_refused(preloaded, tmp_path):
    from distributed.utils_test import captured_logger

    plugin, client = preloaded
    other = str(tmp_path / "other.sqlite3")
    with captured_logger("distributed", logging.INFO) as log:
        with pytest.raises(ConfigError, match="store is .* cannot change .* while oomguard runs"):
            oomguard.install(client, store=other, max_events=10)
    assert plugin.settings["max-events"] != 10  # all or nothing
    # Issue 27: the refusal said "store is None" (the setting left to its default) and the
    # scheduler's log got Dask's "Run Failed" warning with a traceback.
    with pytest.raises(ConfigError) as info:
        oomguard.install(client, store=other)
    text = log.getvalue()
    assert "Run Failed" not in text and "Traceback" not in text, text
    message = str(info.value)
    assert f"store is {plugin.store.path!r}" in message and other in message, message
    assert "None" not in message and "\n" not in message, message
    # The path it already has is no change, however it is spelt.
    assert oomguard.install(client, store=plugin.store.path) == {}


def test_install_where_none_runs_registers_with_its_settings(tmp_path):
    with (
        LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cl,
        Client(cl) as client,
    ):
        assert (
            oomguard.install(client, store=str(tmp_path / "f.sqlite3"), max_shard_infra_failures=2)
            == {}
        )
        plugin = cl.scheduler.plugins["oomguard"]
        assert plugin.settings["max-shard-infra-failures"] == 2
        assert plugin.core.policy.max_shard_infra_failures == 2


def _dask(args, env, timeout=90):
    import os
    import subprocess
    import sys

    dask = os.path.join(os.path.dirname(sys.executable), "dask")
    return subprocess.run(
        [dask, *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout
    )


def test_dask_scheduler_with_a_bad_setting_exits_with_one_line():
    out = _dask(
        [
            "scheduler",
            "--port",
            "0",
            "--dashboard-address",
            ":0",
            "--preload",
            "oomguard.scheduler_plugin",
        ],
        {"DASK_OOMGUARD__SCHEDULER__MAX_SHARD_INFRA_FAILURES": "abc"},
    )
    assert out.returncode == 2, out.stderr[-2000:]
    ours = [
        line for line in out.stderr.splitlines() if "oomguard" in line and "preload" not in line
    ]
    assert len(ours) == 1, out.stderr[-2000:]
    assert (
        " - CRITICAL - oomguard: oomguard.scheduler.max-shard-infra-failures is 'abc'; "
        "expected an integer. The scheduler does not start." in ours[0]
    )
    assert "Traceback" not in out.stderr


def test_dask_worker_with_a_bad_setting_never_runs_an_unguarded_worker(tmp_path):
    out = _dask(
        ["worker", "tcp://127.0.0.1:9", "--preload-nanny", "oomguard.worker_plugin"],
        {"DASK_OOMGUARD__WORKER__SAMPLE_INTERVAL": "soon"},
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "oomguard.worker.sample-interval is 'soon'; expected a duration" in out.stderr
    assert "Start worker" not in out.stderr and "Traceback" not in out.stderr


def test_on_setup_error_warn_runs_the_worker_and_says_it_is_unguarded(tmp_path):
    import os
    import subprocess
    import sys
    import time

    log = tmp_path / "worker.log"
    dask = os.path.join(os.path.dirname(sys.executable), "dask")
    env = {
        **os.environ,
        "DASK_OOMGUARD__WORKER__SAMPLE_INTERVAL": "soon",
        "DASK_OOMGUARD__WORKER__ON_SETUP_ERROR": "warn",
    }
    with open(log, "w") as f:
        proc = subprocess.Popen(
            [dask, "worker", "tcp://127.0.0.1:9", "--preload-nanny", "oomguard.worker_plugin"],
            env=env,
            stderr=f,
        )
    try:
        deadline = time.monotonic() + 60
        while "runs WITHOUT oomguard" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-2000:]
            time.sleep(0.2)
        assert (
            " - WARNING - oomguard: oomguard.worker.sample-interval is 'soon'" in log.read_text()
        )
        assert proc.poll() is None  # the nanny goes on (here: looking for its scheduler)
    finally:
        proc.kill()
        proc.wait(30)


def test_an_unguarded_worker_is_visible_on_the_scheduler(tmp_path):
    import time

    import dask

    # A setting only the nanny reads, so the scheduler's own oomguard starts fine.
    with dask.config.set(
        {
            "oomguard.worker.on-setup-error": "warn",
            "oomguard.worker.max-report-size": "huge",
            "oomguard.scheduler.store": str(tmp_path / "f.sqlite3"),
        }
    ):
        with (
            LocalCluster(
                n_workers=1,
                threads_per_worker=1,
                processes=True,
                dashboard_address=":0",
                scheduler_kwargs={"preload": ["oomguard.scheduler_plugin"]},
                preload_nanny=["oomguard.worker_plugin"],
            ) as cl,
            Client(cl) as client,
        ):
            plugin = cl.scheduler.plugins["oomguard"]
            deadline = time.monotonic() + 60
            while not plugin.unguarded and time.monotonic() < deadline:
                time.sleep(0.2)
            [(nanny, reason)] = plugin.unguarded.items()
            assert nanny == next(iter(cl.scheduler.workers.values())).nanny
            assert "oomguard.worker.max-report-size is 'huge'" in reason
            text = client.run_on_scheduler(_metrics_text)
            assert "oomguard_unguarded_nannies 1.0" in text
            assert client.submit(abs, -1).result() == 1  # the worker does run


def _metrics_text(dask_scheduler=None):
    from prometheus_client import generate_latest

    return generate_latest().decode()


# Issue 27: a mistyped key was silently ignored; the process ran on defaults.


def test_dask_scheduler_with_a_mistyped_key_warns_naming_the_closest_one():
    out = _dask(
        ["scheduler", "--port", "0", "--dashboard-address", ":0"]
        + ["--preload", "oomguard.scheduler_plugin", "--idle-timeout", "3s"],
        {"DASK_OOMGUARD__SCHEDULER__MAX_SHARD_INFRA_FAILRES": "5"},
    )
    lines = [line for line in out.stderr.splitlines() if "max-shard-infra-failres" in line]
    assert len(lines) == 1, out.stderr[-3000:]
    assert " - WARNING - oomguard: oomguard.scheduler.max-shard-infra-failres " in lines[0]
    assert "DASK_OOMGUARD__SCHEDULER__MAX_SHARD_INFRA_FAILRES" in lines[0]
    assert "did you mean oomguard.scheduler.max-shard-infra-failures?" in lines[0]
    assert "Traceback" not in out.stderr


def test_strict_config_stops_dask_scheduler_and_dask_worker_on_a_mistyped_key():
    out = _dask(
        ["scheduler", "--port", "0", "--dashboard-address", ":0"]
        + ["--preload", "oomguard.scheduler_plugin"],
        {"DASK_OOMGUARD__SCHEDULR__STORE": "/tmp/x.sqlite3", "DASK_OOMGUARD__STRICT_CONFIG": "1"},
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert (
        "oomguard.schedulr.store (set by DASK_OOMGUARD__SCHEDULR__STORE) is not an oomguard "
        in (out.stderr)
    )
    assert "did you mean oomguard.scheduler.store?" in out.stderr
    assert "Traceback" not in out.stderr
    out = _dask(
        ["worker", "tcp://127.0.0.1:9", "--preload-nanny", "oomguard.worker_plugin"],
        {"DASK_OOMGUARD__WORKER__SAMPLE_INTERVL": "1s", "DASK_OOMGUARD__STRICT_CONFIG": "true"},
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "did you mean oomguard.worker.sample-interval?" in out.stderr
    assert "Start worker" not in out.stderr and "Traceback" not in out.stderr
