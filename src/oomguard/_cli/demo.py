"""`oomguard demo`: run the demo pipeline and print (or write as HTML) what oomguard saw."""

from __future__ import annotations

import html
import sys
import textwrap
import time
from collections import Counter

from .demo_run import CRASHER, FLAKY, SEGFAULTER, DemoResult, progress_bar, run_demo
from .terminal import echo


def add_parser(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="run a pipeline with a real OOM kill, a segfault and a user error, and report",
        description=(
            "Starts a local Dask cluster (2 workers with nannies, small memory limits) with "
            "oomguard installed, runs a pipeline in which one shard always runs out of "
            "memory, one segfaults once and one raises a user error once, and prints what "
            "oomguard recorded. Exit status 0 when everything happened as designed."
        ),
    )
    p.add_argument("--shards", type=int, default=30, help="number of shards (default 30)")
    p.add_argument("--html", metavar="FILE", help="also write a standalone HTML report")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.shards < FLAKY + 1:
        print(f"oomguard demo: --shards must be at least {FLAKY + 1}", file=sys.stderr)
        return 2
    print("oomguard demo: a local cluster, 2 workers with nannies (320 MiB and 480 MiB)")
    print(
        f"  shard {CRASHER} needs 1 GiB, more than any worker has; "
        f"shard {SEGFAULTER} segfaults once; shard {FLAKY} raises once (retries=1)"
    )
    result = run_demo(args.shards, progress=progress_bar)
    echo(render_text(result))
    if args.html:
        with open(args.html, "w") as f:
            f.write(render_html(result))
        print(f"HTML report written to {args.html}")
    if result.problems:
        for problem in result.problems:
            echo(f"oomguard demo: {problem}", file=sys.stderr)
        return 1
    return 0


def _when(t: float, t0: float) -> str:
    return f"+{t - t0:5.1f}s"


def render_text(r: DemoResult) -> str:
    out = []
    how = (
        "the kernel's OOM killer, in a per-worker memory cgroup"
        if r.kernel_oom
        else "the nanny's memory termination (no writable cgroup here, so no kernel OOM kill)"
    )
    out.append(f"\nMemory kills in this run come from {how}.")
    out.append(f"\nFailure events ({len(r.events)}):")
    t0 = r.events[0].time if r.events else 0.0
    out.append(f"  {'when':>7}  {'kind':5}  {'cause':16}  {'shard':14}  {'worker':22}  evidence")
    for e in r.events:
        out.append(
            f"  {_when(e.time, t0):>7}  {e.kind:5}  {e.cause:16}  {e.shard:14}  "
            f"{e.worker:22}  {e.evidence.get('summary') or e.evidence.get('exception', '')}"
        )
    out.append(f"\nSignatures of this run, deduplicated across workers ({len(r.signatures)}):")
    out.append(f"  {'id':16}  {'count':>5}  {'workers':>7}  title")
    for s in r.signatures:
        out.append(f"  {s.id:16}  {s.count:>5}  {len(s.workers):>7}  {s.title}")
    if r.status is not None:
        out.append(f"\nPipeline 'demo': {r.status.status}")
        out.append(
            textwrap.fill(r.status.summary, 96, initial_indent="  ", subsequent_indent="  ")
        )
    if r.aborted is not None:
        out.append("\nWhat the client got (oomguard.PipelineAborted):")
        out.append(textwrap.fill(str(r.aborted), 96, initial_indent="  ", subsequent_indent="  "))
    if r.store:
        out.append(
            f"\nThe history (this run, and every demo run before it) is kept in {r.store}; "
            "read it again with:"
        )
        out.append(f"  {again(r.store)}")
    out.append(f"\nDone in {r.seconds:.0f} s.")
    return "\n".join(out)


def again(store: str) -> str:
    """The command that shows the crasher's failures again, after the demo has ended."""
    from .._words.causes import shell_arg

    shard = str(("demo", CRASHER))
    return f"oomguard report --store {shell_arg(store)} --shard {shell_arg(shard)}"


def _svg_bars(counts: Counter) -> str:
    """A small bar chart of failures by cause, as inline SVG (no JavaScript)."""
    if not counts:
        return "<p>No failures.</p>"
    width, bar, gap = 520, 26, 8
    top = max(counts.values())
    rows = []
    for i, (cause, n) in enumerate(sorted(counts.items(), key=lambda kv: -kv[1])):
        y = i * (bar + gap)
        w = max(2, int((width - 200) * n / top))
        rows.append(
            f'<text x="0" y="{y + 18}" font-size="14">{html.escape(cause)}</text>'
            f'<rect x="150" y="{y}" width="{w}" height="{bar}" fill="#c0392b"></rect>'
            f'<text x="{155 + w}" y="{y + 18}" font-size="14">{n}</text>'
        )
    height = len(counts) * (bar + gap)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="failures by cause">{"".join(rows)}</svg>'
    )


def render_html(r: DemoResult) -> str:
    esc = html.escape
    t0 = r.events[0].time if r.events else 0.0
    events = "".join(
        f"<tr><td>{esc(_when(e.time, t0))}</td><td>{esc(e.kind)}</td><td>{esc(e.cause)}</td>"
        f"<td>{esc(e.shard)}</td><td>{esc(e.worker)}</td>"
        f"<td>{esc(str(e.evidence.get('summary') or e.evidence.get('exception', '')))}</td></tr>"
        for e in r.events
    )
    sigs = "".join(
        f"<tr><td><code>{esc(s.id)}</code></td><td>{s.count}</td><td>{len(s.workers)}</td>"
        f"<td>{esc(s.title)}</td></tr><tr><td colspan=4><pre>{esc(s.example)}</pre></td></tr>"
        for s in r.signatures
    )
    status = esc(r.status.status if r.status else "unknown")
    summary = esc(r.status.summary if r.status else "")
    aborted = esc(str(r.aborted)) if r.aborted is not None else "not aborted"
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>oomguard demo report</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:70em}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:left}}
pre{{white-space:pre-wrap;font-size:12px;margin:0}}</style></head><body>
<h1>oomguard demo report</h1>
<p>Generated {esc(time.strftime("%Y-%m-%d %H:%M:%S"))}. Memory kills came from
{"the kernel's OOM killer (per-worker cgroup)" if r.kernel_oom else "the nanny's memory termination"}.</p>
<h2>Failures by cause</h2>{_svg_bars(Counter(e.cause for e in r.events))}
<h2>Failure events</h2><table><tr><th>when</th><th>kind</th><th>cause</th><th>shard</th>
<th>worker</th><th>evidence</th></tr>{events}</table>
<h2>Signatures</h2><table><tr><th>id</th><th>count</th><th>workers</th><th>title</th></tr>{sigs}</table>
<h2>Pipeline "demo": {status}</h2><p>{summary}</p>
<h2>PipelineAborted</h2><p>{aborted}</p>
</body></html>
"""
