"""`oomguard fingerprint FILE...` (filled in by the signatures work)."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("fingerprint", help="print the crash signature of each trace file")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--json", action="store_true", help="print the full record as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    raise NotImplementedError
