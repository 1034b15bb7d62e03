"""What `oomguard.scheduler.store` names: a SQLite file (a path) or a PostgreSQL database (a
`postgresql://` URL, libpq's syntax). A value with another scheme is refused, never taken
for a path; a URL's password never leaves this module unredacted (`redact`)."""

from __future__ import annotations

import re
import urllib.parse

#: The schemes libpq takes for a connection URI.
POSTGRES_SCHEMES = ("postgresql", "postgres")
EXTRA = 'pip install "dask-oomguard[postgres]"'

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def scheme(value: str) -> str | None:
    """The URL scheme of `value` ("postgresql"), or None for a path."""
    m = _SCHEME.match(value)
    return m.group(1).lower() if m else None


def is_postgres(value: str | None) -> bool:
    return value is not None and scheme(value) in POSTGRES_SCHEMES


def check(value: str, key: str = "oomguard.scheduler.store") -> str:
    """`value` unchanged when it is a path or a PostgreSQL URL; ValueError naming `key` for
    a URL of another scheme (before, such a value became a directory named after it)."""
    s = scheme(value)
    if s is None or s in POSTGRES_SCHEMES:
        return value
    known = " or ".join(f"{k}://" for k in POSTGRES_SCHEMES)
    raise ValueError(
        f"{key} is a URL of scheme {s!r} ({redact(value)}), which oomguard does not know; it "
        f"takes a path to a SQLite file or a PostgreSQL URL, {known} (with {EXTRA})."
    )


def redact(value: str) -> str:
    """`value` with any password replaced by "***": in the user part and in a `password=`
    query parameter. A path comes back unchanged."""
    if scheme(value) is None:
        return value
    try:
        parts = urllib.parse.urlsplit(value)
    except ValueError:
        return f"{scheme(value)}://***"  # unparseable: show nothing of it
    netloc = parts.netloc
    if "@" in netloc:
        user, host = netloc.rsplit("@", 1)
        if ":" in user:
            user = user.split(":", 1)[0] + ":***"
        netloc = f"{user}@{host}"
    query = "&".join(
        f"{k}=***" if k.lower() == "password" else f"{k}={v}" if v or "=" in pair else k
        for pair in parts.query.split("&")
        if pair
        for k, _, v in [pair.partition("=")]
    )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def driver_missing() -> str | None:
    """None when psycopg (3) and its pool import, else one line naming the extra."""
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as e:
        return f"a postgresql:// store needs psycopg 3 with its pool ({e}): {EXTRA}"
    return None
