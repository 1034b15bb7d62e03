"""`oomguard report --resolve ID [--note TEXT]`: a person marks a signature resolved, in a
running scheduler's history (the RPC `Failures.resolve` uses) or in a store (a SQLite file,
written beside a scheduler that may be writing it, in one short transaction; or a
PostgreSQL history, with the URL's role: a read-only role is refused). Idempotent: a
signature resolved and not seen since stays as it was. Exit 0 resolved (or already), 1 the
history cannot be written or reached, 2 bad arguments, 3 an id the history does not have.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .._display import clock, one_line
from .._exceptions import ReportFailed, StoreError
from .._safe_text import safe_name
from .terminal import echo, printable

PROG = "oomguard report"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--resolve",
        type=safe_name,
        metavar="ID",
        help="mark this signature resolved (fixed): a death with it after now makes it "
        "regressed; with --scheduler, or --store (a file, or a postgresql:// history)",
    )
    p.add_argument("--note", metavar="TEXT", help="with --resolve: why, e.g. the fix's version")


def check(args: argparse.Namespace, sections: tuple[str, ...], error: Any) -> None:
    """Usage errors: --note without --resolve; --resolve with a section."""
    if args.note is not None and args.resolve is None:
        error("--note: give it with --resolve ID")
    if args.resolve is not None and (sections or args.ledger is not None):
        error("--resolve: resolve alone, then print the report (--signatures) after it")


def run(args: argparse.Namespace, store: str | None) -> int:
    """Resolve `args.resolve` in the scheduler (`args.scheduler`) or the store `store`."""
    from .._client.filters import user_name

    note, by = args.note or "", user_name()
    try:
        if args.scheduler is not None:
            row, changed = _in_scheduler(args, note, by)
        elif store is not None:
            row, changed = _in_store(store, args.resolve, note, by)
        else:  # report_default said why there is no history here
            return 1
    except LookupError as e:
        echo(f"{PROG}: --resolve {one_line(e.args[0] if e.args else e)}", file=sys.stderr)
        return 3
    except (ReportFailed, PermissionError, OSError) as e:
        echo(f"{PROG}: {one_line(e)}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(json.dumps({"resolved": row.to_dict(), "changed": changed}, indent=2))
        sys.stdout.write("\n")
        return 0
    lines = [
        (
            f"resolved signature {row.id} ({row.title}) at {clock(row.resolved_at)}"
            if changed
            else f"signature {row.id} ({row.title}) was resolved at {clock(row.resolved_at)}"
            " and not seen since: nothing changed"
        )
        + (f" by {row.resolved_by}" if row.resolved_by else ""),
    ]
    if row.resolve_note:
        lines.append(f"  note: {row.resolve_note}")
    if args.resolve != row.id:
        lines.append(f"  {args.resolve} is an id an older grouping version gave it")
    lines.append(
        "  a death with it from now on makes it regressed (oomguard_signature_regressions_total)"
    )
    sys.stdout.write(printable("\n".join(lines)) + "\n")
    return 0


def _in_scheduler(args: argparse.Namespace, note: str, by: str) -> tuple[Any, bool]:
    from .report_source import connected

    with connected(args.scheduler, args.timeout) as client:
        from .._client.api import Failures

        try:
            return Failures(client, timeout=args.timeout)._resolve(args.resolve, note, by)
        except KeyError as e:
            raise LookupError(str(e.args[0]).replace("signature=", "", 1)) from None
        except TimeoutError as e:
            raise ReportFailed(
                f"the scheduler at {args.scheduler} did not answer within {args.timeout:g} s"
            ) from e


def _in_store(path: str, signature_id: str, note: str, by: str) -> tuple[Any, bool]:
    from .._client.filters import unknown_name
    from .._urls import error_line, is_postgres, redact

    if is_postgres(path):
        from .._store.pg import PgReader

        store: Any = PgReader(path)
    elif not os.path.isfile(path):
        raise ReportFailed(f"no failure store at {path}: the file does not exist")
    else:
        from .._store import FailureStore

        store = FailureStore(path)
    try:
        store.start()
        try:
            return store.resolve(signature_id, note=note, by=by)
        except KeyError:
            _, names = store.known("signature", signature_id)
            raise LookupError(unknown_name(None, signature_id, "signature id", names)) from None
    except (LookupError, PermissionError):
        raise
    except StoreError as e:
        raise ReportFailed(one_line(e)) from None
    except Exception as e:  # a driver's error may quote the URL: never kept, scrubbed
        failed = f"cannot resolve in {redact(path)}: {error_line(e, path)}"
    finally:
        store.close()
    raise ReportFailed(failed)
