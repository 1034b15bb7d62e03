"""`oomguard report` with incidents and related signatures: the INCIDENTS section (the
incidents of several deaths, the rest counted), `--incidents`, "incidents" in `--json`,
the related signatures under SIGNATURES and all of them with `--signature ID`; and the
captures of docs/reading-a-report.md ("Incidents", "Related signatures"), character for
character."""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import subprocess
import sys

import pytest

from _cli_run import report
from oomguard import FailureEvent, Incident, SignatureRow
from oomguard._death.killer import for_cause
from oomguard._death.record import Attribution, Death, Role, Task
from oomguard._decide.accounts import death_id
from oomguard._store import FailureStore

T0 = datetime.datetime(2026, 12, 3, 9, 30, tzinfo=datetime.UTC).timestamp()
SIGKILL = Attribution(
    "unknown",
    "inferred",
    "likely",
    "SIGKILL from an unknown sender: not the kernel (oom_kill unchanged, no kernel log line)",
)
#: The signatures of two native crashes reached from two callers of one native site.
PARSE_RECORD = ("e5b1c0d2a3f49687", "SIGSEGV in shardapp.core.parse_record ← process_shard")
PARSE_HEADER = ("7a90c4e2d1b3f586", "SIGSEGV in shardapp.core.parse_header ← process_header")
IDLE = ("5c0ffee2d00d4a11", "sigkill in <no task>")
SITES = {
    PARSE_RECORD: ("SIGSEGV in ctypes.string_at", "SIGSEGV in shardapp.core.parse_record"),
    PARSE_HEADER: ("SIGSEGV in ctypes.string_at", "SIGSEGV in shardapp.core.parse_header"),
}


def _death(n: int, t: float, signature: tuple[str, str], **kw) -> Death:
    fields = dict(
        id=death_id(f"tcp://10.0.4.7:{40100 + n}", T0 + t),
        cluster="etl-nightly",
        worker=f"tcp://10.0.4.7:{40100 + n}",
        host="ip-10-0-4-7",
        cause="sigkill",
        time=T0 + t,
        killer=SIGKILL,
        signature_id=signature[0],
        signature_title=signature[1],
        sites=SITES.get(signature, ()),
        tasks=(Task(key=f"('scan', {n})", prefix="scan", role=Role.CULPRIT, pipeline="scan"),),
        evidence={"summary": "SIGKILL from an unknown sender"},
    )
    fields.update(kw)
    return Death(**fields)


def build_incident_store(path) -> None:
    """Three workers of one host SIGKILLed within 0.3 s (one incident), and two segfaults of
    one native crash site reached from two callers, on other hosts, later."""
    store = FailureStore(str(path), batch_interval=0.01)
    store.start()
    first = _death(1, 0.0, IDLE)
    deaths = [first, *(_death(n, n / 10, IDLE, incident=first.id) for n in (2, 3))]
    crash = for_cause("native_crash")
    for n, signature, host in ((4, PARSE_RECORD, "ip-10-0-4-8"), (5, PARSE_HEADER, "ip-10-0-4-9")):
        deaths.append(
            _death(n, 300.0 + n, signature, host=host, cause="native_crash", killer=crash)
        )
    for d in deaths:
        event = FailureEvent(
            "infra", d.cause, d.tasks[0].key, "scan", d.worker, d.host, d.signature_id,
            d.signature_title, dict(d.evidence), 1, d.time, killer=d.killer.name,
            killer_how=d.killer.how, killer_confidence=d.killer.confidence,
            killer_summary=d.killer.summary, cluster=d.cluster, death=d.id,
        )  # fmt: skip
        assert store.record(d, [event], example=d.signature_title), store.last_error
    assert store.flush(), store.last_error
    store.close()


@pytest.fixture
def history(tmp_path):
    path = tmp_path / "oomguard.sqlite3"
    build_incident_store(path)
    return path


def test_the_incidents_section_shows_an_incident_of_three_in_one_row(history, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    rc, out, err = report(capsys, "--store", history)
    assert (rc, err) == (0, "")
    incidents = out.split("\n\n")[0].splitlines()
    assert incidents[0].startswith("INCIDENTS: 3, newest first")
    (row,) = [ln for ln in incidents if ln.startswith("2026-")]
    assert row.split()[2:5] == ["3", "sigkill", "unknown"]
    assert "host ip-10-0-4-7: 3 workers within 0.3 s, sigkill; SIGKILL from" in " ".join(incidents)
    assert incidents[-1] == "  2 of one death each: DEATHS below"


def test_json_has_the_incidents_each_death_names(history, capsys):
    rc, out, _ = report(capsys, "--store", history, "--json", "--incidents", "--deaths")
    doc = json.loads(out)
    assert list(doc) == ["incidents", "deaths"]
    incidents = [Incident.from_dict(r) for r in doc["incidents"]]
    assert [(i.deaths, i.place) for i in incidents] == [
        (1, "host ip-10-0-4-9"),
        (1, "host ip-10-0-4-8"),
        (3, "host ip-10-0-4-7"),
    ]
    by_incident = {}
    for d in map(Death.from_dict, doc["deaths"]):
        by_incident.setdefault(d.incident, []).append(d.id)
    assert {i.id: i.deaths for i in incidents} == {k: len(v) for k, v in by_incident.items()}


def test_filters_narrow_the_incidents(history, capsys):
    rc, out, _ = report(capsys, "--store", history, "--json", "--incidents", "--cause", "sigkill")
    assert [i["deaths"] for i in json.loads(out)["incidents"]] == [3]
    # --shard: the incidents of the deaths it was in.
    rc, out, _ = report(
        capsys, "--store", history, "--json", "--incidents", "--shard", "('scan', 2)"
    )
    assert [i["deaths"] for i in json.loads(out)["incidents"]] == [3]
    rc, out, _ = report(capsys, "--store", history, "--incidents", "--kind", "user")
    assert "INCIDENTS: 0" in out and "no incidents match these filters" in out


def test_related_signatures_under_signatures_and_with_signature_id(history, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    rc, out, _ = report(capsys, "--store", history, "--signatures", "--signature", PARSE_RECORD[0])
    assert rc == 0
    said = " ".join(out.split())
    assert f"related {PARSE_HEADER[0]} (same crash site): {PARSE_HEADER[1]}" in said
    rc, out, _ = report(capsys, "--store", history, "--signatures")
    block = out.split(PARSE_HEADER[0], 1)[1].splitlines()[:4]  # its row, clusters, title
    assert f"    related {PARSE_RECORD[0]} (same crash site)" in block, block
    rc, out, _ = report(capsys, "--store", history, "--json", "--signatures")
    rows = {r["id"]: SignatureRow.from_dict(r) for r in json.loads(out)["signatures"]}
    assert rows[PARSE_HEADER[0]].related == [
        {"id": PARSE_RECORD[0], "title": PARSE_RECORD[1], "why": "same crash site"}
    ]
    assert rows[IDLE[0]].related == []  # one signature for the whole incident: none other


@pytest.mark.parametrize(
    "columns, argv",
    [(80, ["--incidents"]), (80, ["--signatures", "--signature", PARSE_RECORD[0]])],
    ids=["incidents-80", "related-80"],
)
def test_the_docs_show_what_the_report_prints(tmp_path, columns, argv):
    """The captures in docs/reading-a-report.md are this output, character for character."""
    build_incident_store(tmp_path / "oomguard.sqlite3")
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
    assert proc.stdout.rstrip("\n") + "\n```" in doc, proc.stdout
    assert max(map(len, proc.stdout.splitlines())) <= columns


# -- the Python API's list, and the dashboard's data -------------------------------------------


def incident(**kw) -> Incident:
    fields = dict(
        id="b85d532796073ace", start=T0, end=T0 + 0.3, deaths=3, hosts=["ip-10-0-4-7"],
        cause="sigkill", killer="unknown", summary="host ip-10-0-4-7: 3 workers within 0.3 s",
        cluster="etl-nightly", place="host ip-10-0-4-7", signatures=[IDLE[0]],
    )  # fmt: skip
    fields.update(kw)
    return Incident(**fields)


def test_an_incident_list_is_a_list_a_table_and_a_dataframe():
    import importlib.util

    from capabilities import require
    from oomguard._client.results import IncidentList

    rows = IncidentList([incident(), incident(id="x", deaths=1, place="<b>host</b>")], "newest")
    assert type(rows[:1]) is IncidentList and rows[0].deaths == 3
    assert repr(rows[0]).startswith("<Incident 2026-12-03") and "deaths=3" in repr(rows[0])
    assert Incident.from_dict(rows[0].to_dict()) == rows[0]
    html = rows._repr_html_()
    assert "2 incidents, newest" in html and "&lt;b&gt;host&lt;/b&gt;" in html
    require(importlib.util.find_spec("pandas"), "pandas is not installed (the test extra has it)")
    import pandas as pd

    df = rows.to_pandas()
    assert list(df["deaths"]) == [3, 1] and df["end"].iloc[0] == pd.Timestamp(
        T0 + 0.3, unit="s", tz="UTC"
    )


def test_the_dashboard_lists_incidents_and_a_signatures_related_ones():
    from oomguard.scheduler_plugin._dashboard_data import incident_columns, signature_detail

    cols = incident_columns([incident(), incident(id="x", deaths=1)])
    assert cols["deaths"] == [3, 1] and cols["start"][0] == T0 * 1000
    assert cols["summary"][0] == "host ip-10-0-4-7: 3 workers within 0.3 s"
    related = [{"id": PARSE_HEADER[0], "title": PARSE_HEADER[1], "why": "same crash site"}]
    row = SignatureRow(PARSE_RECORD[0], PARSE_RECORD[1], 2, 1, T0, T0, related=related)
    text = signature_detail(row, [])
    assert f"related    {PARSE_HEADER[0]} (same crash site): {PARSE_HEADER[1]}" in text
    plain = signature_detail(SignatureRow("x", "T", 2, 1, T0, T0), [])
    assert "related    -" in plain


def test_an_incidents_query_is_bounded_as_every_list_is():
    from oomguard.scheduler_plugin._query_bounds import QUERY_MAX_BYTES, QUERY_MAX_ROWS, bounded

    assert bounded("incidents", {"limit": None, "offset": 5}) == {
        "limit": QUERY_MAX_ROWS,
        "offset": 5,
        "max_bytes": QUERY_MAX_BYTES,
    }
    with pytest.raises(ValueError, match="offset"):
        bounded("incidents", {"offset": -1})
