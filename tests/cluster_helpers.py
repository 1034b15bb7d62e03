"""Small waits shared by the cluster tests."""

from __future__ import annotations

import time


def wait_installed(client, n: int = 2, timeout: float = 60.0) -> None:
    """Wait until `n` workers run oomguard's worker plugin (installed at runtime)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = client.run(lambda dask_worker: "oomguard-worker" in dask_worker.plugins)
        if len(got) >= n and all(got.values()):
            return
        time.sleep(0.1)
    raise AssertionError("worker plugins were not installed")
