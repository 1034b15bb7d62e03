"""Grouping versions: which rules make a signature's id, and the older rules still computed
beside them so that an upgrade keeps history together (issue 40).

A `Grouping` is one version of the rules: its number and its three ways in (a trace's text,
an erred Dask task's texts, a recorded stack). `CURRENT` signs; each of `PREVIOUS` signs
the same input too, and where its id differs, the signature carries it in `previous_ids`
((id, version), newest first). The store then records that old id as an alias of the new
one: the old id still finds the signature, and the old deaths count in it
(`oomguard._store.aliases`). This is how Sentry moves a project to new grouping rules: for
a while every event is hashed with both.

When to bump GROUPING_VERSION (`_records.py`): whenever a change of the rules can change
the id of a trace that already had one: what is parsed, a normalisation rule, which frames
are hashed, the error key, the digest. Not for a change of the title, the message or the
frames shown, which are not hashed. With the bump, keep the old version's rules as a
`Grouping` in PREVIOUS for at least one release, so that crashes seen again after the
upgrade link their old ids; drop it once the fleet runs the new release. A crash never
seen again keeps its old id and its old row.

Version 1 (before traces were stripped of their transport) is not kept: no history of a
fleet predates version 2.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ._records import GROUPING_VERSION, Signature


@dataclass(frozen=True)
class Grouping:
    """One version of the grouping rules. Each function never raises (see
    `oomguard._signature.fingerprint` and friends)."""

    version: int
    fingerprint: Callable[[str | bytes], Signature]
    fingerprint_dask: Callable[[str, str], Signature]
    fingerprint_stack: Callable[[str, Sequence[tuple[str, int | None, str]]], Signature]


def _shipped() -> Grouping:
    from . import _parse

    return Grouping(GROUPING_VERSION, _parse.parse_any, _parse.parse_dask, _parse.stack_signature)


#: The rules that sign (set once at import; `use` in tests).
CURRENT: Grouping = _shipped()
#: Older rules still computed beside CURRENT, newest first. Empty: see the module docstring.
PREVIOUS: tuple[Grouping, ...] = ()


def sign(how: str, *args: Any) -> Signature:
    """The signature CURRENT gives (`how`: "fingerprint", "fingerprint_dask" or
    "fingerprint_stack"), with the ids PREVIOUS give the same input where they differ."""
    sig = getattr(CURRENT, how)(*args)
    if not PREVIOUS:
        return sig
    older = []
    for grouping in PREVIOUS:
        try:
            old = getattr(grouping, how)(*args)
        except Exception:  # an old rule never stops the new one
            continue
        if old.id != sig.id and old.grouping_version < sig.grouping_version:
            older.append((old.id, old.grouping_version))
    return dataclasses.replace(sig, previous_ids=tuple(older)) if older else sig


@contextlib.contextmanager
def use(current: Grouping, previous: Sequence[Grouping] = ()) -> Iterator[None]:
    """Sign with `current`, and `previous` beside it, inside the block (tests: a second
    version of the rules). Callers that cache signatures (`oomguard._decide.signatures`)
    must drop their caches around it.

    >>> with use(Grouping(3, ...), [CURRENT]):              # doctest: +SKIP
    ...     fingerprint(trace).previous_ids
    (('6d4c109d5cf8c83f', 2),)
    """
    global CURRENT, PREVIOUS
    saved = CURRENT, PREVIOUS
    CURRENT, PREVIOUS = current, tuple(previous)
    try:
        yield
    finally:
        CURRENT, PREVIOUS = saved
