"""`oomguard history grant`: a role per cluster on the PostgreSQL history.

    oomguard history grant --store postgresql://admin@db/oomguard \\
        --cluster etl-nightly --role etl_nightly --password-file /run/secrets/etl-nightly
    oomguard history grant --store postgresql://admin@db/oomguard \\
        --cluster etl-nightly --role etl_report --password-file pw --read-only

The first role is for the scheduler of cluster etl-nightly: it adds and amends that
cluster's rows and no other's (row-level security, `_store/pg/roles.py`); the second is for
`oomguard report`: it reads them and writes nothing. Give the writer's password to the
scheduler only (docs/history.md). The password is read from a file, never an argument, and
never printed.
"""

from __future__ import annotations

import argparse
import sys

PROG = "oomguard history grant"

_EPILOG = """\
Run it as the history's owner (the role the first scheduler connected as, or any role that
may create roles and owns the schema `oomguard`); it migrates the schema first. Granting a
role again sets its password, clusters and rights anew.

A writer (without --read-only) takes exactly one --cluster: it reads and writes that
cluster's events, pipeline runs and rows set aside, and none of another cluster's. A
--read-only role reads the clusters named (--cluster repeated), or every cluster's rows
without --cluster. Every role reads the signatures, which all clusters share (counts, the
clusters and hosts each was seen on, one example trace); a writer adds to them.

exit status: 0 granted; 1 the history could not be reached or refused; 2 bad arguments.
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "history",
        help="manage the PostgreSQL failure history (per-cluster roles)",
        description="Manage the PostgreSQL failure history many clusters share.",
    )
    commands = p.add_subparsers(dest="history_command", required=True, metavar="COMMAND")
    g = commands.add_parser(
        "grant",
        help="create (or update) a login role that writes one cluster's rows, or reads",
        description="Create or update a login role of the PostgreSQL history that adds and "
        "amends its own cluster's rows and no other's, or with --read-only one that reads.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g.add_argument("--store", required=True, metavar="URL", help="the history, as its owner")
    g.add_argument(
        "--cluster",
        action="append",
        default=[],
        metavar="NAME",
        help="the cluster whose rows the role writes (or, with --read-only, reads)",
    )
    g.add_argument("--role", required=True, metavar="ROLE", help="the login role to make")
    g.add_argument(
        "--password-file",
        required=True,
        metavar="FILE",
        help="a file holding the role's password (one line); it is never printed",
    )
    g.add_argument("--read-only", action="store_true", help="a role for oomguard report")
    g.set_defaults(func=run_grant)


def run_grant(args) -> int:
    from .._store.pg.roles import grant
    from .._store.pg.ship import pg_connect
    from .._urls import driver_missing, error_line, is_postgres, redact
    from .terminal import echo

    def fail(message: str, status: int) -> int:
        echo(f"{PROG}: {message}", file=sys.stderr)
        return status

    if not is_postgres(args.store):
        return fail(f"--store {redact(args.store)}: expected a postgresql:// URL", 2)
    missing = driver_missing()
    if missing is not None:
        return fail(missing, 1)
    try:
        with open(args.password_file, encoding="utf-8") as f:
            password = f.read(4096)
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or "not UTF-8 text"
        return fail(f"--password-file {args.password_file}: {why}", 2)
    try:
        with pg_connect(args.store) as conn:
            said = grant(
                conn,
                args.store,
                args.role,
                password,
                args.cluster,
                read_only=args.read_only,
            )
    except ValueError as e:
        return fail(error_line(e, args.store), 2)
    except Exception as e:  # the driver's words, without the URL's secrets
        return fail(f"{redact(args.store)}: {error_line(e, args.store)}", 1)
    echo(f"oomguard: {said}, in {redact(args.store)}")
    echo(f"connect as: {_as_role(args.store, args.role)} (its password from {args.password_file})")
    return 0


def _as_role(url: str, role: str) -> str:
    """`url` (redacted) with `role` as its user and no password.

    >>> _as_role("postgresql://admin:pw@db:5432/h?sslmode=require", "etl")
    'postgresql://etl@db:5432/h?sslmode=require'
    """
    import urllib.parse

    from .._urls import redact

    parts = urllib.parse.urlsplit(redact(url))
    host = parts.netloc.rsplit("@", 1)[-1]
    return urllib.parse.urlunsplit((parts.scheme, f"{role}@{host}", parts.path, parts.query, ""))
