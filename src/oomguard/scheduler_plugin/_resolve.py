"""Signature states for clients: a person's resolve (the `RESOLVE_HANDLER` RPC, for
`Failures.resolve` and `oomguard report --resolve`), and the states of this cluster's
signatures read with a PostgreSQL history (`fleet_states`).

With a PostgreSQL history a signature and its state are the fleet's (docs/history.md): the
resolve goes to the history, with this scheduler's role, and this cluster's own signature
reads (answered from its spool) take their states from the history."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from .._urls import error_line

if TYPE_CHECKING:
    from .._models import SignatureRow
    from .._store import FailureStore

logger = logging.getLogger("oomguard.scheduler")

#: What a refused resolve says it was (the client raises KeyError, PermissionError,
#: ValueError or OSError).
REFUSALS = ("unknown", "permission", "invalid", "unavailable")
#: The state fields a spool's row takes from the history's.
_STATE = (
    "state",
    "resolved_at",
    "resolved_by",
    "resolve_note",
    "regressed_at",
    "regressions",
    "last_hour",
    "hourly",
    "aliases",
)


async def resolve(store: FailureStore, request: dict[str, Any]) -> dict[str, Any]:
    """Resolve `request["signature_id"]` with its `note`, by `by` (what the client says of
    its user), in the store or its history: {"signature": row, "changed": bool}, or
    {"refused": one of REFUSALS, "message": a sentence} (a refusal is the caller's: raised
    here, Dask would log a traceback in the scheduler's log)."""
    for name in ("signature_id", "note", "by"):
        if not isinstance(request.get(name, ""), str):
            return _refused("invalid", f"{name}: expected text")
    signature_id = request.get("signature_id", "")
    if not signature_id:
        return _refused("invalid", "signature_id: give the id of a signature")
    history = store.history
    target: Any = store if history is None else history.reader
    try:
        await asyncio.to_thread(store.flush)
        if history is not None and history.shipper.up:
            await asyncio.to_thread(history.shipper.sync, 2.0)  # this cluster's own newest
        row, changed = await asyncio.to_thread(
            target.resolve, signature_id, note=request.get("note", ""), by=request.get("by", "")
        )
    except KeyError as e:
        return _refused("unknown", e.args[0] if e.args else str(e))
    except PermissionError as e:
        return _refused("permission", str(e))
    except Exception as e:  # the history away, a file that cannot be written
        where = getattr(target, "path", "the store")
        logger.warning("oomguard: resolving signature %r failed: %s", signature_id, e)
        line = error_line(e, history.url if history is not None else "")
        return _refused("unavailable", f"cannot resolve in {where}: {line}")
    return {"signature": row.to_dict() if row is not None else None, "changed": changed}


def _refused(kind: str, message: str) -> dict[str, Any]:
    return {"refused": kind, "message": message}


def fleet_states(store: FailureStore, rows: list[SignatureRow]) -> list[SignatureRow]:
    """`rows` of this cluster's spool with the states the PostgreSQL history has for them
    (the fleet's resolves and rates), one bounded read; as they are with no history, or
    with the history away. Blocking: run it in a thread."""
    history = store.history
    if history is None or not rows or not history.shipper.up:
        return rows
    try:
        fleet = {r.id: r for r in history.reader.states(rows)}
    except Exception as e:  # away since: this scheduler's own view
        logger.info("oomguard: the history is away (%s); local signature states", e)
        return rows
    return [
        dataclasses.replace(r, **{f: getattr(fleet[r.id], f) for f in _STATE})
        if r.id in fleet
        else r
        for r in rows
    ]


def regressions(store: FailureStore) -> int:
    """The signatures this scheduler found regressed: its store's writer, and with a
    PostgreSQL history (where the fleet's resolves are) its shipper."""
    n = store.regressions
    if store.history is not None:
        shipper = store.history.shipper
        n += shipper.regressions + shipper.deaths.regressions + shipper.aliases.regressions
    return n
