"""A scheduler's PostgreSQL history: the shipper that feeds it from the scheduler's spool,
and the reader of every cluster's history, started and closed together."""

from __future__ import annotations

from typing import Any

from ..._urls import redact
from ..store import FailureStore
from .reads import PgReader
from .ship import Shipper


class History:
    """The history at `url`, fed by `spool` under the name `cluster`.

    >>> history = History(spool, "postgresql://oomguard@db/oomguard", "etl-prod")
    >>> history.start()                   # no network: the shipper connects on its thread
    >>> history.reader.signatures(limit=5)  # every cluster's
    """

    def __init__(self, spool: FailureStore, url: str, cluster: str, **bounds: Any) -> None:
        self.url = url
        self.path = redact(url)  # what a log line, a metric or the dashboard may show
        self.cluster = cluster
        self.shipper = Shipper(spool, url, cluster, **bounds)
        self.reader = PgReader(url)

    def __repr__(self) -> str:
        return f"History({self.path!r}, cluster={self.cluster!r})"

    def start(self) -> None:
        self.shipper.start()
        self.reader.start()

    def close(self, timeout: float = 5.0) -> None:
        """After the spool's own close: one last batch sent (within `timeout`), then stop."""
        self.shipper.close(timeout)
        self.reader.close()
