"""What one death may cost the store (pure): its evidence is capped in bytes.

A report's evidence is up to 96 keys of up to 1,024 characters each (~100 KiB as JSON),
and each event of the death carries it. It is measured once per death, here: over the cap,
the longest values a report supplied are shortened (longest first) until it fits, and
`evidence_trimmed` names how many were. The keys oomguard writes itself (its summary, the
blame, the source) are kept whole.
"""

from __future__ import annotations

import json
from typing import Any

#: The most bytes (as compact JSON) one death's evidence may take.
EVIDENCE_BYTES = 16 * 1024
#: A shortened value keeps this many characters, and says it was shortened.
KEPT_CHARS = 120
_KEEP = frozenset({"source", "blame", "summary", "killer_summary"})

_encode = json.JSONEncoder(separators=(",", ":")).encode


def evidence_size(evidence: dict[str, Any]) -> int:
    return len(_encode(evidence).encode())


def cap_evidence(evidence: dict[str, Any], limit: int = EVIDENCE_BYTES) -> dict[str, Any]:
    """`evidence`, shortened in place to fit `limit` bytes of JSON where it does not.

    >>> ev = {"summary": "x", **{f"k{i}": "y" * 1000 for i in range(40)}}
    >>> evidence_size(cap_evidence(ev)) <= EVIDENCE_BYTES, ev["evidence_trimmed"] > 0
    (True, True)
    >>> cap_evidence({"summary": "short"})
    {'summary': 'short'}
    """
    size = evidence_size(evidence)
    if size <= limit:
        return evidence
    longest = sorted(
        (k for k, v in evidence.items() if k not in _KEEP and isinstance(v, str)),
        key=lambda k: -len(evidence[k]),
    )
    trimmed = 0
    margin = 64  # room for `evidence_trimmed` itself
    for k in longest:
        if size + margin <= limit:
            break
        value = evidence[k]
        if len(value) <= KEPT_CHARS:
            break
        short = f"{value[:KEPT_CHARS]}... ({len(value)} chars)"
        size -= len(_encode(value).encode()) - len(_encode(short).encode())
        evidence[k] = short
        trimmed += 1
    # Still over (many short values): drop the report's keys, last first.
    for k in [k for k in reversed(list(evidence)) if k not in _KEEP]:
        if size + margin <= limit:
            break
        size -= len(_encode({k: evidence.pop(k)}).encode()) - 1
        trimmed += 1
    evidence["evidence_trimmed"] = trimmed
    return evidence
