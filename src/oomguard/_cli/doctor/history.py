"""`oomguard doctor`'s history check: where a scheduler started here keeps its failure
history, whether it outlives the scheduler, and the command that reads it back."""

from __future__ import annotations

from .check import Check
from .text import FIX


def check_history() -> Check:
    """The `oomguard.scheduler.store` setting here, else this user's default histories
    (`oomguard._store.home`: the directory is made, as a scheduler would)."""
    from ... import _config
    from ..._exceptions import ConfigError
    from ..._store import home
    from ..._urls import redact

    try:
        store = _config.scheduler_settings(only=frozenset({"store"}))["store"]
    except ConfigError as e:
        return Check("history", "no", str(e), FIX["history-setting"])
    if store:
        return Check(
            "history",
            "ok",
            f"{redact(store)} (oomguard.scheduler.store): a scheduler started here with these "
            "settings records there; `oomguard report` reads it",
        )
    directory, why_not = home.writable_dir()
    found = home.histories()
    held = f"{len(found)} cluster(s) there" if found else "none yet"
    if why_not is not None:
        return Check(
            "history",
            "warn",
            f"{why_not}: a scheduler started here with no oomguard.scheduler.store keeps its "
            f"history in {directory} instead, which a reboot or a cleaned /tmp removes ({held})",
            FIX["history"],
        )
    read = "`oomguard report` reads the one written last"
    if len(found) > 1:
        read += ", `oomguard report --cluster NAME` another"
    return Check(
        "history",
        "ok",
        f"{directory}: a scheduler started here with no oomguard.scheduler.store keeps one "
        f"file per cluster name there, across restarts ({held}); {read}",
    )
