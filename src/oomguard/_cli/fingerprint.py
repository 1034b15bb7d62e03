"""`oomguard fingerprint FILE...`: the crash signature of each trace file, one line per file."""

from __future__ import annotations

import argparse
import json
import sys

_EPILOG = """\
Each FILE may be a Python traceback, a faulthandler dump, a Dask worker's "Compute Failed"
log block, or a JSON object with the scheduler's exception_text and traceback_text; as
written, or as a log delivers it: journald or syslog headers, `kubectl logs --timestamps`,
CRI log files and Loki's times, Dask's own log prefix, ANSI colours and CRLF line ends are
taken off, and frames pasted without their indentation are read. The same crash gets the
same id in every one of these forms.

Output: one line per FILE that holds a trace, in order: "<id>\\t<path>" (with --json: one
JSON object per line with id, title, input_kind, error, message, frames, grouping_version,
reason and path).

A FILE that could not be read, or that holds no trace, gets no output line and one line on
stderr saying why: "oomguard: <path>: <reason>", "oomguard: <path>: not a trace: <reason>".

Exit status: 0 when every FILE was read and held a trace; 1 otherwise.
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "fingerprint",
        help="print the crash signature of each trace file",
        description="Print the stable crash signature of each trace file.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--json", action="store_true", help="print the full record as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from .._signature import fingerprint
    from .terminal import echo

    status = 0
    for path in args.files:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            echo(f"oomguard: {path}: {exc.strerror or exc}", file=sys.stderr)
            status = 1
            continue
        sig = fingerprint(data)
        if sig.input_kind == "unparsed":  # an id of its own text would pass for a crash's
            echo(f"oomguard: {path}: not a trace: {sig.reason}", file=sys.stderr)
            status = 1
        elif args.json:
            print(json.dumps({**sig.to_dict(), "path": path}))
        else:
            echo(f"{sig.id}\t{path}")
        sys.stdout.flush()
    return status
