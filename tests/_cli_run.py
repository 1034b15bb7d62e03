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


def suggested_commands(text: str) -> list[str]:
    """Every `oomguard ...` command a text suggests: between backticks (an abort message,
    its lines joined again where a paragraph was wrapped), or on a line of its own."""
    import re

    joined = " ".join(text.split())
    found = re.findall(r"`(oomguard [^`]+)`", joined)
    command = re.compile(r"oomguard (demo|report|fingerprint|doctor)( |$)")
    found += [line.strip() for line in text.splitlines() if command.match(line.strip())]
    return list(dict.fromkeys(found))
