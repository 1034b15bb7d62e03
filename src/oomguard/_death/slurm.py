"""What SLURM says of a job: its state, why, who cancelled it, its limits (`parse_scontrol`,
`parse_sacct`, `parse_output`), and the evidence a death carries from it (`job_facts`).

Pure code: no Dask, no I/O. The texts are SLURM 22.05's own (captured from a real
slurmctld in tests/slurm, kept in tests/fixtures/slurm); `slurm_job.query` runs the
commands. Malformed or unknown text gives fewer facts, never an error.

Where each fact comes from, best first:

- ``sacct -X -n -P -o JobID,State,Reason,ExitCode,Timelimit,ReqMem`` where accounting
  runs (slurmdbd): the state with the canceller's uid (``CANCELLED by 1000``);
- ``scontrol show job`` (no accounting needed; a finished job is kept `MinJobAge`
  seconds): ``JobState``, ``Reason``, ``TimeLimit``, ``MinMemoryNode``, ``StdErr``;
- the lines slurmstepd writes to the job's stderr: ``*** JOB 12 ON node CANCELLED AT
  <time> DUE TO TIME LIMIT ***`` and ``Detected 1 oom-kill event(s) in StepId=12.batch``.

>>> parse_output("slurmstepd-vm: error: *** JOB 2 ON vm CANCELLED AT 2026-12-04T15:18:32 "
...              "DUE TO TIME LIMIT ***")["state"]
'TIMEOUT'
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

#: Job states that mean SLURM itself ended the job's processes (slurmstepd's signals).
ENDED_BY_SLURM = frozenset({"TIMEOUT", "CANCELLED", "PREEMPTED", "DEADLINE", "NODE_FAIL"})
#: Every job state SLURM 22.05 prints (`job_state_string`); anything else is dropped.
STATES = ENDED_BY_SLURM | {
    "PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "COMPLETED", "FAILED", "BOOT_FAIL",
    "OUT_OF_MEMORY", "REQUEUED", "RESIZING", "REVOKED", "SIGNALING", "STAGE_OUT", "STOPPED",
    "CONFIGURING", "RESV_DEL_HOLD", "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT",
}  # fmt: skip
#: The evidence keys this module writes (the scheduler checks them: wire.validate).
KEYS = (
    "slurm_job_id",
    "slurm_step_id",
    "slurm_state",
    "slurm_reason",
    "slurm_cancelled_by",
    "slurm_exit_code",
    "slurm_time_limit",
    "slurm_mem_limit_bytes",
    "slurm_oom_kill_events",
    "slurm_output_line",
    "slurm_source",
)
TEXT_MAX = 64  # ids, states, reasons, limits
LINE_MAX = 256  # slurmstepd's line as written
OUTPUT_TAIL = 64 * 1024  # bytes of the job's stderr read from its end

_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_FIELD = re.compile(r"(\w+)=(\S*)")
_STEPD_END = re.compile(
    r"\*\*\* (?:JOB|STEP) ([\d.]+\w*) ON (\S+) (CANCELLED|FAILED)(?: AT (\S+))?"
    r"(?: DUE TO ([A-Z ]*[A-Z]))?.*?\*\*\*"
)
_STEPD_OOM = re.compile(r"Detected (\d+) oom[-_]kill event\(s\) in (?:StepId=|step )([\d.]+\w*)")
#: slurmstepd's "DUE TO ..." phrase -> the job state slurmctld gives the job.
_DUE_TO = {"TIME LIMIT": "TIMEOUT", "PREEMPTION": "PREEMPTED", "NODE FAILURE": "NODE_FAIL"}


def _text(v: Any, cap: int = TEXT_MAX) -> str | None:
    if not isinstance(v, str) or not v or v in ("(null)", "N/A", "None", "Unknown"):
        return None
    return "".join(c if c.isprintable() and c.isascii() else "?" for c in v[:cap])


def mem_bytes(value: str | None) -> int | None:
    """SLURM's memory sizes (``200M``, ``4G``, ``1000Mn``/``Mc`` in sacct) in bytes.

    >>> mem_bytes("200M"), mem_bytes("2Gn"), mem_bytes("0")
    (209715200, 2147483648, None)
    """
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)[nc]?", value or "")
    if not m:
        return None
    n = int(float(m.group(1)) * _UNITS.get(m.group(2) or "M", 1))
    return n or None


def _state(word: str | None) -> str | None:
    """``CANCELLED`` from ``CANCELLED``, ``CANCELLED+`` or ``CANCELLED by 0``."""
    s = (word or "").split(" ")[0].rstrip("+")
    return s if s in STATES else None


def parse_scontrol(text: str) -> dict[str, Any]:
    """The facts of ``scontrol show job <id>`` (one job; multi-line or ``--oneliner``)."""
    f = dict(_FIELD.findall(text or ""))
    out: dict[str, Any] = {
        "job_id": _text(f.get("JobId")),
        "state": _state(f.get("JobState")),
        "reason": _text(f.get("Reason")),
        "exit_code": _text(f.get("ExitCode")),
        "time_limit": _text(f.get("TimeLimit")),
        "mem_limit_bytes": mem_bytes(f.get("MinMemoryNode")),
        "stderr": f.get("StdErr") or None,
        "name": f.get("JobName") or None,
        "user": (f.get("UserId") or "").split("(")[0] or None,
        "host": f.get("BatchHost") or None,
    }
    if out["mem_limit_bytes"] is None:  # --mem-per-cpu: the job's TRES has the total
        m = re.search(r"\bmem=(\w+)", f.get("TRES", ""))
        out["mem_limit_bytes"] = mem_bytes(m.group(1)) if m else None
    return {k: v for k, v in out.items() if v is not None}


def stderr_path(shown: Mapping[str, Any]) -> str | None:
    """The job's stderr file from `parse_scontrol`'s facts: scontrol shows sbatch's
    pattern (``/logs/worker-%J.err``); its common replacements are made here, and a
    path with any other is not guessed at (None).

    >>> stderr_path({"stderr": "/l/w-%J.err", "job_id": "12", "name": "w"})
    '/l/w-12.err'
    """
    path, job = shown.get("stderr"), shown.get("job_id")
    if not isinstance(path, str) or not path.startswith("/") or not job:
        return None
    names = {"j": job, "J": job, "A": job, "x": shown.get("name"), "u": shown.get("user"),
             "N": shown.get("host"), "%": "%"}  # fmt: skip
    out, rest = [], path
    while "%" in rest:
        head, _, rest = rest.partition("%")
        value = names.get(rest[:1])
        if not value:
            return None
        out += [head, value]
        rest = rest[1:]
    return "".join(out) + rest


def parse_sacct(text: str, job_id: str) -> dict[str, Any]:
    """The facts of ``sacct -j <id> -X -n -P -o JobID,State,Reason,ExitCode,Timelimit,
    ReqMem``: the job's own line (``-X``: not its steps), ``|``-separated."""
    for line in (text or "").splitlines():
        parts = line.split("|")
        if len(parts) < 6 or parts[0] != job_id:
            continue
        state_word = parts[1]
        out: dict[str, Any] = {
            "job_id": _text(parts[0]),
            "state": _state(state_word),
            "reason": _text(parts[2]),
            "exit_code": _text(parts[3]),
            "time_limit": _text(parts[4]),
            "mem_limit_bytes": mem_bytes(parts[5]),
        }
        by = re.fullmatch(r"CANCELLED by (\d+)", state_word.strip())
        if by:
            out["cancelled_by"] = by.group(1)
        return {k: v for k, v in out.items() if v is not None}
    return {}


def parse_output(text: str, job_id: str | None = None) -> dict[str, Any]:
    """slurmstepd's lines in a job's stderr: how its processes were ended (the last such
    line) and the oom-kill events it counted in the job's memory groups."""
    out: dict[str, Any] = {}
    oom = 0
    for line in (text or "").splitlines():
        m = _STEPD_END.search(line)
        if m and (job_id is None or m.group(1).split(".")[0] == job_id):
            what, due = m.group(3), (m.group(5) or "").strip()
            out["state"] = _DUE_TO.get(due, "CANCELLED" if what == "CANCELLED" else "FAILED")
            out["output_line"] = _text(line.strip(), LINE_MAX)
            continue
        m = _STEPD_OOM.search(line)
        if m and (job_id is None or m.group(2).split(".")[0] == job_id):
            oom += int(m.group(1))
            out.setdefault("output_line", _text(line.strip(), LINE_MAX))
    if oom:
        out["oom_kill_events"] = oom
    return out


def job_facts(
    job_id: str | None,
    step_id: str | None = None,
    *,
    sacct: Mapping[str, Any] | None = None,
    scontrol: Mapping[str, Any] | None = None,
    output: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Flat evidence (`KEYS`) from the parsed sources, the best source first for each fact,
    and ``slurm_source`` naming the sources that gave any."""
    if not job_id:
        return {}
    out: dict[str, Any] = {"slurm_job_id": _text(job_id)}
    if step_id:
        out["slurm_step_id"] = _text(step_id)
    sources = []
    for name, facts in (("sacct", sacct), ("scontrol show job", scontrol), ("job stderr", output)):
        if not facts:
            continue
        sources.append(name)
        for key in ("state", "reason", "cancelled_by", "exit_code", "time_limit",
                    "mem_limit_bytes", "oom_kill_events", "output_line"):  # fmt: skip
            if facts.get(key) is not None and f"slurm_{key}" not in out:
                out[f"slurm_{key}"] = facts[key]
    if sources:
        out["slurm_source"] = ", ".join(sources)
    return out


def ended_by_slurm(facts: Mapping[str, Any]) -> bool:
    """Whether the job's state says SLURM ended its processes (time limit, scancel, ...)."""
    return facts.get("slurm_state") in ENDED_BY_SLURM


def describe(facts: Mapping[str, Any]) -> str:
    """One phrase for a summary: ``SLURM job 12 TIMEOUT (TimeLimit, limit 00:01:00)``.

    >>> describe({"slurm_job_id": "3", "slurm_state": "CANCELLED", "slurm_cancelled_by": "0"})
    'SLURM job 3 CANCELLED by uid 0'
    """
    out = f"SLURM job {facts.get('slurm_job_id')}"
    if facts.get("slurm_state"):
        out += f" {facts['slurm_state']}"
    if facts.get("slurm_cancelled_by"):
        out += f" by uid {facts['slurm_cancelled_by']}"
    extra = [str(facts[k]) for k in ("slurm_reason",) if facts.get(k)]
    if facts.get("slurm_state") == "TIMEOUT" and facts.get("slurm_time_limit"):
        extra.append(f"limit {facts['slurm_time_limit']}")
    return out + (f" ({', '.join(extra)})" if extra else "")
