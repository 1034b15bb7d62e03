"""Private directories and the files oomguard keeps in them, safe on a shared host.

The crash dir (`$TMPDIR/oomguard-<uid>`) and the memory ledger's directory have names anyone
can predict: another user may create one first, world-writable, with symlinks in it that
point at the victim's own files. So a directory is used only when, after creating it,
`lstat` shows a real directory (not a symlink) owned by this user that no group or other
user can write; otherwise it is refused with one WARNING naming it and why, and a fresh
private one is used instead (`$XDG_RUNTIME_DIR/oomguard` where that is private, else
`tempfile.mkdtemp`). Files in them are opened with `O_NOFOLLOW | O_CLOEXEC`, created with
`O_EXCL` and mode 0600, and read only when regular, owned by this user, and within a size.
Knows nothing of Dask.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
import tempfile
import threading
import time

logger = logging.getLogger("oomguard")

#: Opened with every file in a private directory: never through a symlink, never inherited.
SAFE = os.O_NOFOLLOW | os.O_CLOEXEC
#: The per-process files in the crash dir, by name: `<pid>.crash` and `<pid>.flight`.
PER_PID = re.compile(r"^([1-9][0-9]{0,9})\.(crash|flight)$")
#: A dead process's files are left alone this long after they last changed: its nanny may
#: be reading them now, or the process may run in another PID namespace (a container that
#: shares the directory), where its PID means nothing here.
STALE_AFTER = 300.0

_lock = threading.Lock()
_replaced: dict[str, str] = {}  # refused directory -> the private one used instead


def why_not_private(path: str) -> str | None:
    """Why `path` is not a private directory of this user (None: it is one)."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"cannot be examined ({e.strerror or e})"
    if stat.S_ISLNK(st.st_mode):
        return "it is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_uid != os.geteuid():
        return f"it is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"it is writable by its group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def private_dir(path: str, what: str = "directory") -> str:
    """`path`, created (mode 0700) where missing, when it is private to this user; else a
    fresh private directory, the same one for every refusal of `path` in this process,
    with one WARNING naming `path` and why it was refused."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError:
        pass  # a symlink to nowhere, a file in the way: lstat below says which
    why = why_not_private(path)
    if why is None:
        return path
    with _lock:
        instead = _replaced.get(path)
        if instead is not None and why_not_private(instead) is None:
            return instead
        instead = _fresh()
        _replaced[path] = instead
    logger.warning(
        "oomguard: not using %s %s: %s (another user may have made it, to redirect "
        "oomguard's files); using the private directory %s instead",
        what,
        path,
        why,
        instead,
    )
    return instead


def _fresh() -> str:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime) and why_not_private(runtime) is None:
        path = os.path.join(runtime, "oomguard")
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            path = ""
        if path and why_not_private(path) is None:
            return path
    return tempfile.mkdtemp(prefix=f"oomguard-{os.geteuid()}-")


def create(path: str, flags: int = os.O_RDWR) -> int:
    """A new file at `path` (mode 0600), after removing one left there: never a file
    someone else put there, nor through a symlink."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return os.open(path, flags | os.O_CREAT | os.O_EXCL | SAFE, 0o600)


def open_regular(path: str, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """A descriptor on `path`, refused (OSError) unless it is a regular file of this user:
    no symlink followed, a FIFO never waited for, a device never read."""
    fd = os.open(path, flags | SAFE | os.O_NONBLOCK, mode)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        if st.st_uid != os.geteuid():
            raise OSError(errno.EPERM, f"owned by uid {st.st_uid}, not by this user", path)
        if flags & os.O_NONBLOCK == 0:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_at_most(fd: int, limit: int, offset: int = 0) -> bytes:
    """Up to `limit` bytes from `offset` (fewer only at the end of the file)."""
    chunks: list[bytes] = []
    got = 0
    while got < limit:
        chunk = os.pread(fd, min(limit - got, 1 << 20), offset + got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_regular(path: str, limit: int) -> bytes:
    """At most `limit` bytes of a regular file of this user (`open_regular`)."""
    fd = open_regular(path)
    try:
        return read_at_most(fd, limit)
    finally:
        os.close(fd)


def pid_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # EPERM: it runs, as another user
    return True


def remove_stale(directory: str, now: float | None = None) -> list[str]:
    """Remove the `<pid>.crash` and `<pid>.flight` files in `directory` of processes that
    no longer run, owned by this user and untouched for `STALE_AFTER` seconds; returns the
    names removed. Never raises."""
    now = time.time() if now is None else now
    uid = os.geteuid()
    found: dict[int, list[tuple[str, os.stat_result]]] = {}
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                match = PER_PID.match(entry.name)
                if match is None:
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if st.st_uid == uid and (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                    found.setdefault(int(match.group(1)), []).append((entry.name, st))
    except OSError:
        return []
    removed = []
    for pid, files in found.items():
        if pid_runs(pid) or max(st.st_mtime for _, st in files) > now - STALE_AFTER:
            continue
        for name, _ in files:
            try:
                os.unlink(os.path.join(directory, name))
                removed.append(name)
            except OSError:
                pass
    return sorted(removed)
