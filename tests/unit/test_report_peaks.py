"""`oomguard report --peaks`: ledger files read without a byte changed (torn, foreign, missing,
a directory), peaks merged across hosts, suggested annotations never below the peak, and the
table and JSON the command prints."""

from __future__ import annotations

import json
import os
import pathlib
import socket

import dask
import pytest
from dask.utils import parse_bytes

from _cli_run import report
from oomguard._admission import ledger_file as _ledger_file
from oomguard._admission import peaks as _peaks
from oomguard._admission.ledger import HostLedger
from oomguard._admission.peaks import (
    STARTUP_LABEL,
    LedgerPeaks,
    PeakRow,
    merge,
    read_ledger,
    suggested,
)
from oomguard._cli import main
from oomguard._cli.report_peaks import PeaksRead, render_peaks

MiB, GiB = 2**20, 2**30
LONG = "repartitiontofewer-6f2d8c1b7e4a3f5d9c0b1a2e3f4d5c6b"


def write_ledger(path, peaks: dict, leases=()) -> pathlib.Path:
    path = pathlib.Path(path)
    path.write_text(json.dumps({"version": 1, "leases": list(leases), "peaks": peaks}))
    return path


def snapshot(directory) -> dict:
    return {
        p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in pathlib.Path(directory).iterdir()
    }


# -- reading a ledger file ------------------------------------------------------------------------


def test_reads_the_peaks_a_host_ledger_wrote_and_leaves_the_file_alone(tmp_path):
    path = str(tmp_path / "memory-ledger.json")
    ledger = HostLedger(path, available=lambda: 8 * GiB)
    ledger.record_peak("load-parquet", 300 * MiB)
    ledger.record_peak(_ledger_file.STARTUP_PEAK, 70 * MiB)
    assert ledger.try_acquire("('load-parquet', 1)", GiB).granted  # a lease held right now
    before = snapshot(tmp_path)
    got = read_ledger(path, host="node-a")
    assert got == LedgerPeaks(
        "node-a", path, {"load-parquet": 300 * MiB, _ledger_file.STARTUP_PEAK: 70 * MiB}
    )
    assert snapshot(tmp_path) == before  # no byte, no mtime, no lock file, no new file
    ledger.release("('load-parquet', 1)")
    ledger.close()


def test_a_missing_ledger_has_no_peaks_and_is_not_created(tmp_path):
    path = tmp_path / "nope" / "memory-ledger.json"
    got = read_ledger(str(path), host="node-a")
    assert got.missing and got.peaks == {} and got.note is None
    assert not path.parent.exists()


def test_an_empty_ledger_just_created_has_no_peaks_and_no_note(tmp_path):
    (tmp_path / "l.json").write_bytes(b"")
    got = read_ledger(str(tmp_path / "l.json"))
    assert (got.peaks, got.note, got.missing) == ({}, None, False)


@pytest.mark.parametrize(
    "content, why",
    [
        (b'{"version":1,"leases":[],"peaks":{"load":1048', "not JSON"),
        (b'{"version":1,"leases":[],"peaks":{"load":1}}{"version":1,"lea', "not JSON"),
        (b"\x00\x00\x00", "not JSON"),
        (b"[1, 2, 3]", "not a JSON object"),
        (b'{"version": 2, "peaks": {"load": 1048576}}', "version is 2"),
        (b'{"leases": [], "peaks": {"load": 1048576}}', "version is None"),
        (b'{"version": 1, "peaks": [["load", 1048576]]}', '"peaks" is not an object'),
    ],
)
def test_a_torn_or_foreign_file_gives_no_peaks_and_a_note(tmp_path, content, why):
    path = tmp_path / "memory-ledger.json"
    path.write_bytes(content)
    got = read_ledger(str(path), host="node-a")
    assert got.peaks == {} and not got.missing
    assert got.note.startswith(f"{path} is not an oomguard memory ledger: ") and why in got.note
    assert path.read_bytes() == content


def test_a_read_that_lands_mid_write_is_read_again(tmp_path, monkeypatch):
    path = tmp_path / "memory-ledger.json"
    path.write_bytes(b'{"version":1,"leases":[],"peaks":{"load":10485')  # the writer is here
    sleeps = []

    def writer_finishes(seconds):
        sleeps.append(seconds)
        write_ledger(path, {"load": 104857600})

    monkeypatch.setattr(_peaks.time, "sleep", writer_finishes)
    got = read_ledger(str(path))
    assert (got.peaks, got.note, len(sleeps)) == ({"load": 104857600}, None, 1)


def test_entries_that_are_not_byte_counts_are_skipped_with_a_note(tmp_path):
    path = write_ledger(
        tmp_path / "l.json",
        {"load": 5 * MiB, "flag": True, "neg": -1, "text": "6 GiB", "zero": 0, "float": 1.5},
    )
    got = read_ledger(str(path))
    assert got.peaks == {"load": 5 * MiB}
    assert got.note == f"{path}: 5 peak(s) that are not a positive number of bytes skipped"


def test_a_directory_is_an_error_to_the_caller(tmp_path):
    with pytest.raises(IsADirectoryError):
        read_ledger(str(tmp_path))


# -- the ledger a worker's config names ---------------------------------------------------------


def test_the_workers_ledger_path_is_resolved_as_admission_resolves_it(tmp_path):
    write_ledger(tmp_path / "memory-ledger.json", {"load": 7 * MiB})
    with dask.config.set(
        {"oomguard.worker.crash-dir": str(tmp_path), "oomguard.worker.admission.ledger": None}
    ):
        got = _peaks.worker_ledger_peaks()
    assert got == {
        "host": socket.gethostname(),
        "path": str(tmp_path / "memory-ledger.json"),
        "peaks": {"load": 7 * MiB},
        "note": None,
        "missing": False,
    }
    other = write_ledger(tmp_path / "elsewhere.json", {"sum": 9 * MiB})
    with dask.config.set({"oomguard.worker.admission.ledger": str(other)}):
        assert _peaks.worker_ledger_peaks()["peaks"] == {"sum": 9 * MiB}


def test_a_worker_never_raises_for_a_bad_path_or_setting(tmp_path):
    with dask.config.set({"oomguard.worker.admission.ledger": str(tmp_path)}):
        got = _peaks.worker_ledger_peaks()
    assert got["peaks"] == {} and f"cannot read {tmp_path}: Is a directory" in got["note"]
    with dask.config.set({"oomguard.worker.admission.ledger": 17}):
        got = _peaks.worker_ledger_peaks()
    assert got["peaks"] == {} and "oomguard.worker.admission.ledger is 17" in got["note"]


def test_what_a_worker_could_not_run_becomes_a_note():
    results = {
        "tcp://10.0.3.11:40211": {
            "host": "a",
            "path": "/l.json",
            "peaks": {"x": 5},
            "note": None,
            "missing": False,
        },
        "tcp://10.0.3.12:39117": ModuleNotFoundError("No module named 'oomguard'"),
    }
    ok, failed = _peaks.from_workers(results)
    assert ok == LedgerPeaks("a", "/l.json", {"x": 5})
    assert failed.note == (
        "worker tcp://10.0.3.12:39117: could not read its ledger: "
        "ModuleNotFoundError: No module named 'oomguard'"
    )


# -- merging across hosts -------------------------------------------------------------------------


def test_merge_keeps_the_largest_peak_per_prefix_and_where_it_came_from():
    ledgers = [
        LedgerPeaks(
            "node-a",
            "/tmp/oomguard-0/memory-ledger.json",
            {"load": 300 * MiB, "sum": 20 * MiB, _ledger_file.STARTUP_PEAK: 70 * MiB},
        ),
        # node-a's second worker read the same file a moment later: counted once.
        LedgerPeaks("node-a", "/tmp/oomguard-0/memory-ledger.json", {"load": 900 * MiB}),
        LedgerPeaks(
            "node-b",
            "/tmp/oomguard-0/memory-ledger.json",
            {"load": 500 * MiB, "sum": 20 * MiB, "parse": 40 * MiB},
        ),
        # node-b also runs workers of another cluster, with their own ledger.
        LedgerPeaks("node-b", "/dev/shm/ledger.json", {_ledger_file.STARTUP_PEAK: 90 * MiB}),
        LedgerPeaks("node-c", "/tmp/oomguard-0/memory-ledger.json", missing=True),
    ]
    assert merge(ledgers) == [
        PeakRow(_ledger_file.STARTUP_PEAK, 90 * MiB, ("node-b",)),  # first, though not the largest
        PeakRow("load", 500 * MiB, ("node-b",)),
        PeakRow("parse", 40 * MiB, ("node-b",)),
        PeakRow("sum", 20 * MiB, ("node-a", "node-b")),  # the same peak on two hosts
    ]


def test_notes_are_said_once():
    lg = [
        LedgerPeaks("a", "/l", note="x"),
        LedgerPeaks("b", "/l", note="x"),
        LedgerPeaks("c", "/l", note="y"),
        LedgerPeaks("d", "/l"),
    ]
    assert _peaks.notes(lg) == ["x", "y"]


# -- suggested annotations ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "peak, size",
    [
        (1, "16 MiB"),
        (16 * MiB, "16 MiB"),
        (16 * MiB + 1, "32 MiB"),
        (100 * MiB, "112 MiB"),
        (GiB - 1, "1 GiB"),
        (GiB + 1, "1040 MiB"),
        (int(1.03 * GiB), "1056 MiB"),
        (6 * GiB, "6 GiB"),
    ],
)
def test_a_suggestion_is_the_peak_rounded_up_to_16_mib(peak, size):
    assert suggested(peak) == f'oomguard.memory("{size}")'
    nbytes = parse_bytes(size)  # what oomguard.memory(size) will lease
    assert peak <= nbytes < peak + 16 * MiB and nbytes % (16 * MiB) == 0


def test_the_start_up_row_is_labelled_and_has_no_annotation():
    assert _peaks.STARTUP_PEAK == "oomguard:worker-start-up"
    row = PeakRow(_ledger_file.STARTUP_PEAK, 70 * MiB, ("a",))
    assert (row.label, row.suggested) == (STARTUP_LABEL, None)
    assert row.to_dict() == {
        "prefix": "oomguard:worker-start-up",
        "peak": 70 * MiB,
        "hosts": ["a"],
        "suggested": None,
    }


# -- the command ---------------------------------------------------------------------------------

PEAKS = {
    _ledger_file.STARTUP_PEAK: 190_000_000,
    "load-parquet": 1_500_000_000,
    LONG: 734_003_200,
    "sum": 70_000_000,
}


@pytest.fixture
def ledger_file(tmp_path) -> pathlib.Path:
    return write_ledger(tmp_path / "memory-ledger.json", PEAKS)


def test_ledger_prints_the_peaks_start_up_first_then_largest(ledger_file, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)  # piped: one line per row
    before = snapshot(ledger_file.parent)
    rc, out, err = report(capsys, "--ledger", ledger_file)
    assert (rc, err) == (0, "")
    host = socket.gethostname()
    lines = out.splitlines()
    assert lines[0] == f"PEAKS: 4, largest first, from {ledger_file}"
    assert lines[1].split() == ["PREFIX", "PEAK", "HOSTS", "SUGGESTED"]
    assert [ln.split("  ")[0] for ln in lines[2:6]] == [STARTUP_LABEL, "load-parquet", LONG, "sum"]
    assert lines[2].split()[-3:] == ["181", "MiB", host]  # no annotation for the start-up
    assert lines[3].split()[-5:] == ["1.4", "GiB", host, 'oomguard.memory("1440', 'MiB")']
    assert lines[4].split()[-2:] == ['oomguard.memory("704', 'MiB")']
    assert "the peak rounded up to 16 MiB" in lines[6]
    assert snapshot(ledger_file.parent) == before


@pytest.mark.parametrize("columns", [60, 80, 100, 160])
def test_the_peaks_table_fits_and_never_cuts_a_prefix(ledger_file, capsys, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.chdir(ledger_file.parent)  # the path in the head line: a key, never cut
    rc, out, _ = report(capsys, "--ledger", ledger_file.name)
    assert rc == 0
    lines = out.splitlines()
    assert max(map(len, lines)) <= columns
    for prefix in (LONG, STARTUP_LABEL, "load-parquet"):
        assert any(ln.split("  ")[0] == prefix for ln in lines), (prefix, out)
    for peak in PEAKS.values():
        if peak != PEAKS[_ledger_file.STARTUP_PEAK]:
            assert suggested(peak) in out


def test_narrow_layouts_move_the_suggestion_under_the_prefix():
    read = PeaksRead(merge([LedgerPeaks("node-a", "/l.json", PEAKS)]), "/l.json", [], [], False)
    lines = render_peaks(read, width=80)
    at = lines.index(next(ln for ln in lines if ln.startswith(LONG)))
    assert lines[at + 1] == '    suggested oomguard.memory("704 MiB")  hosts node-a'
    lines = render_peaks(read, width=None)  # a pipe: everything in the row
    assert any(ln.startswith(LONG) and ln.endswith('oomguard.memory("704 MiB")') for ln in lines)


def test_ledger_json_is_the_rows(ledger_file, capsys):
    rc, out, err = report(capsys, "--ledger", ledger_file, "--json")
    assert (rc, err) == (0, "")
    doc = json.loads(out)
    assert list(doc) == ["peaks"]
    assert doc["peaks"][0] == {
        "prefix": "oomguard:worker-start-up",
        "peak": 190_000_000,
        "hosts": [socket.gethostname()],
        "suggested": None,
    }
    assert [r["prefix"] for r in doc["peaks"][1:]] == ["load-parquet", LONG, "sum"]
    assert doc["peaks"][1]["suggested"] == 'oomguard.memory("1440 MiB")'


def test_peaks_join_the_history_sections_asked_for(ledger_file, tmp_path, capsys):
    from oomguard._store import FailureStore

    store = FailureStore(str(tmp_path / "history.sqlite3"))
    store.start()
    store.close()
    rc, out, err = report(
        capsys,
        "--store",
        tmp_path / "history.sqlite3",
        "--ledger",
        ledger_file,
        "--events",
        "--json",
    )
    assert (rc, err) == (0, "")
    doc = json.loads(out)
    assert list(doc) == ["events", "peaks"] and doc["events"] == [] and len(doc["peaks"]) == 4
    rc, out, _ = report(capsys, "--store", tmp_path / "history.sqlite3", "--ledger", ledger_file)
    assert rc == 0
    assert [ln.split(":")[0] for ln in out.splitlines() if ln[:1].isupper() and ":" in ln] == [
        "INCIDENTS",
        "DEATHS",
        "EVENTS",
        "SIGNATURES",
        "PIPELINES",
        "PEAKS",
    ]


def test_a_torn_ledger_prints_a_note_not_an_error(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    path = tmp_path / "memory-ledger.json"
    path.write_bytes(b'{"version":1,"leases":[],"peaks":{"load":10485')
    rc, out, err = report(capsys, "--ledger", path)
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert lines[:2] == [f"PEAKS: 0, largest first, from {path}", "  no peaks read: see the notes"]
    assert " ".join(" ".join(lines[2:]).split()) == (
        f"note: {path} is not an oomguard memory ledger: it is not JSON (torn, or another "
        "program's file); no peaks read from it"
    )
    rc, out, err = report(capsys, "--ledger", path, "--json")
    assert (rc, json.loads(out)) == (0, {"peaks": []})
    assert err.startswith(f"oomguard report: note: {path} is not an oomguard memory ledger")


def test_a_missing_ledger_says_no_peaks_learned_yet(tmp_path, capsys):
    rc, out, err = report(capsys, "--ledger", tmp_path / "none.json")
    assert (rc, err) == (0, "")
    assert out.splitlines()[1] == "  no peaks learned yet: no such file"
    assert not (tmp_path / "none.json").exists()


@pytest.mark.parametrize(
    "where, why", [("dir", "Is a directory"), ("file/ledger.json", "Not a directory")]
)
def test_an_unreadable_ledger_is_one_line_and_exit_1(tmp_path, capsys, where, why):
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    rc, out, err = report(capsys, "--ledger", tmp_path / where)
    assert (rc, out) == (1, "")
    assert err == f"oomguard report: cannot read the memory ledger {tmp_path / where}: {why}\n"


def test_peaks_alone_read_this_hosts_configured_ledger(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    write_ledger(tmp_path / "memory-ledger.json", {"hold-memory": 100 * MiB})
    with dask.config.set(
        {
            "scheduler-address": None,
            "oomguard.worker.crash-dir": str(tmp_path),
            "oomguard.worker.admission.ledger": None,
        }
    ):
        rc, out, err = report(capsys, "--peaks")
    assert (rc, err) == (0, "")
    assert out.splitlines()[0] == f"PEAKS: 1, largest first, from {tmp_path}/memory-ledger.json"
    assert "hold-memory" in out and 'oomguard.memory("112 MiB")' in out


def test_peaks_with_a_store_needs_a_ledger(tmp_path, capsys):
    rc, out, err = report(capsys, "--store", tmp_path / "x.sqlite3", "--peaks")
    assert (rc, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("oomguard report: --peaks: ")
    assert "--ledger PATH" in err


def test_the_default_sections_are_still_the_history(tmp_path, capsys):
    from oomguard._store import FailureStore

    store = FailureStore(str(tmp_path / "h.sqlite3"))
    store.start()
    store.close()
    rc, out, _ = report(capsys, "--store", tmp_path / "h.sqlite3", "--json")
    sections = ["incidents", "deaths", "events", "signatures", "pipelines"]
    assert (rc, list(json.loads(out))) == (0, sections)


def test_the_examples_in_docstrings_hold():
    import doctest

    assert doctest.testmod(_peaks).attempted >= 3 and doctest.testmod(_peaks).failed == 0


def test_the_help_says_how_peaks_combine(capsys):
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "Without a section flag the report prints deaths, events, signatures and pipelines; the "
        "peaks only when asked for (--peaks, or --ledger)"
    ) in out
    assert os.path.join("<crash-dir>", "memory-ledger.json") in out


def test_the_docs_show_what_the_peaks_section_prints():
    """The 80-column capture in docs/reading-a-report.md is this output, character for
    character."""
    ledger = "/tmp/oomguard-1000/memory-ledger.json"
    repart, parquet = LONG, "read-parquet-8c1f0e2d9a7b4c3e5f6a7b8c9d0e1f2a"
    ledgers = [
        LedgerPeaks(
            "ip-10-0-3-11",
            ledger,
            {
                _ledger_file.STARTUP_PEAK: 71_303_168,
                repart: 1_140_850_688,
                parquet: 601_620_480,
                "load-0a1b": 420_478_976,
            },
        ),
        LedgerPeaks(
            "ip-10-0-3-12",
            ledger,
            {
                _ledger_file.STARTUP_PEAK: 74_448_896,
                parquet: 601_620_480,
                "load-0a1b": 398_458_880,
                "parse": 88_080_384,
            },
        ),
    ]
    read = PeaksRead(merge(ledgers), "tcp://10.0.3.2:8786", ledgers, [], True)
    text = "\n".join(render_peaks(read, width=80))
    doc = (pathlib.Path(__file__).parents[2] / "docs" / "reading-a-report.md").read_text()
    assert f"$ oomguard report --scheduler tcp://10.0.3.2:8786 --peaks\n{text}\n```" in doc
