"""The one guard between oomguard's bugs and the process it runs in.

A hook must never take the scheduler or a worker down: every hook body runs under
``with guard("site"):``, which swallows the exception, counts it in
``oomguard_internal_errors_total{where=site}`` and logs it once per site.
"""

from __future__ import annotations

import logging
from typing import Any


class Guard:
    """>>> import logging
    >>> guard = Guard(None, logging.getLogger("doctest"))
    >>> with guard("demo"):
    ...     1 / 0
    >>> guard.count
    1
    """

    def __init__(self, metrics: Any, logger: logging.Logger) -> None:
        self.metrics = metrics
        self.logger = logger
        self.count = 0
        self._logged: set[str] = set()

    def __call__(self, where: str) -> _Site:
        return _Site(self, where)

    def error(self, where: str) -> None:
        """Count the exception being handled; log it the first time at this site."""
        self.count += 1
        if self.metrics is not None:
            self.metrics.internal_error(where)
        if where not in self._logged:
            self._logged.add(where)
            self.logger.exception("oomguard failed in %s (logged once per site)", where)

    def once(self, site: str, message: str, *args: Any) -> None:
        """A warning logged the first time for `site`, then only counted by the caller."""
        if site not in self._logged:
            self._logged.add(site)
            self.logger.warning(message, *args)


class _Site:
    __slots__ = ("guard", "where")

    def __init__(self, guard: Guard, where: str) -> None:
        self.guard = guard
        self.where = where

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, value, tb) -> bool:
        if kind is None or not issubclass(kind, Exception):
            return False
        self.guard.error(self.where)
        return True
