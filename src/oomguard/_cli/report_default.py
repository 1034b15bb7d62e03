"""Where `oomguard report` reads when it is given neither --scheduler nor --store, so that a
command oomguard suggests (`oomguard report --shard ...` in an abort message, after the demo)
works after the process that printed it is gone. In order:

1. Dask's `scheduler-address` setting (DASK_SCHEDULER_ADDRESS): that running scheduler;
2. the `oomguard.scheduler.store` setting of this host: the store a scheduler started
   here with the same settings writes;
3. this user's default histories on this host (`oomguard._store.home`: one file per cluster
   name, where a scheduler with no `store` setting keeps its history): with --cluster NAME,
   that cluster's; else the one written last, and a note on stderr names it and the others.
"""

from __future__ import annotations

import os

from .._display import one_line
from .._exceptions import ReportFailed


def store_to_read(cluster: str | None) -> tuple[str, str]:
    """(the store to read, the note on stderr that says which) when neither --scheduler nor
    the scheduler-address setting names a scheduler: steps 2 and 3 above."""
    from .. import _config
    from .._urls import redact

    try:
        configured = _config.scheduler_settings(only=frozenset({"store"}))["store"]
    except Exception as e:  # ConfigError: a bad setting here
        raise ReportFailed(f"cannot read oomguard.scheduler.store here: {one_line(e)}") from e
    if configured:
        return configured, f"reading {redact(configured)} (oomguard.scheduler.store here)"
    return default_history(cluster)


def _home(path: str) -> str:
    """`path` with this user's home written as ~ (as a person types it)."""
    home = os.path.expanduser("~")
    return "~" + path[len(home) :] if home != "/" and path.startswith(home + os.sep) else path


def default_history(cluster: str | None) -> tuple[str, str]:
    """(the default history file to read, the note that says which) for --cluster
    `cluster` (None: the one written last). ReportFailed when there is none; LookupError
    when `cluster` has none (exit 3, as for a name that names nothing in a history)."""
    from .._client.filters import unknown_name
    from .._store import home

    found = home.histories()
    if not found:
        raise ReportFailed(
            f"no failure history on this host (none in {_home(home.state_dir())}, where a "
            "scheduler with no oomguard.scheduler.store setting keeps it): give --scheduler "
            "ADDRESS or --store PATH (or set DASK_SCHEDULER_ADDRESS)"
        )
    names = [h.cluster for h in found]
    if cluster is not None:
        chosen = next((h for h in found if h.cluster == cluster), None)
        if chosen is None:
            line = unknown_name("--cluster", cluster, "cluster", names).replace("=", " ", 1)
            raise LookupError(line.replace("in the history", "with a history on this host"))
        return chosen.path, f"reading the history of cluster {cluster!r} in {_home(chosen.path)}"
    chosen = found[0]
    note = f"reading the history of cluster {chosen.cluster!r} in {_home(chosen.path)}"
    if len(found) > 1:
        others = ", ".join(repr(n) for n in names[1:6])
        more = f" and {len(names) - 6} more" if len(names) > 6 else ""
        note += (
            f", the last written of {len(found)} on this host; the others: {others}{more} "
            "(--cluster NAME reads one)"
        )
    return chosen.path, note
