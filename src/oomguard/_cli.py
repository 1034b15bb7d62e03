"""The `oomguard` command: `demo`, `report`, `fingerprint`, `doctor`.

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
    from . import _cli_demo, _cli_doctor, _cli_fingerprint

    _cli_demo.add_parser(sub)
    _cli_fingerprint.add_parser(sub)
    from . import _cli_report; _cli_report.add_parser(sub)  # noqa: E702
    _cli_doctor.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("oomguard: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
