"""What `oomguard.scheduler.store` names: a SQLite file (a path) or a PostgreSQL database (a
`postgresql://` URL, libpq's syntax). A value with another scheme is refused, never taken
for a path; a URL's password never leaves this module unredacted (`redact`), and a
driver's message that may quote it passes through `scrub` (`error_line`)."""

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


#: libpq's connection parameters whose values a message may show. Every other one is
#: shown as "***": `password` and `sslpassword`, a parameter misspelt (`passwrd=`), and
#: any libpq adds later. Keys are compared percent-decoded, as libpq reads them.
SHOWN = frozenset(
    {
        "host", "hostaddr", "port", "dbname", "user", "passfile", "channel_binding",
        "connect_timeout", "client_encoding", "options", "application_name",
        "fallback_application_name", "keepalives", "keepalives_idle", "keepalives_interval",
        "keepalives_count", "tcp_user_timeout", "replication", "gssencmode", "sslmode",
        "requiressl", "sslcompression", "sslcert", "sslkey", "sslcertmode", "sslrootcert",
        "sslcrl", "sslcrldir", "sslsni", "requirepeer", "ssl_min_protocol_version",
        "ssl_max_protocol_version", "krbsrvname", "gsslib", "gssdelegation", "service",
        "target_session_attrs", "load_balance_hosts", "require_auth", "sslnegotiation",
    }
)  # fmt: skip
_PASSWORDS = ("password", "sslpassword")
_QUOTED = re.compile(r'"([^"]*)"')


def redact(value: str) -> str:
    """`value` with any password replaced by "***": in the user part, and the value of
    every query parameter but those in SHOWN (`password=`, however spelt or encoded). A
    path comes back unchanged.

    >>> redact("postgresql://u:pw@db/h?sslmode=require&pass%77ord=pw#x")
    'postgresql://u:***@db/h?sslmode=require&pass%77ord=***'
    """
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
        f"{k}={v}" if _shown(k) else f"{k}=***" if "=" in pair else k
        for pair in parts.query.split("&")
        if pair
        for k, _, v in [pair.partition("=")]
    )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _shown(key: str) -> bool:
    return urllib.parse.unquote(key).lower() in SHOWN


def secrets(url: str) -> list[str]:
    """Every form a secret of `url` may take in a driver's message, longest first: the
    user part's password and each parameter value not in SHOWN, as written and
    percent-decoded (libpq quotes either: ``invalid percent-encoded token: "S3cr%z"``)."""
    found = set()
    rest = url.split("://", 1)[-1]
    authority, _, query = rest.partition("?")
    authority = authority.split("/", 1)[0]
    user = authority.rsplit("@", 1)[0] if "@" in authority else ""
    if ":" in user:
        found.add(user.split(":", 1)[1])
    for pair in query.split("#", 1)[0].split("&"):
        key, eq, value = pair.partition("=")
        # A misspelt key's value is likely a password too, unless too short to be one
        # (replacing "1" everywhere would garble the message, not hide anything).
        if eq and value and not _shown(key):
            if len(value) >= 4 or urllib.parse.unquote(key).lower() in _PASSWORDS:
                found.add(value)
    if "#" in url:
        found.add(url.split("#", 1)[1])
    found |= {urllib.parse.unquote(s) for s in found}
    return sorted((s for s in found if s), key=len, reverse=True)


def scrub(text: str, url: str) -> str:
    """`text` (a driver's message) with `url` shown redacted, every secret of it as "***",
    and any quoted part of the text that holds a piece of one.

    >>> scrub('invalid percent-encoded token: "S3cr%zz"', "postgresql://u@h/d?password=S3cr%zz")
    'invalid percent-encoded token: "***"'
    """
    found = secrets(url)
    for whole in (url, urllib.parse.unquote(url)):
        text = text.replace(whole, redact(url))
    for secret in found:
        text = text.replace(secret, "***")

    def quoted(m: re.Match[str]) -> str:
        inner = m.group(1)
        if len(inner) >= 3 and any(inner in s for s in found):
            return '"***"'
        return m.group(0)

    return _QUOTED.sub(quoted, text)


def error_line(e: BaseException, url: str) -> str:
    """An error as one line for a log, an exception or a terminal: no secret of `url` in
    it (`scrub`), whatever the driver quoted."""
    return scrub(" ".join(str(e).split()), url) or type(e).__name__


def check_url(url: str) -> None:
    """StoreError (no secret in it) for a URL libpq cannot read; nothing is contacted."""
    from psycopg.conninfo import conninfo_to_dict

    from ._exceptions import StoreError

    try:
        conninfo_to_dict(url)
        return
    except Exception as e:
        said = error_line(e, url)
    # Raised here, not in the except: the driver's error (which quotes the URL) is then
    # neither the cause nor the context of this one.
    raise StoreError(f"oomguard.scheduler.store {redact(url)} is not a URL libpq takes: {said}")


def driver_missing() -> str | None:
    """None when psycopg (3) and its pool import, else one line naming the extra."""
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as e:
        return f"a postgresql:// store needs psycopg 3 with its pool ({e}): {EXTRA}"
    return None
