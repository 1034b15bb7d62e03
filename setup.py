"""The native part of oomguard: the signal recorder (src/oomguard/_host/_sigrec.c).

Everything else is declared in pyproject.toml. Linux only (SA_SIGINFO and /proc), and
optional: where it cannot be compiled the package installs without it, and a worker's
death report says "signal senders: not recorded" (docs/configuration.md). Built with
Python 3.11's stable ABI, so one wheel per platform serves every later Python.
"""

import sys

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "oomguard._host._sigrec",
            ["src/oomguard/_host/_sigrec.c"],
            optional=True,
            py_limited_api=True,
        )
    ]
    if sys.platform.startswith("linux")
    else [],
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
