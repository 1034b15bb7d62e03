"""The release: `python -m build` makes an sdist and, from it, a wheel; the wheel, installed
in a fresh virtualenv with its dependencies from the package registry, is a working oomguard
that carries its Helm chart and its config defaults.

Everything runs outside the source tree (a copy is built, the venv lives in a tmp dir, every
command's cwd is that tmp dir), so nothing is imported from src/. The build and the install
happen once for the module; the tests then read the archives and run the installed commands.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile

import pytest
import yaml

from _cli_run import suggested_commands
from capabilities import require

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "oomguard"
PACKAGE = REPO / "src" / "oomguard"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
DIST_INFO = f"dask_oomguard-{VERSION}.dist-info"

# A cold pip cache downloads every dependency; the default 300 s is for one test, not this.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _files(root: pathlib.Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under `root`."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def _env(venv: pathlib.Path | None = None) -> dict[str, str]:
    """This environment without anything that points Python at another tree."""
    drop = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run(argv, cwd: pathlib.Path, timeout: float, venv: pathlib.Path | None = None):
    return subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=_env(venv),
        capture_output=True,
        text=True,
        errors="replace",
        stdin=subprocess.DEVNULL,
        timeout=timeout,
    )


def _check(proc, what: str) -> None:
    out = f"{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 0, f"{what} exited {proc.returncode}:\n{out[-8000:]}"


def _check_pip(proc, what: str) -> None:
    """`_check` for a command that downloads: where pip cannot reach the package registry
    at all, skip (fail when strict)."""
    if proc.returncode != 0:
        require(
            _registry_reachable(),
            f"no network to the package registry ({what} failed, "
            "and pip cannot download setuptools either)",
        )
    _check(proc, what)


def _registry_reachable() -> bool:
    """Whether pip, as configured here, can download from its index (bypassing its cache)."""
    with tempfile.TemporaryDirectory() as dest:
        argv = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-cache-dir",
            "--dest",
            dest,
            "setuptools",
        ]
        return _run(argv, pathlib.Path(dest), 300).returncode == 0


def _copy_sources(dst: pathlib.Path) -> None:
    """The checkout as a clean clone would have it: no venvs, caches, build outputs."""
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.so")
    for entry in REPO.iterdir():
        if entry.name.startswith(".") or entry.name in ("build", "dist", "artifacts"):
            continue
        if entry.is_dir():
            if not (entry / "pyvenv.cfg").exists():  # OOMGUARD_VENV may live here too
                shutil.copytree(entry, dst / entry.name, ignore=skip, symlinks=True)
        else:
            shutil.copy2(entry, dst / entry.name)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("release")


@pytest.fixture(scope="module")
def dists(work) -> tuple[pathlib.Path, pathlib.Path]:
    """(sdist, wheel) from `python -m build` (the wheel is built from the sdist)."""
    require(importlib.util.find_spec("build"), "no `build` module: pip install -e '.[test]'")
    src, out = work / "src", work / "dist"
    src.mkdir()
    _copy_sources(src)
    proc = _run([sys.executable, "-m", "build", "-v", "--outdir", out, src], work, 600)
    _check_pip(proc, "python -m build")
    assert "Building wheel from sdist" in proc.stderr, proc.stderr
    (sdist,), (wheel,) = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    return sdist, wheel


@pytest.fixture(scope="module")
def venv(work, dists) -> pathlib.Path:
    """A fresh virtualenv with the wheel and its dependencies (from the registry)."""
    has_venv = importlib.util.find_spec("venv") and importlib.util.find_spec("ensurepip")
    require(has_venv, "no venv/ensurepip module in this Python (Debian: apt install python3-venv)")
    path = work / "venv"
    _check(_run([sys.executable, "-m", "venv", path], work, 120), "python -m venv")
    _check_pip(
        _run(
            [path / "bin" / "python", "-m", "pip", "install", "--quiet", dists[1]], work, 840, path
        ),
        "pip install <the wheel>",
    )
    return path


# -- the archives --------------------------------------------------------------------------------


def test_the_wheel_holds_every_module_the_chart_and_the_defaults(dists):
    with zipfile.ZipFile(dists[1]) as whl:
        names = set(whl.namelist())
        chart = {
            rel: hashlib.sha256(whl.read(f"oomguard/chart/{rel}")).hexdigest()
            for rel in _files(CHART)
            if f"oomguard/chart/{rel}" in names
        }
        defaults = whl.read("oomguard/oomguard.yaml")
        metadata = whl.read(f"{DIST_INFO}/METADATA").decode()
        scripts = whl.read(f"{DIST_INFO}/entry_points.txt").decode()
    # The chart, byte for byte: every file Helm reads (Chart.yaml, values, schema,
    # templates/, dashboards/, .helmignore), at oomguard/chart/.
    assert chart == _files(CHART)
    assert {"oomguard/chart/Chart.yaml", "oomguard/chart/.helmignore"} <= names
    assert defaults == (PACKAGE / "oomguard.yaml").read_bytes()
    assert "oomguard/py.typed" in names
    # Every module of src/oomguard (the package list in pyproject.toml is written out).
    modules = {f"oomguard/{rel}" for rel in _files(PACKAGE) if rel.endswith(".py")}
    assert sorted(modules - names) == []
    assert {n.split("/")[0] for n in names} == {"oomguard", DIST_INFO}
    # The native signal recorder, built with Python 3.11's stable ABI (one wheel per platform).
    assert any(re.fullmatch(r"oomguard/_host/_sigrec\.abi3\.so", n) for n in names), names
    assert re.search(r"-cp311-abi3-linux_\w+\.whl$", dists[1].name), dists[1].name
    assert re.search(rf"^Version: {re.escape(VERSION)}$", metadata, re.M)
    assert "oomguard = oomguard._cli:main" in scripts


def test_the_sdist_holds_the_chart_readme_and_changelog(dists):
    prefix = f"dask_oomguard-{VERSION}/"
    with tarfile.open(dists[0]) as sdist:
        names = {m.name.removeprefix(prefix) for m in sdist.getmembers() if m.isfile()}
    wanted = {"pyproject.toml", "setup.py", "PKG-INFO", "README.md", "CHANGELOG.md"}
    wanted |= {"src/oomguard/_host/_sigrec.c"}  # the native part, built at install
    wanted |= {p.name for p in REPO.glob("LICEN[CS]E*")} | {"src/oomguard/oomguard.yaml"}
    wanted |= {f"charts/oomguard/{rel}" for rel in _files(CHART)}
    wanted |= {f"src/oomguard/{rel}" for rel in _files(PACKAGE) if rel.endswith(".py")}
    assert sorted(wanted - names) == []


# -- the installed package -------------------------------------------------------------------------

_PROBE = """
import hashlib, importlib.metadata, importlib.resources, json, pathlib
import dask.config, yaml, oomguard
from oomguard._host import sigrec

chart = pathlib.Path(str(importlib.resources.files("oomguard") / "chart"))
print(json.dumps({
    "file": oomguard.__file__,
    "version": oomguard.__version__,
    "metadata": importlib.metadata.version("dask-oomguard"),
    "chart": {
        p.relative_to(chart).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in chart.rglob("*") if p.is_file()
    },
    "chart_version": yaml.safe_load((chart / "Chart.yaml").read_text())["version"],
    "defaults": (importlib.resources.files("oomguard") / "oomguard.yaml").read_text(),
    "cgroup_limit": dask.config.get("oomguard.worker.cgroup-limit"),
    "sigrec": list(sigrec.available()),
}))
"""


def test_the_installed_package_finds_its_chart_and_defaults(work, venv):
    proc = _run([venv / "bin" / "python", "-c", _PROBE], work, 120, venv)
    _check(proc, "the probe")
    got = json.loads(proc.stdout)
    assert pathlib.Path(got["file"]).is_relative_to(venv), got["file"]  # not src/
    assert got["version"] == got["metadata"] == VERSION
    # `importlib.resources.files("oomguard") / "chart"` is a chart Helm can install.
    assert got["chart"] == _files(CHART)
    assert got["chart_version"] == yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    defaults = (PACKAGE / "oomguard.yaml").read_text()
    assert got["defaults"] == defaults
    # ... and Dask's config has them, from the installed file.
    assert got["cgroup_limit"] == yaml.safe_load(defaults)["oomguard"]["worker"]["cgroup-limit"]
    # The native signal recorder is installed and matches the flight record's layout.
    assert got["sigrec"] == [True, ""], got["sigrec"]


def test_the_oomguard_command_and_doctor_run(work, venv):
    oomguard = venv / "bin" / "oomguard"
    proc = _run([oomguard, "--help"], work, 60, venv)
    _check(proc, "oomguard --help")
    for command in ("demo", "report", "fingerprint", "doctor"):
        assert re.search(rf"^\s+{command}\s", proc.stdout, re.M), proc.stdout

    proc = _run([oomguard, "doctor"], work, 120, venv)
    _check(proc, "oomguard doctor")
    lines = proc.stdout.strip().splitlines()
    assert re.match(
        rf"oomguard doctor on \S+: Linux .*, oomguard {re.escape(VERSION)}, "
        r"dask \S+, distributed \S+$",
        lines[0],
    ), proc.stdout
    assert lines[1].startswith("cgroup layout: "), proc.stdout
    assert re.fullmatch(r"\d+ ok, \d+ warn, \d+ no", lines[-1]), proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr

    proc = _run([oomguard, "doctor", "--json"], work, 120, venv)
    _check(proc, "oomguard doctor --json")
    report = json.loads(proc.stdout)
    assert report["versions"]["oomguard"] == VERSION
    assert report["checks"] and {c["status"] for c in report["checks"]} <= {"ok", "warn", "no"}


def test_oomguard_demo_oom_kills_a_worker_and_aborts_the_pipeline(work, venv):
    from oomguard._host import cgroup as _cgroup  # the capability, probed from this checkout

    ok, reason = _cgroup.can_create_child()
    require(ok, f"per-worker memory cgroups cannot be made here: {reason}")
    proc = _run([venv / "bin" / "oomguard", "demo"], work, 300, venv)
    # Exit 0 is the demo's own check: a memory kill, a native crash and the user error were
    # recorded, the crasher's two deaths share one signature, the pipeline was aborted.
    _check(proc, "oomguard demo")
    out = proc.stdout
    assert "Memory kills in this run come from the kernel's OOM killer" in out, out
    assert re.search(r"infra\s+oom_kill\s+\('demo', 7\)\s+\S+\s+kernel oom_kill counted", out), out
    assert re.search(r"infra\s+native_crash\s+\('demo', 13\)", out), out
    # The crasher's deaths on both workers, one signature.
    assert re.search(
        r"\s\d+\s+2\s+oom_kill in oomguard\._cli\.demo_run\.load_shard$", out, re.M
    ), out
    assert "Pipeline 'demo': aborted" in out, out
    assert "What the client got (oomguard.PipelineAborted):" in out, out
    # What it suggests works once it has ended: the abort message's command, and its own.
    commands = suggested_commands(out)
    assert len(commands) == 2, commands
    for command in commands:
        proc = _run([venv / "bin" / "oomguard", *shlex.split(command)[1:]], work, 120, venv)
        _check(proc, command)
        assert "EVENTS: 2, oldest first" in proc.stdout and "('demo', 7)" in proc.stdout
