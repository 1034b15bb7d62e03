"""The one guard between oomguard's bugs and the process it runs in.

A hook must never take the scheduler or a worker down: every hook body runs under
``with guard("site"):``, which swallows the exception, counts it in
``oomguard_internal_errors_total{where=site}`` and logs it once per site. A line that
anyone who can connect may cause (a nanny's "unguarded" notice) goes through `limited`:
at most LOG_BURST lines per LOG_PERIOD seconds per site, the rest counted and said.
"""

from __future__ import annotations

import logging
import time
from typing import Any

#: Lines one site may log per LOG_PERIOD seconds through `Guard.limited`.
LOG_BURST = 10
LOG_PERIOD = 60.0


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
        self.held_back = 0  # lines `limited` did not log
        self._logged: set[str] = set()
        self._windows: dict[str, tuple[float, int, int]] = {}  # site -> (since, logged, held)

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

    def limited(self, site: str, message: str, *args: Any) -> bool:
        """A WARNING for `site`, at most LOG_BURST per LOG_PERIOD seconds: past that it is
        counted (`held_back`), and the site's next line says how many were held back.
        Whether it was logged. The arguments must be printable already (`_safe_text`)."""
        now = time.monotonic()
        since, logged, held = self._windows.get(site, (now, 0, 0))
        if now - since >= LOG_PERIOD:
            since, logged = now, 0
        if logged >= LOG_BURST:
            self.held_back += 1
            self._windows[site] = (since, logged, held + 1)
            return False
        if held:
            message, args = message + " (and %d more like it, not logged)", (*args, held)
        self.logger.warning(message, *args)
        self._windows[site] = (since, logged + 1, 0)
        return True


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
