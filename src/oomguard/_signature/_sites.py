"""Where a crash happened, as keys two signatures can share (`crash_sites`).

Two signatures differ when their stacks differ: the same native crash reached from two
Python callers is two signatures, and rightly so. What they share is the crash site, and
signatures that share one are related (`SignatureRow.related`). A site is the error and one
frame, never hashed into the id (a rule change here regroups nothing):

- the innermost in-app frame: the same error in the same function of the application,
  whoever called it (two tasks crashing in one shared helper);
- for a native crash (a faulthandler dump), also the innermost frame of the crashing
  thread, in-app or not: the Python function that called into native code
  (`ctypes.string_at`, a library's reader), whichever application function called it.

A stack sampled before an OOM kill has no native site: its innermost frame is where the
sampler happened to find the thread, not where memory ran out. A signature made of a task's
name alone (no stack) or of text that is no trace has no site.
"""

from __future__ import annotations

from ._records import FAULTHANDLER, Signature

#: The pseudo-file of a signature made of a task's name alone (no stack).
_NO_STACK = "<task>"
#: Characters of a site kept: a frame's path and function come from a crash dump.
SITE_MAX = 512


def crash_sites(sig: Signature) -> tuple[str, ...]:
    """The crash sites of `sig` (at most two), e.g. ``("SIGSEGV in ctypes.string_at",
    "SIGSEGV in shardapp.core.parse_record")``.

    >>> from oomguard._signature import fingerprint_stack
    >>> crash_sites(fingerprint_stack("oom_kill", [("/srv/shardapp/core.py", 30, "load"),
    ...                                            ("/srv/shardapp/core.py", 12, "explode")]))
    ('oom_kill in shardapp.core.explode',)
    """
    if not sig.frames or sig.frames[-1].filename == _NO_STACK or not sig.error:
        return ()
    sites = []
    if sig.frames[-1].in_app:
        sites.append(_site(sig.error, sig.frames[-1].dotted))
    top = sig.top
    if sig.input_kind == FAULTHANDLER and top is not None and top.dotted:
        sites.append(_site(sig.error, top.dotted))
    return tuple(sorted(set(sites)))


def _site(error: str, where: str) -> str:
    return f"{error} in {where}"[:SITE_MAX]
