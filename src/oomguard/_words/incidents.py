"""An incident in one line: where, how many workers within how long, what and who."""

from __future__ import annotations

from .._display import quantity


def incident_summary(place: str, deaths: int, span: float, cause: str, killer: str) -> str:
    """One line for an incident of `deaths` worker deaths at `place` within `span` seconds,
    of `cause`; `killer`: its first death's killer sentence (or name).

    >>> incident_summary("host node-1", 3, 0.42, "sigkill", "SIGKILL from an unknown sender")
    'host node-1: 3 workers within 0.4 s, sigkill; SIGKILL from an unknown sender'
    >>> incident_summary("host node-1", 1, 0.0, "native_crash", "the worker's own code")
    "host node-1: 1 worker, native_crash; the worker's own code"
    """
    within = f" within {span:.1f} s" if deaths > 1 else ""
    head = f"{place}: " if place else ""
    tail = f"; {killer}" if killer else ""
    return f"{head}{quantity(deaths, 'worker')}{within}, {cause}{tail}"
