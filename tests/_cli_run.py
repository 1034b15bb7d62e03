"""Run the `oomguard` command in the test's own process."""

from __future__ import annotations

from oomguard._cli import main


def report(capsys, *argv):
    """(exit status, stdout, stderr) of `oomguard report ...`, run in this process."""
    try:
        rc = main(["report", *map(str, argv)])
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err
