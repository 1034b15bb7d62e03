"""The failure history in PostgreSQL: one history for many clusters (issue 29).

A scheduler still records into its local SQLite store (the spool, `oomguard._store`); its
`Shipper` sends what the spool committed to the database in order and exactly once, on its
own thread, and keeps it in the spool while the database is away. `PgReader` reads the
whole history (every cluster) or one cluster's. The tables live in the schema `oomguard`,
versioned and migrated under an advisory lock (`schema`). Needs psycopg 3 and its pool:
`pip install "dask-oomguard[postgres]"`.
"""

from __future__ import annotations

from .reads import PgReader
from .schema import MIGRATIONS, NAMESPACE, check_version, migrate
from .ship import Shipper, pg_connect

__all__ = [
    "MIGRATIONS",
    "NAMESPACE",
    "PgReader",
    "Shipper",
    "check_version",
    "migrate",
    "pg_connect",
]
