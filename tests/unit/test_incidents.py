"""Incidents as the scheduler groups them (`oomguard._decide.incidents`): the rule (place,
cause, killer, window), every order of arrival, late reports, window edges, bounds, and
that an incident changes none of the counts the abort rules use."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomguard._death.incident import incident_key, place
from oomguard._death.record import Attribution, Cgroup, Death, Task
from oomguard._decide import ANNOTATION, DecisionCore, Record, Removal, Stop
from oomguard._decide import incidents as incidents_module
from oomguard._decide.decisions import Record as RecordType
from oomguard._decide.incidents import KEEP, OPEN_MAX, REMEMBER, WINDOW, Incidents
from oomguard._signature import crash_sites, fingerprint, fingerprint_stack

KERNEL = Attribution("kernel", "kernel counter", "confirmed", "the kernel's OOM killer")


def death(i: int, t: float, host: str = "node-1", cause: str = "sigkill", **kw) -> Death:
    return Death(id=f"d{i}", worker=f"tcp://10.0.0.1:{4000 + i}", host=host, cause=cause,
                 time=t, **kw)  # fmt: skip


def test_three_workers_of_one_host_killed_at_once_are_one_incident():
    inc = Incidents()
    got = [inc.assign(death(i, 100.0 + i / 10), now=100.5) for i in range(3)]
    assert got == ["d0", "d0", "d0"]
    # The same host seconds later, another host, another cause or killer: others.
    assert inc.assign(death(3, 100.0 + WINDOW + 1), now=110.0) == "d3"
    assert inc.assign(death(4, 100.1, host="node-2"), now=110.0) == "d4"
    assert inc.assign(death(5, 100.1, cause="sigterm"), now=110.0) == "d5"
    assert inc.assign(death(6, 100.1, killer=KERNEL), now=110.0) == "d6"


@pytest.mark.parametrize(
    "cause, killer",
    [
        ("native_crash", None),  # the worker's own crash: killer `task`
        ("exit", None),
        ("memory_terminate", None),  # its own nanny's memory limit: killer `dask-nanny`
        ("sigterm", Attribution("task", "signal sender", "confirmed", "itself")),
    ],
)
def test_a_death_the_worker_or_its_nanny_brought_on_is_always_alone(cause, killer):
    inc = Incidents()
    ids = [inc.assign(death(i, 100.0, cause=cause, killer=killer), now=100.0) for i in range(3)]
    assert ids == ["d0", "d1", "d2"]


def test_a_slurm_job_or_a_node_is_the_place_across_hosts():
    inc = Incidents()
    job = {"slurm_job_id": "812"}
    ids = [inc.assign(death(i, 50.0, host=f"n{i}", evidence=job), now=50.0) for i in range(3)]
    assert ids == ["d0", "d0", "d0"]
    assert place(death(0, 0, evidence={"node": "pool-a-3"})) == "node pool-a-3"
    assert place(death(0, 0, evidence=job)) == "SLURM job 812"
    assert place(death(0, 0, host="")) == "" and incident_key(death(0, 0, host="")) is None


def test_kernel_oom_kills_group_by_the_memory_group_killed_in():
    def oom(i: int, group: str) -> Death:
        return death(i, 10.0, cause="oom_kill", killer=KERNEL, cgroup=Cgroup(1, group))

    inc = Incidents()
    # Each worker in a group of its own, each over its own limit: not one cause.
    own = [inc.assign(oom(i, f"/oomguard/w{i}"), now=10.0) for i in range(3)]
    assert own == ["d0", "d1", "d2"]
    # One shared group (a container): the group ran out, for all of them.
    shared = [inc.assign(oom(i, "/docker/abc"), now=10.0) for i in range(3, 6)]
    assert shared == ["d3", "d3", "d3"]


@pytest.mark.parametrize("span, one", [(WINDOW, True), (WINDOW + 1e-6, False), (WINDOW / 2, True)])
def test_the_window_edge(span, one):
    inc = Incidents()
    first = inc.assign(death(0, 1000.0), now=1000.0)
    assert (inc.assign(death(1, 1000.0 + span), now=1001.0) == first) is one
    # One before the first by as much joins while the incident still spans the window.
    joins = one and 2 * span <= WINDOW
    assert (inc.assign(death(2, 1000.0 - span), now=1001.0) == first) is joins


def test_an_incident_spans_at_most_the_window_however_deaths_chain():
    inc = Incidents()
    times = [0.0, 2.0, 4.0, 6.0, 8.0]  # each within the window of the one before
    ids = [inc.assign(death(i, t), now=t) for i, t in enumerate(times)]
    assert ids == ["d0", "d0", "d0", "d3", "d3"]


def test_a_death_decided_late_joins_the_incident_of_its_time():
    inc = Incidents()
    assert inc.assign(death(0, 100.0), now=100.0) == "d0"
    assert inc.assign(death(1, 110.0), now=110.0) == "d1"  # a later incident, same place
    # Decided after its grace ran out (no report), but it died with the first ones.
    assert inc.assign(death(2, 101.0), now=120.0) == "d0"


def test_a_late_report_keeps_the_incident_of_the_death_it_amends():
    inc = Incidents()
    lost = [death(i, 10.0 + i / 10, cause="worker_lost") for i in range(3)]
    records = [inc.named(RecordType((), d), now=20.0) for d in lost]
    assert {r.death.incident for r in records} == {"d0"}
    # The report of d2 came after: another cause, the same death id, the same incident.
    amend = RecordType((), dataclasses.replace(lost[2], cause="oom_kill"), amends=10.2)
    assert inc.named(amend, now=60.0).death.incident == "d0"
    # Of a death it no longer remembers: the death's own id (an incident of its own).
    assert inc.of("never-seen") == "never-seen"


def test_memory_is_bounded(monkeypatch):
    monkeypatch.setattr(incidents_module, "OPEN_MAX", 50)
    monkeypatch.setattr(incidents_module, "REMEMBER", 80)
    inc = Incidents()
    for i in range(500):
        inc.assign(death(i, float(i), host=f"h{i}"), now=float(i))
    assert len(inc._open) == 50 and len(inc._of) == 80
    # Incidents close KEEP seconds (scheduler clock) after their last death.
    inc.assign(death(999, 0.0, host="z"), now=10_000.0 + KEEP + 1)
    assert len(inc._open) == 1
    assert OPEN_MAX >= 1000 and REMEMBER >= 1000  # the real bounds are not tiny


# -- every order of arrival (hypothesis) -----------------------------------------------------

burst = st.lists(st.floats(0.0, WINDOW, allow_nan=False), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(offsets=burst, order=st.randoms(use_true_random=False), late=st.floats(0.0, 60.0))
def test_a_burst_within_the_window_is_one_incident_in_any_order(offsets, order, late):
    """Deaths of one place, cause and killer all within the window, decided in any order and
    up to a minute after they happened: one incident, named by the first one decided."""
    base = 1_790_000_000.0
    deaths = [death(i, base + o) for i, o in enumerate(offsets)]
    order.shuffle(deaths)
    inc = Incidents()
    assert {inc.assign(d, now=base + late) for d in deaths} == {deaths[0].id}


events = st.lists(
    st.tuples(
        st.floats(0.0, 60.0, allow_nan=False),  # when it died
        st.sampled_from(["node-1", "node-2"]),
        st.sampled_from(["sigkill", "worker_lost", "native_crash"]),
        st.floats(0.0, 30.0, allow_nan=False),  # how long after it was decided
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(stream=events)
def test_every_incident_is_one_place_cause_and_killer_within_the_window(stream):
    inc = Incidents()
    decided = sorted(enumerate(stream), key=lambda x: x[1][0] + x[1][3])
    members: dict[str, list[Death]] = {}
    for i, (t, host, cause, lag) in decided:
        d = death(i, t, host=host, cause=cause)
        members.setdefault(inc.assign(d, now=t + lag), []).append(d)
    for incident, ds in members.items():
        # Named by its first death to be decided, which is one of its own.
        assert ds[0].id == incident
        assert len({incident_key(d) for d in ds}) == 1
        assert max(d.time for d in ds) - min(d.time for d in ds) <= WINDOW
        if incident_key(ds[0]) is None:
            assert len(ds) == 1
    assert len(inc) <= OPEN_MAX


# -- the abort rules do not change -----------------------------------------------------------


def _three_deaths_then_again(window: float) -> tuple[list, DecisionCore]:
    """Three shards of one run, each on a worker of one host, all three workers killed in
    the same second by the kernel in one shared memory group (a container): twice."""
    c = DecisionCore(allowed_failures=3, grace=5.0, max_shard_infra_failures=2)
    c.incidents.window = window
    keys = ["load-1", "load-2", "load-3"]
    c.submitted(keys, keys, {ANNOTATION: dict.fromkeys(keys, "etl")}, now=0.0)
    out = []
    for round_ in (0, 1):
        for i, key in enumerate(keys):
            t = 10.0 + 100 * round_ + i / 10
            worker = f"tcp://10.0.0.1:{4000 + 10 * round_ + i}"
            removal = Removal(worker, "node-1", t, {key: key}, pid=100 + i)
            out += c.removed(removal, now=t)
            report = Death(
                worker=worker, host="node-1", pid=100 + i, cause="oom_kill", time=t,
                killer=KERNEL, cgroup=Cgroup(2, "/kubepods/pod-a"),
                tasks=(Task(key, "load"),),
            )  # fmt: skip
            out += c.reported(report, now=t + 0.01)
    return out, c


def _without_incidents(decisions: list) -> list:
    """The decisions as values, a death's incident left out (an exception is compared by
    what it says: two exceptions are never ==)."""
    out = []
    for d in decisions:
        if isinstance(d, Record) and d.death is not None:
            d = dataclasses.replace(d, death=dataclasses.replace(d.death, incident=""))
        if isinstance(d, Stop):
            d = ("Stop", d.keys, str(d.exception), d.exception.count, d.run)
        out.append(d)
    return out


def test_an_incident_of_three_deaths_changes_no_count_the_abort_rules_use():
    grouped, a = _three_deaths_then_again(WINDOW)
    alone, b = _three_deaths_then_again(0.0)  # each death its own incident
    incidents = [d.death.incident for d in grouped if isinstance(d, Record)]
    assert len(incidents) == 6 and len(set(incidents)) == 2  # two incidents of three
    assert len({d.death.incident for d in alone if isinstance(d, Record)}) == 6
    # Every decision is the same but the incident a death names: the same records, the
    # same events (one per death, each shard's own), the same abort at the same death.
    assert _without_incidents(grouped) == _without_incidents(alone)
    assert [type(d).__name__ for d in grouped].count("Stop") >= 1
    (stop, *_) = [d for d in grouped if isinstance(d, Stop)]
    assert stop.exception.count == 2  # the shard's own two deaths, not the incident's six
    for key in ("load-1", "load-2", "load-3"):
        assert a.policy.attempt(key) == b.policy.attempt(key)
        assert a.budget.deaths(key) == b.budget.deaths(key) == 2
    assert a.deaths == b.deaths == 6
    run = next(iter(a.policy.pipelines()))
    assert a.policy.status(run) == b.policy.status(run)


# -- crash sites ------------------------------------------------------------------------------

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "docs" / "examples"


def test_a_native_crash_has_its_native_and_its_in_app_site():
    sig = fingerprint((EXAMPLES / "faulthandler-sigsegv-dask-worker.txt").read_text())
    assert crash_sites(sig) == (
        "SIGSEGV in ctypes.string_at",
        "SIGSEGV in shardapp.core.parse_record",
    )
    # Another caller of the same native function: another signature, a site in common.
    other = fingerprint(
        "Fatal Python error: Segmentation fault\n\nCurrent thread 0x7f (most recent call "
        'first):\n  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at\n'
        '  File "/srv/shardapp/core.py", line 19 in parse_header\n'
    )
    assert other.id != sig.id and set(crash_sites(other)) & set(crash_sites(sig)) == {
        "SIGSEGV in ctypes.string_at"
    }


def test_sampled_stacks_and_task_names_have_no_native_site():
    sampled = fingerprint_stack(
        "oom_kill",
        [("/srv/shardapp/core.py", 30, "load"), ("/usr/lib/python3/json/decoder.py", 3, "decode")],
    )
    assert sampled.top.function == "decode"  # where the sampler found it, not a site
    assert crash_sites(sampled) == ("oom_kill in shardapp.core.load",)
    assert crash_sites(fingerprint_stack("oom_kill", [("<task>", None, "load")])) == ()
    assert crash_sites(fingerprint("no trace here")) == ()


@pytest.mark.parametrize(
    "module",
    [
        "oomguard._death.incident",
        "oomguard._decide.incidents",
        "oomguard._signature._sites",
        "oomguard._store.links",
        "oomguard._words.incidents",
    ],
)
def test_docstring_examples(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0
