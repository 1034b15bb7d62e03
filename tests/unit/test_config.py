import copy
import logging

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


@pytest.mark.parametrize(
    "env, key, closest",
    [
        (
            "DASK_OOMGAURD__WORKER__SAMPLE_INTERVAL",
            "oomgaurd.worker.sample-interval",
            "oomguard.worker.sample-interval",
        ),
        (
            "DASK_OOM_GUARD__SCHEDULER__STORE",
            "oom-guard.scheduler.store",
            "oomguard.scheduler.store",
        ),
        ("DASK_OOMGARD__STRICT_CONFIG", "oomgard.strict-config", "oomguard.strict-config"),
    ],
)
def test_a_misspelt_top_level_oomguard_is_named_with_oomguard(monkeypatch, env, key, closest):
    # Issue 41: `oomgaurd:` at the top of a Dask config file was ignored silently.
    with dask.config.set(dask.config.collect_env({env: "1s"})):
        found = _config.unknown_keys()
        assert [(u.key, u.closest, u.env) for u in found] == [(key, closest, "")]
        monkeypatch.setenv(env, "1s")
        message = _config.unknown_keys()[0].message()
    assert message == (
        f"{key} (set by {env}) is not an oomguard setting and is ignored; did you mean "
        f"{closest}? (oomguard.strict-config: true makes this an error)"
    )


def test_top_level_keys_far_from_oomguard_are_left_alone():
    with dask.config.set({"guard.x": 1, "memguard.y": 2, "distributed.scheduler.foo": 3}):
        assert _config.unknown_keys() == []


def test_a_misspelt_section_in_a_config_file_fails_under_strict_config(tmp_path):
    (tmp_path / "dask.yaml").write_text(
        "oomgaurd:\n  scheduler:\n    max-shard-infra-failures: 5\n"
    )
    with dask.config.set(dask.config.collect(paths=[str(tmp_path)], env={})):
        with dask.config.set({"oomguard.strict-config": True}):
            with pytest.raises(ConfigError) as e:
                _config.check_keys(logging.getLogger("oomguard.test"))
    assert "oomgaurd.scheduler.max-shard-infra-failures" in str(e.value)
    assert "did you mean oomguard.scheduler.max-shard-infra-failures?" in str(e.value)


@pytest.mark.parametrize(
    "value, word",
    [("no", "false"), ("No", "false"), ("off", "false"), ("0", "false"), (False, "false"),
     ("yes", "true"), ("on", "true"), ("1", "true"), (True, "true"), ("auto", "auto")],
)  # fmt: skip
def test_cgroup_limit_takes_the_boolean_words(value, word):
    # Issue 41: `cgroup-limit: "no"` was refused though the docs say booleans take yes/no.
    with dask.config.set({"oomguard.worker.cgroup-limit": value}):
        assert _config.get_choice("worker.cgroup-limit", ("auto", "true", "false")) == word


def test_a_wrong_choice_names_the_closest():
    with dask.config.set({"oomguard.worker.cgroup-limit": "atuo"}):
        with pytest.raises(ConfigError) as e:
            _config.get_choice("worker.cgroup-limit", ("auto", "true", "false"))
    assert str(e.value) == (
        "oomguard.worker.cgroup-limit is 'atuo'; expected one of auto, true, false "
        "(did you mean auto?)."
    )
