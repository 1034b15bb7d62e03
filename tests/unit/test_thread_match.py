"""A native crash is charged to the thread that crashed (issue 27): the dump's crashing
thread, the flight record's thread per task, the report's `crashed` mark, and blame."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap

import pytest

from oomguard import ReportError
from oomguard._death import wire
from oomguard._death.build import EXAMPLE, build
from oomguard._death.record import Crash, Death, Task
from oomguard._death.threads import match_crash
from oomguard._decide import DecisionCore, Forgive, Record, Removal, Stop
from oomguard._host.flight import FlightRecorder, read_flight_record
from oomguard._signature._parse import crashing_thread

# Two threads beside the main one: "calm" sleeps, "crash" segfaults. The idents printed
# are `threading.get_ident()`, as Dask's `Worker.active_threads` keys them.
_CRASH_IN_A_THREAD = textwrap.dedent(
    """
    import ctypes, faulthandler, json, sys, threading, time
    faulthandler.enable(file=open(sys.argv[1], "w"), all_threads=True)
    idents = {}
    def calm():
        idents["calm"] = threading.get_ident()
        time.sleep(30)
    def crash():
        idents["crash"] = threading.get_ident()
        while len(idents) < 2:
            time.sleep(0.01)
        print(json.dumps(idents), flush=True)
        time.sleep(0.2)
        ctypes.string_at(0)
    threading.Thread(target=calm, daemon=True).start()
    threading.Thread(target=crash).start()
    time.sleep(30)
    """
)


@pytest.fixture(scope="module")
def real_dump(tmp_path_factory):
    path = tmp_path_factory.mktemp("dump") / "crash.txt"
    run = subprocess.run(
        [sys.executable, "-c", _CRASH_IN_A_THREAD, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == -11, run.stderr
    return path.read_text(), json.loads(run.stdout)


def test_the_dumps_crashing_thread_is_the_ident_the_task_ran_on(real_dump):
    text, idents = real_dump
    assert crashing_thread(text) == idents["crash"]
    assert f"Thread {idents['calm']:#018x}" in text  # the other one is named, not marked


def test_no_thread_marked_is_none():
    assert crashing_thread("Fatal Python error: Segmentation fault\n\n") is None
    assert crashing_thread("Thread 0x00007f01 (most recent call first):\n") is None
    assert crashing_thread("") is None


def _entries(idents, **threads):
    return [Task(k, thread=idents.get(v, v)) for k, v in threads.items()]


def test_the_crashing_threads_task_is_found(real_dump):
    text, idents = real_dump
    tasks = _entries(idents, **{"calm-task": "calm", "crash-task": "crash"})
    hit = match_crash("SIGSEGV", text, tasks)
    assert hit.task == 1 and hit.missing == []
    assert hit.evidence == {"crash_thread": hex(idents["crash"]), "crash_task": "crash-task"}


@pytest.mark.parametrize(
    "threads, why",
    [
        ({"calm-task": "calm"}, "ran none of the 1 executing tasks (threads known for 1)"),
        ({"a": 0, "b": 0}, "ran none of the 2 executing tasks (threads known for 0)"),
        ({"a": "crash", "b": "crash"}, "ran 2 of the 2 executing tasks"),
    ],
)
def test_a_dump_whose_thread_matches_no_single_task_falls_back_and_says_so(
    real_dump, threads, why
):
    text, idents = real_dump
    hit = match_crash("SIGSEGV", text, _entries(idents, **threads))
    assert hit.task is None
    assert why in hit.evidence["crash_thread_match"]
    assert hit.evidence["crash_thread_match"].endswith("every executing task is blamed")
    assert hit.missing == [f"crash thread: {hit.evidence['crash_thread_match']}"]


def test_a_dump_that_marks_no_thread_falls_back_and_says_so(real_dump):
    text, idents = real_dump
    cut = text[: text.index("Current thread")]  # truncated before the crashing thread
    hit = match_crash("SIGSEGV", cut, _entries(idents, a="calm", b="crash"))
    assert hit.task is None and "marks no crashing thread" in hit.evidence["crash_thread_match"]


@pytest.mark.parametrize("signal", ["SIGTERM", None])
def test_only_the_fatal_signals_name_a_culprit_thread(real_dump, signal):
    text, idents = real_dump
    hit = match_crash(signal, text, _entries(idents, a="calm", b="crash"))
    assert (hit.task, hit.evidence, hit.missing) == (None, {}, [])


def test_the_report_marks_the_crashed_task_and_lists_it_first(real_dump):
    text, idents = real_dump
    executing = [
        {"key": "calm-task", "start": 1.0, "thread": idents["calm"]},
        {"key": "crash-task", "start": 2.0, "thread": idents["crash"]},
    ]
    r = build_report(exitcode=-11, crash_text=text, executing=executing)
    assert r["cause"] == "native_crash"
    assert [(e["key"], e["crashed"]) for e in r["executing"]] == [
        ("crash-task", True),
        ("calm-task", False),
    ]
    assert r["evidence"]["crash_task"] == "crash-task"
    assert wire.to_wire(wire.validate(r)) == r


def test_a_report_without_a_match_says_so_in_its_evidence_and_notes(real_dump):
    text, _ = real_dump
    executing = [{"key": "a", "start": 1.0, "thread": 5}, {"key": "b", "start": 2.0, "thread": 6}]
    r = build_report(exitcode=-11, crash_text=text, executing=executing)
    assert [e["crashed"] for e in r["executing"]] == [False, False]
    assert "every executing task is blamed" in r["evidence"]["crash_thread_match"]
    assert any(m.startswith("crash thread: ") for m in r["missing"])


def test_a_sigkill_report_marks_nothing():
    executing = [{"key": "a", "start": 1.0, "thread": 5}]
    r = build_report(executing=executing)
    assert r["executing"][0]["crashed"] is None and "crash_thread" not in r["evidence"]


def test_the_wire_checks_the_crashed_mark():
    r = build_report(executing=[{"key": "a", "start": 1.0}])
    r["executing"][0]["crashed"] = "yes"
    with pytest.raises(ReportError, match=r"executing\[0\]\.crashed: must be bool or None"):
        wire.validate(r)
    del r["executing"][0]["crashed"]  # a report from an older nanny
    assert wire.validate(r).tasks[0].crashed is None


def test_the_flight_record_keeps_each_tasks_thread(tmp_path):
    rec = FlightRecorder.create(str(tmp_path / "f"), nslots=2)
    a = rec.task_started("a")
    rec.task_started("b")
    rec.task_thread(a, 0x7F0012345678)
    got = {t["key"]: t["thread"] for t in read_flight_record(rec.path)["executing"]}
    assert got == {"a": 0x7F0012345678, "b": 0}
    rec.task_finished(a)
    assert rec.task_started("c") == a  # a reused slot forgets its last thread
    got = {t["key"]: t["thread"] for t in read_flight_record(rec.path)["executing"]}
    assert got == {"b": 0, "c": 0}


def _crash_report(worker, executing, crashed, **fields):
    return Death(
        **{
            "worker": worker,
            "pid": 7,
            "cause": "native_crash",
            "host": "h",
            "time": 1.0,
            "crash": Crash("SIGSEGV", "Fatal Python error: Segmentation fault\n"),
            "tasks": tuple(Task(k, k, crashed=k == crashed) for k in executing),
            **fields,
        }
    )


def test_only_the_crashed_task_is_blamed_its_neighbour_is_displaced():
    c = DecisionCore(allowed_failures=3, grace=5.0)
    ann = {"span": {"calm": {"name": ("calm",), "ids": ("c1",)}}}
    ann["span"]["crash"] = {"name": ("crash",), "ids": ("x1",)}
    c.submitted(["calm", "crash"], ["calm", "crash"], ann, now=0.0)
    for n in range(3):
        t = 1.0 + n
        c.removed(
            Removal(
                "tcp://w:1", "h", t, {"calm": "calm", "crash": "crash"}, nthreads=2, pid=7 + n
            ),
            now=t,
        )
        rep = _crash_report("tcp://w:1", ["calm", "crash"], "crash", pid=7 + n, time=t)
        out = c.reported(rep, now=t + 0.1)
        [record] = [d for d in out if isinstance(d, Record)]
        assert [e.shard for e in record.events] == ["crash"]
        assert record.death.role_of("calm") == "displaced"
        [forgive] = [d for d in out if isinstance(d, Forgive)]
        assert forgive.keys == ("calm",)
        stops = [d for d in out if isinstance(d, Stop)]
        assert all(s.keys == ("crash",) for s in stops)
        if stops:
            break
    assert stops, "the crasher was never stopped"
    [calm] = [p for p in c.policy.pipelines() if c.policy.status(p).name == "calm"]
    status = c.policy.status(calm)
    assert status.status != "aborted"
    assert "displaced by a neighbour's crash" in status.summary
    # It says whose death took its work.
    assert "lost their work 3 times to worker deaths of pipeline 'crash'" in status.summary


def test_without_a_match_both_are_blamed_as_before():
    c = DecisionCore(allowed_failures=3, grace=5.0)
    c.submitted(["calm", "crash"], ["calm", "crash"], {}, now=0.0)
    c.removed(
        Removal("tcp://w:1", "h", 1.0, {"calm": "calm", "crash": "crash"}, nthreads=2, pid=7),
        now=1.0,
    )
    out = c.reported(_crash_report("tcp://w:1", ["calm", "crash"], None), now=1.1)
    [record] = [d for d in out if isinstance(d, Record)]
    assert sorted(e.shard for e in record.events) == ["calm", "crash"]
    assert {t.role for t in record.death.tasks} == {"suspect"}
    assert not [d for d in out if isinstance(d, Forgive)]


def test_the_examples_in_the_docstrings_hold():
    import doctest

    from oomguard._death import threads
    from oomguard._decide import blame

    for module in (threads, blame):
        result = doctest.testmod(module)
        assert result.attempted and result.failed == 0, module.__name__


def build_report(**seen):
    """What a nanny sends (its `Death` on the wire), from the fields it saw."""
    return wire.to_wire(build(dataclasses.replace(EXAMPLE, **seen)))
