import copy

import dask
import pytest

from oomguard import _config
from oomguard._exceptions import ConfigError


def test_defaults_survive_a_reset_of_dasks_config():
    # distributed.utils_test resets dask.config.config to a copy taken before oomguard
    # was imported: every scheduler start then failed with KeyError: 'oomguard'.
    saved = copy.deepcopy(dask.config.config)
    try:
        dask.config.config.pop("oomguard", None)
        assert _config.get_seconds("scheduler.report-grace-timeout") > 0
        assert _config.get_int("scheduler.max-shard-infra-failures", 1) >= 1
        with pytest.raises(
            ConfigError, match="oomguard.scheduler.nope is not an oomguard setting"
        ):
            _config.get("scheduler.nope")
    finally:
        dask.config.config.clear()
        dask.config.config.update(saved)


def test_a_set_value_still_wins_over_the_packaged_default():
    with dask.config.set({"oomguard.scheduler.report-grace-timeout": "7s"}):
        assert _config.get_seconds("scheduler.report-grace-timeout") == 7.0


# --------------------------------------------------------------------------- unknown keys
# Issue 27: a mistyped key (DASK_OOMGUARD__SCHEDULER__MAX_SHARD_INFRA_FAILRES=5) was
# silently ignored and the process ran on defaults.


@pytest.mark.parametrize(
    "env, key, closest",
    [
        (
            "DASK_OOMGUARD__SCHEDULER__MAX_SHARD_INFRA_FAILRES",
            "oomguard.scheduler.max-shard-infra-failres",
            "oomguard.scheduler.max-shard-infra-failures",
        ),
        (
            "DASK_OOMGUARD__SCHEDULR__STORE",
            "oomguard.schedulr.store",
            "oomguard.scheduler.store",
        ),
        (
            "DASK_OOMGUARD__WORKER__SAMPLE_INTERVL",
            "oomguard.worker.sample-intervl",
            "oomguard.worker.sample-interval",
        ),
    ],
)
def test_an_unknown_key_is_named_with_the_closest_known_one(monkeypatch, env, key, closest):
    monkeypatch.setenv(env, "5")
    with dask.config.set(dask.config.collect_env({env: "5"})):
        found = _config.unknown_keys()
    assert [(u.key, u.closest) for u in found] == [(key, closest)]
    assert found[0].env == env  # the variable is named when it is what set the key
    message = found[0].message()
    assert key in message and closest in message and env in message, message
    assert "oomguard.strict-config" in message and "\n" not in message, message


def test_known_keys_with_underscores_or_dashes_are_not_unknown():
    with dask.config.set(
        dask.config.collect_env(
            {
                "DASK_OOMGUARD__SCHEDULER__MAX_SHARD_INFRA_FAILURES": "5",
                "DASK_OOMGUARD__WORKER__ADMISSION__STARTUP__MAX_WAIT": "1s",
            }
        )
    ):
        assert _config.unknown_keys() == []
    with dask.config.set({"oomguard.scheduler.kubernetes.label-selector": "a=b"}):
        assert _config.unknown_keys() == []


def test_check_keys_warns_once_per_key_and_strict_config_makes_it_an_error(caplog):
    import logging

    log = logging.getLogger("oomguard.test")
    with dask.config.set({"oomguard.worker.sample-intervl": "1s"}):
        with caplog.at_level(logging.WARNING, logger="oomguard.test"):
            _config.check_keys(log)
            _config.check_keys(log)  # a second plugin in the same process: no repeat
        ours = [r for r in caplog.records if r.name == "oomguard.test"]
        assert len(ours) == 1 and ours[0].levelno == logging.WARNING, caplog.text
        assert "oomguard.worker.sample-interval" in ours[0].getMessage()
        with dask.config.set({"oomguard.strict-config": True}):
            with pytest.raises(ConfigError, match="did you mean oomguard.worker.sample-interval"):
                _config.check_keys(log)
