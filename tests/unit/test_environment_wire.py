"""A worker's environment (issue 40) from where it is read to where it arrives: what the
nanny and the worker read (`_host.environment`: versions, kernel, image, the labels named
and no other variable), the packages a crash's stack names, the config key that names the
labels, the cut at the nanny's door (`build`), and the wire schema at the scheduler's:
bad types refused naming the field, oversize refused, control characters made safe, a
report without it (an older nanny) still valid, and a host event's checked the same way."""

from __future__ import annotations

import dataclasses
import os
import platform
import subprocess
import sys

import dask
import pytest

from oomguard import ConfigError, ReportError
from oomguard._death.build import EXAMPLE, build
from oomguard._death.environment import package_of, stack_packages, stack_paths
from oomguard._death.record import (
    ENV_VALUE_MAX,
    LABELS_MAX,
    PACKAGES_MAX,
    Environment,
)
from oomguard._death.wire import decode, encode, environment, to_wire, validate
from oomguard._host.environment import (
    IMAGE_VARIABLES,
    PackageVersions,
    configured_labels,
    read,
)

SPOT = Environment(
    python="3.11.9",
    dask="2026.8.0",
    distributed="2026.8.0",
    oomguard="0.1.0",
    kernel="6.1.0-18-amd64",
    image="ghcr.io/dask/dask:2026.8.0",
    labels={"NODE_POOL": "spot", "INSTANCE_TYPE": "m5.xlarge"},
    packages={"pyarrow": "17.0.0"},
)


def report(env: Environment | None = SPOT) -> dict:
    return to_wire(build(dataclasses.replace(EXAMPLE, environment=env)))


# --------------------------------------------------------------------------- reading


def test_read_names_the_versions_kernel_image_and_only_the_labels_asked_for():
    environ = {
        "NODE_POOL": "spot",
        "AWS_SECRET_ACCESS_KEY": "hunter2",
        "JUPYTER_IMAGE": "jupyter/base:1",
        "OOMGUARD_IMAGE": "registry.example/etl:7",
    }
    e = read(environ, ("NODE_POOL", "ZONE"))
    assert e.labels == {"NODE_POOL": "spot"}  # ZONE unset: left out
    assert "hunter2" not in repr(e)
    assert e.image == "registry.example/etl:7"  # the first of IMAGE_VARIABLES set
    assert IMAGE_VARIABLES[0] == "OOMGUARD_IMAGE"
    assert read({"JUPYTER_IMAGE": "jupyter/base:1"}, ()).image == "jupyter/base:1"
    import dask as d
    import distributed

    assert (e.python, e.dask, e.distributed) == (
        platform.python_version(),
        d.__version__,
        distributed.__version__,
    )
    assert e.oomguard and e.kernel == os.uname().release
    assert e.packages == {}


def test_a_labels_value_is_cut_and_made_one_printable_line():
    e = read({"NODE_POOL": "spot\x1b[2J\n" + "x" * 10_000}, ("NODE_POOL",))
    value = e.labels["NODE_POOL"]
    assert value.isprintable() and len(value.encode()) <= ENV_VALUE_MAX
    assert value.startswith("spot\\x1b[2J\\x0a")


def test_the_config_names_environment_variables():
    with dask.config.set({"oomguard.worker.labels": ["NODE_POOL", "INSTANCE_TYPE", "NODE_POOL"]}):
        assert configured_labels() == ("NODE_POOL", "INSTANCE_TYPE")
    with dask.config.set({"oomguard.worker.labels": "NODE_POOL, ZONE"}):
        assert configured_labels() == ("NODE_POOL", "ZONE")
    assert configured_labels() == ()  # the default
    for bad, said in (
        (["NODE POOL"], "'NODE POOL'"),
        (["1POOL"], "'1POOL'"),
        (["kernel"], "none of python"),
        ([f"L{i}" for i in range(LABELS_MAX + 1)], "at most 16"),
        (7, "expected a list"),
        ([["a"]], "expected a list"),
    ):
        with dask.config.set({"oomguard.worker.labels": bad}):
            with pytest.raises(ConfigError) as err:
                configured_labels()
        assert "oomguard.worker.labels" in str(err.value) and said in str(err.value)


def test_dask_maps_the_variable_onto_the_key():
    code = "from oomguard._host.environment import configured_labels; print(configured_labels())"
    for value, out in (("NODE_POOL,ZONE", "('NODE_POOL', 'ZONE')"), ("['A']", "('A',)")):
        env = {**os.environ, "DASK_OOMGUARD__WORKER__LABELS": value}
        got = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert got.stdout.strip() == out


# --------------------------------------------------------------------------- the stack


CRASH = (
    "Fatal Python error: Segmentation fault\n\n"
    "Thread 0x00007f1c2a3b5700 (most recent call first):\n"
    '  File "/v/lib/python3.11/site-packages/tornado/ioloop.py", line 1 in start\n\n'
    "Current thread 0x00007f1c2a3b4700 (most recent call first):\n"
    '  File "/v/lib/python3.11/site-packages/pyarrow/parquet/core.py", line 9 in read\n'
    '  File "/app/etl.py", line 3 in load\n'
    '  File "/v/lib/python3.11/site-packages/distributed/worker.py", line 2990 in execute\n'
    '  File "/usr/lib/python3.11/threading.py", line 982 in run\n'
)


def test_the_crashing_threads_packages_innermost_first():
    executing = [
        {"key": "x", "stack": [("/v/lib/python3.11/site-packages/pandas/io.py", 1, "f"),
                               ("/usr/lib/python3/dist-packages/numpy/core.py", 2, "g")]},
        {"key": "y", "stack": None},
        "junk",
    ]  # fmt: skip
    paths = stack_paths(CRASH, executing)
    known = {"pyarrow": "17.0.0", "numpy": "1.26"}
    # The crashing thread's first (tornado's thread is not it), then the sampled stacks,
    # innermost first; dask, distributed and oomguard left out (the environment has them).
    assert stack_packages(paths, lambda name: known.get(name, "")) == {
        "pyarrow": "17.0.0",
        "numpy": "1.26",
        "pandas": "",
    }
    assert package_of("<dynamic-code>") is None and package_of("/app/etl.py") is None
    many = [f"/s/site-packages/p{i}/m.py" for i in range(PACKAGES_MAX + 5)]
    assert len(stack_packages(many, lambda name: "1")) == PACKAGES_MAX


def test_package_versions_are_looked_up_once_even_by_import_name():
    versions = PackageVersions()
    import importlib.metadata

    import yaml

    assert versions("msgpack") == importlib.metadata.version("msgpack")
    assert versions("yaml") == yaml.__version__  # no distribution is called "yaml"
    assert versions("no_such_package_here") == ""
    assert set(versions._known) == {"msgpack", "yaml", "no_such_package_here"}


# --------------------------------------------------------------------------- the nanny's door


def test_the_nanny_cuts_what_does_not_fit():
    huge = Environment(
        python="3" * 1000,
        labels={f"L{i}": "v" * 1000 for i in range(40)} | {"X" * 500: "v"},
        packages={f"p{i}": "1" for i in range(40)},
    )
    e = build(dataclasses.replace(EXAMPLE, environment=huge)).environment
    assert len(e.python.encode()) <= ENV_VALUE_MAX
    assert len(e.labels) == LABELS_MAX and len(e.packages) == PACKAGES_MAX
    assert all(len(v.encode()) <= ENV_VALUE_MAX for v in e.labels.values())
    validate(to_wire(build(dataclasses.replace(EXAMPLE, environment=huge))))  # it travels
    d = build(dataclasses.replace(EXAMPLE, environment={"labels": {}}))
    assert d.environment is None
    assert "environment: not an Environment (dict), dropped" in d.missing


# --------------------------------------------------------------------------- the wire


def test_a_death_carries_its_environment_there_and_back():
    assert (
        decode(encode(build(dataclasses.replace(EXAMPLE, environment=SPOT)))).environment == SPOT
    )


def test_an_older_nannys_report_without_one_is_valid():
    r = report(None)
    assert r["environment"] is None and validate(r).environment is None
    del r["environment"]
    assert validate(r).environment is None


@pytest.mark.parametrize(
    "change, field, reason",
    [
        ({"environment": "spot"}, "environment", "wrong_type"),
        ({"python": 3}, "environment.python", "wrong_type"),
        ({"labels": ["NODE_POOL"]}, "environment.labels", "wrong_type"),
        ({"labels": {"NODE_POOL": 7}}, "environment.labels.NODE_POOL", "wrong_type"),
        ({"labels": {"NODE_POOL": None}}, "environment.labels.NODE_POOL", "wrong_type"),
        ({"packages": {"pyarrow": b"\x80\x04"}}, "environment.packages.pyarrow", "pickled"),
        ({"labels": {f"L{i}": "a" for i in range(17)}}, "environment.labels", "too_large"),
        ({"labels": {"L" * 65: "a"}}, "environment.labels", "too_large"),
        ({"labels": {"L": "a" * 129}}, "environment.labels.L", "too_large"),
        ({"image": "i" * 257}, "environment.image", "too_large"),
        ({"zone": "a"}, "environment.zone", "bad_value"),
    ],
)
def test_a_bad_environment_is_refused_naming_the_field(change, field, reason):
    r = report()
    if "environment" in change:
        r.update(change)
    else:
        r["environment"] = {**r["environment"], **change}
    with pytest.raises(ReportError) as err:
        validate(r)
    assert (err.value.field, err.value.reason) == (field, reason)


def test_control_characters_are_made_safe_on_arrival_not_refused():
    r = report()
    r["environment"]["labels"] = {"NODE_POOL": "spot\x1b[31m", "A\x00": "b"}
    r["environment"]["kernel"] = "6.1\r\nforged line"
    e = validate(r).environment
    assert e.labels == {"NODE_POOL": "spot\\x1b[31m", "A\\x00": "b"}
    assert e.kernel == "6.1\\x0d\\x0aforged line"


def test_a_host_events_environment_is_checked_the_same_way():
    assert environment(to_wire(SPOT)) == SPOT
    with pytest.raises(ReportError) as err:
        environment({**to_wire(SPOT), "labels": {"NODE_POOL": 1}})
    assert err.value.field == "environment.labels.NODE_POOL"
    for junk in (None, [], "x", {"python": "3"}, {**to_wire(SPOT), "more": 1}):
        with pytest.raises(ReportError):
            environment(junk)
