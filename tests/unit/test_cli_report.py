"""`oomguard report --store`: tables, filters, the JSON round trip against the store API,
one-line errors with the right exit status, and a store file left byte-for-byte alone."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import pathlib
import re
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from _cli_run import report
from capabilities import require
from oomguard import FailureEvent, Incident, PipelineStatus, SignatureRow
from oomguard._cli.layout import table
from oomguard._cli.report_args import parse_since
from oomguard._death.killer import for_cause
from oomguard._death.record import Death, Role, Task
from oomguard._store import FailureStore

T0 = time.time() - 3 * 3600  # events from 3 h ago to ~1 h ago (reset when stored: _build)
OOMGUARD = pathlib.Path(sys.executable).with_name("oomguard")

#: (kind, cause, shard, pipeline, host, signature)
ROWS = [
    ("infra", "oom_kill", "('load', 7)", "etl", "node-a", "sig-oom"),
    ("infra", "oom_kill", "('load', 7)", "etl", "node-b", "sig-oom"),
    ("user", "exception", "('parse', 2)", "etl", "node-a", "sig-key"),
    ("infra", "native_crash", "('load', 3)", "backfill", "node-b", "sig-segv"),
    ("user", "exception", "('parse', 9)", "backfill", "node-b", "sig-key"),
    ("infra", "oom_kill", "('load', 8)", "backfill", "node-a", "sig-oom"),
    ("infra", "native_crash", "('load', 3)", "backfill", "node-a", "sig-segv"),
]
TITLES = {
    "sig-oom": "MemoryError in shardapp.core.load_shard ← run",
    "sig-key": "KeyError in shardapp.core.parse_block",
    "sig-segv": "SIGSEGV in numpy.core._multiarray_umath ← shardapp.core.load_shard",
}


def _event(i: int, kind, cause, shard, pipeline, host, sig) -> FailureEvent:
    evidence = {"exception": "KeyError: 'x'", "retries_left": 0}
    if cause == "oom_kill":
        evidence = {
            "exitcode": -9,
            "exitcode_source": "nanny: worker process exit status",
            "oom_kill_delta": 1,
            "oom_kill_source": "kernel cgroup counter memory.events",
            "peak_bytes": 1095216660,
            "summary": "kernel oom_kill counted, peak 1.02 GiB of a 1 GiB limit",
        }
    elif cause == "native_crash":
        evidence = {
            "exitcode": -11,
            "signal": "SIGSEGV",
            "summary": "SIGSEGV, faulthandler stack captured",
        }
    return FailureEvent(
        kind=kind,
        cause=cause,
        shard=shard,
        pipeline=pipeline,
        worker=f"tcp://{host}:4000{i}",
        host=host,
        signature_id=sig,
        signature_title=TITLES[sig],
        evidence=evidence,
        attempt=1 + sum(1 for r in ROWS[:i] if r[2] == shard),
        time=T0 + i * 1200,  # 20 minutes apart
    )


def store_failure(
    store: FailureStore, event: FailureEvent, example: str = "", displaced=()
) -> None:
    """Store a failure as the scheduler does: a death (kind infra) with the event of its
    culprit naming it, and `displaced` ((shard, pipeline), ...) beside it; a task's
    exception as its event alone."""
    if event.kind != "infra":
        assert store.add(event, example=example), store.last_error
        return
    key = f"{event.worker}|{event.time!r}".encode()
    death_id = hashlib.blake2b(key, digest_size=8).hexdigest()
    tasks = (Task(event.shard, role=Role.CULPRIT, pipeline=event.pipeline),) + tuple(
        Task(shard, role=Role.DISPLACED, pipeline=pipeline) for shard, pipeline in displaced
    )
    death = Death(
        id=death_id,
        cluster=event.cluster,
        worker=event.worker,
        host=event.host,
        cause=event.cause,
        time=event.time,
        tasks=tasks,
        killer=for_cause(event.cause),
        evidence=event.evidence,
        signature_id=event.signature_id,
        signature_title=event.signature_title,
    )
    event = dataclasses.replace(event, death=death_id)
    assert store.record(death, [event], example=example), store.last_error


def section(out: str, name: str) -> str:
    """One section of a report's text ("EVENTS", "SIGNATURES", ...), its head line first."""
    blocks = re.split(r"\n\n(?=[A-Z]+: )", out)
    return next(b for b in blocks if b.startswith(f"{name}: "))


def _build(path: pathlib.Path) -> None:
    # "3 h ago" from when the history is stored, not from when this module was imported: a
    # busy suite reaches these tests half an hour later, and `--since 90m` then saw nothing.
    global T0
    T0 = time.time() - 3 * 3600
    store = FailureStore(str(path), batch_interval=0.01)
    store.start()
    for i, row in enumerate(ROWS):
        store_failure(store, _event(i, *row), example=f"Traceback ...\n{TITLES[row[5]]}")
    store.upsert_pipeline(
        PipelineStatus(
            "backfill",
            "succeeded_after_infra_failures",
            40,
            0,
            0,
            3,
            1,
            "40 shards finished, after 3 worker deaths (2 native_crash, 1 oom_kill) that "
            "oomguard retried, and 1 user error that Dask retried.",
        )
    )
    store.upsert_pipeline(
        PipelineStatus(
            "etl",
            "aborted",
            10,
            1,
            5,
            2,
            1,
            "a worker was OOM-killed by the kernel at shard ('load', 7) 2 times; the pipeline "
            "was aborted; 10 shards had finished, 1 erred, 5 were aborted.",
            "oomguard aborted pipeline 'etl' because shard ('load', 7) failed 2 times: its worker "
            "was OOM-killed by the kernel each time. " + "Pipeline tally: ... " * 8,
        )
    )
    assert store.flush(), store.last_error
    store.close()


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("report") / "history.sqlite3"
    _build(path)
    return path


def sha256(path) -> str:
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def store_api(path, method, **kw):
    """What the Python store API returns, as dicts (opened after the report ran)."""
    store = FailureStore(str(path))
    store.start()
    try:
        got = getattr(store, method)(**kw)
    finally:
        store.close()
    return [r.to_dict() for r in (got if isinstance(got, list) else [got] if got else [])]


# -- tables -----------------------------------------------------------------------------------


def test_tables_hold_every_row_and_fit_100_columns(history, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    before = sha256(history)
    rc, out, err = report(capsys, "--store", history)
    assert rc == 0 and err == ""
    assert [ln for ln in out.splitlines() if len(ln) > 100] == []
    for head in ("EVENTS: 7,", "SIGNATURES: 3,", "PIPELINES: 2,"):
        assert head in out
    events = section(out, "EVENTS")
    for _kind, cause, shard, pipeline, host, _sig in ROWS:
        assert any(
            cause in ln and shard in ln and pipeline in ln and host in ln
            for ln in events.splitlines()
        ), (cause, shard)
    # Newest first: the last event added is on the first row.
    assert events.splitlines()[2].split()[2:4] == ["infra", "native_crash"]
    sigs = section(out, "SIGNATURES")
    rows = [ln for ln in sigs.splitlines()[2:] if ln and not ln.startswith(" ")]
    counts = {ln.split()[0]: ln.split()[1:4] for ln in rows}
    assert counts == {
        "sig-oom": ["new", "3", "2"],
        "sig-key": ["new", "2", "2"],
        "sig-segv": ["new", "2", "2"],
    }
    pipes = out.split("PIPELINES:")[1]
    assert "aborted" in pipes and "succeeded_after_infra_failures" in pipes
    # The summary and the abort paragraph are wrapped, never cut.
    text = " ".join(pipes.split())
    assert "10 shards had finished, 1 erred, 5 were aborted." in text
    assert "oomguard aborted pipeline 'etl' because shard ('load', 7)" in text
    assert sha256(history) == before


def test_a_store_path_relative_to_the_working_directory(history, capsys, monkeypatch):
    monkeypatch.chdir(history.parent)
    rc, out, err = report(capsys, "--store", history.name, "--json", "--events")
    assert (rc, err) == (0, "") and len(json.loads(out)["events"]) == len(ROWS)


def test_sections_can_be_picked(history, capsys):
    rc, out, _ = report(capsys, "--store", history, "--signatures")
    assert rc == 0 and "SIGNATURES:" in out
    assert "EVENTS:" not in out and "PIPELINES:" not in out
    rc, out, _ = report(capsys, "--store", history, "--pipelines", "--json")
    assert list(json.loads(out)) == ["pipelines"]


def test_shard_history_is_oldest_first_with_its_evidence(history, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    rc, out, _ = report(capsys, "--store", history, "--shard", "('load', 7)")
    assert rc == 0
    assert "EVENTS: 2, oldest first" in out
    assert "kernel oom_kill counted, peak 1.02 GiB of a 1 GiB limit" in out
    assert 'oom_kill_source="kernel cgroup counter memory.events"' in out
    assert "worker tcp://node-a:40000" in out and "worker tcp://node-b:40001" in out
    # Only the shard's signature and pipeline.
    assert "sig-oom" in out and "sig-key" not in out and "backfill" not in out
    assert [ln for ln in out.splitlines() if len(ln) > 100] == []


def test_table_shortens_only_the_columns_it_may():
    lines = table(["ID", "TITLE"], [["abc", "x" * 300]], width=40, shorten={"TITLE": 10})
    assert max(map(len, lines)) == 40
    assert lines[1].startswith("abc  ") and lines[1].endswith("…")
    # Without leave to shorten, or without a width (not a terminal), nothing is cut.
    assert table(["ID", "TITLE"], [["abc", "x" * 300]], width=40)[1] == "abc  " + "x" * 300
    assert table(["ID", "TITLE"], [["abc", "x" * 300]])[1] == "abc  " + "x" * 300


# -- fitting the terminal: the scenario of the issue, with keys as Dask writes them ----------


#: (kind, cause, shard, pipeline, host, signature id, signature title)
WIDE_ROWS = [
    (
        "infra",
        "oom_kill",
        "('repartitiontofewer-6f2d8c1b7e4a3f5d9c0b1a2e3f4d5c6b', 17)",
        "nightly-load",
        "dask-worker-7f9c8d-x2lqp",
        "6d4c109d5cf8c83f",
        "oom_kill in shardapp.core.load_shard ← run",
    ),
    (
        "infra",
        "memory_terminate",
        "('read-parquet-8c1f0e2d9a7b4c3e5f6a7b8c9d0e1f2a', 3)",
        "read_parquet → groupby → sum",
        "dask-worker-7f9c8d-9hq2v",
        "a1b2c3d4e5f60718",
        "memory_terminate in pandas.core.groupby.ops._cython_operation ← shardapp.agg.totals",
    ),
    (
        "infra",
        "native_crash",
        "('load-0a1b', 17)",
        "per-file",
        "dask-worker-7f9c8d-x2lqp",
        "0f9e8d7c6b5a4938",
        "SIGSEGV in numpy.core._multiarray_umath ← shardapp.core.load_shard",
    ),
    (
        "user",
        "exception",
        "parse-7",
        "etl",
        "10.0.3.12",
        "77aa88bb99cc00dd",
        "ValueError in shardapp.parse.parse_block",
    ),
    (
        "infra",
        "worker_lost",
        "slowish-5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c",
        "finalize-hlgfinalizecompute-9a8b7c6d5e4f",
        "ip-10-0-3-11.eu-west-1.compute.internal",
        "3c2b1a0f9e8d7c6b",
        "worker_lost (no death report)",
    ),
]
WIDE_CAUSES = {r[1] for r in WIDE_ROWS}


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("wide") / "history.sqlite3"
    store = FailureStore(str(path), batch_interval=0.01)
    store.start()
    for i, (kind, cause, shard, pipeline, host, sig, title) in enumerate(WIDE_ROWS):
        store_failure(
            store,
            FailureEvent(
                kind=kind,
                cause=cause,
                shard=shard,
                pipeline=pipeline,
                host=host,
                worker=f"tcp://{host}:4021{i}",
                signature_id=sig,
                signature_title=title,
                evidence={"summary": f"{cause} of {shard}", "exitcode": -9},
                time=T0 + i * 60,
            ),
            example=title,
            # Its neighbour, of another pipeline, lost its work (the widest keys again).
            displaced=[WIDE_ROWS[(i + 1) % len(WIDE_ROWS)][2:4]],
        )
        store.upsert_pipeline(
            PipelineStatus(
                pipeline,
                "aborted" if i == 0 else "succeeded_after_infra_failures",
                41,
                1,
                58,
                2,
                0,
                f"a worker died at shard {shard} 2 times; 41 shards had finished.",
                f"oomguard aborted pipeline {pipeline!r} because shard {shard} failed 2 times. "
                * (i == 0),
            )
        )
    assert store.flush(), store.last_error
    store.close()
    return path


def _keys_whole(lines: list[str], keys) -> list[str]:
    """The keys that no single line holds whole."""
    return [k for k in keys if not any(k in ln for ln in lines)]


def _too_wide(lines: list[str], columns: int) -> list[str]:
    """Lines wider than the terminal, but for a key longer than it, alone on its line
    (after its label: the shard of an event, the task a death blamed)."""
    keys = {r[2] for r in WIDE_ROWS}
    return [
        ln
        for ln in lines
        if len(ln) > columns
        and ln.strip().removeprefix("shard ").removeprefix("blamed ") not in keys
    ]


@pytest.mark.parametrize("columns", [60, 80, 100, 160])
def test_report_fits_the_terminal_and_keeps_every_key_whole(wide, capsys, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    rc, out, err = report(capsys, "--store", wide)
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert _too_wide(lines, columns) == []
    events = section(out, "EVENTS").splitlines()
    # The values a user copies into --shard, --signature and --pipeline: whole, on one line.
    assert _keys_whole(events, [r[2] for r in WIDE_ROWS]) == []
    assert _keys_whole(events, [r[5] for r in WIDE_ROWS]) == []
    assert _keys_whole(events, [r[3] for r in WIDE_ROWS]) == []
    # Times and causes are never cut either.
    stamps = [ln for ln in events if re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", ln)]
    assert len(stamps) == len(WIDE_ROWS)
    assert {c for c in WIDE_CAUSES if any(f" {c} " in ln for ln in stamps)} == WIDE_CAUSES
    sigs = section(out, "SIGNATURES").splitlines()
    assert _keys_whole(sigs, [r[5] for r in WIDE_ROWS]) == []
    deaths = section(out, "DEATHS").splitlines()
    infra = [r for r in WIDE_ROWS if r[0] == "infra"]
    assert _keys_whole(deaths, [r[2] for r in infra] + [r[5] for r in infra]) == []
    pipes = section(out, "PIPELINES").splitlines()
    assert _keys_whole(pipes, [r[3] for r in WIDE_ROWS]) == []
    # The shard named in the abort paragraph is not broken across two lines either.
    assert _keys_whole(pipes, [WIDE_ROWS[0][2]]) == []
    assert "…" not in section(out, "SIGNATURES")  # signature titles are wrapped, not cut


def test_a_wider_terminal_shows_more_on_each_line(wide, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    narrow = report(capsys, "--store", wide, "--events")[1].splitlines()
    monkeypatch.setenv("COLUMNS", "160")
    broad = report(capsys, "--store", wide, "--events")[1].splitlines()
    assert len(broad) < len(narrow)
    assert max(map(len, broad)) > 100  # the width is used, not a fixed 100


@pytest.mark.parametrize("columns", [60, 80, 160])
@pytest.mark.parametrize("row", WIDE_ROWS[:3], ids=["oom", "terminate", "segv"])
def test_shard_view_fits_the_terminal_and_keeps_keys_whole(
    wide, capsys, monkeypatch, columns, row
):
    monkeypatch.setenv("COLUMNS", str(columns))
    rc, out, err = report(capsys, "--store", wide, "--shard", row[2])
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert _too_wide(lines, columns) == []
    assert "EVENTS: 1, oldest first" in out
    assert _keys_whole(lines, [row[2], row[3], row[5], f"tcp://{row[4]}:"]) == []
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d +\w+ +" + row[1] + " ", out)


def test_a_key_longer_than_the_terminal_is_printed_whole(tmp_path, capsys, monkeypatch):
    path = tmp_path / "store.sqlite3"
    shard = "('" + "very-long-task-name-" * 6 + "0a1b2c3d', 17)"
    store = FailureStore(str(path), batch_interval=0.01)
    store.start()
    store.add(_event(0, "infra", "oom_kill", shard, "etl", "node-a", "sig-oom"))
    assert store.flush()
    store.close()
    monkeypatch.setenv("COLUMNS", "80")
    for argv in ([], ["--shard", shard]):
        rc, out, _ = report(capsys, "--store", path, *argv)
        assert rc == 0
        too_wide = [ln for ln in out.splitlines() if len(ln) > 80]
        # The one line allowed past the edge is the key itself, alone on its line.
        assert too_wide and all(ln.strip().endswith(shard) for ln in too_wide), too_wide
        assert all(len(ln.strip()) <= len(shard) + len("shard ") for ln in too_wide)


def test_piped_output_cuts_nothing(wide, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    rc, out, _ = report(capsys, "--store", wide)  # capsys: stdout is not a terminal
    assert rc == 0 and "…" not in out
    events = [ln for ln in section(out, "EVENTS").splitlines()[2:] if ln]
    # One line per event, every column whole: easy to grep and to cut(1).
    assert len(events) == len(WIDE_ROWS)
    for kind, cause, shard, pipeline, host, sig, title in WIDE_ROWS:
        assert any(
            all(v in ln for v in (kind, cause, shard, pipeline, host, sig, title)) for ln in events
        ), shard


def test_the_terminal_width_is_used_without_columns(wide, tmp_path):
    """In a real terminal (a pty of 80 columns) with COLUMNS unset."""
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 80, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PYTHONIOENCODING"] = "utf-8"
    proc = subprocess.Popen(
        [sys.executable, "-m", "oomguard._cli", "report", "--store", str(wide)],
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=180) == 0, proc.stderr.read()
    lines = b"".join(chunks).decode().replace("\r\n", "\n").splitlines()
    assert lines and max(map(len, lines)) <= 80
    assert _keys_whole(lines, [r[2] for r in WIDE_ROWS] + [r[5] for r in WIDE_ROWS]) == []


# -- the captures in docs/reading-a-report.md ----------------------------------------------------

#: The example store of the docs: a P2P shuffle's repartition, read_parquet, client.map.
DOC_T0 = datetime.datetime(2026, 11, 30, 12, 0, tzinfo=datetime.UTC).timestamp()
_OOM = {
    "summary": "kernel oom_kill counted, peak 1.02 GiB of a 1 GiB limit",
    "exitcode": -9,
    "oom_kill_delta": 1,
    "oom_kill_source": "kernel cgroup counter memory.events",
}
_REPART = "('repartitiontofewer-6f2d8c1b7e4a3f5d9c0b1a2e3f4d5c6b', 17)"
#: (kind, cause, shard, pipeline, host, worker, signature id, title, attempt, evidence)
DOC_ROWS = [
    (
        "infra",
        "oom_kill",
        _REPART,
        "nightly-load",
        "10.0.3.11",
        "tcp://10.0.3.11:40211",
        "6d4c109d5cf8c83f",
        "oom_kill in shardapp.core.load_shard ← run",
        1,
        _OOM,
    ),
    (
        "infra",
        "oom_kill",
        _REPART,
        "nightly-load",
        "10.0.3.12",
        "tcp://10.0.3.12:39117",
        "6d4c109d5cf8c83f",
        "oom_kill in shardapp.core.load_shard ← run",
        2,
        {**_OOM, "summary": "kernel oom_kill counted, peak 1.01 GiB of a 1 GiB limit"},
    ),
    (
        "infra",
        "memory_terminate",
        "('read-parquet-8c1f0e2d9a7b4c3e5f6a7b8c9d0e1f2a', 3)",
        "per-file",
        "10.0.3.12",
        "tcp://10.0.3.12:39117",
        "a1b2c3d4e5f60718",
        "memory_terminate in pandas.core.groupby.ops._cython_operation ← shardapp.agg.totals",
        1,
        {"summary": "the nanny terminated it at 573.59 MiB nanny RSS", "exitcode": -15},
    ),
    (
        "infra",
        "native_crash",
        "('load-0a1b', 17)",
        "per-file",
        "10.0.3.11",
        "tcp://10.0.3.11:40211",
        "0f9e8d7c6b5a4938",
        "SIGSEGV in numpy.core._multiarray_umath ← shardapp.core.load_shard",
        1,
        {"summary": "SIGSEGV, faulthandler stack captured", "exitcode": -11, "signal": "SIGSEGV"},
    ),
    (
        "user",
        "exception",
        "parse-7",
        "etl",
        "10.0.3.12",
        "tcp://10.0.3.12:39117",
        "77aa88bb99cc00dd",
        "ValueError in shardapp.parse.parse_block",
        1,
        {"exception": "ValueError: cannot parse block 7", "retries_left": 0},
    ),
    (
        "infra",
        "worker_lost",
        "slowish-5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c",
        "sum-tree",
        "ip-10-0-3-13.eu-west-1.compute.internal",
        "tcp://ip-10-0-3-13.eu-west-1.compute.internal:36001",
        "3c2b1a0f9e8d7c6b",
        "worker_lost (no death report)",
        1,
        {"source": "no death report within the grace timeout"},
    ),
]
DOC_PIPELINES = [
    PipelineStatus(
        "sum-tree",
        "succeeded_after_infra_failures",
        64,
        0,
        0,
        1,
        0,
        "all 64 shards finished, after 1 worker death (1 worker_lost) that oomguard retried.",
        started=DOC_T0,
    ),
    PipelineStatus(
        "etl",
        "failed",
        99,
        1,
        0,
        0,
        1,
        "shard parse-7 raised ValueError past its retries; 99 shards finished.",
        started=DOC_T0,
    ),
    PipelineStatus(
        "per-file",
        "succeeded_after_infra_failures",
        100,
        0,
        0,
        2,
        0,
        "all 100 shards finished, after 2 worker deaths (1 memory_terminate, "
        "1 native_crash) that oomguard retried without using task retries.",
        started=DOC_T0,
    ),
    PipelineStatus(
        "nightly-load",
        "aborted",
        41,
        1,
        58,
        2,
        0,
        f"a worker was OOM-killed by the kernel at shard {_REPART} 2 times; the "
        "pipeline was aborted; 41 shards had finished, 58 are being aborted.",
        f"oomguard aborted pipeline 'nightly-load' because shard {_REPART} failed 2 "
        "times: its worker was OOM-killed by the kernel each time (last time: kernel "
        "oom_kill counted, peak 1.01 GiB of a 1 GiB limit). Crash signature: oom_kill "
        "in shardapp.core.load_shard ← run (id 6d4c109d5cf8c83f). Workers: "
        "tcp://10.0.3.11:40211, tcp://10.0.3.12:39117; hosts: 10.0.3.11, 10.0.3.12.",
        started=DOC_T0,
    ),
]


def _killer(cause: str) -> dict:
    """What the cause alone says of the killer, as a death's event holds it."""
    if cause in ("exception", "memory_error"):
        return {}
    k = for_cause(cause)
    return {
        "killer": k.name,
        "killer_how": k.how,
        "killer_confidence": k.confidence,
        "killer_summary": k.summary,
    }


#: The cluster whose history the docs show (oomguard.scheduler.cluster-name).
DOC_CLUSTER = "prod-etl"
#: A task of another pipeline that ran beside the first OOM kill's culprit.
DOC_DISPLACED = ("('load-0a1b', 16)", "per-file")


def build_doc_store(path) -> None:
    """The store the captures in the docs were taken from (`oomguard.sqlite3`, TZ=UTC)."""
    store = FailureStore(str(path), batch_interval=0.01)
    store.start()
    for i, (kind, cause, shard, pipe, host, worker, sig, title, attempt, ev) in enumerate(
        DOC_ROWS
    ):
        store_failure(
            store,
            FailureEvent(
                kind=kind,
                cause=cause,
                shard=shard,
                pipeline=pipe,
                worker=worker,
                host=host,
                signature_id=sig,
                signature_title=title,
                evidence=ev,
                attempt=attempt,
                time=DOC_T0 + i * 97,
                **_killer(cause),
                cluster=DOC_CLUSTER,
            ),
            example=title,
            # The first OOM kill took a task of another pipeline with it: displaced.
            displaced=[DOC_DISPLACED] if i == 0 else [],
        )
        if i == 0:  # resolved after the first OOM kill: the second makes it regressed
            store.resolve(
                "6d4c109d5cf8c83f", note="memory raised to 2 GiB", by="maria", at=DOC_T0 + 60
            )
    store.resolve("77aa88bb99cc00dd", note="fixed in shardapp 2.3.1", by="maria", at=DOC_T0 + 900)
    for status in DOC_PIPELINES:
        store.upsert_pipeline(dataclasses.replace(status, cluster=DOC_CLUSTER))
    assert store.flush(), store.last_error
    store.close()


@pytest.mark.parametrize(
    "columns, argv",
    [
        (80, []),
        (160, []),
        (80, ["--shard", _REPART]),
        (80, ["--shard", "('load-0a1b', 17)", "--events", "--cause", "sigkill"]),
        (80, ["--shard", DOC_DISPLACED[0], "--deaths"]),
    ],
    ids=["80", "160", "shard-80", "no-events-80", "displaced-80"],
)
def test_the_docs_show_what_the_report_prints(tmp_path, columns, argv):
    """The tmux captures in docs/reading-a-report.md are this output, character for character."""
    build_doc_store(tmp_path / "oomguard.sqlite3")
    env = {**os.environ, "COLUMNS": str(columns), "TZ": "UTC", "PYTHONIOENCODING": "utf-8"}
    proc = subprocess.run(
        [sys.executable, "-m", "oomguard._cli", "report", "--store", "oomguard.sqlite3", *argv],
        cwd=tmp_path,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=180,
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    doc = (pathlib.Path(__file__).parents[2] / "docs" / "reading-a-report.md").read_text()
    assert proc.stdout.rstrip("\n") + "\n```" in doc
    assert max(map(len, proc.stdout.splitlines())) <= columns


# -- --shard: what is a task key -----------------------------------------------------------------


@pytest.mark.parametrize(
    "shard",
    [
        "",
        "   ",
        "('load', 7",
        "'load', 7)",
        "(load, 7)",
        "('load', [7])",
        "('load')",
        "('load', None)",
        "load\n7",
    ],
)
def test_a_malformed_shard_is_refused_in_one_line(history, capsys, shard):
    rc, out, err = report(capsys, "--store", history, "--shard", shard)
    assert (rc, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("oomguard report: argument --shard: "), err
    assert "task key" in err and "('load-0a1b', 17)" in err  # what a key looks like


@pytest.mark.parametrize("shard", ['("load", 7)', "('load',7)", " ('load', 7) "])
def test_a_shard_written_another_way_finds_its_events(history, capsys, shard):
    rc, out, _ = report(capsys, "--store", history, "--shard", shard)
    assert rc == 0 and "EVENTS: 2, oldest first" in out and "('load', 7)" in out
    rc, out, _ = report(capsys, "--store", history, "--shard", shard, "--json")
    assert json.loads(out)["events"] == store_api(history, "shard", key="('load', 7)")


@pytest.mark.parametrize("shard", ["('load', 99)", "load-0a1b", "17", "(('x', 1), 2.5)"])
def test_a_shard_the_history_does_not_have_is_named_and_exits_3(history, capsys, shard):
    # As --pipeline does: never an empty report that exits 0 (issue 41).
    for narrowing in ([], ["--kind", "infra"], ["--json"]):
        rc, out, err = report(capsys, "--store", history, "--shard", shard, *narrowing)
        assert (rc, out) == (3, ""), err
        assert err.startswith(f"oomguard report: --shard {shard!r} names no shard in the history")
        assert "('load', 7)" in err and err.count("\n") == 1


def test_a_shard_with_no_events_matching_the_filters_says_so(history, capsys):
    rc, out, err = report(capsys, "--store", history, "--shard", "('load', 3)", "--kind", "user")
    assert rc == 0 and err == ""
    assert "with these filters, no events for shard ('load', 3)" in out


# -- filters and the JSON round trip -----------------------------------------------------------


FILTERS = [
    ([], {}),
    (["--kind", "user"], dict(kind="user")),
    (["--cause", "oom_kill"], dict(cause="oom_kill")),
    (["--pipeline", "backfill"], dict(pipeline="backfill")),
    (["--signature", "sig-segv"], dict(signature="sig-segv")),
    (["--since", "90m"], "since-90m"),
    (["--limit", "2"], dict(limit=2)),
    (["--cause", "exception", "--pipeline", "etl"], dict(cause="exception", pipeline="etl")),
    (["--shard", "('load', 3)", "--limit", "1"], dict(shard="('load', 3)", limit=1)),
]


def _filter_id(v):
    return " ".join(v) or "none" if isinstance(v, list) else ""


@pytest.mark.parametrize("argv, query", FILTERS, ids=_filter_id)
def test_json_events_equal_the_store_api(history, capsys, argv, query):
    before = sha256(history)
    rc, out, err = report(capsys, "--store", history, "--events", "--json", *argv)
    assert rc == 0 and err == ""
    rows = json.loads(out)["events"]
    if query == "since-90m":
        # The boundary moves with the clock: check the rows against it, and the ends.
        cut = time.time() - 90 * 60
        assert rows and all(r["time"] >= cut - 5 for r in rows)
        query = dict(since=rows[-1]["time"])
    assert sha256(history) == before
    expected = store_api(history, "events", **{"limit": 1000, **query})
    assert rows == expected
    assert [FailureEvent.from_dict(r).to_dict() for r in rows] == rows
    if argv:
        assert 0 < len(rows) < len(ROWS)  # the filter did narrow, to something


def test_json_round_trips_all_five_sections(history, capsys):
    rc, out, _ = report(capsys, "--store", history, "--json")
    doc = json.loads(out)
    assert list(doc) == ["incidents", "deaths", "events", "signatures", "pipelines"]
    assert doc["incidents"] == store_api(history, "incidents", limit=1000)
    assert doc["deaths"] == store_api(history, "deaths")
    deaths = [Death.from_dict(r) for r in doc["deaths"]]
    # Each death names its incident, and each incident counts its deaths.
    incidents = [Incident.from_dict(r) for r in doc["incidents"]]
    assert sum(i.deaths for i in incidents) == len(deaths)
    assert {d.incident for d in deaths} == {i.id for i in incidents}
    assert len(deaths) == sum(r[0] == "infra" for r in ROWS)  # one per death, none twice
    assert {e["death"] for e in doc["events"] if e["kind"] == "infra"} == {d.id for d in deaths}
    assert doc["events"] == store_api(history, "events")
    assert doc["signatures"] == store_api(history, "signatures")
    assert doc["pipelines"] == store_api(history, "pipelines")
    events = [FailureEvent.from_dict(r) for r in doc["events"]]
    assert {(e.shard, e.cause, e.host) for e in events} == {(r[2], r[1], r[4]) for r in ROWS}
    assert all(isinstance(e.evidence, dict) and e.id for e in events)
    sigs = [SignatureRow.from_dict(r) for r in doc["signatures"]]
    assert {s.id: s.count for s in sigs} == {"sig-oom": 3, "sig-key": 2, "sig-segv": 2}
    assert {s.id: s.hosts for s in sigs}["sig-oom"] == ["node-a", "node-b"]
    assert [PipelineStatus.from_dict(r).status for r in doc["pipelines"]] == [
        "aborted",
        "succeeded_after_infra_failures",
    ]


def test_json_shard_alone_is_the_shard_history(history, capsys):
    rc, out, _ = report(capsys, "--store", history, "--json", "--shard", "('load', 3)")
    doc = json.loads(out)
    assert doc["events"] == store_api(history, "shard", key="('load', 3)")
    assert [e["attempt"] for e in doc["events"]] == [1, 2]
    assert [s["id"] for s in doc["signatures"]] == ["sig-segv"]
    assert [p["name"] for p in doc["pipelines"]] == ["backfill"]


def test_signature_and_pipeline_filters_narrow_their_sections(history, capsys):
    rc, out, _ = report(
        capsys, "--store", history, "--json", "--cause", "native_crash", "--signatures"
    )
    assert json.loads(out)["signatures"] == store_api(history, "signatures", cause="native_crash")
    assert [s["id"] for s in json.loads(out)["signatures"]] == ["sig-segv"]
    rc, out, _ = report(capsys, "--store", history, "--json", "--pipeline", "etl", "--pipelines")
    assert json.loads(out)["pipelines"] == store_api(history, "pipeline", name="etl")
    # Issue 27: a name the history does not have is said, with exit 3 (it was 0 and empty
    # sections, exactly as for a known pipeline with nothing to show).
    rc, out, err = report(capsys, "--store", history, "--json", "--pipeline", "etll")
    assert (rc, out) == (3, ""), (rc, out, err)
    assert err.startswith("oomguard report: --pipeline 'etll' names no pipeline in the "), err
    assert "did you mean 'etl'?" in err, err
    rc, out, err = report(capsys, "--store", history, "--signature", "sig-segg")
    assert rc == 3 and "did you mean 'sig-segv'?" in err, (rc, err)
    rc, out, _ = report(
        capsys, "--store", history, "--json", "--pipeline", "etl", "--cause", "sigterm"
    )
    assert rc == 0 and json.loads(out)["events"] == []  # known, excluded by --cause


def test_the_examples_in_docstrings_hold():
    import doctest

    from oomguard._cli import layout as _layout
    from oomguard._cli import report as _cli_report

    assert doctest.testmod(_cli_report).failed == 0
    assert doctest.testmod(_layout).attempted and doctest.testmod(_layout).failed == 0


def test_since_accepts_iso_and_relative_times():
    assert parse_since("30m", now=10_000.0) == 8_200.0
    assert parse_since("1h", now=10_000.0) == 6_400.0
    assert parse_since("2026-05-01T12:00:00+00:00") == 1777636800.0
    assert parse_since("2026-05-01T12:00:00Z") == 1777636800.0
    naive = datetime.datetime(2026, 5, 1, 12, 0)
    assert parse_since("2026-05-01 12:00") == naive.timestamp()  # local time


# -- errors: one line, the right status ----------------------------------------------------------


@pytest.mark.parametrize(
    "argv, code, words",
    [
        (["--limit", "-1"], 2, "--limit"),
        (["--limit", "many"], 2, "--limit"),
        (["--cause", "oom"], 2, "--cause: 'oom' is not a cause; expected one of oom_kill,"),
        (["--cause", "oom"], 2, "(did you mean 'oom_kill'?)"),
        (["--killer", "earlyom"], 2, "(did you mean 'earlyoom'?)"),
        (["--kind", "Infra"], 2, "(did you mean 'infra'?)"),
        (["--kind", "both"], 2, "--kind"),
        (["--since", "yesterday"], 2, "--since"),
        (["--since", "2026-13-45"], 2, "--since"),
        (["--timeout", "0"], 2, "--timeout"),
        (["--scheduler", "tcp://127.0.0.1:1"], 2, "not allowed with"),
        (["--colour"], 2, "unrecognized arguments: --colour"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(history, capsys, argv, code, words):
    rc, out, err = report(capsys, "--store", history, *argv)
    assert (rc, out) == (code, "")
    assert err.count("\n") == 1 and err.startswith("oomguard report: ") and words in err


@pytest.mark.parametrize("url", ["mysql://u:secret@db/x", "sqlite:///tmp/x.sqlite3"])
def test_a_store_of_an_unknown_scheme_names_the_schemes_there_are(capsys, url):
    rc, out, err = report(capsys, "--store", url)
    assert (rc, out) == (2, "")
    assert err.count("\n") == 1 and "which oomguard does not know" in err
    assert "a path to a SQLite file or a PostgreSQL URL, postgresql:// or postgres://" in err
    assert "secret" not in err and "does not exist" not in err


def test_scheduler_address_setting_is_the_default(capsys):
    import dask

    with dask.config.set({"scheduler-address": "tcp://127.0.0.1:1"}):
        rc, out, err = report(capsys, "--events", "--timeout", "1")
    assert rc == 1
    assert err.startswith("oomguard report: ") and "127.0.0.1:1" in err


def _other_app(path):
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")


def _empty_sqlite(path):
    sqlite3.connect(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("VACUUM")  # a valid, empty SQLite file


@pytest.mark.parametrize(
    "make, words",
    [
        (None, "does not exist"),
        (lambda p: p.mkdir(), "is not a file"),
        (lambda p: p.write_bytes(b""), "is empty"),
        (lambda p: p.write_bytes(b"not a database at all\n" * 200), "not a SQLite database"),
        (lambda p: p.write_bytes(b"SQLite format 3\x00" + os.urandom(8192)), "failure store"),
        (_other_app, "another application"),
        (_empty_sqlite, "empty SQLite database"),
    ],
    ids=["missing", "directory", "empty", "text", "corrupt", "other-app", "empty-sqlite"],
)
def test_unusable_store_files_are_one_line_exit_1_and_untouched(tmp_path, capsys, make, words):
    path = tmp_path / "store.sqlite3"
    if make is not None:
        make(path)
    before = sorted(os.listdir(tmp_path))
    digest = sha256(path) if path.is_file() else None
    rc, out, err = report(capsys, "--store", path)
    assert (rc, out) == (1, "")
    assert err.count("\n") == 1 and err.startswith("oomguard report: ") and words in err, err
    assert sorted(os.listdir(tmp_path)) == before  # nothing created, not even the file
    if digest is not None:
        assert sha256(path) == digest


def test_the_installed_script_prints_one_line_and_no_traceback(tmp_path):
    require(OOMGUARD.exists(), f"no {OOMGUARD} (package not installed as a script)")
    for argv, code in (
        (["--store", tmp_path / "nope"], 1),
        (["--store", "x", "--limit", "-1"], 2),
    ):
        proc = subprocess.run(
            [str(OOMGUARD), "report", *map(str, argv)], capture_output=True, text=True, timeout=180
        )
        assert proc.returncode == code and proc.stdout == ""
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("oomguard report: ")


# -- the file is only read -------------------------------------------------------------------------


_CRASHING_WRITER = textwrap.dedent(
    """
    import os, sys
    sys.path[:0] = {paths!r}
    from test_cli_report import ROWS, _event
    from oomguard._store import FailureStore
    store = FailureStore({path!r}, batch_interval=0.01)
    store.start()
    for i, row in enumerate(ROWS):
        store.add(_event(i, *row))
    assert store.flush()
    os._exit(0)  # a scheduler that died: its commits are in the WAL, not the main file
    """
)


def test_commits_only_in_the_wal_are_read_and_nothing_is_checkpointed(tmp_path, capsys):
    path = tmp_path / "store.sqlite3"
    here = str(pathlib.Path(__file__).parent)
    code = _CRASHING_WRITER.format(paths=[here, *sys.path], path=str(path))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=180)
    wal = pathlib.Path(f"{path}-wal")
    assert wal.stat().st_size > 0
    main_before, wal_before = sha256(path), sha256(wal)
    rc, out, _ = report(capsys, "--store", path, "--json", "--events")
    assert rc == 0 and len(json.loads(out)["events"]) == len(ROWS)
    assert (sha256(path), sha256(wal)) == (main_before, wal_before)


def test_a_store_needing_a_migration_is_read_from_a_copy(tmp_path, capsys, monkeypatch):
    path = tmp_path / "store.sqlite3"
    _build(path)
    digest = sha256(path)
    newer = (*FailureStore.migrations, ("CREATE TABLE added_later (x)",))
    monkeypatch.setattr(FailureStore, "migrations", newer)  # this oomguard knows one more
    rc, out, _ = report(capsys, "--store", path, "--json")
    assert rc == 0 and len(json.loads(out)["events"]) == len(ROWS)
    assert sha256(path) == digest and sorted(os.listdir(tmp_path)) == ["store.sqlite3"]


def test_a_store_of_schema_1_is_read_from_a_migrated_copy(tmp_path, capsys):
    from oomguard._store import MIGRATIONS

    path = tmp_path / "store.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in MIGRATIONS[0]:  # the released schema 1: one row per pipeline name
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(
        "INSERT INTO pipelines VALUES ('etl', 'failed', 3, 1, 0, 0, 1, 'oops', '', ?)", (T0,)
    )
    conn.close()
    digest = sha256(path)
    rc, out, _ = report(capsys, "--store", path, "--json", "--pipelines")
    assert rc == 0
    assert json.loads(out)["pipelines"] == [
        PipelineStatus("etl", "failed", 3, 1, 0, 0, 1, "oops", started=0.0).to_dict()
    ]
    assert sha256(path) == digest and sorted(os.listdir(tmp_path)) == ["store.sqlite3"]


def test_a_store_not_in_wal_mode_is_read_from_a_copy(tmp_path, capsys):
    path = tmp_path / "store.sqlite3"
    _build(path)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode = DELETE").fetchone() == ("delete",)
    conn.close()
    digest = sha256(path)
    rc, out, _ = report(capsys, "--store", path, "--json", "--signatures")
    assert rc == 0 and len(json.loads(out)["signatures"]) == 3
    assert sha256(path) == digest and sorted(os.listdir(tmp_path)) == ["store.sqlite3"]
