"""Host-wide memory admission: the ledger every worker on a host shares, what a task says it
needs, the peaks learned per prefix, and start-up reservations (no Dask in here)."""
