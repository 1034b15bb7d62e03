"""`oomguard report --resolve ID [--note TEXT]` against a store file (issue 40), and what the
report shows of a signature's state and old ids: resolved with who and why, idempotent, an
unknown id named with exit 3, usage errors with exit 2, and an old id that finds the
signature it is now. (Against a running scheduler: tests/cluster/test_signature_states_live.py;
against PostgreSQL with a read-only role: tests/unit/test_history_states.py.)"""

from __future__ import annotations

import json

import pytest
from test_signature_states import T0, death, record

from _cli_run import report
from oomguard._store import FailureStore


@pytest.fixture
def history(tmp_path):
    """A store with one signature of two deaths, sig-a; and sig-b, one death, since become
    an old id of sig-a (grouping version 1 -> 2)."""
    path = tmp_path / "history.sqlite3"
    store = FailureStore(str(path), batch_interval=0.01)
    store.start()
    record(store, death(1, T0 + 1), death(2, T0 + 2), death(3, T0 + 3, "sig-b"))
    record(store, death(4, T0 + 4), aliases=[("sig-b", 1)], grouping_version=2)
    store.close()
    return path


def test_resolve_a_signature_in_a_store_file(history, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    rc, out, err = report(capsys, "--store", history, "--resolve", "sig-a", "--note", "fix 1.4")
    assert (rc, err) == (0, ""), err
    assert out.startswith("resolved signature sig-a (oom_kill in load) at ")
    assert "  note: fix 1.4\n" in out
    rc, out, err = report(capsys, "--store", history, "--resolve", "sig-b", "--json")
    assert (rc, err) == (0, "")
    doc = json.loads(out)
    assert doc["changed"] is False and doc["resolved"]["id"] == "sig-a"
    assert (doc["resolved"]["state"], doc["resolved"]["resolve_note"]) == ("resolved", "fix 1.4")
    rc, out, err = report(capsys, "--store", history, "--resolve", "sig-b")
    assert rc == 0 and "nothing changed" in out
    assert "sig-b is an id an older grouping version gave it" in out
    # The table: the state, what it rests on, the old ids.
    rc, out, err = report(capsys, "--store", history, "--signatures", "--signature", "sig-b")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[2].split()[:3] == ["sig-a", "resolved", "4"], out
    assert "  sig-a:" in lines
    assert any(ln.startswith("    resolved ") and ln.endswith(": fix 1.4") for ln in lines)
    assert "    also sig-b (ids of older grouping versions)" in lines


def test_an_unknown_id_exits_3_naming_the_ids_there_are(history, capsys):
    rc, out, err = report(capsys, "--store", history, "--resolve", "sig-q")
    assert (rc, out) == (3, "")
    assert err.startswith("oomguard report: --resolve 'sig-q' names no signature id")
    assert "'sig-a'" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--note", "why"], "--note: give it with --resolve ID"),
        (["--resolve", "sig-a", "--signatures"], "--resolve: resolve alone"),
    ],
)
def test_usage_errors(history, capsys, argv, said):
    rc, out, err = report(capsys, "--store", history, *argv)
    assert (rc, out) == (2, "") and said in err


def test_a_store_that_is_not_there_is_not_made(tmp_path, capsys):
    missing = tmp_path / "nope.sqlite3"
    rc, out, err = report(capsys, "--store", missing, "--resolve", "sig-a")
    assert rc == 1 and "does not exist" in err and not missing.exists()


def test_a_user_with_no_name_still_resolves(history, capsys, monkeypatch):
    """A container's UID with no passwd entry and no USER: getpass raises KeyError there;
    the resolve is kept with no name rather than a traceback."""
    import pwd

    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(name, raising=False)

    def no_entry(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    rc, out, err = report(capsys, "--store", history, "--resolve", "sig-a", "--json")
    assert (rc, err) == (0, ""), err
    doc = json.loads(out)
    assert doc["changed"] is True and doc["resolved"]["resolved_by"] == ""
