"""SLURM's texts -> facts (`oomguard._death.slurm`), over output captured from the real
slurmctld and slurmstepd of tests/slurm (SLURM 22.05, tests/fixtures/slurm), and the
verdicts they give a death (`killer.attribute`, the scheduler's `_slurm_jobs.verdict`)."""

from __future__ import annotations

import dataclasses
import pathlib
import time

import pytest

from oomguard._death import slurm
from oomguard._death.killer import attribute
from oomguard._death.record import Seen
from oomguard._lookups.slurm_job import _run, query, valid_job_id
from oomguard.scheduler_plugin._slurm_jobs import SlurmJobs, verdict

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "slurm"


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    "name, job, state, reason, limit, mem",
    [
        ("scontrol-oom.txt", "1", "OUT_OF_MEMORY", "OutOfMemory", "UNLIMITED", 200 * 2**20),
        ("scontrol-cancel.txt", "3", "CANCELLED", None, "UNLIMITED", 24105 * 2**20),
        ("scontrol-timeout.txt", "2", "TIMEOUT", "TimeLimit", "00:01:00", 24105 * 2**20),
        ("scontrol-timeout-oneliner.txt", "2", "TIMEOUT", "TimeLimit", "00:01:00", 24105 * 2**20),
        ("scontrol-preempt.txt", "1", "PREEMPTED", None, "UNLIMITED", 500 * 2**20),
    ],
)
def test_scontrol_show_job(name, job, state, reason, limit, mem):
    f = slurm.parse_scontrol(text(name))
    assert (f["job_id"], f["state"], f.get("reason")) == (job, state, reason)
    assert (f["time_limit"], f["mem_limit_bytes"]) == (limit, mem)
    assert slurm.stderr_path(f) == f"/tmp/oomguard-slurm-lab/jobs/{job}.out"


@pytest.mark.parametrize(
    "name, job, state",
    [
        ("stderr-cancel.txt", "3", "CANCELLED"),
        ("stderr-timeout.txt", "2", "TIMEOUT"),
        ("stderr-preempt.txt", "1", "PREEMPTED"),
    ],
)
def test_slurmstepd_end_lines(name, job, state):
    f = slurm.parse_output(text(name), job)
    assert f["state"] == state
    assert f["output_line"].startswith(f"slurmstepd-vm: error: *** JOB {job} ON vm CANCELLED AT ")
    assert slurm.parse_output(text(name), "99") == {}  # another job's line


def test_slurmstepd_oom_line():
    f = slurm.parse_output(text("stderr-oom.txt"), "1")
    assert f["oom_kill_events"] == 1
    assert "Detected 1 oom-kill event(s) in StepId=1.batch" in f["output_line"]
    assert "state" not in f  # the job ended by itself (its shell exited 0): no verdict here


def test_other_stepd_endings():
    line = (
        "slurmstepd: error: *** JOB 9 ON n1 CANCELLED AT 2026-01-01T00:00:00 DUE TO PREEMPTION ***"
    )
    assert slurm.parse_output(line)["state"] == "PREEMPTED"
    line = "slurmstepd: error: *** STEP 9.0 ON n1 CANCELLED AT 2026-01-01T00:00:00 DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***"
    assert slurm.parse_output(line, "9")["state"] == "NODE_FAIL"
    assert slurm.parse_output("no such line\n\x00garbage *** JOB") == {}


def test_sacct_names_who_cancelled():
    # sacct's -P format, as documented (no slurmdbd in the lab to capture it from).
    out = "7|CANCELLED by 1000|None|0:15|00:10:00|600M\n7.batch|CANCELLED||0:15||\n"
    f = slurm.parse_sacct(out, "7")
    assert (f["state"], f["cancelled_by"], f["mem_limit_bytes"]) == (
        "CANCELLED",
        "1000",
        600 * 2**20,
    )
    assert slurm.parse_sacct(out, "8") == {}
    assert slurm.parse_sacct("7|WEIRD|x|y|z|w", "7") == {
        "job_id": "7", "reason": "x", "exit_code": "y", "time_limit": "z"
    }  # fmt: skip


def test_job_facts_best_source_first():
    facts = slurm.job_facts(
        "7",
        None,
        sacct={"state": "CANCELLED", "cancelled_by": "1000"},
        scontrol=slurm.parse_scontrol(text("scontrol-cancel.txt")),
        output=slurm.parse_output(text("stderr-cancel.txt")),
    )
    assert facts["slurm_state"] == "CANCELLED" and facts["slurm_cancelled_by"] == "1000"
    assert facts["slurm_source"] == "sacct, scontrol show job, job stderr"
    assert set(facts) <= set(slurm.KEYS)
    assert slurm.job_facts(None, sacct={"state": "TIMEOUT"}) == {}


def test_stderr_path_is_never_guessed():
    assert (
        slurm.stderr_path({"stderr": "/l/%x-%J.err", "job_id": "4", "name": "w"}) == "/l/w-4.err"
    )
    assert slurm.stderr_path({"stderr": "/l/%a-%J.err", "job_id": "4"}) is None  # array index
    assert slurm.stderr_path({"stderr": "relative.err", "job_id": "4"}) is None


def _death(cause, facts, **extra):
    env = {"slurm_job_id": "2", "slurm_step_id": None, "slurm": facts}
    return attribute(Seen(slurm_job=env, **extra), cause, {})


def test_a_sigkill_in_a_timed_out_job_is_slurm_confirmed():
    facts = slurm.job_facts(
        "2", scontrol=slurm.parse_scontrol(text("scontrol-timeout.txt")),
        output=slurm.parse_output(text("stderr-timeout.txt")),
    )  # fmt: skip
    a = _death("sigkill", facts, exitcode=-9)
    assert (a.name, a.how, a.confidence) == ("slurm", "job state", "confirmed")
    assert a.summary == "SIGKILL from slurmstepd: SLURM job 2 TIMEOUT (TimeLimit, limit 00:01:00)"
    assert a.facts["slurm_state"] == "TIMEOUT" and a.facts["slurm_reason"] == "TimeLimit"


def test_a_running_job_is_no_verdict():
    facts = slurm.job_facts("2", scontrol={"state": "RUNNING", "mem_limit_bytes": 5})
    a = _death("sigkill", facts, exitcode=-9)
    assert (a.name, a.confidence) == ("slurm", "likely")  # as before: no state to name
    k = _death("oom_kill", facts, exitcode=-9)
    assert (k.name, k.facts["slurm_state"], k.facts["slurm_mem_limit_bytes"]) == (
        "kernel", "RUNNING", 5
    )  # fmt: skip


def test_scheduler_verdict_on_a_lost_worker():
    v = verdict({"slurm_job_id": "3", "slurm_state": "CANCELLED", "slurm_cancelled_by": "0"})
    assert (v["killer"], v["killer_how"], v["killer_confidence"]) == (
        "slurm", "job state", "confirmed"
    )  # fmt: skip
    assert v["killer_summary"].endswith("SLURM job 3 CANCELLED by uid 0")
    assert verdict({"slurm_job_id": "3", "slurm_state": "RUNNING"})["killer"] == "unknown"


def test_workers_name_their_job():
    jobs = SlurmJobs()
    jobs.note("tcp://a:1", {"slurm_job_id": "12", "slurm_step_id": "batch"})
    jobs.note("tcp://b:1", {"slurm_job_id": "12; rm -rf /"})
    jobs.note("tcp://c:1", {"slurm_job_id": 12})
    assert jobs.job_of("tcp://a:1") == ("12", "batch")
    assert jobs.job_of("tcp://b:1") is None and jobs.job_of("tcp://c:1") is None
    assert valid_job_id("123_4") and not valid_job_id("") and not valid_job_id("1 2")


def test_commands_are_bounded():
    t0 = time.monotonic()
    assert _run(["sleep", "10"], timeout=0.2) is None  # killed at its timeout
    # Past the cap the rest is never read: the command is killed, its output not trusted.
    assert _run(["yes"], timeout=5, cap=1000) is None
    assert time.monotonic() - t0 < 4
    # A command at the end of its output is let exit, never killed first (a race, once).
    assert all(_run(["echo", "JobId=1"], timeout=5) == "JobId=1\n" for _ in range(50))
    t0 = time.monotonic()  # output closed late: the timeout still ends it
    assert _run(["sh", "-c", "echo JobId=1; exec sleep 30"], timeout=0.3) is None
    assert time.monotonic() - t0 < 5
    assert _run(["oomguard-no-such-command"], timeout=1) is None
    assert query("not a job") == {}


def test_doctests():
    import doctest

    from oomguard.scheduler_plugin import _slurm_jobs

    for module in (slurm, _slurm_jobs):
        assert doctest.testmod(module).failed == 0


def test_the_scheduler_checks_slurm_evidence():
    from oomguard._death import wire
    from oomguard._death.build import EXAMPLE, build
    from oomguard._exceptions import ReportError

    facts = slurm.job_facts(
        "2", scontrol=slurm.parse_scontrol(text("scontrol-timeout.txt")),
        output=slurm.parse_output(text("stderr-timeout.txt")),
    )  # fmt: skip
    env = {
        "slurm_job_id": "2",
        "slurm_step_id": None,
        "slurm": {**facts, "slurm_query_seconds": 0.1},
    }
    death = build(dataclasses.replace(EXAMPLE, exitcode=-9, slurm_job=env))
    ok = wire.decode(wire.encode(death))
    assert ok.evidence["slurm_state"] == "TIMEOUT"
    assert (ok.killer.name, ok.killer.how) == ("slurm", "job state")
    report = wire.to_wire(death)
    for key, bad, reason in [
        ("slurm_state", "EXPLODED", "bad_value"),
        ("slurm_mem_limit_bytes", "600M", "wrong_type"),
        ("slurm_reason", "x" * 65, "too_large"),
        ("slurm_secret", "x", "bad_value"),
    ]:
        forged = {**report, "evidence": {**report["evidence"], key: bad}}
        with pytest.raises(ReportError) as e:
            wire.validate(forged)
        assert (e.value.field, e.value.reason) == (f"evidence.{key}", reason)
