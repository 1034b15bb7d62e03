"""What a task says it needs in memory, and what earlier runs of its prefix needed.

`memory("6 GiB")` annotates the tasks built inside it (`dask.annotate(oomguard_memory=...)`);
workers with admission enabled then take a host-wide lease of that size before the task
runs (see `worker_plugin/_admission.py`). A task that says nothing gets an estimate from
the peaks observed for its task prefix on this host (`PeakEstimator`), or no lease at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import dask
from dask.utils import key_split, parse_bytes

from .._protocol import MEMORY_ANNOTATION as ANNOTATION

__all__ = ["ANNOTATION", "PeakEstimator", "memory", "parse_need"]

#: The task annotation carrying the need in bytes.


def parse_need(value: Any, field: str = ANNOTATION) -> int:
    """Bytes from an int or a size string; ValueError naming `field` otherwise.

    >>> parse_need("6 GiB"), parse_need(1024)
    (6442450944, 1024)
    """
    if isinstance(value, bool):
        raise ValueError(f"{field} is {value!r}; expected a size such as '6 GiB' or bytes.")
    try:
        n = int(parse_bytes(value)) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"{field} is {value!r}; expected a size such as '6 GiB' or a number of bytes."
        ) from None
    if n <= 0:
        raise ValueError(f"{field} is {value!r}; it must be positive.")
    return n


@contextlib.contextmanager
def memory(need: int | str) -> Iterator[int]:
    """Annotate the tasks built inside with the memory each one needs.

    Same as ``dask.annotate(oomguard_memory=<bytes>)``. With admission enabled, a worker
    runs such a task only once the host has that much memory free beside the leases of
    other tasks (it waits, bounded by ``oomguard.worker.admission.max-wait``).

    >>> import dask, oomguard
    >>> with oomguard.memory("6 GiB"):
    ...     x = dask.delayed(sum)([1, 2])
    >>> x.__dask_graph__().layers[x.key].annotations
    {'oomguard_memory': 6442450944}
    """
    nbytes = parse_need(need, "need")
    with dask.annotate(**{ANNOTATION: nbytes}):
        yield nbytes


def need_of(
    key: Any, annotations: Mapping[str, Any] | None, estimator: PeakEstimator | None
) -> int | None:
    """The bytes a task needs: its annotation, else its prefix's estimate, else None.

    >>> need_of("load-1", {ANNOTATION: 100}, None)
    100
    """
    if annotations:
        value = annotations.get(ANNOTATION)
        if value is not None:
            return parse_need(value)
    if estimator is not None:
        return estimator.estimate(key_split(key))
    return None


class PeakEstimator:
    """Per-prefix memory needs learned from the peaks observed in earlier runs.

    An estimate is the largest observed peak times (1 + `margin`); prefixes whose peak
    stays below `min_bytes` get no estimate (no lease: small tasks never wait).

    >>> est = PeakEstimator(min_bytes=2**20, margin=0.25)
    >>> est.update({"load": 8 * 2**20, "tiny": 1000})
    >>> est.estimate("load"), est.estimate("tiny"), est.estimate("never-seen")
    (10485760, None, None)
    """

    def __init__(self, *, min_bytes: int = 64 * 2**20, margin: float = 0.2) -> None:
        if margin < 0:
            raise ValueError(f"margin is {margin!r}; expected a fraction >= 0.")
        self.min_bytes = min_bytes
        self.margin = margin
        self._peaks: dict[str, int] = {}

    def update(self, peaks: Mapping[str, int]) -> None:
        """Take the peaks read from the host ledger (prefix -> bytes)."""
        self._peaks = {k: v for k, v in peaks.items() if isinstance(v, int)}

    def observe(self, prefix: str, peak: int) -> None:
        if peak > self._peaks.get(prefix, 0):
            self._peaks[prefix] = peak

    def estimate(self, prefix: str) -> int | None:
        peak = self._peaks.get(prefix)
        if peak is None or peak < self.min_bytes:
            return None
        return int(peak * (1 + self.margin))
