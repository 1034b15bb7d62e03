"""What a nanny saw of one death (`record.Seen`) says: the facts the cause rules decide on
(`facts_from`) and flat evidence for people (`evidence`), each value naming its source.

Pure code: no Dask, no I/O. Malformed parts are skipped, never raised on. The rules the
facts feed, and the sentences built from the evidence, are in `classify`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._models import evidence_int as _int
from .._models import evidence_map as _map
from .._models import evidence_number as _num
from .._units import format_bytes
from .cause import (
    UNKNOWN_EXITCODES,
    DeathFacts,
    crash_signal,
    describe_signal,
    terminated_first,
)
from .record import MemoryCounters, Seen

_V1_OOM_SOURCE = "kernel cgroup counter memory.oom_control"
_V2_OOM_SOURCE = "kernel cgroup counter memory.events"
_PEAK_SOURCES = {
    1: "kernel cgroup counter memory.max_usage_in_bytes",
    2: "kernel cgroup counter memory.peak",
}
_LIMIT_SOURCES = {1: "kernel cgroup memory.limit_in_bytes", 2: "kernel cgroup memory.max"}
_NANNY_EVENT_SOURCE = "nanny event worker-restart-memory"


def _nanny_killed(event: Any) -> bool:
    # The event dict (even an empty one) means it was seen; a bare True is accepted too.
    return isinstance(event, Mapping) or event is True


def _kernel_log_is_worker(victim: Mapping[str, Any], pid: Any) -> bool:
    # A victim with another PID is a child process of the worker, not the worker itself.
    vpid = _int(victim.get("pid"))
    return vpid is None or _int(pid) is None or vpid == pid


def _counts(c: MemoryCounters | None) -> Mapping[str, Any]:
    return vars(c) if isinstance(c, MemoryCounters) else _map(c)


def facts_from(seen: Seen) -> DeathFacts:
    """The facts the cause rules decide on."""
    before, after = _counts(seen.cgroup_before), _counts(seen.cgroup_after)
    victim = seen.kernel_log_victim
    reading = _map(seen.cgroup_reading)
    return DeathFacts(
        exitcode=_int(seen.exitcode),
        oom_kill_before=_int(before.get("oom_kill")),
        oom_kill_after=_int(after.get("oom_kill")),
        nanny_memory_kill=_nanny_killed(seen.nanny_memory_kill),
        kernel_log_oom=isinstance(victim, Mapping) and _kernel_log_is_worker(victim, seen.pid),
        crash_signal=crash_signal(seen.crash_text),
        requested_close=bool(seen.requested),
        terminated_first=terminated_first(seen.crash_text),
        oom_kill_reading=_int(reading.get("oom_kill")),
        others_gone=_int(reading.get("others_gone")),
    )


def evidence(seen: Seen) -> dict[str, Any]:
    """Flat evidence for one death; each value's source is in its key or a ``*_source`` key.

    Malformed parts of what the nanny read are skipped, never raised on. The peak's scope
    follows how the nanny put the worker into its group (`Seen.cgroup_placement`).

    >>> before, after = example_counters(oom_kill=0), example_counters(oom_kill=1, peak=2**30)
    >>> ev = evidence(Seen(exitcode=-9, cgroup_version=2, cgroup_before=before,
    ...                    cgroup_after=after))
    >>> ev["signal"], ev["oom_kill_delta"], ev["oom_kill_source"], ev["peak_source"]
    ('SIGKILL', 1, 'kernel cgroup counter memory.events', 'kernel cgroup counter memory.peak')
    """
    ev: dict[str, Any] = {}
    code = _int(seen.exitcode)
    ev["exitcode"] = code
    ev["exitcode_source"] = "nanny: worker process exit status"
    if code == 255:
        ev["exitcode_note"] = "255 usually means the status was already reaped"
    sig = describe_signal(code)
    text = seen.crash_text if isinstance(seen.crash_text, str) else None
    fatal = crash_signal(text)
    if sig is not None:
        ev["signal"], ev["signal_source"] = sig, "exit status"
    elif fatal is not None and code in UNKNOWN_EXITCODES:
        ev["signal"], ev["signal_source"] = fatal, "faulthandler crash file"
    if text is not None:
        ev["crash_signal"] = fatal
        ev["crash_stack"] = "Current thread" in text or "Stack (most recent call first)" in text
        ev["crash_source"] = "faulthandler crash file"

    version = _int(seen.cgroup_version)
    before, after = _counts(seen.cgroup_before), _counts(seen.cgroup_after)
    if version is not None or before or after:
        ev["cgroup_version"] = version
        b, a = _int(before.get("oom_kill")), _int(after.get("oom_kill"))
        ev["oom_kill_before"], ev["oom_kill_after"] = b, a
        ev["oom_kill_delta"] = a - b if a is not None and b is not None else None
        ev["oom_kill_source"] = _V2_OOM_SOURCE if version == 2 else _V1_OOM_SOURCE
        if ev["oom_kill_delta"] is None:
            ev["oom_kill_source"] += " (unreadable before or after the death)"
        peak = _int(after.get("peak"))
        if peak is None:
            peak = _int(before.get("peak"))
        if peak is not None:
            ev["peak_bytes"] = peak
            ev["peak_source"] = _PEAK_SOURCES.get(version or 1, _PEAK_SOURCES[1])
        limit = _int(after.get("limit"))
        if limit is None:
            limit = _int(before.get("limit"))
        if limit is not None:
            ev["limit_bytes"] = limit
            ev["limit_source"] = _LIMIT_SOURCES.get(version or 1, _LIMIT_SOURCES[1])
        placement = _map(seen.cgroup_placement)
        if placement and (placement.get("own_group") or peak is not None):
            _placement_evidence(ev, placement, version)
        _reading_evidence(ev, _map(seen.cgroup_reading), a, placement)
        fb, fa = _int(before.get("failcnt")), _int(after.get("failcnt"))
        if fb is not None and fa is not None:
            ev["failcnt_delta"] = fa - fb
            ev["failcnt_source"] = (
                "kernel cgroup counter memory.events max"
                if version == 2
                else "kernel cgroup counter memory.failcnt"
            )
    if isinstance(seen.flight_read, bool):  # False: `executing` says nothing
        ev["flight_record"] = seen.flight_read
    mem_limit = _int(seen.memory_limit)
    if mem_limit is not None:
        ev["memory_limit_bytes"] = mem_limit
        ev["memory_limit_source"] = "dask worker memory_limit"
    rss = _int(seen.rss_sampled)
    if rss is not None:
        ev["rss_sampled_bytes"] = rss
        ev["rss_source"] = "sampled RSS"
        t, rt = _num(seen.time), _num(seen.rss_time)
        if t is not None and rt is not None:
            ev["rss_age_seconds"] = round(float(t - rt), 3)
    host = _map(seen.host_memory)
    if host:
        ev["host_available_bytes"] = _int(host.get("available"))
        ev["host_total_bytes"] = _int(host.get("total"))
        ev["host_memory_source"] = "host memory after the death"

    nanny = seen.nanny_memory_kill
    ev["nanny_memory_kill"] = _nanny_killed(nanny)
    ev["nanny_memory_kill_source"] = _NANNY_EVENT_SOURCE
    if isinstance(nanny, Mapping) and _int(nanny.get("rss")) is not None:
        ev["nanny_rss_bytes"] = nanny["rss"]
        ev["nanny_rss_source"] = (
            f"nanny RSS: the nanny's own reading, in its {_NANNY_EVENT_SOURCE}"
        )

    victim = seen.kernel_log_victim
    if isinstance(victim, Mapping):
        is_worker = _kernel_log_is_worker(victim, seen.pid)
        if is_worker:
            ev["oom_attribution"] = "the kernel log names this PID (records since it started)"
            ev["oom_confirmed"] = True
        ev["kernel_log_oom"] = is_worker
        ev["kernel_log_victim_pid"] = _int(victim.get("pid"))
        name = victim.get("name", victim.get("comm"))
        if isinstance(name, str):
            ev["kernel_log_victim_name"] = name[:256]
        ev["kernel_log_victim_is_worker"] = is_worker
        ev["kernel_log_source"] = "kernel log (dmesg)"
    return ev


def _reading_evidence(
    ev: dict[str, Any], reading: Mapping[str, Any], after: int | None, placement
) -> None:
    """What the last reading of the worker's group says: did the kernel count an OOM kill
    since, and is it this worker's (see R5 in classify's table)?"""
    count = _int(reading.get("oom_kill"))
    if count is None:
        return
    ev["oom_kill_last_reading"] = count
    age = _num(reading.get("age"))
    if age is not None:
        ev["last_reading_age_seconds"] = age
    others, gone = _int(reading.get("others")), _int(reading.get("others_gone"))
    ev["group_others"], ev["group_others_gone"] = others, gone
    ev["reading_source"] = (
        "the nanny's reading of the group while the worker ran (every sample interval): "
        "oom_kill, and the other processes in cgroup.procs"
    )
    if after is None or after <= count:
        ev["oom_kill_since_reading"] = 0 if after is not None else None
        return
    ev["oom_kill_since_reading"] = after - count
    own = _map(placement).get("own_group") is True
    if gone:
        ev["oom_confirmed"] = False
        ev["oom_attribution"] = (
            f"not confirmed: {gone} other process(es) in the group stopped since the "
            "reading, and the kill may be theirs"
        )
    else:
        ev["oom_confirmed"] = True
        ev["oom_attribution"] = (
            "counted in the worker's own group"
            if own
            else "counted in its shared group, and every other process there still runs"
        )


def _placement_evidence(ev: dict[str, Any], placement: Mapping[str, Any], version) -> None:
    """What the group's peak covers, given how the nanny put the worker into it.

    Charges stay where they were made (v1 moved them only with move_charge_at_immigrate,
    which Linux 6.13 removed; v2 never): a peak is the worker's whole peak only when its
    earlier charges moved with it.
    """
    if not placement.get("own_group"):
        ev["peak_scope"] = "shared"
        ev["peak_covers"] = (
            "every process in the worker's cgroup, other processes included: the worker had "
            "no group of its own"
        )
        return
    ev["peak_scope"] = "worker"
    moved = placement.get("charge_moved") is True and version != 2
    ev["charge_moved"] = moved
    rss = _int(placement.get("rss_at_move"))
    if rss is not None:
        ev["rss_at_move_bytes"] = rss
        ev["rss_at_move_source"] = (
            "the worker's RSS when the nanny moved it into its group (/proc/PID/status)"
        )
    if moved:
        ev["peak_covers"] = (
            "everything the worker charged: what it charged before it joined its group moved "
            "with it (memory.move_charge_at_immigrate: anonymous and mapped file pages)"
        )
        return
    if version == 2:
        why = (
            "cgroup v2 never moves charges; memory.peak is the group's highest "
            "memory.current since the group was made"
        )
    else:
        note = placement.get("note")
        why = (
            note[:300]
            if isinstance(note, str) and note
            else ("memory.move_charge_at_immigrate was not set")
        )
    held = f" (RSS then: {format_bytes(rss)})" if rss is not None else ""
    ev["peak_covers"] = (
        "only what the worker charged after it joined its group; what it charged before it "
        f"joined its group{held} stayed charged to the parent group: {why}"
    )


def example_counters(**counts: int) -> MemoryCounters:
    """A v2 group's counters with `counts` set (examples and tests)."""
    fields = dict.fromkeys(("oom_kill", "oom", "oom_group_kill", "failcnt", "peak", "limit"))
    return MemoryCounters(2, "/sys/fs/cgroup/w", **{**fields, "usage": None, **counts})
