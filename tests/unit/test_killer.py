"""Naming the killer (issue 26): the nanny's attribution (`_death.killer`), what it does
to the report, and what the decision core makes of it."""

from __future__ import annotations

import dataclasses
import doctest

import pytest

from oomguard._causes import Confidence, Killer, Known, memory_death
from oomguard._death import killer as killer_mod
from oomguard._death.build import EXAMPLE, build
from oomguard._death.killer import for_cause
from oomguard._death.record import Attribution, Death, Seen, Task
from oomguard._death.wire import to_wire, validate


def attribute(d):
    """The killer rules on what a nanny saw (`d`: Seen's fields, the cause, the evidence)."""
    d = dict(d)
    cause, evidence = d.pop("cause"), d.pop("evidence", {})
    return killer_mod.attribute(Seen(**d), cause, evidence if isinstance(evidence, dict) else {})


GIB = 2**30
EARLYOOM = {
    "name": "earlyoom",
    "pid": 812,
    "cmdline": "earlyoom -M 1048576,524288 -s 100,100",
    "term_bytes": GIB,
    "kill_bytes": GIB // 2,
    "term_percent": None,
    "kill_percent": None,
}


def host(available, total=24 * GIB, time=99.5):
    return {"time": time, "total": total, "available": available, "psi_some10": 12.5}


def sigterm_from(pid, name, uid=0, cmdline=None, time=99.0):
    return {
        "signal": "SIGTERM",
        "signo": 15,
        "time": time,
        "code": 0,
        "pid": pid,
        "uid": uid,
        "name": name,
        "cmdline": cmdline,
    }


def test_doctests():
    assert doctest.testmod(killer_mod).failed == 0


@pytest.mark.parametrize(
    "cause, killer, how",
    [
        ("oom_kill", "kernel", "kernel counter"),
        ("memory_terminate", "dask-nanny", "nanny event"),
        ("native_crash", "task", "exit status"),
        ("exit", "task", "exit status"),
    ],
)
def test_causes_that_name_their_killer(cause, killer, how):
    a = attribute({"cause": cause, "exitcode": -9, "evidence": {}})
    assert (a.name, a.how, a.confidence) == (killer, how, "confirmed")
    assert for_cause(cause).name == killer


def test_kernel_log_is_said_when_it_is_the_proof():
    a = attribute({"cause": "oom_kill", "evidence": {"kernel_log_oom": True}})
    assert a.how == Known.KERNEL_LOG and a.memory


def test_earlyoom_sigterm_is_confirmed_from_the_sender_with_memavailable():
    a = attribute(
        {
            "cause": "sigterm",
            "pid": 40,
            "time": 100.0,
            "rss_sampled": 3 * GIB,
            "signals": [sigterm_from(812, "earlyoom", cmdline="earlyoom -M 1048576")],
            "host_reading": host(GIB - 2**20, total=8 * GIB),
            "killers": [EARLYOOM],
        }
    )
    assert (a.name, a.how, a.confidence) == ("earlyoom", "signal sender", "confirmed")
    assert a.facts["sender_pid"] == 812 and a.facts["sender_uid"] == 0
    assert a.facts["memavailable_bytes"] == GIB - 2**20
    assert a.facts["memavailable_age_seconds"] == 0.5
    assert a.facts["psi_some_avg10"] == 12.5
    assert a.summary.startswith("SIGTERM from earlyoom (pid 812, uid 0) at MemAvailable 12.5 %")
    assert "SIGTERM threshold 12.5 %" in a.summary
    # 3 GiB of the 7 GiB in use: not most of it, so an external death, not a memory kill.
    assert a.memory is False and a.facts["worker_largest"] is False


def test_earlyoom_kill_of_the_largest_process_is_a_memory_kill():
    a = attribute(
        {
            "cause": "sigterm",
            "rss_sampled": 6 * GIB,
            "signals": [sigterm_from(812, "earlyoom")],
            "host_reading": host(GIB, total=8 * GIB),
        }
    )
    assert a.name == "earlyoom" and a.memory and a.facts["killer_memory"] is True
    assert memory_death("sigterm", a.facts)


def test_a_named_process_is_named_with_pid_and_uid_and_is_external():
    a = attribute(
        {
            "cause": "sigterm",
            "pid": 40,
            "nanny_pid": 30,
            "rss_sampled": 6 * GIB,
            "host_reading": host(GIB, total=8 * GIB),
            "signals": [
                sigterm_from(4242, "chaos-monkey", uid=1001, cmdline="chaos-monkey\x1b[31m -t")
            ],
        }
    )
    assert (a.name, a.how, a.confidence) == ("process", "signal sender", "confirmed")
    assert a.summary == "SIGTERM from chaos-monkey (pid 4242, uid 1001)"
    assert a.facts["sender_cmdline"] == "chaos-monkey [31m -t"  # no control characters
    assert a.memory is False  # a person or a chaos tool: never the shard's fault


def test_a_sender_gone_before_it_was_named_is_named_by_pid_and_uid():
    a = attribute({"cause": "sigterm", "signals": [sigterm_from(4242, None, uid=7)]})
    assert a.name == "process"
    assert a.summary == "SIGTERM from pid 4242 (uid 7; it exited before it was named)"


def test_a_sender_outside_the_pid_namespace_says_so():
    a = attribute({"cause": "sigterm", "signals": [sigterm_from(0, None)]})
    assert a.name == "unknown" and a.how == "signal sender"
    assert "outside this container" in a.summary and a.facts["sender_outside"] is True


@pytest.mark.parametrize(
    "name, killer",
    [("slurmstepd", "slurm"), ("kubelet", "kubelet"), ("systemd-oomd", "systemd-oomd")],
)
def test_named_killers(name, killer):
    a = attribute({"cause": "sigterm", "signals": [sigterm_from(77, name)]})
    assert (a.name, a.confidence) == (killer, "confirmed")


def test_the_nanny_and_the_worker_itself_as_senders():
    base = {"cause": "sigterm", "pid": 40, "nanny_pid": 30}
    # The nanny's memory terminate is K2 (its own event); any other SIGTERM from its process
    # is other code there (a LocalCluster's client), never Dask's nanny.
    from_nanny = attribute({**base, "signals": [sigterm_from(30, "python")]})
    assert from_nanny.name == "process" and from_nanny.facts["sender_is_nanny_process"]
    assert attribute({**base, "signals": [sigterm_from(40, "python")]}).name == "task"


def test_the_last_sigterm_counts_and_other_signals_are_ignored():
    signals = [
        sigterm_from(5, "chaos-monkey"),
        {**sigterm_from(6, "earlyoom"), "signal": "SIGHUP"},
        sigterm_from(812, "earlyoom"),
    ]
    assert attribute({"cause": "sigterm", "signals": signals}).name == "earlyoom"


def test_sigkill_with_low_memory_is_likely_earlyoom_with_the_numbers():
    a = attribute(
        {
            "cause": "sigkill",
            "time": 100.0,
            "evidence": {"oom_kill_delta": 0},
            "oomd": {"reading": {"ooms": 0, "kill": 0}, "after": {"ooms": 0, "kill": 0}},
            "host_reading": host(GIB // 4, total=8 * GIB),
            "killers": [EARLYOOM],
        }
    )
    assert (a.name, a.how, a.confidence) == ("earlyoom", "inferred", "likely")
    assert "at or below its SIGKILL threshold 6.2 %" in a.summary
    assert "MemAvailable 3.1 %" in a.summary
    assert a.facts["killer_threshold_bytes"] == GIB // 2
    assert a.facts["killer_excluded"] == (
        "not the kernel (oom_kill unchanged, no kernel log line); "
        "not systemd-oomd (user.oomd_kill unchanged)"
    )


def test_an_earlyoom_in_dryrun_is_never_the_likely_killer():
    a = attribute(
        {
            "cause": "sigkill",
            "host_reading": host(GIB // 4, total=8 * GIB),
            "killers": [{**EARLYOOM, "dryrun": True}],
        }
    )
    assert a.name == "unknown"


def test_sigkill_with_plenty_of_memory_is_unknown_with_what_was_excluded():
    a = attribute(
        {
            "cause": "sigkill",
            "evidence": {"oom_kill_delta": 0},
            "host_reading": host(20 * GIB),
            "killers": [EARLYOOM],
        }
    )
    assert (a.name, a.confidence) == ("unknown", "likely")
    assert a.summary.startswith("SIGKILL from an unknown sender: not the kernel")
    assert "MemAvailable 83.3 %" in a.summary


def test_sigkill_after_a_sigterm_names_its_sender_as_likely():
    a = attribute(
        {
            "cause": "sigkill",
            "time": 130.0,
            "signals": [sigterm_from(99, "slurmstepd", time=100.0)],
        }
    )
    assert (a.name, a.how, a.confidence) == ("slurm", "inferred", "likely")
    assert a.summary.startswith("SIGKILL 30.0 s after a SIGTERM from slurmstepd")


def test_sigkill_counted_by_systemd_oomd_xattrs_is_confirmed():
    a = attribute(
        {
            "cause": "sigkill",
            "oomd": {"reading": {"ooms": 1, "kill": 3}, "after": {"ooms": 2, "kill": 4}},
        }
    )
    assert (a.name, a.how, a.confidence) == ("systemd-oomd", "cgroup xattr", "confirmed")
    assert a.facts["oomd_kill_delta"] == 1


def test_xattrs_not_available_are_no_evidence_either_way():
    for oomd in (None, {}, {"reading": None, "after": {"kill": 5}}, {"after": {"kill": None}}):
        assert attribute({"cause": "sigkill", "oomd": oomd}).name == "unknown"


def test_slurmstepd_names_the_job():
    a = attribute(
        {
            "cause": "sigterm",
            "signals": [sigterm_from(99, "slurmstepd")],
            "slurm_job": {"slurm_job_id": "42", "slurm_step_id": "0"},
        }
    )
    assert (a.name, a.confidence) == ("slurm", "confirmed")
    assert a.summary == (
        "SIGTERM from slurmstepd (pid 99, uid 0) in SLURM job 42: its time limit, scancel "
        "or preemption"
    )
    assert (a.facts["slurm_job_id"], a.facts["slurm_step_id"]) == ("42", "0")


def test_slurm_job_without_a_sender_is_likely_slurm():
    a = attribute({"cause": "sigterm", "slurm_job": {"slurm_job_id": "42", "slurm_step_id": "0"}})
    assert (a.name, a.how, a.confidence) == ("slurm", "job state", "likely")
    assert a.facts["slurm_job_id"] == "42"


@pytest.mark.parametrize(
    "junk",
    [None, 3, "x", [None, 1, {"signal": 5}, {"signal": "SIGTERM", "pid": -1}], {"a": 1}],
)
def test_malformed_inputs_never_raise_and_never_hide_the_death(junk):
    a = attribute(
        {
            "cause": "sigterm",
            "signals": junk,
            "killers": junk,
            "oomd": junk,
            "host_reading": junk,
            "slurm_job": junk,
            "evidence": junk,
        }
    )
    assert a.name in {k.value for k in Killer} and a.summary


def test_the_report_carries_the_killer_and_validates():
    d = build(
        dataclasses.replace(
            EXAMPLE,
            exitcode=-15,
            signals=(sigterm_from(812, "earlyoom"),),
            host_reading=host(GIB, total=8 * GIB),
            killers=(EARLYOOM,),
        )
    )
    assert d.cause == "sigterm"
    assert (d.killer.name, d.killer.how) == ("earlyoom", "signal sender")
    # The killer is said once: its facts are in the evidence, it is not.
    assert d.evidence["sender_pid"] == 812 and "killer" not in d.evidence
    assert validate(to_wire(d)).killer == d.killer
    # A requested close is no death: no killer either.
    closed = build(dataclasses.replace(EXAMPLE, requested=True))
    assert closed.cause == "" and closed.killer is None


def test_a_report_from_an_older_nanny_has_no_killer_and_still_validates():
    r = to_wire(build(EXAMPLE))
    del r["killer"]
    assert validate(r).killer is None


@pytest.mark.parametrize(
    "field, value",
    [("name", "chaos-monkey"), ("how", "gossip"), ("confidence", "certain"), ("memory", 1)],
)
def test_a_killer_outside_the_vocabulary_is_refused_naming_the_field(field, value):
    from oomguard import ReportError

    r = to_wire(build(dataclasses.replace(EXAMPLE, exitcode=-15)))
    r["killer"][field] = value
    with pytest.raises(ReportError) as e:
        validate(r)
    assert e.value.field == f"killer.{field}"


def test_vocabularies_are_small_and_fixed():
    assert len(Killer) == 10 and len(Known) == 9 and len(Confidence) == 2


# --- what the decision core makes of a killer ----------------------------------------


def _death(core, worker, keys, killer, now, stack="load"):
    from oomguard._decide.pairing import Removal

    core.removed(
        Removal(worker=worker, host="h", time=now, processing={k: k for k in keys}, nthreads=2),
        now=now,
    )
    tasks = tuple(Task(k, k.split("-")[0], stack=(("/app/etl.py", 3, stack),)) for k in keys)
    death = Death(
        worker=worker,
        pid=7,
        cause="sigterm",
        host="h",
        time=now,
        evidence={"killer_memory": killer.memory},
        killer=killer,
        tasks=tasks,
    )
    return core.reported(death, now=now + 0.1)


def _killer(name, memory):
    summary = f"SIGTERM from {name} (pid 812, uid 0)"
    return Attribution(name, "signal sender", "confirmed", summary, memory=memory)


@pytest.mark.parametrize("memory", [True, False])
def test_a_userspace_oom_kill_of_the_largest_is_a_shared_memory_kill(memory):
    """earlyoom SIGTERMed a worker running two tasks: when the worker held most of the
    host's memory, its tasks are suspects as for memory_terminate (each retried alone);
    when others held it, the death is external (no isolation)."""
    from oomguard._decide import DecisionCore, Record, RunAlone

    c = DecisionCore(allowed_failures=3, grace=5.0)
    c.submitted(["a-1", "b-2"], ["a-1", "b-2"], {}, now=0.0)
    out = _death(c, "tcp://w:1", ["a-1", "b-2"], _killer("earlyoom", memory), now=1.0)
    [record] = [d for d in out if isinstance(d, Record)]
    assert {e.killer for e in record.events} == {"earlyoom"}
    assert record.death.killer.summary == "SIGTERM from earlyoom (pid 812, uid 0)"
    alone = [d.key for d in out if isinstance(d, RunAlone)]
    assert (len(alone) == 1) is memory  # one runs alone


@pytest.mark.parametrize(
    "name, memory, aborts", [("earlyoom", True, True), ("process", False, False)]
)
def test_same_signature_on_two_workers_aborts_only_for_a_memory_killer(name, memory, aborts):
    from oomguard._decide import DecisionCore, Stop

    c = DecisionCore(allowed_failures=5, grace=5.0)
    c.submitted(["load-1"], ["load-1"], {}, now=0.0)
    stops = []
    for i, w in enumerate(("tcp://w:1", "tcp://v:1")):
        stops += [
            d
            for d in _death(c, w, ["load-1"], _killer(name, memory), now=1.0 + i)
            if isinstance(d, Stop)
        ]
    assert bool(stops) is aborts
    if aborts:  # the PipelineAborted message names the killer and how it is known
        message = str(stops[0].exception)
        assert "killed by earlyoom (signal sender, confirmed)" in message, message
        assert "SIGTERM from earlyoom (pid 812, uid 0)" in message


# --- a SIGTERM to the nanny itself ---------------------------------------------------


def test_a_nanny_closed_on_a_signal_names_it_and_only_then(tmp_path):
    from oomguard.worker_plugin._reporting import stopped_by

    assert stopped_by("signal-15", None, None) == {"signal": "SIGTERM", "executing": []}
    assert stopped_by("signal-2", str(tmp_path), 4242)["signal"] == "SIGINT"
    for reason in ("nanny-close", "signal-", "signal-x", "", "worker-close"):
        assert stopped_by(reason, str(tmp_path), 4242) is None


@pytest.mark.parametrize(
    "value, field",
    [
        ("SIGTERM", "stopped_by"),
        ({"signal": "SIGTERM"}, "stopped_by"),
        ({"signal": "", "executing": []}, "stopped_by.signal"),
        ({"signal": "SIGTERM", "executing": ["k"] * 17}, "stopped_by.executing"),
        ({"signal": "SIGTERM", "executing": [3]}, "stopped_by.executing"),
    ],
)
def test_the_scheduler_checks_a_stopped_nanny_as_a_report(value, field):
    from oomguard import ReportError
    from oomguard.scheduler_plugin._reports import _stopped_by

    with pytest.raises(ReportError) as e:
        _stopped_by(value)
    assert e.value.field == field


def test_a_stopped_nannys_event_is_external_and_signed():
    from oomguard._decide import nanny_stop_record

    r = nanny_stop_record("tcp://w:1", "h", "('load', 3)", "etl", 100.0)
    [e] = r.events
    assert (e.cause, e.kind, r.death) == ("sigterm", "infra", None)
    assert e.evidence["external"] is True and e.signature_id
    assert e.killer == "unknown" and e.killer_confidence == "likely"


# --- a userspace OOM killer with no sender seen (issue 39, point 3) -----------------------

MIB = 2**20


def _no_sender(available, *, rate=None, age=0.4, killers=(EARLYOOM,), rss=None, largest=None):
    """A SIGTERM death the worker recorded no sender of (signal-senders: false)."""
    reading = host(available, total=8 * GIB, time=100.0 - age)
    if rate is not None:
        reading["available_rate"] = rate
    return attribute(
        {
            "cause": "sigterm",
            "time": 100.0,
            "evidence": {"oom_kill_delta": 0},
            "host_reading": reading,
            "killers": list(killers),
            "rss_sampled": rss,
            "host_memory": {"total": 8 * GIB, "available": 7 * GIB, "largest_other": largest},
        }
    )


def test_fast_growth_between_readings_is_likely_earlyoom_with_the_readings_age():
    """The issue's case: the nanny's last reading, 0.4 s old, was above earlyoom's SIGTERM
    threshold (1 GiB); MemAvailable fell ~1.3 GB/s, so it was past it by the death."""
    a = _no_sender(GIB + 300 * MIB, rate=-1.3e9)
    assert (a.name, a.how, a.confidence) == ("earlyoom", "inferred", "likely")
    assert a.facts["killer_basis"] == "memavailable projected"
    assert a.facts["memavailable_age_seconds"] == 0.4
    assert a.facts["memavailable_rate_bytes_per_second"] == -1_300_000_000
    assert a.facts["killer_threshold_signal"] == "SIGTERM"
    assert a.facts["memavailable_projected_bytes"] < GIB
    assert a.summary == (
        "SIGTERM, likely from earlyoom (pid 812): MemAvailable 16.2 % at a reading 0.4 s "
        "before the death, falling 1.21 GiB/s, so about 10.1 % by the death (at or below its "
        "SIGTERM threshold 12.5 %)"
    )


def test_what_the_reading_showed_comes_before_a_projection():
    a = _no_sender(GIB - MIB, rate=-4e9)  # read under SIGTERM's; projected under SIGKILL's
    assert a.facts["killer_basis"] == "memavailable read"
    assert a.facts["killer_threshold_signal"] == "SIGTERM"


@pytest.mark.parametrize("rate", [None, 0.0, 5e8, -1e8])
def test_memory_not_falling_fast_enough_names_no_earlyoom(rate):
    # 300 MiB above the threshold: at -100 MB/s it is still above it 0.4 s later.
    a = _no_sender(GIB + 300 * MIB, rate=rate)
    assert a.name == "unknown" and "killer_basis" not in a.facts


def test_the_hosts_largest_process_is_likely_earlyooms_pick():
    a = _no_sender(6 * GIB, rss=3 * GIB, largest={"pid": 77, "name": "postgres", "rss": GIB})
    assert (a.name, a.confidence) == ("earlyoom", "likely")
    assert a.facts["killer_basis"] == "largest process"
    assert a.memory is True and a.facts["worker_largest_process"] is True
    assert a.summary == (
        "SIGTERM, likely from earlyoom (pid 812): the worker was the host's largest process "
        "(RSS 3 GiB at its last sample; the next, postgres pid 77, 1 GiB), the one "
        "earlyoom kills; MemAvailable 75.0 % at a reading 0.4 s before the death"
    )


def test_a_larger_process_elsewhere_or_no_earlyoom_names_nobody():
    bigger = {"pid": 77, "name": "postgres", "rss": 4 * GIB}
    assert _no_sender(6 * GIB, rss=3 * GIB, largest=bigger).name == "unknown"
    smaller = {"pid": 77, "name": "postgres", "rss": GIB}
    assert _no_sender(6 * GIB, rss=3 * GIB, largest=smaller, killers=()).name == "unknown"
    assert _no_sender(GIB // 2, rate=-4e9, killers=()).name == "unknown"
