"""`oomguard fingerprint FILE...`."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from oomguard._cli import main

EXAMPLES = sorted((pathlib.Path(__file__).resolve().parents[2] / "docs" / "examples").iterdir())


def test_examples_run_cleanly(capsys):
    assert len(EXAMPLES) >= 4
    assert main(["fingerprint", *map(str, EXAMPLES)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert [line.split("\t")[1] for line in lines] == list(map(str, EXAMPLES))
    assert all(len(line.split("\t")[0]) == 16 for line in lines)
    assert err == ""


def test_order_follows_the_arguments(capsys):
    paths = list(map(str, reversed(EXAMPLES)))
    main(["fingerprint", *paths])
    assert [line.split("\t")[1] for line in capsys.readouterr().out.splitlines()] == paths


def test_json_records(capsys):
    dump = next(p for p in EXAMPLES if "sigsegv" in p.name)
    assert main(["fingerprint", "--json", str(dump)]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    record = json.loads(line)
    assert set(record) == {
        "id",
        "title",
        "input_kind",
        "error",
        "message",
        "frames",
        "grouping_version",
        "reason",
        "previous_ids",
        "top",
        "path",
    }
    assert record["path"] == str(dump) and record["error"] == "SIGSEGV"
    assert record["frames"][-1]["function"] == "parse_record"
    # The innermost frame, in-app or not: where the crash left Python (its native site).
    assert record["top"]["function"] == "string_at" and not record["top"]["in_app"]


def test_missing_file_named_others_still_printed(tmp_path):
    missing = tmp_path / "no-such-trace.txt"
    args = [str(EXAMPLES[0]), str(missing), str(EXAMPLES[1])]
    proc = subprocess.run(
        [sys.executable, "-m", "oomguard._cli", "fingerprint", *args],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert [line.split("\t")[1] for line in proc.stdout.splitlines()] == [args[0], args[2]]
    assert proc.stderr.strip() == f"oomguard: {missing}: No such file or directory"


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_not_a_trace_gets_no_id_and_fails(tmp_path, capsys, json_flag):
    # One thing said of a file with no trace: no id (which would pass for a crash's), one
    # line on stderr, exit 1; the other files are still printed.
    notes = tmp_path / "notes.txt"
    notes.write_text("shopping list: eggs, milk\n")
    assert main(["fingerprint", *json_flag, str(notes), str(EXAMPLES[0])]) == 1
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1 and str(notes) not in out
    assert str(EXAMPLES[0]) in out
    assert err.startswith(f"oomguard: {notes}: not a trace: ") and len(err.splitlines()) == 1


def test_help_documents_exit_status(capsys):
    try:
        main(["fingerprint", "--help"])
    except SystemExit:
        pass
    assert "Exit status" in capsys.readouterr().out


def test_a_dump_as_logs_deliver_it_has_the_id_of_the_dump(tmp_path, capsys):
    dump = next(p for p in EXAMPLES if "sigsegv" in p.name)
    lines = dump.read_text().split("\n")
    wrapped = {
        "journald.log": "\n".join(f"Nov 30 12:00:01 node-7 python3[4242]: {x}" for x in lines),
        "kubectl.log": "\n".join(f"2026-11-30T12:00:01.{i:09d}Z {x}" for i, x in enumerate(lines)),
        "pasted.txt": "\r\n".join(x.lstrip() for x in lines),
    }
    paths = [str(dump)]
    for name, text in wrapped.items():
        (tmp_path / name).write_bytes(text.encode())
        paths.append(str(tmp_path / name))
    assert main(["fingerprint", *paths]) == 0
    ids = {line.split("\t")[0] for line in capsys.readouterr().out.splitlines()}
    assert len(ids) == 1
