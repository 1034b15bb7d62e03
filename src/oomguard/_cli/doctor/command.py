"""`oomguard doctor`: what evidence of worker deaths this host gives oomguard, and what not."""

from __future__ import annotations

import argparse
import json

_EPILOG = """\
Run it where the nanny runs (same host or container, same user): it probes for real, creating
and removing a throwaway child memory cgroup and a file in the crash directory, and making
the directory of the default failure history where it is missing, as a scheduler would.

Each line is one check: "ok" (oomguard collects this evidence), "warn" (it does, with a
caveat, or something else may kill workers), "no" (it cannot); "warn" and "no" lines are
followed by "fix: ...". The cgroup layout: v1 or v2-delegated (a memory group per worker),
v1-shared or v2-shared (the nanny and its workers share one group), none.

--json prints one object: {"layout", "cgroup": {"version", "path"}, "checks": [{"name",
"status", "detail", "fix"}], "versions": {"oomguard", "dask", "distributed", "python",
"kernel", "host"}}.

--store URL checks a PostgreSQL failure history instead of this host: that it is reachable
and its schema, which clusters' rows the URL's role may reach, and the rows PostgreSQL
refused and the schedulers set aside (the newest listed); the URL's password is never
shown. --json then prints {"store", "checks": [...], "set_aside": [{"cluster", "kind",
"item", "reason", "time"}]}.

exit status: 0 (a report, whatever it finds); 2 bad arguments.
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "doctor",
        help="check what evidence of worker deaths this host lets oomguard collect",
        description="Check what evidence of worker deaths oomguard can collect on this host "
        "(cgroup counters, kernel log, crash files), what it cannot, and the fix for each.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--store",
        metavar="URL",
        help="check this PostgreSQL failure history (postgresql://...) instead of the host",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from ..terminal import printable
    from .checks import diagnose

    if args.store is not None:
        return run_store(args)

    d = diagnose()
    print(json.dumps(d.to_dict(), indent=2) if args.json else printable(render_text(d)))
    return 0


def render_text(d) -> str:
    """The report: a header, one line per check, "fix:" under each that is not ok.

    >>> from oomguard._cli.doctor.check import Check
    >>> from oomguard._cli.doctor.checks import Diagnosis
    >>> v = dict(oomguard="1", dask="2", distributed="3", python="4", kernel="5", host="h")
    >>> d = Diagnosis("none", None, None, (Check("cgroup", "no", "why", "do this"),), v)
    >>> print(render_text(d))                                  # doctest: +ELLIPSIS
    oomguard doctor on h: Linux 5, Python 4, oomguard 1, dask 2, distributed 3
    cgroup layout: none (no memory cgroup: ...)
    no    cgroup  why
          fix: do this
    0 ok, 0 warn, 1 no
    """
    from .text import LAYOUTS

    v = d.versions
    lines = [
        f"oomguard doctor on {v['host']}: Linux {v['kernel']}, Python {v['python']}, "
        f"oomguard {v['oomguard']}, dask {v['dask']}, distributed {v['distributed']}",
        f"cgroup layout: {d.layout} ({LAYOUTS[d.layout]})",
    ]
    width = max(len(c.name) for c in d.checks)
    for c in d.checks:
        lines.append(f"{c.status:<5} {c.name:<{width}}  {c.detail}")
        if c.status != "ok":
            lines.append(f"{'':<5} fix: {c.fix}")
    counts = {s: sum(c.status == s for c in d.checks) for s in ("ok", "warn", "no")}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    return "\n".join(lines)


def run_store(args) -> int:
    """`--store URL`: the history's checks (doctor/store.py)."""
    from ..._urls import is_postgres, redact
    from ..terminal import echo
    from .checks import Check
    from .store import check_store

    where = redact(args.store)
    if is_postgres(args.store):
        checks, rows = check_store(args.store)
    else:
        checks, rows = [Check("history", "no", f"{where} is not a postgresql:// URL", "")], []
    if args.json:
        print(
            json.dumps(
                {"store": where, "checks": [c.to_dict() for c in checks], "set_aside": rows},
                indent=2,
            )
        )
        return 0
    lines = [f"oomguard doctor on the history {where}"]
    width = max(len(c.name) for c in checks)
    for c in checks:
        lines.append(f"{c.status:<5} {c.name:<{width}}  {c.detail}")
        if c.status != "ok" and c.fix:
            lines.append(f"{'':<5} fix: {c.fix}")
    echo("\n".join(lines))
    return 0
