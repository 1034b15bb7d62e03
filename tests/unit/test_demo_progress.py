"""`oomguard demo`'s progress: a bar redrawn with \\r on a terminal, plain lines elsewhere
(issue 27: piped to a log, the bar made one 2,000-character line)."""

from __future__ import annotations

import io
import os

from oomguard._cli.demo_run import progress_bar


def test_not_a_terminal_gets_a_few_plain_lines():
    out = io.StringIO()
    for done in range(1, 31):
        progress_bar(done, 30, stream=out)
    text = out.getvalue()
    assert "\r" not in text, repr(text)
    lines = text.splitlines()
    assert 2 <= len(lines) <= 5 and all(len(line) < 80 for line in lines), lines
    assert lines[-1].strip() == "30/30 shards done", lines


def test_a_terminal_gets_the_bar_redrawn_in_place():
    master, slave = os.openpty()
    try:
        with open(slave, "w", closefd=False) as tty:
            assert tty.isatty()
            for done in range(1, 4):
                progress_bar(done, 3, stream=tty)
        text = os.read(master, 65536).decode()
    finally:
        os.close(master)
        os.close(slave)
    assert text.count("\r") >= 3 and "3/3 shards" in text, repr(text)
