"""docs/getting-started.md's tour, run as a reader runs it (issue 41): every block of its "A
tour" section in order, the shell lines as commands (the installed `oomguard` script, in an
environment whose HOME and XDG_STATE_HOME are the test's own), the Python blocks in one
session, as notebook cells (the last expression's value is the cell's output). Only `pip
install` is not run here: tests/release/test_wheel.py installs the wheel in a fresh venv.

Then the tour's dashboard page in a real browser; its screenshot is the one in the docs
(`OOMGUARD_DOCS_IMAGES=1`: tests/chromium.py).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import io
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tomllib
import urllib.request

import dask
import pytest

from chromium import browser, save_for_docs
from oomguard.scheduler_plugin._dashboard import PATH

pytestmark = pytest.mark.timeout(300)

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "getting-started.md"
BIN = pathlib.Path(sys.executable).parent


def tour_blocks() -> list[tuple[str, str]]:
    """(language, code) of each fenced block in the "A tour" section, in order."""
    section = DOC.read_text().split("\n## A tour", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```(\w+)\n(.*?)^```", section, re.M | re.S)


def run_cell(code: str, namespace: dict) -> tuple[str, object]:
    """What a notebook shows of a cell: what it printed, and its last expression's value."""
    tree = ast.parse(code)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(tree, "<tour>", "exec"), namespace)
        value = (
            eval(compile(ast.Expression(last.value), "<tour>", "eval"), namespace)
            if last
            else None
        )
    return printed.getvalue(), value


@pytest.fixture(scope="module")
def tour(tmp_path_factory):
    """Every step's output: ("$ command", exit status, stdout, stderr) for a shell line,
    ("python", printed, value) for a cell; the session's namespace."""
    tmp = tmp_path_factory.mktemp("tour")
    mp = pytest.MonkeyPatch()
    mp.setenv("HOME", str(tmp))
    mp.setenv("XDG_STATE_HOME", str(tmp / "state"))
    for name in ("DASK_SCHEDULER_ADDRESS", "DASK_OOMGUARD__SCHEDULER__STORE"):
        mp.delenv(name, raising=False)
    env = {**os.environ, "COLUMNS": "120"}
    saved = copy.deepcopy(dask.config.config)  # the cells set config, as a notebook does
    namespace: dict = {"__name__": "__tour__"}
    steps: list[tuple] = []
    try:
        for language, code in tour_blocks():
            if language == "python":
                steps.append(("python", *run_cell(code, namespace)))
                continue
            assert language == "bash", language
            for line in code.splitlines():
                argv = shlex.split(line, comments=True)
                if argv[:2] == ["pip", "install"]:
                    steps.append((f"$ {line}", None, "", ""))
                    continue
                proc = subprocess.run(
                    [str(BIN / argv[0]), *argv[1:]],
                    env=env,
                    cwd=tmp,
                    capture_output=True,
                    text=True,
                    timeout=240,
                )
                steps.append((f"$ {line}", proc.returncode, proc.stdout, proc.stderr))
        yield steps, namespace
    finally:
        for name in ("client", "cluster"):
            if name in namespace:
                namespace[name].close()
        dask.config.config.clear()
        dask.config.config.update(saved)
        mp.undo()


def _step(steps, start: str) -> tuple:
    (found,) = [s for s in steps if s[0].startswith(start)]
    return found


def test_every_step_of_the_tour_does_what_it_says(tour):
    steps, namespace = tour
    # 1. The install line installs this project (and the dashboard's Bokeh, as the test
    #    extra has it).
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert _step(steps, "$ pip install")[0] == '$ pip install dask-oomguard "bokeh>=3.1"'
    assert project["name"] == "dask-oomguard"
    assert '"bokeh>=3.1"' in (ROOT / "pyproject.toml").read_text()
    # Every command it shows exits 0.
    for step in steps:
        if step[0].startswith("$ ") and step[1] is not None:
            assert step[1] == 0, step
    # 2. The demo: the abort, and the command that shows it again.
    demo = _step(steps, "$ oomguard demo")
    assert "Pipeline 'demo': aborted" in demo[2] and "read it again with:" in demo[2]
    # 3. The first abort, after one death: the shard ran alone, and no worker is larger.
    cells = [s for s in steps if s[0] == "python"]
    abort = cells[0][1]
    assert "oomguard aborted pipeline 'etl' at once because shard ('load', 3)" in abort, abort
    # 4. From a shell, the tour's history by its cluster name.
    listing = _step_line(steps, "oomguard report --cluster tour")
    shard = _step(steps, "$ oomguard report --cluster tour --shard")
    for out in (listing, shard):
        assert "reading the history of cluster 'tour'" in out[3], out[3]
    assert "('load', 3)" in listing[2] and "etl" in listing[2] and "aborted" in listing[2]
    assert "EVENTS: 1, oldest first" in shard[2], shard[2]
    # 5. The notebook's answers.
    events, summary = cells[1][2], cells[2][2]
    assert [e.shard for e in events] == ["('load', 3)"]
    assert "aborted" in summary, summary
    # 6. The link to the page, served.
    url = cells[3][2]
    assert url.endswith(PATH), url
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200
    assert namespace["cluster"].scheduler.plugins["oomguard"].cluster == "tour"


def _step_line(steps, line: str) -> tuple:
    return next(s for s in steps if s[0] == f"$ {line}")


def test_the_tours_dashboard_page_in_a_browser(tour, artifacts_dir):
    steps, namespace = tour
    url = [s for s in steps if s[0] == "python"][3][2]
    with browser() as chromium:
        page = chromium.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(30_000)
        page.goto(url)
        signature = "in load"
        page.locator(".slick-row", has_text="etl").filter(has_text="aborted").first.wait_for()
        page.locator("canvas").first.wait_for()
        # Drill down, as the page invites: the signature's example trace and evidence.
        page.locator(".slick-cell", has_text=signature).first.click()
        page.locator("pre", has_text="Example trace").filter(has_text="load").wait_for()
        page.wait_for_timeout(1000)  # the chart's first draw
        page.mouse.move(0, 0)
        png = page.screenshot(full_page=True)
    (artifacts_dir / "dashboard-tour.png").write_bytes(png)
    save_for_docs(png)
