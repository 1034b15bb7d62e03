"""Cause classification of worker deaths: the rule table, evidence sources, summaries."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capabilities import require
from oomguard import Cause
from oomguard._death import facts as _facts
from oomguard._death.cause import (
    DeathFacts,
    classify,
    crash_signal,
    describe_signal,
    explain,
)
from oomguard._death.record import Seen
from oomguard._words import evidence_summary


def seen(report_like) -> Seen:
    """What a nanny saw, from the report-like mapping these tests were written in."""
    r = report_like if isinstance(report_like, dict) else {}
    cg = r.get("cgroup") if isinstance(r.get("cgroup"), dict) else {}
    crash = r.get("crash") if isinstance(r.get("crash"), dict) else {}
    plain = ("exitcode", "pid", "time", "memory_limit", "rss_sampled", "rss_time")
    return Seen(
        **{k: r[k] for k in plain if k in r},
        crash_text=crash.get("text"),
        cgroup_version=cg.get("version"),
        cgroup_before=cg.get("before"),
        cgroup_after=cg.get("after"),
        cgroup_placement=cg.get("placement"),
        cgroup_reading=cg.get("reading"),
        host_memory=r.get("host_memory"),
        nanny_memory_kill=r.get("nanny_memory_kill"),
        kernel_log_victim=r.get("kernel_log_victim"),
        requested=bool(r.get("requested_close")),
        flight_read=r.get("flight_record"),
    )


def evidence(report_like):
    return _facts.evidence(seen(report_like))


def facts_from(report_like):
    return _facts.facts_from(seen(report_like))


KILL, TERM = -signal.SIGKILL, -signal.SIGTERM
SEGV, ABRT, BUS, FPE, ILL = (
    -signal.SIGSEGV,
    -signal.SIGABRT,
    -signal.SIGBUS,
    -signal.SIGFPE,
    -signal.SIGILL,
)
MOVED = dict(oom_kill_before=0, oom_kill_after=1)

# (id, facts, cause, rule) -- the table in classify's docstring, row by row, plus precedence.
TABLE = [
    ("close-sigkill", dict(exitcode=KILL, requested_close=True), None, "R1"),
    ("close-oom", dict(exitcode=KILL, requested_close=True, **MOVED), None, "R1"),
    ("close-exit1", dict(exitcode=1, requested_close=True), None, "R1"),
    ("close-segv", dict(exitcode=SEGV, requested_close=True), None, "R1"),
    ("exit0", dict(exitcode=0), None, "R2"),
    ("exit0-child-oom", dict(exitcode=0, **MOVED), None, "R2"),
    ("exit0-nanny", dict(exitcode=0, nanny_memory_kill=True), None, "R2"),
    ("segv", dict(exitcode=SEGV), Cause.NATIVE_CRASH, "R3"),
    ("abrt", dict(exitcode=ABRT), Cause.NATIVE_CRASH, "R3"),
    ("bus", dict(exitcode=BUS), Cause.NATIVE_CRASH, "R3"),
    ("fpe", dict(exitcode=FPE), Cause.NATIVE_CRASH, "R3"),
    ("ill", dict(exitcode=ILL), Cause.NATIVE_CRASH, "R3"),
    ("segv-beats-oom-counter", dict(exitcode=SEGV, **MOVED), Cause.NATIVE_CRASH, "R3"),
    ("segv-beats-kernel-log", dict(exitcode=SEGV, kernel_log_oom=True), Cause.NATIVE_CRASH, "R3"),
    # A crash while the nanny terminates it for memory: the termination came first.
    (
        "nanny-beats-segv",
        dict(exitcode=SEGV, nanny_memory_kill=True),
        Cause.MEMORY_TERMINATE,
        "R3a",
    ),
    ("unknown-crashfile", dict(exitcode=None, crash_signal="SIGSEGV"), Cause.NATIVE_CRASH, "R4"),
    ("255-crashfile", dict(exitcode=255, crash_signal="SIGABRT"), Cause.NATIVE_CRASH, "R4"),
    (
        "crashfile-beats-oom",
        dict(exitcode=None, crash_signal="SIGBUS", **MOVED),
        Cause.NATIVE_CRASH,
        "R4",
    ),
    ("known-exit-beats-crashfile", dict(exitcode=1, crash_signal="SIGSEGV"), Cause.EXIT, "R9"),
    ("sigterm-crashfile-ignored", dict(exitcode=None, crash_signal="SIGTERM"), Cause.EXIT, "R9"),
    ("oom-sigkill", dict(exitcode=KILL, **MOVED), Cause.OOM_KILL, "R5"),
    ("oom-unknown", dict(exitcode=None, **MOVED), Cause.OOM_KILL, "R5"),
    ("oom-255", dict(exitcode=255, oom_kill_before=2, oom_kill_after=3), Cause.OOM_KILL, "R5"),
    ("oom-kernel-log", dict(exitcode=KILL, kernel_log_oom=True), Cause.OOM_KILL, "R5"),
    (
        "oom-beats-nanny",
        dict(exitcode=KILL, nanny_memory_kill=True, **MOVED),
        Cause.OOM_KILL,
        "R5",
    ),
    ("oom-counter-but-sigterm", dict(exitcode=TERM, **MOVED), Cause.SIGTERM, "R7"),
    (
        "oom-counter-sigterm-nanny",
        dict(exitcode=TERM, nanny_memory_kill=True, **MOVED),
        Cause.MEMORY_TERMINATE,
        "R6",
    ),
    ("oom-counter-but-exit1", dict(exitcode=1, **MOVED), Cause.EXIT, "R9"),
    ("before-unreadable", dict(exitcode=KILL, oom_kill_after=1), Cause.SIGKILL, "R8"),
    ("after-unreadable", dict(exitcode=KILL, oom_kill_before=0), Cause.SIGKILL, "R8"),
    (
        "counter-still",
        dict(exitcode=KILL, oom_kill_before=1, oom_kill_after=1),
        Cause.SIGKILL,
        "R8",
    ),
    (
        "counter-reset",
        dict(exitcode=KILL, oom_kill_before=2, oom_kill_after=0),
        Cause.SIGKILL,
        "R8",
    ),
    ("nanny-sigterm", dict(exitcode=TERM, nanny_memory_kill=True), Cause.MEMORY_TERMINATE, "R6"),
    ("nanny-sigkill", dict(exitcode=KILL, nanny_memory_kill=True), Cause.MEMORY_TERMINATE, "R6"),
    ("nanny-unknown", dict(exitcode=None, nanny_memory_kill=True), Cause.MEMORY_TERMINATE, "R6"),
    ("nanny-exit1", dict(exitcode=1, nanny_memory_kill=True), Cause.EXIT, "R9"),
    ("sigterm", dict(exitcode=TERM), Cause.SIGTERM, "R7"),
    ("sigkill", dict(exitcode=KILL), Cause.SIGKILL, "R8"),
    ("exit1", dict(exitcode=1), Cause.EXIT, "R9"),
    ("exit3", dict(exitcode=3), Cause.EXIT, "R9"),
    ("sigusr1", dict(exitcode=-signal.SIGUSR1), Cause.EXIT, "R9"),
    ("sigint", dict(exitcode=-signal.SIGINT), Cause.EXIT, "R9"),
    ("unknown", dict(exitcode=None), Cause.EXIT, "R9"),
    ("255", dict(exitcode=255), Cause.EXIT, "R9"),
    # Judged against the last reading while the worker ran, not against its start.
    (
        "moved-since-reading",
        dict(
            exitcode=KILL, oom_kill_reading=1, others_gone=0, oom_kill_before=0, oom_kill_after=2
        ),
        Cause.OOM_KILL,
        "R5",
    ),
    (
        "moved-only-before-reading",
        dict(
            exitcode=KILL, oom_kill_reading=2, others_gone=0, oom_kill_before=0, oom_kill_after=2
        ),
        Cause.SIGKILL,
        "R8",
    ),
    (
        "moved-another-stopped",
        dict(
            exitcode=KILL, oom_kill_reading=1, others_gone=1, oom_kill_before=0, oom_kill_after=2
        ),
        Cause.SIGKILL,
        "R8",
    ),
    (
        "another-stopped-kernel-log",
        dict(
            exitcode=KILL, oom_kill_reading=1, others_gone=1, oom_kill_after=2, kernel_log_oom=True
        ),
        Cause.OOM_KILL,
        "R5",
    ),
    (
        "another-stopped-unknown-exit",
        dict(exitcode=None, oom_kill_reading=0, others_gone=1, oom_kill_after=1),
        Cause.EXIT,
        "R9",
    ),
    (
        "another-stopped-nanny",
        dict(
            exitcode=KILL,
            oom_kill_reading=0,
            others_gone=1,
            oom_kill_after=1,
            nanny_memory_kill=True,
        ),
        Cause.MEMORY_TERMINATE,
        "R6",
    ),
]


@pytest.mark.parametrize(
    "facts, cause, rule", [row[1:] for row in TABLE], ids=[row[0] for row in TABLE]
)
def test_classification_table(facts, cause, rule):
    f = DeathFacts(**facts)
    assert classify(f) == cause
    assert explain(f)[1].startswith(rule + " ")


def test_every_death_cause_but_worker_lost_is_reachable():
    reached = {row[2] for row in TABLE} - {None}
    assert reached == {
        Cause.OOM_KILL,
        Cause.MEMORY_TERMINATE,
        Cause.NATIVE_CRASH,
        Cause.SIGTERM,
        Cause.SIGKILL,
        Cause.EXIT,
    }


@pytest.mark.parametrize(
    "code, name",
    [
        (KILL, "SIGKILL"),
        (TERM, "SIGTERM"),
        (SEGV, "SIGSEGV"),
        (ABRT, "SIGABRT"),
        (0, None),
        (1, None),
        (255, None),
        (None, None),
        (True, None),
        (-200, "signal 200"),
    ],
)
def test_describe_signal(code, name):
    assert describe_signal(code) == name


def test_describe_signal_linux_numbers():
    require(sys.platform == "linux", "Linux signal numbers (11, 9, 7) on another platform")
    assert (describe_signal(-11), describe_signal(-9), describe_signal(-7)) == (
        "SIGSEGV",
        "SIGKILL",
        "SIGBUS",
    )


@pytest.mark.parametrize(
    "text, sig",
    [
        ("Fatal Python error: Segmentation fault\n\nCurrent thread 0x1", "SIGSEGV"),
        ("Fatal Python error: Aborted\n", "SIGABRT"),
        ("Fatal Python error: Bus error\n", "SIGBUS"),
        ("Fatal Python error: Floating point exception\n", "SIGFPE"),
        ("Fatal Python error: Illegal instruction\n", "SIGILL"),
        ("Fatal Python error: _PyMem_DebugRawFree: bad ID\n", "SIGABRT"),  # Py_FatalError
        ("junk before\nFatal Python error: Segmentation fault\n", "SIGSEGV"),
        ("Current thread 0x00007f (most recent call first):\n  File ...", None),  # SIGTERM dump
        ("", None),
        (None, None),
    ],
)
def test_crash_signal(text, sig):
    assert crash_signal(text) == sig


def _run_and_dump(tmp_path, body: str) -> tuple[int, str]:
    crash = tmp_path / "crash.txt"
    code = textwrap.dedent(
        f"""
        import faulthandler, os, signal, ctypes, sys
        f = open({str(crash)!r}, "w")
        faulthandler.enable(file=f, all_threads=True)
        faulthandler.register(signal.SIGTERM, file=f, all_threads=True, chain=True)
        {body}
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    return proc.returncode, crash.read_text()


def test_real_segfault_is_a_native_crash_with_stack(tmp_path):
    code, text = _run_and_dump(tmp_path, "ctypes.string_at(0)")
    assert code == SEGV
    report_like = {"exitcode": code, "crash": {"text": text}}
    facts = facts_from(report_like)
    assert facts.crash_signal == "SIGSEGV"
    assert classify(facts) is Cause.NATIVE_CRASH
    ev = evidence(report_like)
    assert ev["crash_stack"] is True
    assert evidence_summary(ev, Cause.NATIVE_CRASH) == "SIGSEGV, faulthandler stack captured"
    # Same dump, but the nanny lost the exit status: the crash file alone decides.
    lost = {"exitcode": 255, "crash": {"text": text}}
    assert classify(facts_from(lost)) is Cause.NATIVE_CRASH
    assert evidence(lost)["signal_source"] == "faulthandler crash file"


def test_real_sigterm_dump_is_not_a_native_crash(tmp_path):
    code, text = _run_and_dump(tmp_path, "os.kill(os.getpid(), signal.SIGTERM)")
    assert code == TERM
    assert "Current thread" in text or "Stack (most recent call first)" in text
    facts = facts_from({"exitcode": code, "crash": {"text": text}})
    assert facts.crash_signal is None
    assert classify(facts) is Cause.SIGTERM
    # With the exit status lost, a SIGTERM dump proves nothing about a native crash.
    assert classify(facts_from({"exitcode": None, "crash": {"text": text}})) is Cause.EXIT


def _counters(oom_kill, peak=None, limit=None, failcnt=None):
    return {"oom_kill": oom_kill, "peak": peak, "limit": limit, "failcnt": failcnt}


@pytest.mark.parametrize(
    "version, oom_source, peak_source, limit_source",
    [
        (
            1,
            "kernel cgroup counter memory.oom_control",
            "kernel cgroup counter memory.max_usage_in_bytes",
            "kernel cgroup memory.limit_in_bytes",
        ),
        (
            2,
            "kernel cgroup counter memory.events",
            "kernel cgroup counter memory.peak",
            "kernel cgroup memory.max",
        ),
    ],
)
def test_evidence_names_kernel_sources(version, oom_source, peak_source, limit_source):
    ev = evidence(
        {
            "exitcode": KILL,
            "pid": 10,
            "cgroup": {
                "version": version,
                "before": _counters(0, peak=5, limit=2**30, failcnt=0),
                "after": _counters(1, peak=2**30 + 2**20, limit=2**30, failcnt=7),
            },
            "memory_limit": 2**31,
            "rss_sampled": 900 * 2**20,
            "rss_time": 99.5,
            "time": 100.0,
            "host_memory": {"total": 2**34, "available": 2**30},
            "nanny_memory_kill": None,
        }
    )
    assert ev["exitcode"] == KILL and ev["exitcode_source"].startswith("nanny")
    assert ev["signal"] == "SIGKILL" and ev["signal_source"] == "exit status"
    assert (ev["oom_kill_before"], ev["oom_kill_after"], ev["oom_kill_delta"]) == (0, 1, 1)
    assert ev["oom_kill_source"] == oom_source
    assert (ev["peak_bytes"], ev["peak_source"]) == (2**30 + 2**20, peak_source)
    assert (ev["limit_bytes"], ev["limit_source"]) == (2**30, limit_source)
    assert ev["failcnt_delta"] == 7
    assert ev["failcnt_source"] == (
        "kernel cgroup counter memory.failcnt"
        if version == 1
        else "kernel cgroup counter memory.events max"
    )
    assert (ev["memory_limit_bytes"], ev["memory_limit_source"]) == (
        2**31,
        "dask worker memory_limit",
    )
    assert (ev["rss_sampled_bytes"], ev["rss_source"], ev["rss_age_seconds"]) == (
        900 * 2**20,
        "sampled RSS",
        0.5,
    )
    assert ev["host_available_bytes"] == 2**30 and "host_memory_source" in ev
    assert ev["nanny_memory_kill"] is False
    assert ev["nanny_memory_kill_source"] == "nanny event worker-restart-memory"
    # Every value key has a source: a *_source sibling or a self-describing name.
    sources = {k for k in ev if k.endswith("_source")}
    assert {
        "exitcode_source",
        "signal_source",
        "oom_kill_source",
        "peak_source",
        "limit_source",
        "rss_source",
        "memory_limit_source",
        "host_memory_source",
        "nanny_memory_kill_source",
    } <= sources
    assert evidence_summary(ev, Cause.OOM_KILL) == (
        "kernel oom_kill counted: kernel peak of the worker's group 1 GiB of a 1 GiB limit, "
        "sampled RSS 900 MiB 500 ms before"
    )


def test_unreadable_counters_are_unknown_not_moved():
    report_like = {
        "exitcode": KILL,
        "cgroup": {"version": 1, "before": _counters(None), "after": _counters(3)},
    }
    ev = evidence(report_like)
    assert ev["oom_kill_delta"] is None
    assert "unreadable" in ev["oom_kill_source"]
    assert classify(facts_from(report_like)) is Cause.SIGKILL
    assert evidence_summary(ev, Cause.SIGKILL) == "SIGKILL, kernel OOM counters unreadable"


def test_peak_falls_back_to_the_counters_at_start():
    ev = evidence({"cgroup": {"version": 2, "before": {"peak": 7}, "after": {"peak": None}}})
    assert ev["peak_bytes"] == 7


def test_nanny_event_rss_and_empty_event_count():
    ev = evidence({"exitcode": TERM, "nanny_memory_kill": {"rss": 1_900 * 2**20}})
    assert ev["nanny_memory_kill"] is True and ev["nanny_rss_bytes"] == 1_900 * 2**20
    assert classify(facts_from({"exitcode": TERM, "nanny_memory_kill": {}})) is (
        Cause.MEMORY_TERMINATE
    )


def test_kernel_log_victim_must_be_the_worker():
    mine = {"exitcode": KILL, "pid": 10, "kernel_log_victim": {"pid": 10, "name": "python"}}
    child = {"exitcode": KILL, "pid": 10, "kernel_log_victim": {"pid": 11, "name": "ffmpeg"}}
    assert classify(facts_from(mine)) is Cause.OOM_KILL
    assert classify(facts_from(child)) is Cause.SIGKILL
    ev = evidence(child)
    assert (ev["kernel_log_oom"], ev["kernel_log_victim_is_worker"]) == (False, False)
    assert (ev["kernel_log_victim_pid"], ev["kernel_log_victim_name"]) == (11, "ffmpeg")
    assert ev["kernel_log_source"] == "kernel log (dmesg)"


def test_evidence_tolerates_garbage():
    for junk in (None, [], {"cgroup": "x", "crash": 3, "exitcode": "9", "host_memory": 1}):
        ev = evidence(junk)  # type: ignore[arg-type]
        assert ev["exitcode"] is None


GiB, MiB = 2**30, 2**20


@pytest.mark.parametrize(
    "ev, cause, phrase",
    [
        (
            {"oom_kill_delta": 1, "peak_bytes": 1095216660, "limit_bytes": GiB},
            "oom_kill",
            "kernel oom_kill counted: kernel peak of the worker's group 1.02 GiB of a 1 GiB limit",
        ),
        (
            {"oom_kill_delta": None, "kernel_log_oom": True, "rss_sampled_bytes": GiB},
            "oom_kill",
            "kernel log shows an OOM kill: sampled RSS 1 GiB",
        ),
        (
            {
                "oom_kill_delta": None,
                "kernel_log_oom": True,
                "rss_sampled_bytes": GiB,
                "rss_age_seconds": 2.34,
                "memory_limit_bytes": GiB,
            },
            "oom_kill",
            "kernel log shows an OOM kill: sampled RSS 1 GiB 2.3 s before, of a 1 GiB limit",
        ),
        (
            {
                "oom_kill_delta": 1,
                "peak_bytes": GiB,
                "limit_bytes": 2**63 - 4096,
                "memory_limit_bytes": 2 * GiB,
            },
            "oom_kill",
            "kernel oom_kill counted: kernel peak of the worker's group 1 GiB of a 2 GiB limit",
        ),  # an "unlimited" cgroup limit falls back to Dask's memory_limit
        (
            {
                "nanny_rss_bytes": int(1.9 * GiB),
                "memory_limit_bytes": 2 * GiB,
                "rss_sampled_bytes": int(1.7 * GiB),
                "rss_age_seconds": 0.3,
            },
            "memory_terminate",
            "nanny terminated it for memory: nanny RSS 1.9 GiB of a 2 GiB limit",
        ),  # the nanny's own reading, named as such, never as the sampled one
        (
            {
                "rss_sampled_bytes": int(1.7 * GiB),
                "rss_age_seconds": 0.3,
                "memory_limit_bytes": 2 * GiB,
            },
            "memory_terminate",
            "nanny terminated it for memory: sampled RSS 1.7 GiB 300 ms before, of a 2 GiB limit",
        ),  # no RSS in the nanny's event: the flight recorder's sample, named as such
        ({}, "memory_terminate", "nanny terminated it for memory"),
        (
            {"signal": "SIGSEGV", "crash_stack": True},
            "native_crash",
            "SIGSEGV, faulthandler stack captured",
        ),
        ({"signal": "SIGABRT"}, "native_crash", "SIGABRT, no faulthandler stack"),
        ({"signal": "SIGTERM"}, "sigterm", "SIGTERM from outside the nanny"),
        (
            {"signal": "SIGKILL", "oom_kill_delta": 0, "oom_kill_source": "x"},
            "sigkill",
            "SIGKILL with no kernel OOM evidence",
        ),
        ({"signal": "SIGKILL"}, "sigkill", "SIGKILL with no kernel OOM evidence"),
        ({"exitcode": 3}, "exit", "exit status 3"),
        ({"exitcode": None}, "exit", "exit status unknown"),
        ({"exitcode": 255}, "exit", "exit status 255 (status possibly lost)"),
        ({"exitcode": -10, "signal": "SIGUSR1"}, "exit", "killed by SIGUSR1"),
        ({}, "worker_lost", "no report from the nanny: host or pod died with it"),
    ],
)
def test_evidence_summary(ev, cause, phrase):
    assert evidence_summary(ev, cause) == phrase


# The scenario of the user report: cgroup v1, per-worker group, the kernel kept the charges of
# what the worker held before it joined its group on the parent; the nanny terminated it.
V1_NOT_MOVED = {
    "version": 1,
    "before": _counters(0, peak=0, limit=600 * MiB),
    "after": _counters(1, peak=450 * MiB, limit=600 * MiB),
    "placement": {
        "own_group": True,
        "charge_moved": False,
        "rss_at_move": 130 * MiB,
        "note": "memory.move_charge_at_immigrate refused (EINVAL): the kernel no longer "
        "moves charges (Linux 6.13+)",
    },
}


def _scenario(placement=None, version=1, **extra):
    cgroup = dict(V1_NOT_MOVED, version=version)
    if placement is not None:
        cgroup["placement"] = placement
    report_like = {
        "exitcode": KILL,
        "pid": 10,
        "time": 100.0,
        "memory_limit": 600 * MiB,
        "rss_sampled": 570 * MiB,
        "rss_time": 99.8,
        "cgroup": cgroup,
    }
    report_like.update(extra)
    return evidence(report_like)


def test_each_number_is_named_by_its_source():
    ev = _scenario(nanny_memory_kill={"rss": int(573.59 * MiB)})
    assert ev["rss_source"] == "sampled RSS"
    assert ev["nanny_rss_source"].startswith("nanny RSS")
    assert ev["peak_scope"] == "worker"
    summary = evidence_summary(ev, Cause.MEMORY_TERMINATE)
    assert summary == "nanny terminated it for memory: nanny RSS 574 MiB of a 600 MiB limit"
    assert "sampled" not in summary  # 573.59 MiB was the nanny's reading, not a sample


def test_a_peak_that_excludes_charges_from_before_the_move_says_so():
    ev = _scenario()
    assert ev["charge_moved"] is False
    assert ev["rss_at_move_bytes"] == 130 * MiB and "rss_at_move_source" in ev
    assert "before it joined its group" in ev["peak_covers"]
    assert "Linux 6.13+" in ev["peak_covers"]  # why the charge did not move
    assert evidence_summary(ev, Cause.OOM_KILL) == (
        "kernel oom_kill counted: kernel peak of the worker's group 450 MiB of a "
        "600 MiB limit, sampled RSS 570 MiB 200 ms before; the peak excludes up to "
        "130 MiB charged before the worker joined its group"
    )


def test_a_peak_whose_charges_moved_with_the_worker_has_no_caveat():
    ev = _scenario({"own_group": True, "charge_moved": True, "rss_at_move": 130 * MiB})
    assert ev["charge_moved"] is True
    assert "moved with it" in ev["peak_covers"]
    assert evidence_summary(ev, Cause.OOM_KILL) == (
        "kernel oom_kill counted: kernel peak of the worker's group 450 MiB of a "
        "600 MiB limit, sampled RSS 570 MiB 200 ms before"
    )


def test_cgroup_v2_never_moves_charges_and_says_what_memory_peak_covers():
    ev = _scenario({"own_group": True, "charge_moved": None, "rss_at_move": 6 * MiB}, version=2)
    assert ev["charge_moved"] is False  # v2 has no charge moving at all
    assert "cgroup v2 never moves charges" in ev["peak_covers"]
    assert "since the group was made" in ev["peak_covers"]
    assert ev["peak_source"] == "kernel cgroup counter memory.peak"
    assert evidence_summary(ev, Cause.OOM_KILL).endswith(
        "; the peak excludes up to 6 MiB charged before the worker joined its group"
    )


def test_an_unknown_amount_before_the_move_is_still_named():
    ev = _scenario({"own_group": True, "charge_moved": False, "rss_at_move": None})
    assert "rss_at_move_bytes" not in ev
    assert evidence_summary(ev, Cause.OOM_KILL).endswith(
        "; the peak excludes memory charged before the worker joined its group"
    )


def test_a_shared_group_peak_is_not_called_the_workers():
    ev = _scenario({"own_group": False, "charge_moved": None, "rss_at_move": None})
    assert ev["peak_scope"] == "shared"
    assert "charge_moved" not in ev and "rss_at_move_bytes" not in ev
    assert "other processes" in ev["peak_covers"]
    assert evidence_summary(ev, Cause.OOM_KILL) == (
        "kernel oom_kill counted: kernel peak of its shared group 450 MiB of a 600 MiB "
        "limit, sampled RSS 570 MiB 200 ms before"
    )


def test_reports_without_placement_facts_keep_the_plain_peak():
    # A nanny of an older oomguard sends no placement: no guess either way.
    ev = _scenario()
    del ev["peak_scope"], ev["peak_covers"], ev["charge_moved"], ev["rss_at_move_bytes"]
    assert evidence_summary(ev, Cause.OOM_KILL) == (
        "kernel oom_kill counted: kernel peak of the worker's group 450 MiB of a "
        "600 MiB limit, sampled RSS 570 MiB 200 ms before"
    )
    cg = dict(V1_NOT_MOVED)
    del cg["placement"]
    assert "peak_scope" not in evidence({"cgroup": cg})


@pytest.mark.parametrize(
    "facts, cause",
    [
        # A crash while dying of the nanny's memory kill is the memory kill.
        (DeathFacts(exitcode=-11, nanny_memory_kill=True), Cause.MEMORY_TERMINATE),
        # A crash while dying of an outside SIGTERM (its dump came first) is the SIGTERM.
        (DeathFacts(exitcode=-11, terminated_first=True), Cause.SIGTERM),
        (DeathFacts(exitcode=-6, terminated_first=True), Cause.SIGTERM),
        # Without either, a segfault is a native crash.
        (DeathFacts(exitcode=-11), Cause.NATIVE_CRASH),
    ],
)
def test_crash_while_terminating(facts, cause):
    assert classify(facts) is cause


def test_terminated_first_reads_the_crash_file_head():

    sigterm_then_segv = (
        'Current thread 0x00007f (most recent call first):\n  File "x.py", line 1 in f\n\n'
        "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f ...\n"
    )
    assert facts_from({"exitcode": -11, "crash": {"text": sigterm_then_segv}}).terminated_first
    segv = "Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 ...\n"
    assert not facts_from({"exitcode": -11, "crash": {"text": segv}}).terminated_first


def _shared(after, reading, others, gone, **extra):
    return {
        "exitcode": KILL,
        "pid": 7,
        **extra,
        "cgroup": {
            "version": 2,
            "before": {"oom_kill": 0},
            "after": {"oom_kill": after, "peak": 600 * 2**20, "limit": 600 * 2**20},
            "placement": {"own_group": False},
            "reading": {"oom_kill": reading, "age": 0.42, "others": others, "others_gone": gone},
        },
    }


def test_a_kill_in_a_shared_group_is_confirmed_when_every_other_process_runs():
    r = _shared(after=2, reading=1, others=1, gone=0)
    ev = evidence(r)
    assert classify(facts_from(r)) is Cause.OOM_KILL
    assert (ev["oom_kill_since_reading"], ev["oom_confirmed"]) == (1, True)
    assert ev["oom_attribution"] == (
        "counted in its shared group, and every other process there still runs"
    )
    assert evidence_summary(ev, "oom_kill") == (
        "kernel oom_kill +1 in its shared group within 0.4 s of the death; every other "
        "process there still runs: kernel peak of its shared group 600 MiB of a 600 MiB limit"
    )


def test_a_kill_in_a_shared_group_where_another_process_stopped_is_not_proof():
    r = _shared(after=2, reading=1, others=2, gone=1)
    ev = evidence(r)
    cause, rule = explain(facts_from(r))
    assert cause is Cause.SIGKILL and "not confirmed" in rule
    assert ev["oom_confirmed"] is False
    assert evidence_summary(ev, "sigkill") == (
        "SIGKILL; an OOM kill counted in its group within 0.4 s of the death is not "
        "confirmed as this worker's (1 other process there stopped too)"
    )


def test_the_kernel_log_naming_the_worker_confirms_it_whatever_else_stopped():
    r = _shared(after=2, reading=1, others=2, gone=1, kernel_log_victim={"pid": 7})
    ev = evidence(r)
    assert classify(facts_from(r)) is Cause.OOM_KILL
    assert ev["oom_confirmed"] is True and "kernel log names this PID" in ev["oom_attribution"]
    assert evidence_summary(ev, "oom_kill").startswith(
        "kernel oom_kill +1 in its shared group within 0.4 s of the death; kernel log names"
    )


def test_a_kill_counted_before_the_last_reading_does_not_taint_a_later_sigkill():
    # The container case: a task subprocess (or another worker) was OOM-killed earlier.
    r = _shared(after=2, reading=2, others=1, gone=0)
    ev = evidence(r)
    assert classify(facts_from(r)) is Cause.SIGKILL
    assert (ev["oom_kill_delta"], ev["oom_kill_since_reading"]) == (2, 0)
    assert "oom_confirmed" not in ev
    assert evidence_summary(ev, "sigkill") == "SIGKILL with no kernel OOM evidence"


_counts = st.none() | st.integers(0, 3)


@given(
    exitcode=st.sampled_from([KILL, TERM, SEGV, None, 255, 0, 1]),
    before=_counts,
    reading=_counts,
    after=_counts,
    gone=st.none() | st.integers(0, 2),
    kernel_log=st.booleans(),
    nanny=st.booleans(),
)
def test_oom_kill_only_with_evidence_for_this_worker(
    exitcode, before, reading, after, gone, kernel_log, nanny
):
    """Whatever the facts, `oom_kill` means the kernel log named the worker, or the counter
    moved since the last reading (since the start when there is none) with nothing else in
    the group gone; and a kill counted before that reading never makes one."""
    f = DeathFacts(
        exitcode=exitcode,
        oom_kill_before=before,
        oom_kill_reading=reading,
        oom_kill_after=after,
        others_gone=gone,
        kernel_log_oom=kernel_log,
        nanny_memory_kill=nanny,
    )
    base = before if reading is None else reading
    moved = base is not None and after is not None and after > base
    if classify(f) is Cause.OOM_KILL:
        assert kernel_log or (moved and not gone)
    if not kernel_log and not moved and exitcode == KILL and not nanny:
        assert classify(f) is Cause.SIGKILL
