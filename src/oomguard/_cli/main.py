"""The `oomguard` command: `demo`, `report`, `fingerprint`, `doctor`, `history`.

Each subcommand lives in its own module and registers itself here with `add_parser`;
errors print one clear line on stderr and exit non-zero.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="oomguard",
        description="Why your Dask workers died, and which crashes are the same crash.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    from . import demo, fingerprint, history, report
    from .doctor import command as doctor

    demo.add_parser(sub)
    fingerprint.add_parser(sub)
    report.add_parser(sub)
    doctor.add_parser(sub)
    history.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("oomguard: interrupted", file=sys.stderr)
        return 130
