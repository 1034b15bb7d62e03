"""Per-cluster roles on the PostgreSQL history (`oomguard history grant`).

A scheduler's role can add and amend its own cluster's rows and no other's. The tables
that hold a cluster's rows (events, pipeline runs, rows set aside; deaths since version 3:
`schema.CLUSTER_TABLES`) are under row-level security since schema version 2: a role listed in `cluster_roles` sees only
the rows of its clusters, and writes only those of the cluster it `writes`, whatever its
statement says (an UPDATE or DELETE of another cluster's rows touches none; an INSERT or an
UPDATE that would make one is refused). Signatures (their counts, lists and example) are
the fleet's shared catalogue: every role reads them, and a writer adds to them, so a writer
can also change them. A role not listed (the tables' owner, a role granted by hand) keeps
what its privileges give it.

`grant` makes the role (or updates it): a login with the password given, its rights, and
its rows of `cluster_roles`. The password is sent as a SCRAM verifier computed here
(libpq's PQencryptPasswordConn), so the server and its log never see it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..._safe_text import safe_name
from .schema import CLUSTER_TABLES, NAMESPACE, migrate

#: The history's other tables, read by every role; a writer adds to them too.
SHARED_TABLES = (
    "signatures",
    "signature_members",
    "signature_fields",
    "signature_aliases",
    "signature_sites",
    "signature_links",
)
#: A role's name: an unquoted PostgreSQL identifier, in lower case.
ROLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def grant(
    conn: Any,
    url: str,
    role: str,
    password: str,
    clusters: Sequence[str],
    *,
    read_only: bool = False,
) -> str:
    """Make `role` a login with `password` that writes (and reads) the rows of one cluster,
    or with `read_only` reads those of `clusters` (every cluster's when none is given).
    Run it as the history's owner (or a role that may create roles and owns the schema).
    Migrates the schema first. ValueError naming the argument for a bad one, or a role
    that row-level security cannot hold. One sentence saying what the role may do."""
    if not ROLE_NAME.fullmatch(role):
        raise ValueError(
            f"--role {role!r}: expected a PostgreSQL name in lower case (letters, digits, "
            "underscores; at most 63, not starting with a digit)"
        )
    password = password.rstrip("\r\n")
    if not password or "\n" in password or "\r" in password:
        raise ValueError("--password-file: expected one line, the role's password")
    clusters = list(dict.fromkeys(clusters))
    if any(safe_name(c) != c or not c for c in clusters):
        raise ValueError("--cluster: expected a cluster's name, printable and at most 1 KiB")
    if not read_only and len(clusters) != 1:
        raise ValueError("--cluster: a writer writes exactly one cluster's rows")
    from psycopg import sql

    migrate(conn, url)
    verifier = conn.pgconn.encrypt_password(
        password.encode(), role.encode(), b"scram-sha-256"
    ).decode()
    name = sql.Identifier(role)
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(f"SET LOCAL search_path = {NAMESPACE}")
        cur.execute("SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = %s", (role,))
        found = cur.fetchone()
        if found is not None and found[0]:
            raise ValueError(
                f"--role {role}: a superuser or BYPASSRLS role reaches every cluster's rows "
                "whatever it is granted; choose another role"
            )
        cur.execute("SELECT tableowner FROM pg_tables WHERE schemaname = %s", (NAMESPACE,))
        if role in {r[0] for r in cur.fetchall()}:
            raise ValueError(
                f"--role {role}: it owns the history's tables, which row-level security "
                "does not restrict; choose another role"
            )
        make = "ALTER ROLE {} LOGIN PASSWORD {}" if found else "CREATE ROLE {} LOGIN PASSWORD {}"
        cur.execute(sql.SQL(make).format(name, sql.Literal(verifier)))
        cur.execute(
            sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
                sql.Identifier(conn.info.dbname), name
            )
        )
        tables = sql.SQL(", ").join(
            sql.Identifier(NAMESPACE, t)
            for t in ("schema_version", *CLUSTER_TABLES, *SHARED_TABLES)
        )
        cur.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(NAMESPACE), name)
        )
        cur.execute(sql.SQL("REVOKE ALL ON {} FROM {}").format(tables, name))
        cur.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(tables, name))
        sequence = sql.SQL(", ").join(
            sql.Identifier(NAMESPACE, s) for s in ("events_id_seq", "deaths_seq_seq")
        )
        if read_only:
            cur.execute(sql.SQL("REVOKE ALL ON SEQUENCE {} FROM {}").format(sequence, name))
        else:
            written = sql.SQL(", ").join(
                sql.Identifier(NAMESPACE, t) for t in (*CLUSTER_TABLES, *SHARED_TABLES)
            )
            cur.execute(sql.SQL("GRANT INSERT, UPDATE, DELETE ON {} TO {}").format(written, name))
            cur.execute(sql.SQL("GRANT USAGE ON SEQUENCE {} TO {}").format(sequence, name))
        cur.execute("DELETE FROM cluster_roles WHERE role = %s", (role,))
        cur.executemany(
            "INSERT INTO cluster_roles (role, cluster, writes) VALUES (%s, %s, %s)",
            [(role, c, not read_only) for c in clusters],
        )
    return describe(role, clusters, read_only)


def describe(role: str, clusters: Sequence[str], read_only: bool) -> str:
    """What a role granted so may do, in one sentence.

    >>> describe("etl_writer", ["etl"], False)
    "role etl_writer adds and amends the rows of cluster 'etl' and reads them; it reads and adds to the shared signatures"
    """
    if not read_only:
        return (
            f"role {role} adds and amends the rows of cluster {clusters[0]!r} and reads them; "
            "it reads and adds to the shared signatures"
        )
    which = (
        "every cluster's rows"
        if not clusters
        else "the rows of " + ", ".join(f"cluster {c!r}" for c in clusters)
    )
    return f"role {role} reads {which} and the shared signatures, and writes nothing"


def rights(conn: Any) -> tuple[str, list[tuple[str, bool]]]:
    """How the connected role reaches the history: "owner" (it owns the tables, or
    bypasses row-level security: every cluster's rows), "listed" (its clusters, with
    whether it writes each, from `cluster_roles`), or "unlisted" (its privileges alone)."""
    try:
        return _rights(conn)
    finally:
        conn.rollback()


def _rights(conn: Any) -> tuple[str, list[tuple[str, bool]]]:
    with conn.cursor() as cur:
        cur.execute("SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user")
        row = cur.fetchone()
        cur.execute(
            "SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = 'events'"
            " AND tableowner = current_user",
            (NAMESPACE,),
        )
        if (row is not None and row[0]) or cur.fetchone() is not None:
            return "owner", []
        cur.execute(
            f"SELECT cluster, writes FROM {NAMESPACE}.cluster_roles"
            " WHERE role = current_user ORDER BY cluster"
        )
        listed = [(c, bool(w)) for c, w in cur.fetchall()]
    return ("listed" if listed else "unlisted"), listed
