"""oomguard's dashboard page in a real headless Chromium, on a real scheduler.

Needs Debian's chromium (`apt-get install -y chromium`) and the `playwright` package; the
browser is Debian's, never one downloaded by `playwright install`.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import urllib.request

import pytest
from distributed import Client, LocalCluster

from _cli_run import report
from chromium import browser
from oomguard._death.record import Death, Role, Task
from oomguard._models import FailureEvent, PipelineStatus
from oomguard._signature import fingerprint
from oomguard.scheduler_plugin import OomguardSchedulerPlugin
from oomguard.scheduler_plugin._dashboard import (
    MENU_PATH,
    NOT_INSTALLED,
    PATH,
    add_to_dashboard_menu,
    register_dashboard,
)

XSS = "<script>window.__pwned=1</script>"
XSS_IMG = '<img src=x onerror="window.__pwned=2">'  # runs where text lands in innerHTML
XSS_TRACE = f"""Traceback (most recent call last):
  File "etl/render.py", line 12, in render
    return template.format(row)
ValueError: bad row {XSS} with <b>bold</b> markup {XSS_IMG}
"""
OOM_TITLE = "MemoryError in parse_block"
XSS_TITLE = "ValueError in render <b>bold</b>"
SEGV_TITLE = "SIGSEGV in libfoo.so decode_columnar_block_with_a_name_far_too_long_to_fit_its_cell"
# Real signature ids (16 hex digits), as the scheduler makes them.
OOM_ID, XSS_ID, SEGV_ID = (fingerprint(t).id for t in ("oom", XSS_TRACE, "segv"))
# Longer than their columns: the cells cut them, their hover text holds them whole.
LONG_PIPELINE = "backfill-2024-" + "-".join(["orders", "customers", "returns", "ledger"] * 4)
LONG_SUMMARY = (
    "aborted: shard ('parse-1a', 2) was OOM-killed 3 times on node-0, node-1 and node-2; "
    "its signature repeats each time, so retrying it again would only "
    "kill a fourth worker. Read `oomguard report --pipeline` for every event and its evidence."
)
SIGNATURE_HEADERS = [
    "signature id",
    "state",
    "count",
    "hosts",
    "first seen",
    "last seen",
    "causes",
    "other clusters",
    "title",
]
PIPELINE_HEADERS = [
    "pipeline",
    "status",
    "source",
    "done",
    "failed",
    "aborted",
    "infra",
    "user",
    "summary",
]


@pytest.fixture
def dask_applications():
    """Dask's module-level page dict, restored after the test (it is process-wide)."""
    from distributed.dashboard.scheduler import applications

    saved = dict(applications)
    yield applications
    applications.clear()
    applications.update(saved)


@pytest.fixture
def cluster(dask_applications):
    # The runtime path: a dashboard built without oomguard's page.
    dask_applications.pop(PATH, None)
    dask_applications.pop(MENU_PATH, None)
    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0"
    ) as cluster:
        with Client(cluster) as client:
            yield cluster, client


def base_url(cluster) -> str:
    # The server listens where dashboard_address says; dashboard_link may name another IP.
    return f"http://127.0.0.1:{cluster.scheduler.http_server.port}"


def seed(plugin) -> None:
    now = time.time()
    events = (
        [
            (
                FailureEvent(
                    "infra",
                    "oom_kill",
                    f"('parse-1a', {i})",
                    "nightly",
                    f"tcp://w{i}",
                    f"node-{i}",
                    OOM_ID,
                    OOM_TITLE,
                    {"oom_kill_delta": 1},
                    time=now - 3000 + 600 * i,
                ),
                "MemoryError\n  File parse.py, line 3",
            )
            for i in range(3)
        ]
        + [
            (
                FailureEvent(
                    "user",
                    "exception",
                    f"('render-2b', {i})",
                    "nightly",
                    "tcp://w0",
                    "node-0",
                    XSS_ID,
                    XSS_TITLE,
                    {"exception": f"ValueError: {XSS}"},
                    time=now - 900 + 300 * i,
                ),
                XSS_TRACE,
            )
            for i in range(2)
        ]
        + [
            (
                FailureEvent(
                    "infra",
                    "native_crash",
                    "('decode-3c', 0)",
                    "",
                    "tcp://w1",
                    "node-1",
                    SEGV_ID,
                    SEGV_TITLE,
                    {"signal": "SIGSEGV"},
                    time=now - 60,
                ),
                "Fatal Python error: Segmentation fault",
            ),
        ]
    )
    # Stamped with this cluster's name, as the plugin does; and one more OOM kill of the
    # same crash on another cluster that shares the store: counted, not plotted.
    own = [(dataclasses.replace(e, cluster=plugin.cluster), trace) for e, trace in events]
    other = dataclasses.replace(events[0][0], time=now - 120, cluster="etl-elsewhere")
    for i, (event, trace) in enumerate([*own, (other, "")]):
        if event.kind == "user":
            assert plugin.store.add(event, example=trace)
            continue
        # A worker death, stored as the plugin stores it: the death, its event naming it.
        death = Death(
            id=f"death-{i}", cluster=event.cluster, worker=event.worker, host=event.host,
            cause=event.cause, time=event.time, signature_id=event.signature_id,
            signature_title=event.signature_title,
            tasks=(Task(event.shard, role=Role.CULPRIT, pipeline=event.pipeline),),
        )  # fmt: skip
        event = dataclasses.replace(event, death=death.id)
        assert plugin.store.record(death, [event], example=trace)
    plugin.store.upsert_pipeline(
        PipelineStatus(
            LONG_PIPELINE, "aborted", 10, 1, 4, 3, 0, LONG_SUMMARY, cluster=plugin.cluster
        )
    )
    assert plugin.store.flush()


def submit_live_pipeline(dask_scheduler):
    dask_scheduler.plugins["oomguard"].core.policy.pipeline_submitted("live-etl", ["a", "b"])


def headers(page, table: str) -> list[str]:
    return [
        h.strip()
        for h in page.locator(f".oomguard-{table} .slick-header-column").all_inner_texts()
    ]


def test_dashboard_page_in_a_browser(cluster, tmp_path, artifacts_dir, capsys):
    cluster, client = cluster

    # Installed at runtime, after the dashboard was built: served by a second Bokeh app.
    assert client.run_on_scheduler(register_dashboard) == PATH
    assert client.run_on_scheduler(register_dashboard) == PATH  # idempotent
    http = cluster.scheduler.http_application
    assert sum(type(a).__name__.endswith("BokehTornado") for a in http.applications) == 2

    with browser() as chromium:
        page = chromium.new_page(viewport={"width": 1400, "height": 1100})
        page.set_default_timeout(20_000)
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(base_url(cluster) + PATH)

        # No plugin yet: the page says so.
        page.get_by_text(NOT_INSTALLED).wait_for()

        # The periodic refresh notices the plugin and shows what its store holds.
        client.register_plugin(OomguardSchedulerPlugin(store=str(tmp_path / "s.sqlite3")))
        plugin = cluster.scheduler.plugins["oomguard"]
        seed(plugin)
        client.run_on_scheduler(submit_live_pipeline)
        for title in (OOM_TITLE, XSS_TITLE, SEGV_TITLE):
            page.locator(".slick-cell", has_text=title).first.wait_for()
        # Table cells are text: the <b> in a title is not markup.
        assert page.locator(".slick-cell b").count() == 0
        oom_row = page.locator(".slick-row", has_text=OOM_TITLE)
        # Count 4 on 3 hosts (across both clusters), seen by 1 other cluster.
        assert re.search(r"\b4\s+3\b", oom_row.inner_text())
        assert re.search(r"oom_kill\s+1\b", oom_row.inner_text())

        # Pipelines: the live one from the policy, the finished one from the store.
        page.locator(".slick-row", has_text="live-etl").filter(has_text="running").wait_for()
        page.locator(".slick-row", has_text="backfill-2024").filter(
            has_text="aborted"
        ).first.wait_for()

        # Every column has a header, the signature id first.
        assert headers(page, "signature-table") == SIGNATURE_HEADERS
        assert headers(page, "pipeline-table") == PIPELINE_HEADERS
        # The id shown is the store's, the one `oomguard report --signature` takes.
        stored = {r.title: r.id for r in plugin.store.signatures()}
        for title in (OOM_TITLE, XSS_TITLE, SEGV_TITLE):
            row = page.locator(".oomguard-signature-table .slick-row", has_text=title)
            shown = row.locator(".slick-cell").first.inner_text().strip()
            assert shown == stored[title], (title, shown)
            id_cell = row.locator(".slick-cell").first
            assert id_cell.evaluate("c => c.scrollWidth <= c.clientWidth")  # all of it
            store = tmp_path / "s.sqlite3"
            rc, out, _ = report(capsys, "--store", store, "--signature", shown, "--json")
            found = {e["signature_title"] for e in json.loads(out)["events"]}
            assert rc == 0 and found == {title}, (rc, found)
        # Cut text is whole on hover: the cell's title attribute, as text.
        for text in (SEGV_TITLE, XSS_TITLE, LONG_PIPELINE, LONG_SUMMARY):
            cell = page.locator(".slick-cell [title]", has_text=text[:20]).first
            assert cell.get_attribute("title") == text
        cut = page.locator(".slick-cell", has_text=LONG_SUMMARY[:20]).first
        assert cut.evaluate("c => c.scrollWidth > c.clientWidth")  # it is cut

        # The plot is drawn, and its data holds every seeded failure by cause.
        canvas = page.locator("canvas").first
        canvas.wait_for()
        box = canvas.bounding_box()
        assert box and box["width"] > 300 and box["height"] > 100
        totals = page.evaluate(
            """() => {
                const doc = Bokeh.documents[0];
                const src = doc.get_model_by_name("oomguard-failures");
                const sum = (c) => (src.data[c] || []).reduce((a, b) => a + b, 0);
                return {oom_kill: sum("oom_kill"), exception: sum("exception"),
                        native_crash: sum("native_crash"), sigterm: sum("sigterm")};
            }"""
        )
        assert totals == {"oom_kill": 3, "exception": 2, "native_crash": 1, "sigterm": 0}
        # The header counts what the plot does: this cluster's deaths, each once.
        header = page.evaluate(
            "() => Bokeh.documents[0].get_model_by_name('oomguard-header').text"
        )
        assert "worker deaths 4 (each once" in header and "task exceptions 2" in header

        # Drill down: the trace is shown as text, its <script> never runs.
        page.locator(".slick-cell", has_text=XSS_TITLE).first.click()
        detail = page.locator("pre", has_text="Example trace")
        detail.filter(has_text="window.__pwned").wait_for()
        text = detail.inner_text()
        assert XSS in text and "<b>bold</b>" in text and XSS_IMG in text
        assert "etl/render.py" in text and "node-0" in text
        page.wait_for_timeout(300)  # let an onerror handler fire, were there one
        assert page.evaluate("() => typeof window.__pwned") == "undefined"
        # Nothing from a trace or title became an element anywhere on the page.
        assert page.locator("b", has_text="bold").count() == 0
        assert page.locator("img[src=x]").count() == 0
        assert page.locator("script", has_text="__pwned").count() == 0

        page.mouse.move(0, 0)
        page.screenshot(path=str(artifacts_dir / "dashboard.png"), full_page=True)
        assert errors == []


def test_preloaded_page_is_in_the_more_menu(dask_applications):
    # The preload path: the page is added before the scheduler builds its dashboard.
    add_to_dashboard_menu()
    add_to_dashboard_menu()  # idempotent
    with LocalCluster(n_workers=0, processes=False, dashboard_address="127.0.0.1:0") as cluster:
        base = base_url(cluster)
        status = urllib.request.urlopen(base + "/status", timeout=10).read().decode()
        assert 'href="individual-oomguard"' in status and ">Oomguard<" in status
        for path in (PATH, MENU_PATH):
            body = urllib.request.urlopen(base + path, timeout=10).read().decode()
            assert "Bokeh" in body
        with Client(cluster) as client:
            # Already served by Dask's own Bokeh app: nothing more is added.
            assert client.run_on_scheduler(register_dashboard) == PATH
        http = cluster.scheduler.http_application
        assert sum(type(a).__name__.endswith("BokehTornado") for a in http.applications) == 1


def test_no_page_where_the_dashboard_is_off(dask_applications):
    with LocalCluster(n_workers=0, processes=False, dashboard_address=None) as cluster:
        with Client(cluster) as client:
            assert client.run_on_scheduler(register_dashboard) == ""
        assert not any(
            type(a).__name__.endswith("BokehTornado")
            for a in cluster.scheduler.http_application.applications
        )
