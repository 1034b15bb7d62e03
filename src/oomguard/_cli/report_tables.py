"""The tables `oomguard report` prints of the failure history: worker deaths, events (or one
shard's history), signatures and pipelines, each as lines that fit the terminal's width.
"""

from __future__ import annotations

import json

from .._client.results import blamed, tasks_by_role
from .._death.record import BLAMED, Death, Role
from .._display import clock, one_line, utc_offset
from .._models import Incident, SignatureRow
from .._words import environment_line, suspects_phrase
from .layout import PROSE_WIDTH, Column, Layout, key_line, lay_out, wrap

# Tables fit the terminal without cutting what a user copies (a shard, a signature id, a
# pipeline name): each table has layouts from the widest to the narrowest, and the first
# whose rows fit is printed. Narrower layouts shorten only the events' signature title
# (SIGNATURES prints it whole) and host, then move keys to lines of their own under the row.


# One row per incident of several deaths: worker deaths one cause explains, with its one-line
# summary under it (its place, and the killer's sentence). An incident of one death is that
# death: counted on one line, it is in DEATHS (and in --json, as an incident of one).
_INCIDENT_COLUMNS = [
    Column("TIME"),
    Column("DEATHS", right=True),
    Column("CAUSE"),
    Column("KILLER"),
    Column("ID", "incident"),
]
_INCIDENT_LAYOUTS = [
    Layout(("TIME", "DEATHS", "CAUSE", "KILLER", "ID")),
    Layout(("TIME", "DEATHS", "CAUSE", "KILLER"), below=("ID",)),
]


def render_incidents(
    incidents: list[Incident],
    *,
    width: int | None = None,
    empty: list[str] | None = None,
    deaths: str = "DEATHS below",
) -> list[str]:
    """The incidents section: a row for each incident of several deaths, newest first, and
    how many were of one death each (`deaths`: where those are shown)."""
    head = [f"INCIDENTS: {len(incidents)}, newest first, times {utc_offset()}"]
    if not incidents:
        return head + (empty or ["  no incidents recorded"])
    several = [i for i in incidents if i.deaths > 1]
    lines = head
    if several:
        rows = [[clock(i.start), i.deaths, i.cause, i.killer or "-", i.id] for i in several]
        _, header, blocks = lay_out(_INCIDENT_COLUMNS, rows, _INCIDENT_LAYOUTS, width)
        lines += header
        for i, block in zip(several, blocks, strict=True):
            lines += block + wrap(i.summary, width, "    ", hold=(i.place,))
    alone = len(incidents) - len(several)
    if alone:
        lines += wrap(f"{alone} of one death each: {deaths}", width, "  ")
    return lines


# One row per worker death. ROLE (with --shard or --pipeline): what that shard, or that
# pipeline's tasks, had to do with the death.
_DEATH_COLUMNS = [
    Column("TIME"),
    Column("CAUSE"),
    Column("KILLER"),
    Column("ROLE", "role"),
    Column("HOST", "host"),
    Column("SIGNATURE", "signature"),
    Column("BLAMED", "blamed"),
    Column("TASKS", "tasks", key=False),
]
_DEATH_LAYOUTS = [
    Layout(("TIME", "CAUSE", "KILLER", "ROLE", "HOST", "SIGNATURE", "BLAMED", "TASKS")),
    Layout(("TIME", "CAUSE", "KILLER", "ROLE", "HOST", "SIGNATURE"), below=("BLAMED", "TASKS")),
    Layout(("TIME", "CAUSE", "KILLER", "ROLE", "SIGNATURE"), below=("HOST", "BLAMED", "TASKS")),
    Layout(("TIME", "CAUSE", "KILLER", "ROLE"), below=("SIGNATURE", "HOST", "BLAMED", "TASKS")),
]


def render_deaths(
    deaths: list[Death],
    *,
    width: int | None = None,
    shard: str | None = None,
    pipeline: str | None = None,
    empty: list[str] | None = None,
) -> list[str]:
    """The deaths section: one row per worker death, the tasks it blamed and those it took
    without blame. With `shard` (or `pipeline`), the ROLE its task(s) had there, and a line
    for a death it was only displaced (or queued) by: its work lost, no blame."""
    head = [f"DEATHS: {len(deaths)}, newest first, times {utc_offset()}"]
    if not deaths:
        return head + (empty or ["  no worker deaths recorded"])
    focus = shard is not None or pipeline is not None
    roles = [_roles(d, shard, pipeline) for d in deaths]
    rows = [
        [
            clock(d.time),
            d.cause,
            d.killer.name if d.killer else "-",
            ",".join(sorted(r.value for r in had)) or "-",
            d.host or d.worker,
            d.signature_id,
            blamed(d) or "-",
            tasks_by_role(d) or "-",
        ]
        for d, had in zip(deaths, roles, strict=True)
    ]
    layouts = _DEATH_LAYOUTS if focus else [_without(lay, "ROLE") for lay in _DEATH_LAYOUTS]
    _, header, blocks = lay_out(_DEATH_COLUMNS, rows, layouts, width)
    lines = head + header
    for d, had, block in zip(deaths, roles, blocks, strict=True):
        lines += block
        if had and not had & BLAMED:
            lines += wrap(_unblamed(d, shard, pipeline, had), width, "    ", hold=(shard or "",))
    return lines


def _roles(d: Death, shard: str | None, pipeline: str | None) -> set[Role]:
    """The roles the shard, or the pipeline's tasks, had in `d` (none without either)."""
    if shard is None and pipeline is None:
        return set()
    return {
        t.role
        for t in d.tasks
        if t.role is not None
        and (shard is None or t.key == shard)
        and (pipeline is None or t.pipeline == pipeline)
    }


def _unblamed(d: Death, shard: str | None, pipeline: str | None, roles: set[Role]) -> str:
    """A death the shard (or pipeline) only lost work to."""
    culprits = [t for t in d.tasks if t.role in BLAMED]
    by = ", ".join(f"{t.key} ({t.pipeline or 'no pipeline'})" for t in culprits) or "no task"
    how = " and ".join(sorted(r.value for r in roles))
    if shard is not None:
        return (
            f"{how}, not blamed: {shard} lost its work to this death of {by}; it carries "
            "neither the death's count nor its signature"
        )
    return (
        f"{how}, not blamed: pipeline {pipeline} lost work to this death of {by}; its tasks "
        "carry neither the death's count nor its signature"
    )


def _without(layout: Layout, header: str) -> Layout:
    return layout._replace(
        row=tuple(h for h in layout.row if h != header),
        below=tuple(h for h in layout.below if h != header),
    )


_EVENT_COLUMNS = [
    Column("TIME"),
    Column("KIND"),
    Column("CAUSE"),
    Column("KILLER"),
    Column("#", right=True),
    Column("SHARD", "shard"),
    Column("PIPELINE", "pipeline"),
    Column("HOST", "host"),
    Column("SIGNATURE", "signature"),
    Column("TITLE", key=False),
]
_FIRST = ("TIME", "KIND", "CAUSE", "KILLER", "#")
_EVENT_LAYOUTS = [
    Layout((*_FIRST, "SHARD", "PIPELINE", "HOST", "SIGNATURE", "TITLE"), shorten={"TITLE": 16}),
    Layout((*_FIRST, "SHARD", "PIPELINE", "HOST", "SIGNATURE")),
    Layout((*_FIRST, "SHARD", "PIPELINE", "HOST", "SIGNATURE"), shorten={"HOST": 12}),
    Layout(
        (*_FIRST, "HOST", "SIGNATURE", "TITLE"), below=("SHARD", "PIPELINE"), shorten={"TITLE": 16}
    ),
    Layout((*_FIRST, "HOST", "SIGNATURE"), below=("SHARD", "PIPELINE")),
    Layout((*_FIRST, "SIGNATURE"), below=("SHARD", "PIPELINE", "HOST")),
    Layout(_FIRST, below=("SIGNATURE", "SHARD", "PIPELINE", "HOST")),
]
#: One shard's history: the shard is in the head line; worker and signature under each row.
_HISTORY_LAYOUTS = [
    Layout((*_FIRST, "PIPELINE", "HOST")),
    Layout((*_FIRST, "HOST"), below=("PIPELINE",)),
    Layout(_FIRST, below=("PIPELINE", "HOST")),
]


def render_events(
    events: list,
    *,
    history: bool,
    width: int | None = None,
    shard: str | None = None,
    empty: list[str] | None = None,
    titles: str = "",
) -> list[str]:
    """The events section. `empty`: the lines that say why there are none; `titles`: where
    the signature titles are when the table has no room for them."""
    order = "oldest first" if history else "newest first"
    head = [f"EVENTS: {len(events)}, {order}, times {utc_offset()}"]
    if shard is not None and history:
        head = key_line(head[0] + ", shard", shard, width)
    if not events:
        return head + (empty or ["  no events recorded"])
    rows = [
        [
            clock(e.time),
            e.kind,
            e.cause,
            e.killer or "-",
            e.attempt,
            e.shard,
            e.pipeline,
            e.host,
            e.signature_id,
            e.signature_title,
        ]
        for e in events
    ]
    layouts = _HISTORY_LAYOUTS if history else _EVENT_LAYOUTS
    layout, header, blocks = lay_out(_EVENT_COLUMNS, rows, layouts, width)
    lines = head + header
    for e, block in zip(events, blocks, strict=True):
        lines += block
        if not history:
            continue
        title = one_line(e.signature_title or "?")
        held = (title,) if 4 + len(title) <= min(width or PROSE_WIDTH, PROSE_WIDTH) else ()
        lines += wrap(
            f"worker {e.worker or '?'}; signature {e.signature_id or '?'}: {title}",
            width,
            "    ",
            hold=held,
        )
        summary = e.evidence.get("summary") if isinstance(e.evidence, dict) else None
        if isinstance(summary, str) and summary:
            lines += wrap(summary, width, "    ")
        if e.killer:
            lines += wrap(
                f"killed by {e.killer} ({e.killer_how}, {e.killer_confidence})"
                + (f": {e.killer_summary}" if e.killer_summary not in ("", summary) else ""),
                width,
                "    ",
            )
        pairs = [
            f"{k}={json.dumps(v, ensure_ascii=False)}"
            for k, v in e.evidence.items()
            if k != "summary"
        ]
        if pairs:
            lines += wrap("evidence: " + ", ".join(pairs), width, "    ")
    if not history and "TITLE" not in layout.row and titles:
        lines += wrap(f"(no room for signature titles: {titles})", width, "  ")
    return lines


# COUNT is across every cluster of the history; CLUSTERS names the clusters that saw it;
# STATE: new, ongoing, escalating, regressed or resolved (`_store/states.py`).
_SIGNATURE_COLUMNS = [
    Column("ID"),
    Column("STATE"),
    Column("COUNT", right=True),
    Column("HOSTS", right=True),
    Column("LAST SEEN"),
    Column("CAUSES", "causes"),
    Column("CLUSTERS", "clusters"),
    Column("TITLE", key=False),
]
_SIGNATURE_LAYOUTS = [
    Layout(("ID", "STATE", "COUNT", "HOSTS", "LAST SEEN", "CAUSES", "CLUSTERS", "TITLE")),
    Layout(("ID", "STATE", "COUNT", "HOSTS", "LAST SEEN", "CAUSES", "CLUSTERS"), below=("TITLE",)),
    Layout(("ID", "STATE", "COUNT", "HOSTS", "LAST SEEN", "CAUSES"), below=("CLUSTERS", "TITLE")),
    Layout(("ID", "STATE", "COUNT", "HOSTS", "LAST SEEN"), below=("CAUSES", "CLUSTERS", "TITLE")),
    Layout(("ID", "STATE", "COUNT"), below=("HOSTS", "LAST SEEN", "CAUSES", "CLUSTERS", "TITLE")),
]


def render_signatures(
    rows: list,
    *,
    width: int | None = None,
    empty: list[str] | None = None,
    detail: bool = False,
) -> list[str]:
    """The signatures' table, then a line for each that has suspects (the values its deaths
    have much more often than the workers); `detail` (--signature): its first environment
    too."""
    head = f"SIGNATURES: {len(rows)}, most frequent first"
    if not rows:
        return [head] + (empty or ["  no signatures recorded"])
    body = [
        [
            s.id,
            s.state or "-",
            s.count,
            len(s.hosts),
            clock(s.last_seen),
            ",".join(s.causes),
            ",".join(s.clusters) or "-",
            s.title,
        ]
        for s in rows
    ]
    _, header, blocks = lay_out(_SIGNATURE_COLUMNS, body, _SIGNATURE_LAYOUTS, width)
    lines = [head, *header]
    for s, block in zip(rows, blocks, strict=True):
        lines += block + _related(s, width, full=len(rows) == 1)
    for s in rows:
        said = _state_lines(s)
        if said:
            lines.append(f"  {s.id}:")
        for line in said:
            lines += wrap(line, width, "    ")
    notes = []
    for s in rows:
        if s.environment_suspects:
            line = f"{s.id} suspects: {suspects_phrase(s.environment_suspects)}"
            notes += wrap(line, width, "  ", hold=(s.id,))
        if detail:
            env = environment_line(s.first_environment) or "not known"
            notes += wrap(f"{s.id} first environment: {env}", width, "  ", hold=(s.id,))
    return lines + ["", *notes] if notes else lines


def _state_lines(s) -> list[str]:
    """What a signature's state rests on: its resolve, its regressions, its rate, and
    the ids older grouping versions gave it."""
    out = []
    if s.resolved_at:
        said = f"resolved {clock(s.resolved_at)}" + (
            f" by {s.resolved_by}" if s.resolved_by else ""
        )
        if s.resolve_note:
            said += f": {s.resolve_note}"
        out.append(said)
    if s.state == "regressed":
        times = f", {s.regressions} times after a resolve" if s.regressions > 1 else ""
        out.append(f"regressed {clock(s.regressed_at)}: seen again after its resolve{times}")
    if s.state == "escalating":
        out.append(f"escalating: {s.last_hour} in the last hour, {s.hourly:g} an hour before")
    if s.aliases:
        out.append("also " + ", ".join(s.aliases) + " (ids of older grouping versions)")
    return out


#: Related signatures shown under each of several signatures (all of them for one).
RELATED_SHOWN = 3


def _related(s: SignatureRow, width: int | None, full: bool) -> list[str]:
    """A signature's related ones (`SignatureRow.related`), a line each: with their titles
    when it is the only one shown (`--signature ID`), else the first RELATED_SHOWN."""
    shown = s.related if full else s.related[:RELATED_SHOWN]
    lines = []
    for r in shown:
        said = f"related {r.get('id')} ({r.get('why')})"
        if full:
            said += f": {r.get('title') or '(no longer in the history)'}"
        lines += wrap(said, width, "    ", hold=(str(r.get("id")),))
    if len(s.related) > len(shown):
        more = f"and {len(s.related) - len(shown)} more: oomguard report --signature {s.id}"
        lines += wrap(more, width, "    ", hold=(s.id,))
    return lines


_COUNTS = ("DONE", "FAILED", "ABORTED", "INFRA", "USER")
_PIPELINE_COLUMNS = [
    Column("NAME"),
    Column("STATUS"),
    *(Column(h, h.lower(), right=True) for h in _COUNTS),
]
_PIPELINE_LAYOUTS = [
    Layout(("NAME", "STATUS", *_COUNTS)),
    Layout(("STATUS", *_COUNTS), above=("NAME",)),
    Layout(("STATUS",), above=("NAME",), below=_COUNTS),
]


def render_pipelines(
    rows: list, *, width: int | None = None, empty: list[str] | None = None
) -> list[str]:
    head = f"PIPELINES: {len(rows)}, most recently updated first"
    if not rows:
        return [head] + (empty or ["  no pipelines recorded"])
    body = [
        [
            p.name,
            p.status,
            p.shards_done,
            p.shards_failed,
            p.shards_aborted,
            p.infra_failures,
            p.user_failures,
        ]
        for p in rows
    ]
    _, header, blocks = lay_out(_PIPELINE_COLUMNS, body, _PIPELINE_LAYOUTS, width)
    lines = [head, *header, *(line for block in blocks for line in block)]
    for p in rows:
        if p.summary or p.abort_reason:
            lines.append("")
            lines += wrap(f"{p.name}: {p.summary}", width, "  ", hold=(p.name,))
            if p.abort_reason:
                lines += wrap(p.abort_reason, width, "    ", hold=(p.name,))
    return lines
