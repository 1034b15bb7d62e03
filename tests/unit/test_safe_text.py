"""Texts from outside made safe at the door (`oomguard._safe_text`, issue 39): printable,
bounded, no NUL; the identity on safe text, idempotent; and each door: a run's name, a
stored row, a query's filter."""

from __future__ import annotations

import doctest
import time

from hypothesis import given
from hypothesis import strategies as st

from oomguard import FailureEvent, PipelineStatus, _safe_text
from oomguard._decide.runs import Runs
from oomguard._safe_text import NAME_BYTES, safe_name, safe_text, safe_value
from oomguard._store import FailureStore
from oomguard.scheduler_plugin._query_bounds import safe_filters

ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=3000)


def test_docstring_examples():
    result = doctest.testmod(_safe_text)
    assert result.attempted > 0 and result.failed == 0


@given(ANY_TEXT)
def test_a_name_is_one_printable_bounded_line_and_stays_so(text):
    name = safe_name(text)
    assert name.isprintable() and len(name.encode()) <= NAME_BYTES
    assert safe_name(name) == name  # idempotent: a filter finds what was stored
    if text.isprintable() and len(text.encode()) <= NAME_BYTES:
        assert name == text  # safe text is left as it is


@given(ANY_TEXT)
def test_prose_keeps_its_lines_and_loses_every_control_character(text):
    prose = safe_text(text, 1000)
    assert not _safe_text._TEXT_BAD.search(prose) and "\x00" not in prose
    assert safe_text(prose, None) == prose
    assert prose.count("\n") == text[:1000].count("\n")


def test_long_names_keep_a_readable_start_and_stay_apart():
    a, b = safe_name("etl-" + "a" * 5000 + "1"), safe_name("etl-" + "a" * 5000 + "2")
    assert a != b and a.startswith("etl-aaaa") and len(a.encode()) == NAME_BYTES
    wide = safe_name("é" * 5000)  # two bytes each: cut on a character, never inside one
    assert wide.startswith("é" * 500) and len(wide.encode()) <= NAME_BYTES


def test_evidence_values_are_escaped_not_cut():
    evidence = {"cmd": "kill\x00 -9", "nested": {"k\x1b": ["a\udcff"]}, "n": 3, "big": "x" * 10**5}
    out = safe_value(evidence, None)
    assert out == {
        "cmd": "kill\\x00 -9",
        "nested": {"k\\x1b": ["a\\udcff"]},
        "n": 3,
        "big": "x" * 10**5,
    }


def test_a_run_is_named_safely_once():
    runs = Runs()
    span = {"name": ("nul\x00", "x" * 3000), "ids": ("id-1", "id-2")}
    (run,) = runs.observe(["k"], ["k"], {"span": {"k": span}}, 0.0)
    assert run.name.startswith("nul\\x00/xxxx") and len(run.name.encode()) <= NAME_BYTES
    assert run.label == run.name


def test_one_hostile_row_no_longer_loses_a_batch_of_the_spool(tmp_path):
    """SQLite refuses a lone surrogate: before, the writer's whole batch (up to 50,000
    writes) was lost with it. Now the row is escaped where it enters the store."""
    store = FailureStore(str(tmp_path / "s.sqlite3"), batch_interval=60)
    store.start()
    try:
        for n in range(100):
            shard = f"k{n}" if n != 50 else "k\udcff\x00"
            event = FailureEvent(
                "user", "exception", shard, "etl\ud800", "w", "h", f"sig-{n}", "T\udcff", {}
            )
            assert store.add(event, example="trace\udcff")
        store.upsert_pipeline(
            PipelineStatus("etl\ud800", "running", 0, 0, 0, 0, 0, "s\udcff", started=time.time())
        )
        assert store.flush() and store.write_errors == 0, store.last_error
        assert len(store.events(limit=None)) == 100
        found = store.events(shard=safe_name("k\udcff\x00"))  # as every door asks
        assert [e.shard for e in found] == ["k\\udcff\\x00"]
        assert store.pipeline("etl\\ud800").summary == "s\\udcff"
    finally:
        store.close()


def test_query_filters_are_made_safe_as_names_are_stored():
    assert safe_filters({"shard": "k\x00", "limit": 3, "cluster": None}) == {
        "shard": "k\\x00",
        "limit": 3,
        "cluster": None,
    }
    try:
        safe_filters({"pipeline": {"$ne": 1}})
    except ValueError as e:
        assert "pipeline" in str(e)
    else:
        raise AssertionError("a filter that is not text was taken")
