"""Small file helpers shared by the cgroup readers and `oomguard doctor`: a path inside a
filesystem root, and a read that says why it failed instead of raising."""

from __future__ import annotations

import errno
import os


def join_root(root: str, path: str) -> str:
    """`path` (absolute or not) inside the filesystem root `root`."""
    return os.path.join(root, path.lstrip("/"))


def read_text(path: str) -> tuple[str | None, str]:
    """(text, "") or (None, short reason)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(), ""
    except FileNotFoundError:
        return None, "not found"
    except PermissionError:
        return None, "permission denied"
    except OSError as e:
        return None, f"unreadable ({errno.errorcode.get(e.errno or 0, e.errno)})"
