"""Who ended a worker process, and how that is known (`attribute`).

Pure code: no Dask, no I/O. The cause (`classify`) says *how* the worker died; this names
*who*: a `Killer` from a fixed vocabulary, how it is known (`Known`), and whether that is
`confirmed` (evidence names it) or `likely` (what could be excluded was, and this remains).
The nanny gathers the inputs: the senders of the catchable signals the worker received (its
flight record), its last reading of host memory, the userspace OOM killers running on the
host and their thresholds, systemd-oomd's cgroup xattrs, SLURM's job from the environment.

=====  ===================================================================  =============
rule   when                                                                 killer, how
=====  ===================================================================  =============
K1     cause oom_kill (kernel counter or kernel log, see classify R5)       kernel
K2     cause memory_terminate (the nanny's worker-restart-memory event)     dask-nanny
K3     cause native_crash or exit (the process crashed or exited itself)    task
K4     SIGTERM, and the worker saw its sender (si_pid, si_uid, /proc):      the sender:
       earlyoom, systemd-oomd, slurmstepd, kubelet, the worker itself,      confirmed,
       any other process (named, the nanny's own too); pid 0 is a sender    signal sender
       outside the worker's PID namespace (a container runtime, the
       kubelet): unknown unless the pod status says more
K5     SIGKILL and systemd-oomd's user.oomd_kill moved on the worker's      systemd-oomd,
       group or an ancestor since the last reading                          cgroup xattr
K6     SIGTERM or SIGKILL with no sender seen: the kernel and systemd-oomd  likely:
       excluded where their counters were read; a SIGTERM's sender seen     inferred
       shortly before a SIGKILL; a userspace OOM killer running on the
       host (`memory_killer`) whose threshold MemAvailable had reached
       at the last reading, or would have by the death at the rate it
       fell between the last two readings, or that picks the host's
       largest process when the worker was that; a SLURM job's worker;
       else unknown
=====  ===================================================================  =============

What a killer means for blame (`Attribution.memory`): a userspace OOM killer (earlyoom,
systemd-oomd) picks the host's largest process; when that was this worker (its RSS more
than half the memory in use on the host at the last reading) the kill is a memory kill of
the worker, and its executing shards are suspects as for ``memory_terminate``. When most of
the host's memory was held by others it is an external death. Any other named process, a
person, SLURM and an unexplained signal are external: never a deterministic crasher.

>>> seen = Seen(exitcode=-15, pid=40,
...     signals=({"signal": "SIGTERM", "pid": 812, "uid": 0, "name": "earlyoom"},))
>>> a = attribute(seen, "sigterm", {})
>>> a.name, a.how, a.confidence
('earlyoom', 'signal sender', 'confirmed')
>>> a.summary
'SIGTERM from earlyoom (pid 812, uid 0)'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._causes import Confidence, Killer, Known
from .._models import evidence_int as _int
from .._models import evidence_map as _map
from .._models import evidence_number as _num
from .._units import format_bytes
from . import slurm as _slurm
from .memory_killer import likely_memory_killer, memory_phrase
from .record import Attribution, Seen

#: Process names (/proc/PID/comm, at most 15 characters) of the killers we can name.
SENDER_NAMES = {
    "earlyoom": Killer.EARLYOOM,
    "systemd-oomd": Killer.SYSTEMD_OOMD,
    "slurmstepd": Killer.SLURM,
    "slurmd": Killer.SLURM,
    "kubelet": Killer.KUBELET,
}
#: Killers that act on host memory: their kill of the largest process is a memory kill.
MEMORY_KILLERS = frozenset({Killer.EARLYOOM, Killer.SYSTEMD_OOMD})
#: A SIGTERM seen this many seconds before a SIGKILL makes its sender the likely killer
#: (SLURM, the kubelet and `timeout -k` all send SIGTERM, then SIGKILL after a grace).
SIGTERM_BEFORE_SIGKILL = 120.0
_CMDLINE_MAX = 1024


def unknown(summary: str = "no evidence names the killer") -> Attribution:
    return Attribution(Killer.UNKNOWN.value, Known.INFERRED.value, Confidence.LIKELY, summary)


def for_cause(cause: str) -> Attribution:
    """The killer a cause alone implies, for deaths with no nanny attribution: a report
    from an older nanny, or a worker lost with its nanny (no report)."""
    if cause == "oom_kill":
        return _confirmed(Killer.KERNEL, Known.KERNEL_COUNTER, "the kernel's OOM killer")
    if cause == "memory_terminate":
        return _confirmed(Killer.DASK_NANNY, Known.NANNY_EVENT, "Dask's nanny (memory terminate)")
    if cause in ("native_crash", "exit"):
        return _confirmed(Killer.TASK, Known.EXIT_STATUS, "the worker's own code")
    if cause == "worker_lost":
        return unknown("no report: the worker was lost with its nanny (host or pod gone)")
    return unknown()


def _confirmed(killer: Killer, how: Known, summary: str, **facts: Any) -> Attribution:
    return Attribution(killer.value, how.value, Confidence.CONFIRMED.value, summary, facts)


def attribute(seen: Seen, cause: str, evidence: Mapping[str, Any]) -> Attribution:
    """The killer of one death of `cause` (from the cause rules), from what the nanny saw
    and the evidence the facts gave (for the kernel's). Malformed parts are skipped, never
    raised on (see docs/reading-a-report.md)."""
    host = _host_facts(seen)
    slurm = _slurm_facts(seen)
    if cause == "oom_kill":
        how = Known.KERNEL_LOG if evidence.get("kernel_log_oom") else Known.KERNEL_COUNTER
        what = "the kernel log names its PID" if how is Known.KERNEL_LOG else "oom_kill counted"
        return _with(
            _confirmed(Killer.KERNEL, how, f"SIGKILL from the kernel's OOM killer ({what})"),
            host,
            slurm,
            memory=True,
        )
    if cause == "memory_terminate":
        nanny = _map(seen.nanny_memory_kill)
        rss = _int(nanny.get("rss"))
        at = f" at RSS {format_bytes(rss)}" if rss is not None else ""
        limit = _int(seen.memory_limit)
        of = f" of its {format_bytes(limit)} memory_limit" if limit and at else ""
        return _with(
            _confirmed(
                Killer.DASK_NANNY,
                Known.NANNY_EVENT,
                f"SIGTERM from Dask's nanny: memory terminate{at}{of}",
            ),
            host,
            slurm,
            memory=True,
        )
    if cause in ("native_crash", "exit"):
        code = _int(seen.exitcode)
        what = "crashed" if cause == "native_crash" else f"exited with status {code}"
        return _with(
            _confirmed(Killer.TASK, Known.EXIT_STATUS, f"the worker's own code: it {what}"),
            host,
            slurm,
        )
    signals = _signals(seen.signals)
    if cause == "sigterm":
        sender = _last(signals, "SIGTERM")
        if sender is not None:
            return _with(_by_sender(sender, seen, host), host, slurm)
        return _with(_inferred("SIGTERM", seen, evidence, host, slurm, signals), host, slurm)
    if cause == "sigkill":
        oomd = _oomd_moved(seen.oomd)
        if oomd:
            a = _confirmed(
                Killer.SYSTEMD_OOMD,
                Known.CGROUP_XATTR,
                f"SIGKILL from systemd-oomd (user.oomd_kill +{oomd} on the worker's group or an ancestor)",
                oomd_kill_delta=oomd,
            )
            return _with(a, host, slurm, memory=bool(host.get("worker_largest")))
        return _with(_inferred("SIGKILL", seen, evidence, host, slurm, signals), host, slurm)
    return unknown()


def _with(a: Attribution, host: dict, slurm: dict, *, memory: bool | None = None) -> Attribution:
    facts = {**host, **slurm, **a.facts}
    mem = a.memory if memory is None else memory
    if a.name in {k.value for k in MEMORY_KILLERS} and memory is None:
        mem = bool(facts.get("worker_largest") or facts.get("worker_largest_process"))
    facts["killer_memory"] = mem
    return Attribution(a.name, a.how, a.confidence, a.summary, facts, mem)


def _by_sender(s: dict, seen: Seen, host: dict) -> Attribution:
    """K4: a SIGTERM whose sender the worker saw."""
    facts = {
        "sender_pid": s["pid"],
        "sender_uid": s["uid"],
        "sender_name": s["name"],
        "sender_cmdline": s["cmdline"],
        "sender_source": "the signal's si_pid and si_uid, and /proc/PID of the sender on receipt",
    }
    facts = {k: v for k, v in facts.items() if v is not None}
    pid, uid, name = s["pid"], s["uid"], s["name"]
    if pid == 0:
        facts["sender_outside"] = True
        return Attribution(
            Killer.UNKNOWN.value,
            Known.SIGNAL_SENDER.value,
            Confidence.LIKELY.value,
            f"SIGTERM from outside this container (pid 0, uid {uid}): its runtime, "
            "the kubelet or a person",
            facts,
        )
    who = (
        f"{name} (pid {pid}, uid {uid})"
        if name
        else f"pid {pid} (uid {uid}; it exited before it was named)"
    )
    if pid == _int(seen.nanny_pid):
        # Not Dask's memory terminate (K2) nor a requested stop (no death): other code in
        # the nanny's process, as a LocalCluster's client in the same process.
        facts["sender_is_nanny_process"] = True
        return _sent(
            Killer.PROCESS,
            f"SIGTERM from the nanny's own process {who}, neither its memory terminate nor "
            "a requested stop",
            facts,
        )
    if pid == _int(seen.pid):
        return _sent(Killer.TASK, f"SIGTERM from the worker itself ({who})", facts)
    killer = SENDER_NAMES.get(name or "", Killer.PROCESS)
    summary = f"SIGTERM from {who}"
    job = _slurm_facts(seen)
    if killer is Killer.SLURM and _slurm.ended_by_slurm(job):
        summary += f": {_slurm.describe(job)}"
    elif killer is Killer.SLURM and job:
        summary += f" in SLURM job {job['slurm_job_id']}: its time limit, scancel or preemption"
    if killer in MEMORY_KILLERS:
        summary += memory_phrase(host, _threshold(seen, killer, pid, "term"))
    return _sent(killer, summary, facts)


def _sent(killer: Killer, summary: str, facts: dict) -> Attribution:
    return Attribution(
        killer.value, Known.SIGNAL_SENDER.value, Confidence.CONFIRMED.value, summary, facts
    )


def _inferred(
    sig: str,
    seen: Seen,
    ev: Mapping[str, Any],
    host: dict,
    job: dict,
    signals: list[dict],
) -> Attribution:
    """K6: no sender seen. Say what was excluded, and what is likely, with the numbers."""
    facts: dict[str, Any] = {}
    excluded = []
    if ev.get("oom_kill_delta") == 0 or ev.get("oom_kill_since_reading") == 0:
        excluded.append("not the kernel (oom_kill unchanged, no kernel log line)")
    oomd = _map(seen.oomd)
    if _int(_map(oomd.get("after")).get("kill")) is not None and not _oomd_moved(oomd):
        excluded.append("not systemd-oomd (user.oomd_kill unchanged)")
    if excluded:
        facts["killer_excluded"] = "; ".join(excluded)
    death = _num(seen.time)
    if sig == "SIGKILL":
        term = _last(signals, "SIGTERM")
        t = _num(term.get("time")) if term else None
        if term is not None and (
            death is None or t is None or death - t <= SIGTERM_BEFORE_SIGKILL
        ):
            named = _by_sender(term, seen, host)
            ago = f" {death - t:.1f} s" if death is not None and t is not None else ""
            return Attribution(
                named.name,
                Known.INFERRED.value,
                Confidence.LIKELY.value,
                f"SIGKILL{ago} after a {named.summary}",
                {**named.facts, **facts},
            )
    for k in _killers(seen.killers):
        killer = SENDER_NAMES.get(k["name"])
        if killer not in MEMORY_KILLERS or k.get("dryrun") is True:  # --dryrun kills nothing
            continue
        summary = likely_memory_killer(k, sig, host, seen, facts)
        if summary is not None:
            return Attribution(
                killer.value, Known.INFERRED.value, Confidence.LIKELY.value, summary, facts
            )
    if job and _slurm.ended_by_slurm(job):
        return Attribution(
            Killer.SLURM.value,
            Known.JOB_STATE.value,
            Confidence.CONFIRMED.value,
            f"{sig} from slurmstepd: {_slurm.describe(job)}",
            facts,
        )
    if job:
        return Attribution(
            Killer.SLURM.value,
            Known.JOB_STATE.value,
            Confidence.LIKELY.value,
            f"{sig} in SLURM job {job.get('slurm_job_id')}: likely slurmstepd (time limit, scancel or preemption)",
            facts,
        )
    why = "; ".join(excluded) or "no killer evidence was readable"
    mem = memory_phrase(host, None)
    return Attribution(
        Killer.UNKNOWN.value,
        Known.INFERRED.value,
        Confidence.LIKELY.value,
        f"{sig} from an unknown sender: {why}{mem}",
        facts,
    )


def _threshold(seen: Seen, killer: Killer, pid: int, level: str):
    for k in _killers(seen.killers):
        if k["pid"] == pid or SENDER_NAMES.get(k["name"]) is killer:
            limit = _int(k.get(f"{level}_bytes"))
            if limit is not None:
                return level, limit, _num(k.get(f"{level}_percent"))
    return None


def _host_facts(seen: Seen) -> dict[str, Any]:
    """The nanny's last reading of host memory while the worker ran (else the one after
    the death), and the worker's share of the memory in use then."""
    reading = _map(seen.host_reading)
    source = "the nanny's last reading of /proc/meminfo while the worker ran"
    if _int(reading.get("available")) is None:
        reading = _map(seen.host_memory)
        source = "/proc/meminfo after the death"
    total, avail = _int(reading.get("total")), _int(reading.get("available"))
    if total is None or avail is None or total <= 0:
        return {}
    facts: dict[str, Any] = {
        "memavailable_bytes": avail,
        "memtotal_bytes": total,
        "memavailable_percent": round(100.0 * avail / total, 2),
        "memavailable_source": source,
    }
    t, death = _num(reading.get("time")), _num(seen.time)
    if t is not None and death is not None:
        facts["memavailable_age_seconds"] = round(max(death - t, 0.0), 3)
    rate = _num(reading.get("available_rate"))  # bytes/s between the last two readings
    if rate is not None:
        facts["memavailable_rate_bytes_per_second"] = round(rate)
    for key in ("psi_some10", "psi_full10"):
        v = _num(reading.get(key))
        if v is not None:
            facts[f"psi_{key[4:-2]}_avg10"] = v
    rss = _int(seen.rss_sampled)
    used = total - avail
    if rss is not None and used > 0:
        share = min(rss / used, 1.0)
        facts["worker_share_of_used"] = round(share, 3)
        facts["worker_largest"] = share > 0.5
    return facts


def _slurm_facts(seen: Seen) -> dict[str, Any]:
    """The job from the worker's environment, and what SLURM said of it after the death
    (``slurm_job["slurm"]``: `slurm_job.query`'s flat facts, keys in `slurm.KEYS`)."""
    env = _map(seen.slurm_job)
    out = {}
    for key in ("slurm_job_id", "slurm_step_id"):
        v = env.get(key)
        if isinstance(v, str) and v:
            out[key] = v[:64]
    if out.get("slurm_job_id"):
        said = _map(env.get("slurm"))
        for key in (*_slurm.KEYS, "slurm_query_seconds"):
            v = said.get(key)
            if key not in out and isinstance(v, (str, int, float)) and not isinstance(v, bool):
                out[key] = v[: _slurm.LINE_MAX] if isinstance(v, str) else v
    return out


def _signals(value: Any) -> list[dict]:
    """The well-formed signal records, oldest first (at most 8)."""
    out = []
    for s in value if isinstance(value, (list, tuple)) else ():
        s = _map(s)
        name, pid, uid = s.get("signal"), _int(s.get("pid")), _int(s.get("uid"))
        if not isinstance(name, str) or pid is None or pid < 0:
            continue
        comm = s.get("name")
        cmd = s.get("cmdline")
        out.append(
            {
                "signal": name[:16],
                "pid": pid,
                "uid": uid,
                "time": _num(s.get("time")),
                "name": _clean(comm, 64) if isinstance(comm, str) and comm else None,
                "cmdline": _clean(cmd, _CMDLINE_MAX) if isinstance(cmd, str) and cmd else None,
            }
        )
    return out[-8:]


def _clean(s: str, cap: int) -> str:
    return "".join(c if c.isprintable() else " " for c in s[:cap]).strip()


def _last(signals: list[dict], name: str) -> dict | None:
    for s in reversed(signals):
        if s["signal"] == name:
            return s
    return None


def _killers(value: Any) -> list[dict]:
    out = []
    for k in value if isinstance(value, (list, tuple)) else ():
        k = _map(k)
        if isinstance(k.get("name"), str) and _int(k.get("pid")) is not None:
            out.append(k)
    return out[:16]


def _oomd_moved(value: Any) -> int:
    """How many kills systemd-oomd counted since the last reading (0: none or unknown)."""
    oomd = _map(value)
    before = _int(_map(oomd.get("reading")).get("kill"))
    after = _int(_map(oomd.get("after")).get("kill"))
    if after is None or before is None:
        return 0
    return max(after - before, 0)
