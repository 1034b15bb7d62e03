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
