"""Where the failure history lives when no `oomguard.scheduler.store` is set: one SQLite
file per cluster name in a per-user state directory, so that a scheduler restarted with the
same cluster name continues its history, and `oomguard report` on the same host finds it.

The directory: `$XDG_STATE_HOME/oomguard` (an absolute XDG_STATE_HOME, as the XDG base
directory spec says), else `~/.local/state/oomguard` (root's is /root/.local/state/oomguard).
Where that cannot be made or written (a read-only or missing home, as for `nobody`), the
history goes to `<tempdir>/oomguard-<uid>/history` instead, which outlives the scheduler but
not a reboot or a cleaned /tmp; the scheduler says so in one WARNING. A container's home is
the container's own filesystem: its history lasts as long as the container (set a `store` on
a volume there, docs/configuration.md).

A file is named after its cluster, `<name>.sqlite3`, with any character other than letters,
digits and `-_.:@+,=~` written as %XX (so `etl/nightly` is `etl%2Fnightly.sqlite3`); the
spool of a PostgreSQL history sits in the `spool/` folder beside them, named alike.
Knows nothing of Dask.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from .. import _private

SUFFIX = ".sqlite3"
_SAFE = "-_.:@+,=~"  # kept as they are in a file name (letters and digits always are)
_MAX_NAME = 200  # bytes of a file name before the suffix; most file systems take 255


def state_dir(environ: Mapping[str, str] = os.environ) -> str:
    """The per-user directory of default histories (made or not).

    >>> state_dir({"XDG_STATE_HOME": "/srv/state", "HOME": "/home/ada"})
    '/srv/state/oomguard'
    >>> state_dir({"XDG_STATE_HOME": "relative/ignored", "HOME": "/home/ada"})
    '/home/ada/.local/state/oomguard'
    """
    xdg = environ.get("XDG_STATE_HOME", "")
    if os.path.isabs(xdg):
        return os.path.join(xdg, "oomguard")
    home = environ.get("HOME") or os.path.expanduser("~")
    return os.path.join(home, ".local", "state", "oomguard")


def fallback_dir() -> str:
    """Where the histories go when `state_dir` cannot be written."""
    return os.path.join(tempfile.gettempdir(), f"oomguard-{os.geteuid()}", "history")


def file_name(cluster: str) -> str:
    """The history file of `cluster` in a directory of default histories.

    >>> file_name("node-3:8786"), file_name("etl/nightly"), file_name("..")
    ('node-3:8786.sqlite3', 'etl%2Fnightly.sqlite3', '%2E..sqlite3')
    """
    name = urllib.parse.quote(cluster, safe=_SAFE)
    if name.startswith("."):  # never hidden, never "." or ".."
        name = "%2E" + name[1:]
    if len(name) > _MAX_NAME:  # a long name: its start and a digest of the whole
        digest = hashlib.sha256(cluster.encode()).hexdigest()[:16]
        cut = name[: _MAX_NAME - 17]
        pct = cut.find("%", len(cut) - 2)  # never half a %XX
        name = f"{cut[:pct] if pct >= 0 else cut}~{digest}"
    return name + SUFFIX


def cluster_of(file: str) -> str:
    """The cluster a default history file is named after (`file_name` read back).

    >>> cluster_of("/x/etl%2Fnightly.sqlite3")
    'etl/nightly'
    """
    return urllib.parse.unquote(os.path.basename(file).removesuffix(SUFFIX))


def history_path(directory: str, cluster: str) -> str:
    return os.path.join(directory, file_name(cluster))


def spool_path(directory: str, cluster: str) -> str:
    return os.path.join(directory, "spool", file_name(cluster))


def _unusable(path: str) -> str | None:
    """Why `path` cannot hold this user's histories (made, mode 0700, where missing)."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as e:
        return f"it cannot be made ({e.strerror or e})"
    if not os.path.isdir(path):
        return "it is not a directory"
    if os.stat(path).st_uid != os.geteuid():
        return "it belongs to another user"
    if not os.access(path, os.W_OK | os.X_OK):
        return "it is not writable"
    return None


def writable_dir(environ: Mapping[str, str] = os.environ) -> tuple[str, str | None]:
    """(the directory the scheduler keeps its default history in, made; why `state_dir`
    was not used, or None). Blocking file I/O."""
    wanted = state_dir(environ)
    why = _unusable(wanted)
    if why is None:
        return wanted, None
    # A predictable name in /tmp: used only when private to this user (_private).
    return _private.private_dir(fallback_dir(), "history directory"), f"{wanted}: {why}"


@dataclass(frozen=True)
class History:
    """A default history file on this host: its cluster, its path, when it was last written."""

    cluster: str
    path: str
    written: float


def histories(environ: Mapping[str, str] = os.environ) -> list[History]:
    """The default history files of this user on this host, the most recently written
    first (reads only: nothing is made)."""
    found = {}
    for directory in (state_dir(environ), fallback_dir()):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            path = os.path.join(directory, name)
            if not name.endswith(SUFFIX) or not os.path.isfile(path):
                continue
            try:  # in WAL mode a commit changes the -wal file, the main file at checkpoints
                written = max(
                    os.path.getmtime(p) for p in (path, path + "-wal") if os.path.exists(p)
                )
            except (OSError, ValueError):  # removed meanwhile
                continue
            cluster = cluster_of(name)
            if cluster not in found or found[cluster].written < written:
                found[cluster] = History(cluster, path, written)
    return sorted(found.values(), key=lambda h: -h.written)
