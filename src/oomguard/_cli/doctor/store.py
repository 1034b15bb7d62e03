"""`oomguard doctor --store URL`: what a PostgreSQL history holds for the role that reads it.

Three checks: the history (reachable, its schema version), the role (which clusters' rows
it may reach: row-level security, `_store/pg/roles.py`) and the rows set aside (refused by
PostgreSQL, kept in their scheduler's spool: `_store/pg/aside.py`), the latest listed. No
secret of the URL is ever in what it says (`_urls.error_line`).
"""

from __future__ import annotations

from typing import Any

from .check import Check

#: Rows set aside listed (the newest); the count covers them all.
SHOWN = 10
_GRANT = "oomguard history grant --store URL --cluster NAME --role ROLE --password-file FILE"


def check_store(url: str) -> tuple[list[Check], list[dict[str, Any]]]:
    """The checks, and the newest rows set aside that this role may read."""
    from ..._store.pg import MIGRATIONS, check_version, pg_connect
    from ..._store.pg.roles import rights
    from ..._urls import driver_missing, error_line, redact

    missing = driver_missing()
    if missing is not None:
        return [Check("history", "no", missing, "install the extra")], []
    try:
        with pg_connect(url) as conn:
            version = check_version(conn, url, len(MIGRATIONS))
            user = conn.info.user
            if version == 0:
                return [_empty(redact(url))], []
            checks = [_version(version, len(MIGRATIONS), user)]
            if version < 2:  # no roles and no rows set aside before schema version 2
                return checks, []
            checks.append(_role(user, *rights(conn)))
            count, rows = _set_aside(conn)
            checks.append(_aside(count, rows))
            return checks, rows
    except Exception as e:
        return [
            Check(
                "history",
                "no",
                f"cannot read {redact(url)}: {error_line(e, url)}",
                "check the URL, that the server runs, and the password (PGPASSWORD, "
                "~/.pgpass or ?passfile=...)",
            )
        ], []


def _empty(where: str) -> Check:
    return Check("history", "warn", f"no oomguard history in {where} yet", "start a scheduler")


def _version(version: int, known: int, user: str) -> Check:
    if version < known:
        return Check(
            "history",
            "warn",
            f"schema version {version} (this oomguard knows {known}), read as role {user}",
            "the next scheduler of this oomguard migrates it (as the history's owner)",
        )
    return Check("history", "ok", f"schema version {version}, read as role {user}")


def _role(user: str, how: str, clusters: list[tuple[str, bool]]) -> Check:
    if how == "listed":
        writes = [c for c, w in clusters if w]
        reads = [c for c, _ in clusters]
        said = f"writes cluster {writes[0]!r} and " if writes else "writes nothing, "
        return Check(
            "role",
            "ok",
            f"{user} {said}reads the rows of {', '.join(map(repr, reads))} only "
            "(row-level security); the signatures are shared by every cluster",
        )
    what = (
        "owns the history (or bypasses row-level security)"
        if how == "owner"
        else "is not bound to a cluster"
    )
    return Check(
        "role",
        "warn",
        f"{user} {what}: it reaches every cluster's rows its privileges allow",
        f"give each cluster's scheduler a role of its own: {_GRANT}",
    )


def _set_aside(conn: Any) -> tuple[int, list[dict[str, Any]]]:
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM set_aside")
        (count,) = cur.fetchone()
        cur.execute(
            "SELECT cluster, kind, item, reason, time FROM set_aside ORDER BY time DESC LIMIT %s",
            (SHOWN,),
        )
        names = ("cluster", "kind", "item", "reason", "time")
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    conn.rollback()
    return count, rows


def _aside(count: int, rows: list[dict[str, Any]]) -> Check:
    if not count:
        return Check("set-aside", "ok", "no row set aside: PostgreSQL took every row sent")
    listed = "; ".join(
        f"{r['kind']} {r['item']} of cluster {r['cluster']!r}: {r['reason']}" for r in rows
    )
    return Check(
        "set-aside",
        "warn",
        f"{count} row(s) PostgreSQL refused were set aside, every other row went through "
        f"(newest first: {listed})",
        "each stays in the spool of the scheduler that sent it (that cluster's own queries "
        "show it); the reason says what PostgreSQL could not hold",
    )
