"""Path rules: reduce a frame's file to the module path that is the same on every machine.

Each rule is a small pure function `(path) -> reduced path or None` (None: rule does not
apply); `normalise_path` tries them in order. `path_origin` tells where a file came from,
which decides whether its frame is in-app.
"""

from __future__ import annotations

import re
import sys
from functools import lru_cache

# Top-level packages whose frames are Dask's or Python's machinery, never the user's crash.
PLUMBING = frozenset(
    {
        "dask",
        "distributed",
        "tornado",
        "asyncio",
        "cloudpickle",
        "concurrent",
        "threading",
        "toolz",
        "tlz",
        "multiprocessing",
        "selectors",
        "runpy",
    }
)
# Directory names that are never a package of the user's code (an unknown root's top levels).
_ROOTISH = frozenset(
    {
        "",
        "tmp",
        "usr",
        "opt",
        "srv",
        "var",
        "app",
        "mnt",
        "home",
        "Users",
        "root",
        "work",
        "workspace",
        "data",
        "code",
        "lib",
        "lib64",
        "bin",
        "local",
        "share",
        "site",
    }
)
_STDLIB_DIR = re.compile(
    r"/(?:lib|Lib)/(?:python\d+(?:\.\d+)?t?|pypy\d*(?:\.\d+)?)/|^(?:[A-Za-z]:)?/.*?/Lib/"
)
# Standard library top-level modules (Python 3.10+ knows the list itself).
_STDLIB_NAMES = frozenset(sys.stdlib_module_names)
_IDENTIFIER = re.compile(r"^[A-Za-z_]\w*$")


# A `<string>`, `<dynamic-code>` or `<frozen ...>` pseudo-file has no path to reduce: keep it.
def _keep_pseudo(path: str) -> str | None:
    return path if path.startswith("<") and path.endswith(">") else None


# An installed package keeps what follows its site-packages / dist-packages directory.
def _below_site_packages(path: str) -> str | None:
    i = max(path.rfind("/site-packages/"), path.rfind("/dist-packages/"))
    return path[path.index("-packages/", i) + len("-packages/") :] if i >= 0 else None


# The standard library keeps what follows lib/pythonX.Y/ (and its lib-dynload/ directory).
def _below_stdlib(path: str) -> str | None:
    last = None
    for last in _STDLIB_DIR.finditer(path):  # noqa: B007 (the last match)
        pass
    if last is None:
        return None
    rest = path[last.end() :]
    return rest[len("lib-dynload/") :] if rest.startswith("lib-dynload/") else rest


# A src-layout project keeps what follows its last src/ directory (`proj/src/pkg/mod.py`).
def _below_src(path: str) -> str | None:
    i = path.rfind("/src/")
    return path[i + len("/src/") :] if i >= 0 else None


# A relative path is already relative to the project: drop leading ./ and ../ only.
def _relative(path: str) -> str | None:
    if path.startswith("/"):
        return None
    while path.startswith(("./", "../")):
        path = path[path.index("/") + 1 :]
    return path


# Elsewhere keep `package/module.py`: the parent directory and the file, the shortest suffix
# that stays the same wherever the package is installed; a home or scratch parent is dropped.
def _package_and_module(path: str) -> str:
    parts = path.split("/")
    if (
        len(parts) >= 3
        and parts[-2]
        and _IDENTIFIER.match(parts[-2])
        and parts[-2] not in _ROOTISH
    ):
        # /home/<user>/x.py: the user's name is no package.
        if not (len(parts) == 4 and parts[1] in ("home", "Users")):
            return "/".join(parts[-2:])
    return parts[-1]


_RULES = (
    (_keep_pseudo, "pseudo"),
    (_below_site_packages, "site"),
    (_below_stdlib, "stdlib"),
    (_below_src, "src"),
    (_relative, "relative"),
)


@lru_cache(maxsize=8192)
def path_origin(path: str) -> tuple[str, str]:
    """(normalised path, origin) where origin is pseudo|site|stdlib|src|relative|other."""
    if not path.startswith("<"):
        # Windows paths: forward slashes, no drive letter.
        path = path.replace("\\", "/")
        if len(path) > 1 and path[1] == ":":
            path = path[2:]
    for rule, origin in _RULES:
        reduced = rule(path)
        if reduced is not None:
            if origin == "pseudo" and path.startswith("<frozen "):
                origin = "stdlib"
            return reduced, origin
    return _package_and_module(path), "other"


def normalise_path(path: str) -> str:
    """Reduce a frame's file path to its module path, the same on every host.

    >>> normalise_path("/home/u/proj/src/shardapp/core.py")
    'shardapp/core.py'
    >>> normalise_path("/opt/conda/lib/python3.11/site-packages/distributed/worker.py")
    'distributed/worker.py'
    >>> normalise_path("<dynamic-code>")
    '<dynamic-code>'
    """
    return path_origin(path)[0]


@lru_cache(maxsize=8192)
def is_in_app(path: str) -> bool:
    """True unless the raw `path` is the standard library or Dask/async plumbing."""
    reduced, origin = path_origin(path)
    if origin == "stdlib":
        return False
    if origin == "pseudo":
        return True
    top = reduced.split("/", 1)[0]
    top = top[:-3] if top.endswith(".py") else top
    if top in PLUMBING:
        return False
    # A reduced path (a scrubbed trace, a relative one) still names the stdlib by its module.
    return origin == "site" or top not in _STDLIB_NAMES
