"""`oomguard report`: the failure history, from a running scheduler or from a store file,
and the memory peaks the workers learned.

Five history sections: incidents (worker deaths one cause explains), deaths (one row per
worker death, with its tasks and their roles), events (one failure of one shard each),
signatures (deduplicated crashes across hosts, with their related ones) and pipelines (where
each stands); and, on request (`--peaks`), the peaks: per task prefix, the
largest memory growth admission learned, read from the workers' ledger files through
`client.run` (or from one ledger file on this host; `report_peaks`).
Tables fit the terminal (COLUMNS when set) and never cut a shard, a signature id, a pipeline
name or a task prefix: narrower layouts move them to lines of their own; piped to a file,
nothing is shortened. `--json` prints the rows as `to_dict()` of `Incident`, `Death`,
`FailureEvent`, `SignatureRow`, `PipelineStatus` and `PeakRow`, so
`FailureEvent.from_dict(row)` gives back what `oomguard.Failures` returns.

Errors are one line on stderr, ``oomguard report: ...``; exit 2 for bad arguments, 1 for a
scheduler that cannot be reached or a store or ledger file that cannot be read, 3 for a
--cluster, --pipeline, --signature or --shard that names nothing in the history.

This module is the command (its arguments, and `run`); the history is read in
`report_source` (which opens a store file read-only) and printed by `report_tables`; the
peaks are read and printed in `report_peaks`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Any

from .._admission import peaks as _peaks
from .._client import filters as _filters
from .._display import one_line
from .._exceptions import ReportFailed
from .._safe_text import safe_name
from . import report_resolve
from .layout import key_line, output_width
from .report_args import cluster_name, parse_shard, parse_since, positive_seconds, store_place
from .report_default import store_to_read
from .report_peaks import peaks_from_file, peaks_from_workers, render_peaks
from .report_source import (
    connected,
    read_history,
    scheduler_source,
    shard_history,
    store_source,
)
from .report_tables import (
    render_deaths,
    render_events,
    render_incidents,
    render_pipelines,
    render_signatures,
)
from .terminal import echo, printable

PROG = "oomguard report"
#: The failure history: printed when no section is asked for.
HISTORY = ("incidents", "deaths", "events", "signatures", "pipelines")
SECTIONS = (*HISTORY, "peaks")

_EPILOG = """\
examples:
  oomguard report
  oomguard report --scheduler tcp://scheduler:8786
  oomguard report --store /var/lib/dask/oomguard.sqlite3 --cause oom_kill --since 1h
  oomguard report --scheduler tcp://scheduler:8786 --shard "('load-0a1b', 17)"
  oomguard report --store history.sqlite3 --pipelines --pipeline etl
  oomguard report --store history.sqlite3 --deaths --pipeline etl --since 1d
  oomguard report --store /shared/oomguard.sqlite3 --signatures --cluster etl-nightly
  oomguard report --store history.sqlite3 --events --json | jq '.events[].evidence'
  oomguard report --scheduler tcp://scheduler:8786 --peaks
  oomguard report --ledger /tmp/oomguard-1000/memory-ledger.json
  oomguard report --scheduler tcp://scheduler:8786 --resolve 6d4c109d5cf8c83f --note "fix 1.4"

INCIDENTS has one row per incident: the worker deaths one cause explains (workers of one
host, SLURM job or node ended within seconds by one killer), a death alone an incident of
one. DEATHS has one row per worker death, however many tasks it took: a death is counted once
there, in its signature's COUNT and in oomguard_worker_deaths_total. EVENTS has one row per
task a death is blamed on (its culprit, or each suspect), and one per task exception.
SIGNATURES names under each signature those related to it (the same crash site, or deaths
of one incident): the first three, and all of them with their titles for --signature ID.

Filters narrow each section they apply to (never the peaks): --kind, --cause, --killer and
--since the incidents, events and deaths (and --cause, --since the signatures); --pipeline
all five; --shard and --signature the events and deaths, the incidents to those of the
deaths shown, and the signatures and pipelines to those the shown events name. With --shard
or --pipeline, a death is shown when the shard (or a task of the pipeline) was among its
tasks in any role, and ROLE says which: a death it was only displaced by says so on a line
of its own. --shard alone prints the shard's whole
history oldest first, with evidence; with other filters or --limit, its newest events.
--limit applies to each section (defaults: 1000 incidents, 1000 deaths, 1000 events, 100
signatures, 100 pipelines). Times are local unless an ISO time carries an offset.

With neither --scheduler nor --store, the report reads a running scheduler when Dask's
scheduler-address setting names one (DASK_SCHEDULER_ADDRESS); else the store that
oomguard.scheduler.store names on this host; else this host's default history: a scheduler
with no store setting keeps one file per cluster name in $XDG_STATE_HOME/oomguard
(~/.local/state/oomguard), and the report reads the one written last, or --cluster NAME's;
a line on stderr says which, and names the others.

A store may hold the history of many clusters, one after another (each named by its
oomguard.scheduler.cluster-name). The report reads the whole history, from a store or a
scheduler; --cluster NAME narrows the events and pipelines to that cluster's, and the
signatures to those it saw. A signature's COUNT is across every cluster, and CLUSTERS (in
--json, "clusters") names the clusters that saw it. Under the table, a signature whose
deaths have a value of the workers' environment far more often than the workers do says so
("ID suspects: NODE_POOL=spot (4 of 4 deaths, 2 of 5 workers)"); with --signature, its
first environment too ("environment_suspects", "first_environment" in --json).

Tables fit the terminal's width (or COLUMNS); a shard, signature id, pipeline name or task
prefix is never cut: in a narrow terminal it moves to a line of its own. Piped to a
file or another program, nothing is shortened or moved (COLUMNS=N sets a width).

Without a section flag the report prints deaths, events, signatures and pipelines; the
peaks only when asked for (--peaks, or --ledger). --peaks prints the memory peaks admission
learned per task prefix, with an oomguard.memory(...) annotation to size from each: with a
scheduler (--scheduler, or the scheduler-address setting), from the ledger file of every
worker host (read only, through client.run; a host's workers share one file); with --ledger
PATH, from that file; with neither, from this host's ledger, where oomguard's settings here
put it (oomguard.worker.admission.ledger, else <crash-dir>/memory-ledger.json). A failure
store holds no peaks: with --store, --peaks needs --ledger. --ledger alone prints only the
peaks.

--json prints one document {"incidents": [...], "deaths": [...], "events": [...],
"signatures": [...], "pipelines": [...], "peaks": [...]} (the sections asked for) whose rows
are Incident / Death / FailureEvent / SignatureRow / PipelineStatus.to_dict() and {"prefix",
"peak" (bytes), "hosts", "suggested"}.

SIGNATURES has each signature's STATE: new (first seen in the last 24 h), ongoing,
escalating (5 or more in the last hour, 3 times its hourly rate before), resolved (--resolve
ID marks it fixed, with --note why), regressed (seen again after that resolve). An id of an
older grouping version finds the signature it is now.

exit status: 0 success; 1 the scheduler, the store or the ledger could not be read (or
written, for --resolve); 2 bad arguments; 3 --cluster, --pipeline, --signature, --shard or
--resolve names nothing in the history (no event, run or signature has it: the known names
and the closest one are printed).
"""


# --------------------------------------------------------------------------- arguments
# (their types: `report_args`)


def _usage_error(message: str) -> None:
    echo(f"{PROG}: {' '.join(str(message).split())}", file=sys.stderr)
    sys.exit(2)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "report",
        help="print the failure history (deaths, events, signatures, pipelines) and peaks",
        description="Print the failure history a scheduler keeps: worker deaths, failure\n"
        "events, crash signatures and pipeline statuses, from a running scheduler or a store\n"
        "file; and the memory peaks the workers learned per task prefix (--peaks).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="a running scheduler, e.g. "
        "tcp://10.0.0.5:8786 (default: Dask's scheduler-address setting, "
        "DASK_SCHEDULER_ADDRESS)",
    )
    src.add_argument(
        "--store",
        type=store_place,
        metavar="PATH",
        help="a failure store file, or a postgresql:// history of many clusters (read only)",
    )
    p.add_argument(
        "--timeout",
        type=positive_seconds,
        default=5.0,
        metavar="SECONDS",
        help="for the connection to the scheduler and each query (default 5)",
    )
    for name in HISTORY:
        p.add_argument(f"--{name}", action="store_true", help=f"print the {name} section")
    p.add_argument(
        "--peaks",
        action="store_true",
        help="print the memory peaks learned per "
        "task prefix, with a suggested oomguard.memory(...) for each",
    )
    p.add_argument(
        "--ledger",
        metavar="PATH",
        help="read the peaks from this memory ledger file (read only; implies --peaks)",
    )
    # Checked as oomguard.Failures checks them: a wrong word gets "did you mean".
    p.add_argument(
        "--kind", type=_filters.for_argparse(_filters.kind), metavar="KIND", help="infra or user"
    )
    p.add_argument(
        "--cause",
        type=_filters.for_argparse(_filters.cause),
        metavar="CAUSE",
        help=", ".join(_filters.CAUSES),
    )
    p.add_argument(
        "--killer",
        type=_filters.for_argparse(_filters.killer),
        metavar="KILLER",
        help="who ended the worker: " + ", ".join(_filters.KILLERS),
    )
    p.add_argument("--pipeline", type=safe_name, metavar="NAME")
    p.add_argument(
        "--cluster",
        type=cluster_name,
        metavar="NAME",
        help="only this cluster's events and pipelines, and the signatures it saw "
        "(default: every cluster in the history)",
    )
    p.add_argument(
        "--shard",
        type=parse_shard,
        metavar="KEY",
        help="a task key as str(key) writes it, e.g. \"('load', 7)\" or load-0a1b",
    )
    p.add_argument("--signature", type=safe_name, metavar="ID")
    p.add_argument(
        "--since",
        type=parse_since,
        metavar="WHEN",
        help="an ISO time, or a span back from now: 30m, 1h, 2d",
    )
    p.add_argument(
        "--limit",
        type=_filters.for_argparse(_filters.limit, int, allow_none=False),
        metavar="N",
        help="rows per section",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    report_resolve.add_arguments(p)
    p.set_defaults(func=run)

    # Errors in one line, not argparse's usage block (instance attributes: other
    # subcommands keep the default behaviour).
    p.error = _usage_error  # type: ignore[method-assign]
    parse_known = p.parse_known_args

    def parse_known_args(args=None, namespace=None):
        # The top-level parser would report our unknown arguments with its usage block.
        ns, extras = parse_known(args, namespace)
        if extras:
            _usage_error(f"unrecognized arguments: {' '.join(extras)}")
        return ns, extras

    p.parse_known_args = parse_known_args  # type: ignore[method-assign]
    return p


# --------------------------------------------------------------------------- the command


def _sections(args: argparse.Namespace) -> tuple[str, ...]:
    """The sections asked for: the history by default; --ledger adds the peaks, and alone
    (no --scheduler, no --store) asks for the peaks only."""
    asked = [s for s in SECTIONS if getattr(args, s)]
    if not asked and (args.ledger is None or args.scheduler or args.store):
        asked = list(HISTORY)
    if args.ledger is not None and "peaks" not in asked:
        asked.append("peaks")
    return tuple(asked)


def run(args: argparse.Namespace) -> int:
    report_resolve.check(args, tuple(s for s in SECTIONS if getattr(args, s)), _usage_error)
    sections = _sections(args)
    history = tuple(s for s in sections if s != "peaks")
    # Where the peaks come from: the --ledger file, the scheduler's workers, or this host.
    workers = "peaks" in sections and args.ledger is None
    store = args.store
    if args.scheduler is None and store is None and (history or workers):
        import dask

        args.scheduler = dask.config.get("scheduler-address", None) or None
        if args.scheduler is None and history:  # this host's history (report_default)
            try:
                store, note = store_to_read(args.cluster)
            except (ReportFailed, LookupError) as e:  # no history; none of --cluster
                echo(f"{PROG}: {one_line(e)}", file=sys.stderr)
                return 3 if isinstance(e, LookupError) else 1
            echo(f"{PROG}: {note}", file=sys.stderr)
    if args.resolve is not None:
        return report_resolve.run(args, store)
    ledger = args.ledger
    if workers and args.scheduler is None:
        if args.store is not None:
            _usage_error(
                "--peaks: a failure store holds no memory peaks; give --ledger PATH "
                "(a memory ledger file on this host) or --scheduler ADDRESS"
            )
        workers = False
        try:
            ledger = _peaks.configured_ledger()
        except Exception as e:  # ConfigError: a bad oomguard setting here
            echo(
                f"{PROG}: cannot tell where this host's memory ledger is: {one_line(e)}",
                file=sys.stderr,
            )
            return 1
    data: dict[str, Any] = {}
    try:
        if args.scheduler is not None and (history or workers):
            with connected(args.scheduler, args.timeout) as client:
                if history:
                    source = scheduler_source(client, args.scheduler, args.timeout, args.cluster)
                    data = read_history(source, args, history)
                if workers:
                    data["peaks"] = peaks_from_workers(client, args.scheduler, args.timeout)
        elif history:
            args.store = store
            with store_source(store, args.cluster) as source:
                data = read_history(source, args, history)
        if ledger is not None:
            data["peaks"] = peaks_from_file(ledger)
    except ReportFailed as e:
        echo(f"{PROG}: {one_line(e)}", file=sys.stderr)
        return 1
    except Exception as e:  # anything else is still one line, never a traceback
        where = f"the scheduler at {args.scheduler}" if args.scheduler else args.store or ledger
        echo(f"{PROG}: reading {where} failed: {type(e).__name__}: {one_line(e)}", file=sys.stderr)
        return 1
    unknown = data.pop("unknown", None)
    if unknown:  # a mistyped name is not an empty history: say so, exit 3
        for line in unknown:
            echo(f"{PROG}: {line}", file=sys.stderr)
        return 3
    return _print(data, sections, args)


def _empty(what: str, args: argparse.Namespace, width: int | None) -> list[str]:
    """Why a section has no rows, in words: never a bare "none"."""
    narrowed = any(
        v is not None
        for v in (
            args.kind,
            args.cause,
            args.killer,
            args.pipeline,
            args.signature,
            args.since,
            args.cluster,
        )
    )
    if args.shard is not None:
        prefix = "  with these filters, no" if narrowed else "  no"
        return key_line(f"{prefix} {what} for shard", args.shard, width)
    return [f"  no {what} match these filters" if narrowed else f"  no {what} recorded"]


def _print(data: dict[str, Any], sections: tuple[str, ...], args: argparse.Namespace) -> int:
    if args.json:
        doc = {
            name: [row.to_dict() for row in (data[name].rows if name == "peaks" else data[name])]
            for name in sections
        }
        text = json.dumps(doc, indent=2)
        for note in data["peaks"].notes if "peaks" in data else ():  # the document has rows only
            echo(f"{PROG}: note: {one_line(note)}", file=sys.stderr)
    else:
        width = output_width()
        blocks = []
        if "incidents" in data:
            alone = "DEATHS below" if "deaths" in data else "oomguard report --deaths"
            empty = _empty("incidents", args, width)
            blocks.append(
                render_incidents(data["incidents"], width=width, empty=empty, deaths=alone)
            )
        if "deaths" in data:
            blocks.append(
                render_deaths(
                    data["deaths"],
                    width=width,
                    shard=args.shard,
                    pipeline=args.pipeline,
                    empty=_empty("worker deaths", args, width),
                )
            )
        if "events" in data:
            titles = (
                "SIGNATURES below"
                if "signatures" in data
                else "oomguard report --signatures --signature ID"
            )
            blocks.append(
                render_events(
                    data["events"],
                    history=shard_history(args),
                    width=width,
                    shard=args.shard,
                    empty=_empty("events", args, width),
                    titles=titles,
                )
            )
        if "signatures" in data:
            blocks.append(
                render_signatures(
                    data["signatures"],
                    width=width,
                    empty=_empty("signatures", args, width),
                    detail=args.signature is not None,
                )
            )
        if "pipelines" in data:
            blocks.append(
                render_pipelines(
                    data["pipelines"], width=width, empty=_empty("pipelines", args, width)
                )
            )
        if "peaks" in data:
            blocks.append(render_peaks(data["peaks"], width=width))
        text = "\n\n".join("\n".join(b) for b in blocks)
    try:
        with contextlib.suppress(AttributeError, ValueError):
            sys.stdout.reconfigure(errors="replace")  # type: ignore[union-attr]
        sys.stdout.write((text if args.json else printable(text)) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `oomguard report | head`
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
