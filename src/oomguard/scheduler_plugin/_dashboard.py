"""oomguard's page in the Dask dashboard: worker deaths (each once) and task exceptions by
cause over time, the incidents (deaths one cause explains), the signature table
with a drill-down to one signature's example trace, evidence and related signatures, and
pipeline statuses.
Read-only.

Two ways onto a scheduler's dashboard:

- Before the scheduler is built (the `--preload oomguard.scheduler_plugin` path):
  `add_to_dashboard_menu()` adds the page to `distributed.dashboard.scheduler.applications`
  as "/oomguard" (full page, Dask's navigation bar) and "/individual-oomguard" (listed in
  the dashboard's "More" menu as "Oomguard").
- At runtime (`client.register_plugin(...)`, after the dashboard was built): Dask builds
  its Bokeh server once, from that dict, so `register_dashboard(scheduler)` starts a second
  Bokeh server application serving only "/oomguard" and adds it to the scheduler's
  `http_application` (a `RoutingApplication`, which tries each added application in turn).
  It has no entry in the "More" menu, which Dask renders once; the URL is the same.

The page finds the plugin as `scheduler.plugins.get("oomguard")` on every refresh, so it
outlives the plugin ("oomguard is not installed on this scheduler") and notices a new one.
The Bokeh server runs on the scheduler's event loop: store reads (blocking SQLite) go to a
thread with `asyncio.to_thread`; the policy (in-memory, mutated on the loop) is read on
the loop. All text from failures (titles, traces, evidence) reaches the browser as text:
PreText and table cells, or `html.escape` where a Div renders HTML. What the page shows is
shaped in `_dashboard_data.py` (no Bokeh).
"""

from __future__ import annotations

import asyncio
import functools
import html
import logging
import time
from typing import TYPE_CHECKING, Any

from .._display import quantity
from ._dashboard_data import (
    CAUSES,
    MAX_INCIDENTS,
    Snapshot,
    failure_columns,
    incident_columns,
    pipeline_columns,
    read_detail,
    read_store,
    signature_columns,
)

if TYPE_CHECKING:
    from distributed import Scheduler

    from .._models import PipelineStatus

logger = logging.getLogger("oomguard.dashboard")

PATH = "/oomguard"
MENU_PATH = "/individual-oomguard"
PLUGIN_NAME = "oomguard"
NOT_INSTALLED = "oomguard is not installed on this scheduler"
REFRESH_MS = 2000
#: Re-read the store at least this often even when nothing was written (the window slides).
STALE_S = 30.0
#: Category10 plus a grey for "other", one per cause, in CAUSES order.
COLORS = (
    "#d62728",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#7f7f7f",
    "#1f77b4",
    "#17becf",
    "#c7c7c7",
)
_BOKEH_MISSING = 'oomguard\'s dashboard page needs Bokeh: pip install "bokeh>=3.1"'
#: A text cell whose whole text is its hover text (a cell cuts what is wider than it).
#: `<%- %>` is Underscore's escaping interpolation: the value stays text in the attribute
#: and in the cell; `<%= %>` would make it markup.
HOVER_TEXT = '<span title="<%- value %>"><%- value %></span>'


# -- the Bokeh page ----------------------------------------------------------------------------


class OomguardPage:
    """One browser session's page. Built by the Bokeh app function; refreshed by a periodic
    callback on the scheduler's event loop, with every store read in a thread."""

    def __init__(self, scheduler: Scheduler, doc: Any) -> None:
        from bokeh.layouts import column
        from bokeh.models import (
            ColumnDataSource,
            DataTable,
            DateFormatter,
            Div,
            HoverTool,
            HTMLTemplateFormatter,
            NumberFormatter,
            PreText,
            TableColumn,
        )
        from bokeh.plotting import figure

        self.scheduler = scheduler
        self.doc = doc
        self._busy = False
        self._read_at = 0.0
        self._written = -2
        self._live_names: tuple[str, ...] = ()
        self._store_id = 0
        self._detail_id: str | None = None
        self._cluster = ""  # this cluster's name, from the last read (signature_columns)
        self._stored: list[PipelineStatus] = []  # finished pipelines, from the last read

        self.header = Div(text="", sizing_mode="stretch_width", name="oomguard-header")
        self.failures = ColumnDataSource(failure_columns([], 0.0), name="oomguard-failures")
        self.plot = figure(
            title="Worker deaths by cause, each once, and task exceptions (last 24 hours)",
            x_axis_type="datetime",
            height=260,
            sizing_mode="stretch_width",
            tools="xpan,xwheel_zoom,reset",
            toolbar_location="above",
            name="oomguard-plot",
        )
        bars = self.plot.vbar_stack(
            list(CAUSES),
            x="time",
            width="width",
            source=self.failures,
            color=list(COLORS),
            legend_label=list(CAUSES),
        )
        self.plot.add_tools(
            HoverTool(
                renderers=bars,
                tooltips=[("cause", "$name"), ("count", "@$name"), ("bin", "@time{%F %T}")],
                formatters={"@time": "datetime"},
            )
        )
        self.plot.y_range.start = 0
        self.plot.yaxis.axis_label = "deaths, exceptions"
        self.plot.legend.click_policy = "hide"
        self.plot.add_layout(self.plot.legend[0], "right")

        when = DateFormatter(format="%Y-%m-%d %H:%M:%S")
        whole = HTMLTemplateFormatter(template=HOVER_TEXT)
        # Deaths one cause explains (a death alone is an incident of one), newest first.
        self.incidents = ColumnDataSource(incident_columns([]), name="oomguard-incidents")
        self.incident_table = DataTable(
            source=self.incidents,
            columns=[
                TableColumn(field="start", title="start", formatter=when, width=150),
                TableColumn(field="deaths", title="deaths", width=50),
                TableColumn(field="place", title="place", formatter=whole, width=200),
                TableColumn(field="cause", title="cause", formatter=whole, width=110),
                TableColumn(field="killer", title="killer", formatter=whole, width=90),
                TableColumn(field="summary", title="summary", formatter=whole, width=600),
                TableColumn(field="id", title="incident id", formatter=whole, width=140),
            ],
            index_position=None,
            height=160,
            sizing_mode="stretch_width",
            name="oomguard-incident-table",
            css_classes=["oomguard-incident-table"],
        )

        self.signatures = ColumnDataSource(signature_columns([]), name="oomguard-signatures")
        self.table = DataTable(
            source=self.signatures,
            columns=[
                # The id `oomguard report --signature ID` takes.
                TableColumn(field="id", title="signature id", formatter=whole, width=140),
                # new, ongoing, escalating, regressed, resolved (docs/reading-a-report.md).
                TableColumn(field="state", title="state", width=80),
                TableColumn(field="count", title="count", width=60),
                TableColumn(field="hosts", title="hosts", width=50),
                TableColumn(field="first_seen", title="first seen", formatter=when, width=150),
                TableColumn(field="last_seen", title="last seen", formatter=when, width=150),
                TableColumn(field="causes", title="causes", formatter=whole, width=120),
                # Seen by how many other clusters sharing this store (oomguard report
                # --signatures names them).
                TableColumn(field="other_clusters", title="other clusters", width=90),
                TableColumn(field="title", title="title", formatter=whole, width=600),
            ],
            index_position=None,
            height=240,
            sizing_mode="stretch_width",
            name="oomguard-signature-table",
            css_classes=["oomguard-signature-table"],
        )
        self.signatures.selected.on_change("indices", self._on_select)
        self.detail = PreText(
            text="Select a signature above to see its example trace and evidence.",
            sizing_mode="stretch_width",
            styles={"overflow": "auto", "max-height": "420px", "font-size": "12px"},
            name="oomguard-detail",
        )

        self.pipelines = ColumnDataSource(pipeline_columns([], []), name="oomguard-pipelines")
        n = NumberFormatter(format="0,0")
        self.pipeline_table = DataTable(
            source=self.pipelines,
            columns=[
                TableColumn(field="name", title="pipeline", formatter=whole, width=160),
                TableColumn(field="status", title="status", formatter=whole, width=170),
                # "live": the scheduler's, in memory; "stored": finished, from the store.
                TableColumn(field="source", title="source", width=60),
                TableColumn(field="shards_done", title="done", formatter=n, width=60),
                TableColumn(field="shards_failed", title="failed", formatter=n, width=60),
                TableColumn(field="shards_aborted", title="aborted", formatter=n, width=60),
                TableColumn(field="infra_failures", title="infra", formatter=n, width=50),
                TableColumn(field="user_failures", title="user", formatter=n, width=50),
                TableColumn(field="summary", title="summary", formatter=whole, width=600),
            ],
            index_position=None,
            height=180,
            sizing_mode="stretch_width",
            name="oomguard-pipeline-table",
            css_classes=["oomguard-pipeline-table"],
        )

        def title(text: str) -> Div:
            return Div(text=f"<h3 style='margin:8px 0 0 0'>{html.escape(text)}</h3>")

        self.root = column(
            self.header,
            self.plot,
            title("Incidents: worker deaths one cause explains (last 24 hours)"),
            self.incident_table,
            title("Signatures (select one for its trace, evidence and related signatures)"),
            self.table,
            self.detail,
            title("Pipelines"),
            self.pipeline_table,
            sizing_mode="stretch_width",
            name="oomguard-root",
        )

    def _set_header(self, message: str, *, warn: bool = False) -> None:
        color = "#b00020" if warn else "inherit"
        self.header.text = f"<div style='padding:4px 0;color:{color}'>{html.escape(message)}</div>"

    async def refresh(self) -> None:
        """One periodic refresh; never raises (a dashboard must not log a traceback a tick)."""
        if self._busy:  # the last read is still running: skip a tick rather than pile up
            return
        self._busy = True
        try:
            await self._refresh()
        except Exception as e:
            logger.debug("oomguard dashboard refresh failed", exc_info=True)
            self._set_header(f"oomguard: the failure history cannot be read: {e}", warn=True)
        finally:
            self._busy = False

    async def _refresh(self) -> None:
        plugin = self.scheduler.plugins.get(PLUGIN_NAME)
        store = getattr(plugin, "store", None)
        if plugin is None:
            self._set_header(NOT_INSTALLED + ".", warn=True)
            self._clear()
            return
        if store is None:
            self._set_header("oomguard is starting: its failure store is not open yet.")
            return
        policy = getattr(getattr(plugin, "core", None), "policy", None)
        live = []
        if policy is not None:  # in memory and mutated on this loop: read it here
            live = [policy.status(name) for name in policy.pipelines()]
        names = tuple(sorted(p.name for p in live))
        now = time.time()
        # The store only changes when something is written, or a pipeline leaves the policy.
        changed = (
            id(store) != self._store_id
            or store.written != self._written
            or names != self._live_names
            or now - self._read_at > STALE_S
        )
        if changed:
            self._cluster = cluster = getattr(plugin, "cluster", "")
            snap = await asyncio.to_thread(read_store, store, now, cluster)
            # A pipeline leaving the policy is written just before: read again next tick.
            self._written = snap.written if names == self._live_names else -2
            self._store_id, self._read_at, self._live_names = id(store), now, names
            self._show(snap, now)
            n = len(snap.incidents)
            incidents = f"{n}+ incidents" if n >= MAX_INCIDENTS else quantity(n, "incident")
            self._set_header(
                f"oomguard, last 24 hours: worker deaths {len(snap.deaths)} (each once, "
                f"however many tasks it took) in {incidents}, task exceptions "
                f"{len(snap.exceptions)}; "
                f"signatures {len(snap.signatures)}, live pipelines {len(live)}. Cluster "
                f"{cluster!r}, history: {store.path}"
            )
        self.pipelines.data = pipeline_columns(live, self._stored)

    def _show(self, snap: Snapshot, now: float) -> None:
        self._stored = snap.pipelines
        self.failures.data = failure_columns(snap.failures(), now)
        incidents = incident_columns(snap.incidents)
        if incidents != self.incidents.data:
            self.incidents.data = incidents
        cols = signature_columns(snap.signatures, self._cluster)
        if cols != self.signatures.data:
            self.signatures.data = cols
            # Keep the selected signature selected though rows moved.
            ids = cols["id"]
            index = ids.index(self._detail_id) if self._detail_id in ids else None
            self.signatures.selected.indices = [] if index is None else [index]

    def _clear(self) -> None:
        self._written = -2
        self._stored = []
        self.failures.data = failure_columns([], 0.0)
        self.incidents.data = incident_columns([])
        self.signatures.data = signature_columns([])
        self.pipelines.data = pipeline_columns([], [])

    def _on_select(self, attr: str, old: list[int], new: list[int]) -> None:
        ids = self.signatures.data.get("id", [])
        if not new or new[0] >= len(ids):
            return
        signature_id = ids[new[0]]
        if signature_id == self._detail_id:
            return  # the refresh re-selected the same row
        self._detail_id = signature_id
        self.doc.add_next_tick_callback(functools.partial(self._show_detail, signature_id))

    async def _show_detail(self, signature_id: str) -> None:
        store = getattr(self.scheduler.plugins.get(PLUGIN_NAME), "store", None)
        if store is None:
            self.detail.text = NOT_INSTALLED + "."
            return
        try:
            text = await asyncio.to_thread(read_detail, store, signature_id)
        except Exception as e:
            text = f"The failure history cannot be read: {e}"
        if self._detail_id == signature_id:  # the user may have clicked on meanwhile
            self.detail.text = text


def _build(scheduler: Scheduler, extra: dict, doc: Any, *, template: bool) -> None:
    from distributed.dashboard.components.scheduler import BOKEH_THEME, env

    page = OomguardPage(scheduler, doc)
    doc.title = "Dask: oomguard"
    doc.add_root(page.root)
    doc.theme = BOKEH_THEME
    if template:  # Dask's navigation bar, like /workers and /exceptions
        doc.template = env.get_template("simple.html")
        doc.template_variables.update(extra)
    doc.add_next_tick_callback(page.refresh)
    doc.add_periodic_callback(page.refresh, REFRESH_MS)


def oomguard_doc(scheduler: Scheduler, extra: dict, doc: Any) -> None:
    """The Bokeh app function of "/oomguard" (Dask's `applications` signature)."""
    _build(scheduler, extra, doc, template=True)


def oomguard_individual_doc(scheduler: Scheduler, extra: dict, doc: Any) -> None:
    """The Bokeh app function of "/individual-oomguard": the same page, no navigation bar."""
    _build(scheduler, extra, doc, template=False)


# -- getting onto a dashboard ------------------------------------------------------------------


def add_to_dashboard_menu() -> None:
    """Add the page to every dashboard built after this call in this process, at "/oomguard"
    and, in the "More" menu, "/individual-oomguard". The scheduler preload calls it at
    import, before the Scheduler builds its dashboard. Without Bokeh it does nothing.

    >>> add_to_dashboard_menu()
    >>> from distributed import LocalCluster
    >>> cluster = LocalCluster()  # its dashboard lists "Oomguard" under "More"
    """
    try:
        from distributed.dashboard.scheduler import applications
    except ImportError:  # no (suitable) Bokeh: Dask builds no dashboard either
        logger.debug("oomguard: no Bokeh, no dashboard page", exc_info=True)
        return
    applications.setdefault(PATH, oomguard_doc)
    applications.setdefault(MENU_PATH, oomguard_individual_doc)


def _the_scheduler() -> Scheduler:
    from distributed import Scheduler

    running = [s for s in list(Scheduler._instances) if s.status.name == "running"]
    if len(running) != 1:
        raise ValueError(
            f"register_dashboard() needs the scheduler: {len(running)} are running in this "
            "process. Pass it: register_dashboard(scheduler), or "
            "client.run_on_scheduler(register_dashboard)."
        )
    return running[0]


def _served(app: Any, path: str) -> bool:
    from tornado import web
    from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine

    request = HTTPServerRequest(
        start_line=RequestStartLine("GET", path, "HTTP/1.1"),
        headers=HTTPHeaders({"Host": "localhost"}),
    )
    delegate = app.find_handler(request)
    return delegate is not None and not issubclass(delegate.handler_class, web.ErrorHandler)


def register_dashboard(scheduler: Scheduler | None = None, *, dask_scheduler=None) -> str:
    """Serve the page on this scheduler's dashboard server; returns its URL path, or "" when
    the scheduler has no Bokeh dashboard (started with `dashboard=False`). Idempotent.

    Where the dashboard was built after `add_to_dashboard_menu()`, the page is already
    there. Otherwise a Bokeh application serving only this page is added to the
    scheduler's HTTP server. Call it on the scheduler's event loop: from a scheduler plugin's
    `start()`, or with `client.run_on_scheduler(register_dashboard)`. Raises ImportError
    (with the pip command) without Bokeh.

    >>> client.run_on_scheduler(register_dashboard)
    '/oomguard'
    """
    scheduler = scheduler or dask_scheduler or _the_scheduler()
    try:
        from bokeh.server.server import BokehTornado
        from distributed.dashboard.core import BokehApplication
        from distributed.dashboard.scheduler import template_variables
    except ImportError as e:
        raise ImportError(_BOKEH_MISSING) from e
    from tornado.ioloop import IOLoop

    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is None or running is not getattr(scheduler.loop, "asyncio_loop", None):
        raise RuntimeError(
            "register_dashboard() must run on the scheduler's event loop: call it from a "
            "scheduler plugin's start(), or client.run_on_scheduler(register_dashboard)."
        )
    http = scheduler.http_application
    dashboards = [a for a in http.applications if isinstance(a, BokehTornado)]
    if not dashboards:  # the operator turned the dashboard off: add no page behind their back
        return ""
    prefix = dashboards[0].prefix  # follow `dask scheduler --dashboard-prefix`
    path = prefix.rstrip("/") + PATH
    if _served(http, path):
        return path
    app = BokehApplication(
        {PATH: oomguard_doc},
        scheduler,
        prefix=prefix,
        template_variables=template_variables(scheduler),
    )
    http.add_application(app)
    app.initialize(IOLoop.current())
    app.start()
    logger.info("oomguard: dashboard page at %s", path)
    return path
