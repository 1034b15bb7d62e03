"""`oomguard demo`'s progress: a bar redrawn with \\r on a terminal, plain lines elsewhere
(issue 27: piped to a log, the bar made one 2,000-character line); finished, failed and
aborted shards counted apart (issue 41: "30/30 shards done" when 8 were aborted)."""

from __future__ import annotations

import io
import os
import select

from oomguard._cli.demo_run import progress_bar


def _tallies(finished: int, failed: int, aborted: int):
    """The tally after each shard ends: the finished first, then the failed, the aborted."""
    tally = {"finished": 0, "failed": 0, "aborted": 0}
    for outcome, n in (("finished", finished), ("failed", failed), ("aborted", aborted)):
        for _ in range(n):
            tally[outcome] += 1
            yield dict(tally)


def test_not_a_terminal_gets_a_few_plain_lines():
    out = io.StringIO()
    for tally in _tallies(20, 2, 8):
        progress_bar(tally, 30, stream=out)
    text = out.getvalue()
    assert "\r" not in text, repr(text)
    lines = text.splitlines()
    assert 2 <= len(lines) <= 5 and all(len(line) < 80 for line in lines), lines
    assert lines[-1].strip() == "30/30 shards ended: 20 finished, 2 failed, 8 aborted", lines


def test_a_terminal_gets_the_bar_redrawn_in_place():
    master, slave = os.openpty()
    try:
        with open(slave, "w", closefd=False) as tty:
            assert tty.isatty()
            for tally in _tallies(2, 0, 1):
                progress_bar(tally, 3, stream=tty)
        text = ""
        while "\n" not in text and select.select([master], [], [], 10)[0]:
            text += os.read(master, 65536).decode()  # the tty may hand it over in parts
    finally:
        os.close(master)
        os.close(slave)
    assert text.count("\r") >= 3, repr(text)
    assert "3/3 shards: 2 finished, 0 failed, 1 aborted" in text, repr(text)
