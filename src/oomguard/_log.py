"""oomguard's log lines where Dask's go.

`dask scheduler` and `dask worker` give the "distributed" logger its own handler (the
format in `distributed.admin.log-format`) and stop it propagating; a logger nobody set up,
like "oomguard", would reach only Python's last-resort handler: warnings without level or
time, and no INFO lines at all. So, unless the application configured logging itself (a
handler on the root logger, or on "oomguard"), "oomguard" gets Dask's handlers at INFO.
"""

from __future__ import annotations

import logging
import os
import sys


def follow_dask_logging() -> None:
    """Give the "oomguard" logger Dask's handlers, once, unless someone configured logging."""
    ours, dask = logging.getLogger("oomguard"), logging.getLogger("distributed")
    configured = ours.handlers or ours.level != logging.NOTSET or logging.getLogger().handlers
    if configured or not dask.handlers:
        return
    for handler in dask.handlers:
        ours.addHandler(handler)
    ours.setLevel(logging.INFO)
    ours.propagate = dask.propagate


def stop_cli(what: str, error: Exception) -> None:
    """Under Dask's own command line (`dask scheduler`, `dask worker`), a bad oomguard
    setting ends the process here with one line and exit status 2: raised instead, it
    would become a long traceback, or (for a nanny) be logged and ignored while the worker
    runs unguarded. Elsewhere (a cluster in the user's process) this returns, and the
    caller raises."""
    program = os.path.basename(sys.argv[0] if sys.argv else "")
    if program not in ("dask", f"dask-{what}", f"dask_{what}.py"):
        return
    logging.getLogger("oomguard").critical("oomguard: %s The %s does not start.", error, what)
    for handler in logging.getLogger("oomguard").handlers + logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(2)
