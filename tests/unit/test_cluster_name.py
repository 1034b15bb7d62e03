"""A cluster's name (oomguard.scheduler.cluster-name): the setting checked, else what the
deployment puts in the scheduler's environment or host name, else host:port."""

from __future__ import annotations

import dask
import pytest

from oomguard import _config
from oomguard._exceptions import ConfigError
from oomguard.scheduler_plugin._cluster_name import clean, detect

KEY = "oomguard.scheduler.cluster-name"
ENV = "DASK_OOMGUARD__SCHEDULER__CLUSTER_NAME"
POD = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}


def setting(value):
    return _config.scheduler_settings({"cluster-name": value})["cluster-name"]


@pytest.mark.parametrize(
    "value, name",
    [
        (None, None),
        ("", None),
        ("  etl-nightly  ", "etl-nightly"),
        ("équipe données / prod", "équipe données / prod"),
        (2026, "2026"),  # DASK_..._CLUSTER_NAME=2026 arrives as a number
        ("x" * 200, "x" * 200),
    ],
)
def test_a_good_name_is_taken(value, name):
    assert setting(value) == name


@pytest.mark.parametrize(
    "value, why",
    [
        ("x" * 201, "at most 200"),
        ("etl\nnightly", "printable"),
        ("etl\x1b[31m", "printable"),
        ("   ", "only spaces"),
        (True, "expected a name"),
        (["etl"], "expected a name"),
    ],
)
def test_a_bad_name_is_refused_naming_the_key(value, why):
    with pytest.raises(ConfigError, match=KEY) as info:
        setting(value)
    assert why in str(info.value)


def test_the_environment_variable_sets_it():
    with dask.config.set(dask.config.collect_env({ENV: "etl-nightly"})):
        assert _config.scheduler_settings()["cluster-name"] == "etl-nightly"
    with dask.config.set(dask.config.collect_env({ENV: "a\tb"})):
        with pytest.raises(ConfigError, match=KEY):
            _config.scheduler_settings()


@pytest.mark.parametrize(
    "configured, environ, hostname, port, expected",
    [
        # The setting wins over everything the deployment says.
        ("etl", {"DASK_GATEWAY_CLUSTER_NAME": "ns.abc", **POD}, "x-scheduler", 8786, "etl"),
        # dask-gateway names the cluster in the scheduler's environment.
        (
            None,
            {"DASK_GATEWAY_CLUSTER_NAME": "dask-gateway.3f9a1c"},
            "h",
            8786,
            "dask-gateway.3f9a1c",
        ),
        # The operator: a Deployment's pod, and the bare Pod of operators before 2023.
        (None, POD, "etl-nightly-scheduler-7d9c5b8f4-x2k9q", 8786, "etl-nightly"),
        (None, POD, "etl-nightly-scheduler", 8786, "etl-nightly"),
        # Not the operator's form, or not in a pod: host and port.
        (None, POD, "etl-nightly-scheduler-0", 8786, "etl-nightly-scheduler-0:8786"),
        (None, POD, "etl-scheduler-7d9c5b8f4-x2k9a", 8786, "etl-scheduler-7d9c5b8f4-x2k9a:8786"),
        (None, {}, "etl-nightly-scheduler", 8786, "etl-nightly-scheduler:8786"),
        (None, {"DASK_GATEWAY_CLUSTER_NAME": "  "}, "node-3", 40123, "node-3:40123"),
        # An inproc scheduler has no port.
        (None, {}, "node-3", None, "node-3"),
    ],
)
def test_the_name_the_deployment_gives(configured, environ, hostname, port, expected):
    assert detect(configured, environ, hostname, port)[0] == expected


def test_a_name_from_outside_is_made_printable_and_bounded():
    name, source = detect(None, {"DASK_GATEWAY_CLUSTER_NAME": "a\x1b[2Jb" + "x" * 300}, "h", 1)
    assert name == clean(name) and name.isprintable() and len(name) == 200
    assert name.startswith("a?[2Jb") and source == "DASK_GATEWAY_CLUSTER_NAME"
