"""Issue 28, item 12: a task key, pipeline name or title holding ESC sequences reaches the
terminal escaped (`\\x1b`) from `oomguard report` and `oomguard fingerprint`, and as itself
in --json (which JSON escapes)."""

from __future__ import annotations

import json
import re
import time

import pytest

from _cli_run import report
from oomguard import FailureEvent
from oomguard._cli import main
from oomguard._cli.terminal import printable
from oomguard._store import FailureStore

KEY = "\x1b]0;pwned\x07\x1b[2J"  # set the terminal's title, clear the screen
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # a control character but tab, newline


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    path = tmp_path_factory.mktemp("escapes") / "history.sqlite3"
    store = FailureStore(str(path))
    store.start()
    store.add(
        FailureEvent(
            "infra",
            "oom_kill",
            f"('load', '{KEY}')",
            f"etl{KEY}",
            "tcp://node-a:4000",
            "node-a",
            "sig-esc",
            f"MemoryError in load{KEY}",
            {"summary": f"killed{KEY}"},
            time=time.time() - 60,
        ),
        example=f"Traceback{KEY}",
    )
    assert store.flush(), store.last_error
    store.close()
    return path


def test_printable_escapes_controls_and_keeps_tab_and_newline():
    assert printable(f"a\tb\nc{KEY}\r\x9b\u202e") == f"a\tb\nc{SHOWN}\\x0d\\x9b\\u202e"
    assert printable("('load', 7) ← run") == "('load', 7) ← run"


def test_the_report_shows_a_hostile_key_escaped(capsys, history):
    rc, out, err = report(capsys, "--store", history)
    assert rc == 0, err
    assert not RAW.search(out), repr(out)
    assert SHOWN in out and f"etl{SHOWN}" in out


def test_json_shows_the_key_as_the_store_keeps_it(capsys, history):
    """Since issue 39 names are made safe where they enter the store: the key is kept with
    its control characters written as escapes, and a query by the key itself finds it."""
    rc, out, err = report(capsys, "--store", history, "--events", "--json")
    assert rc == 0, err
    (event,) = json.loads(out)["events"]
    assert event["shard"] == f"('load', '{SHOWN}')" and event["pipeline"] == f"etl{SHOWN}"
    assert not RAW.search(event["shard"] + event["pipeline"] + event["signature_title"])
    rc, out, err = report(  # the name as given finds it: the filter is made safe alike
        capsys, "--store", history, "--json", "--pipeline", f"etl{KEY}", "--events"
    )
    assert rc == 0 and len(json.loads(out)["events"]) == 1, err


def test_a_mistyped_name_lists_the_known_ones_escaped(capsys, history):
    rc, out, err = report(capsys, "--store", history, "--pipeline", "etl")
    assert rc == 3
    assert not RAW.search(err) and repr(f"etl{SHOWN}") in err, err


def test_fingerprint_shows_a_hostile_path_escaped(capsys, tmp_path):
    path = tmp_path / f"trace{KEY}.txt"
    path.write_text('Traceback (most recent call last):\n  File "a.py", line 1\nKeyError: 1\n')
    assert main(["fingerprint", str(path)]) == 0
    out = capsys.readouterr().out
    assert not RAW.search(out) and f"trace{SHOWN}.txt" in out, repr(out)


def test_an_escaped_key_keeps_its_table_aligned():
    from oomguard._cli.layout import table

    rows = [[f"('a', '{KEY}')", 1], ["x", 22]]
    header, hostile, plain = table(["SHARD", "N"], rows, right=frozenset({1}))
    assert SHOWN in hostile and not RAW.search(hostile)
    assert len(header) == len(hostile) == len(plain)  # the widths count what is shown
