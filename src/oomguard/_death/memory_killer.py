"""Rule K6 for a userspace OOM killer (earlyoom) when no sender was seen (pure).

The worker's signal recorder names the sender of a SIGTERM (`killer` K4). Where nothing
was recorded (`oomguard.worker.signal-senders: false`, no native recorder, or a SIGKILL,
which no process sees), a userspace OOM killer running on the host (`killers.find_killers`)
is the likely killer when the nanny's evidence puts the worker within its reach:

- MemAvailable was at or below one of its thresholds at the nanny's last reading; or
- it would have been by the death, at the rate it fell between the last two readings: a
  task growing at ~1 GB/s crosses earlyoom's threshold between two readings, and earlyoom
  polls more often than the nanny reads when memory is low; or
- the worker was the host's largest process (its last sampled RSS above every other
  process's RSS right after the death): the one earlyoom picks.

Each says its numbers, and the facts keep the reading's age (`memavailable_age_seconds`)
and which of the three it was (`killer_basis`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._models import evidence_int as _int
from .._models import evidence_map as _map
from .._models import evidence_number as _num
from .._units import format_bytes
from .record import Seen

Threshold = tuple[str, int, float | None]  # level ("term", "kill"), bytes, percent


def likely_memory_killer(
    k: Mapping[str, Any], sig: str, host: Mapping[str, Any], seen: Seen, facts: dict
) -> str | None:
    """The summary naming killer `k` (a `find_killers` entry) as the likely sender of
    `sig`, its facts added to `facts`; None when the evidence does not put the worker in
    its reach. `host`: `killer._host_facts`; `seen`: what the nanny read (its
    ``rss_sampled`` and ``host_memory["largest_other"]``)."""
    who = f"{sig}, likely from {k['name']} (pid {k['pid']})"
    avail, age = host.get("memavailable_bytes"), host.get("memavailable_age_seconds")
    rate = host.get("memavailable_rate_bytes_per_second")
    projected = None
    if avail is not None and age is not None and rate is not None and rate < 0:
        projected = max(int(avail + rate * age), 0)
    # What the reading showed first, at either threshold; then what it would have shown.
    for level, read in (("kill", True), ("term", True), ("kill", False), ("term", False)):
        limit, value = _int(k.get(f"{level}_bytes")), avail if read else projected
        if value is None or limit is None or value > limit:
            continue
        threshold = (level, limit, _num(k.get(f"{level}_percent")))
        facts.update(
            killer_pid=k["pid"],
            killer_threshold_bytes=limit,
            killer_threshold_signal=f"SIG{level.upper()}",
            killer_basis="memavailable read" if read else "memavailable projected",
        )
        if read:
            return who + memory_phrase(host, threshold)
        facts["memavailable_projected_bytes"] = projected
        return (
            f"{who}: MemAvailable {host['memavailable_percent']:.1f} % at a reading {age:.1f} s "
            f"before the death, falling {format_bytes(int(-rate))}/s, so about "
            f"{100.0 * projected / host['memtotal_bytes']:.1f} % by the death"
            f"{threshold_phrase(host, threshold)}"
        )
    largest = _map(_map(seen.host_memory).get("largest_other"))
    rss, other = _int(seen.rss_sampled), _int(largest.get("rss"))
    if rss is None or other is None or rss <= other:
        return None
    facts.update(killer_pid=k["pid"], killer_basis="largest process", worker_largest_process=True)
    name = largest.get("name")
    name = "".join(c for c in name[:64] if c.isprintable()) if isinstance(name, str) else "?"
    pct = host.get("memavailable_percent")
    at = (
        f"; MemAvailable {pct:.1f} % at a reading {age:.1f} s before the death"
        if (pct is not None and age is not None)
        else ""
    )
    return (
        f"{who}: the worker was the host's largest process (RSS {format_bytes(rss)} at its "
        f"last sample; the next, {name} pid {_int(largest.get('pid'))}, "
        f"{format_bytes(other)}), the one {k['name']} kills{at}"
    )


def memory_phrase(host: Mapping[str, Any], threshold: Threshold | None) -> str:
    """ " at MemAvailable 4.1 % (at or below its SIGTERM threshold 5.0 %)", from the last
    reading."""
    pct = host.get("memavailable_percent")
    if pct is None:
        return ""
    return f" at MemAvailable {pct:.1f} %{threshold_phrase(host, threshold)}"


def threshold_phrase(host: Mapping[str, Any], threshold: Threshold | None) -> str:
    """ " (at or below its SIGTERM threshold 5.0 %)"; "" without a threshold."""
    if threshold is None:
        return ""
    level, limit, percent = threshold
    total = host.get("memtotal_bytes")
    if percent is None and total:
        percent = 100.0 * limit / total
    shown = f"{percent:.1f} %" if percent is not None else format_bytes(limit)
    return f" (at or below its SIG{level.upper()} threshold {shown})"
