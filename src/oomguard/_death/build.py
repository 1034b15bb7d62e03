"""Building a death report in the nanny: classify the death, gather its evidence, and fit
the result to its size cap (`build_report`).

It never raises for bad input (it runs in the nanny's exit hook): malformed inputs are
dropped with a note in ``missing``, long ones cut with a note in ``truncated``. The schema
it builds, and its caps, are in `wire`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .cause import DeathFacts, crash_signal, describe_signal, explain
from .facts import evidence, facts_from
from .killer import attribute
from .threads import mark_crashed
from .wire import (
    COUNTER_INTS,
    COUNTER_KEYS,
    EVIDENCE_KEY_MAX,
    EVIDENCE_MAX,
    EVIDENCE_STR_MAX,
    FILENAME_MAX,
    FUNCTION_MAX,
    IDENT_MAX,
    INT_MAX,
    INT_MIN,
    KEY_MAX,
    LIST_MAX,
    MAX_REPORT_BYTES,
    MIN_REPORT_BYTES,
    NOTE_MAX,
    PATH_MAX,
    SCHEMA_VERSION,
    SIGNAL_MAX,
    SUMMARY_MAX,
    encode,
)


def _clip(v: Any, cap: int) -> str:
    """Any value as a valid, capped str; never raises."""
    try:
        s = v if isinstance(v, str) else str(v)
    except Exception:
        s = f"<unprintable {type(v).__name__}>"
    s = str.__str__(s)[:cap]
    if not s.isascii():
        s = s.encode("utf-8", "replace").decode("utf-8")
    return s


def _opt_int(v: Any, minimum: int = INT_MIN) -> int | None:
    if isinstance(v, int) and not isinstance(v, bool) and minimum <= v <= INT_MAX:
        return int(v)
    return None


def _opt_float(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        try:
            f = float(v)
        except OverflowError:
            return None
        return f if math.isfinite(f) else None
    return None


def _build_frame(f: Any) -> list[Any] | None:
    if isinstance(f, Mapping):
        f = (f.get("filename"), f.get("lineno"), f.get("function", f.get("name")))
    if not isinstance(f, (list, tuple)) or len(f) != 3:
        return None
    return [_clip(f[0], FILENAME_MAX), _opt_int(f[1], 0), _clip(f[2], FUNCTION_MAX)]


def _build_task(t: Any, i: int, missing: list[str], cuts: dict[str, int]) -> dict[str, Any] | None:
    if not isinstance(t, Mapping):
        missing.append(f"executing[{i}]: not a mapping ({type(t).__name__}), dropped")
        return None
    key = _clip(t.get("key"), 100_000)
    if len(key) > KEY_MAX:
        cuts["keys"] = cuts.get("keys", 0) + 1
        key = key[:KEY_MAX]
    start = _opt_float(t.get("start"))
    if start is None:
        missing.append(f"executing[{i}].start: unknown, set to 0.0")
    stack = t.get("stack")
    frames: list[Any] | None = None
    if isinstance(stack, (list, tuple)):
        if len(stack) > LIST_MAX:
            cuts["stacks"] = cuts.get("stacks", 0) + 1
            cuts["longest"] = max(cuts.get("longest", 0), len(stack))
            stack = stack[-LIST_MAX:]  # innermost last: the frames nearest the death
        frames = [fr for fr in map(_build_frame, stack) if fr is not None]
        if len(frames) < len(stack):
            dropped = len(stack) - len(frames)
            missing.append(f"executing[{i}].stack: {dropped} malformed frames dropped")
    prefix = t.get("prefix")
    return {
        "key": key,
        "prefix": _clip(prefix if prefix is not None else "", IDENT_MAX),
        "start": start if start is not None else 0.0,
        "thread": _opt_int(t.get("thread"), 0) or 0,
        "stack": frames,
        "stack_time": _opt_float(t.get("stack_time")),
        "grew": _opt_int(t.get("grew"), 0),
        "crashed": None,  # set for a native crash (threads.mark_crashed)
    }


def _build_counters(c: Any, field: str, missing: list[str]) -> dict[str, Any] | None:
    if c is None:
        return None
    c = _as_map(c)
    if not isinstance(c, Mapping):
        missing.append(f"{field}: not a mapping ({type(c).__name__}), dropped")
        return None
    extra = sorted(str(k) for k in c if k not in COUNTER_KEYS)
    if extra:
        missing.append(_clip(f"{field}: unknown keys dropped: {', '.join(extra)}", NOTE_MAX))
    notes = c.get("missing")
    path = c.get("path")
    return {
        "version": _opt_int(c.get("version")),
        "path": None if path is None else _clip(path, PATH_MAX),
        **{k: _opt_int(c.get(k), 0) for k in COUNTER_INTS},
        "missing": [_clip(s, NOTE_MAX) for s in notes[:LIST_MAX]]
        if isinstance(notes, (list, tuple))
        else [],
    }


def _truncate_crash(text: str, budget: int, original_len: int | None = None) -> str:
    """`text` cut to at most `budget` UTF-8 bytes, keeping its head and the crashing thread.

    faulthandler writes the "Fatal Python error" header, then one block per thread separated
    by blank lines; the crashing thread's block starts "Current thread" and may come late.
    """
    budget = max(budget, 0)
    for _ in range(4):  # the cut is in characters; shrink until the UTF-8 bytes fit
        out = _cut_crash(text, budget, original_len or len(text))
        size = len(out.encode("utf-8", "replace"))
        if size <= budget or not out:
            return out
        budget = max(budget - (size - budget) - 16, 0)
    return ""


def _cut_crash(text: str, budget: int, original_len: int) -> str:
    if len(text) <= budget:
        return text
    mark = f"\n[oomguard: cut from {original_len} characters to fit the report]\n"
    room = budget - len(mark)
    if room <= 0:
        return ""
    cur = text.find("Current thread")
    if cur == -1:
        return text[:room] + mark
    end = text.find("\n\n", cur)
    end = len(text) if end == -1 else end
    if end <= room:  # the crashing thread's block is within the head anyway
        return text[:room] + mark
    first = text.find("Thread 0x")
    head_end = cur if first == -1 or first > cur else first
    head = text[: min(head_end, room // 4)]
    block = text[cur : cur + room - len(head) - 1]
    sep = "" if head.endswith("\n") else "\n"
    return head + sep + block + mark


def _size(report: dict[str, Any]) -> int:
    return len(encode(report))


def _fit(report: dict[str, Any], max_bytes: int, original_crash_len: int) -> None:
    """Shrink `report` in place until it encodes to <= max_bytes, noting each cut."""
    truncated: list[str] = report["truncated"]
    crash = report["crash"]
    size = _size(report)
    if size <= max_bytes:
        return
    # 1. The crash text, but not below an eighth of the cap yet.
    if crash is not None and crash["text"]:
        text_bytes = len(crash["text"].encode("utf-8"))
        target = max(text_bytes - (size - max_bytes) - 512, max_bytes // 8)
        if target < text_bytes:
            crash["text"] = _truncate_crash(crash["text"], target, original_crash_len)
            size = _size(report)
    # 2. Stacks, keeping the innermost frames.
    keep, noted = LIST_MAX, False
    while size > max_bytes and keep > 0:
        keep //= 2
        if not any(t["stack"] and len(t["stack"]) > keep for t in report["executing"]):
            continue
        for t in report["executing"]:
            if t["stack"]:
                t["stack"] = t["stack"][-keep:] if keep else []
        if not noted:
            truncated.append("")
            noted = True
        truncated[-1] = f"executing[*].stack: kept the innermost {keep} frames to fit"
        size = _size(report)
    # 3. Executing entries, from the end.
    n = len(report["executing"])
    if size > max_bytes and n:
        truncated.append("")
        while size > max_bytes and report["executing"]:
            report["executing"].pop()
            dropped = n - len(report["executing"])
            truncated[-1] = f"executing: dropped {dropped} of {n} entries to fit"
            size = _size(report)
    # 4. The crash text, all the way down.
    if size > max_bytes and crash is not None and crash["text"]:
        text_bytes = len(crash["text"].encode("utf-8"))
        budget = text_bytes - (size - max_bytes) - 512
        crash["text"] = _truncate_crash(crash["text"], budget, original_crash_len)
        size = _size(report)
    # 5. Notes and paths: only huge caller-supplied notes get here.
    if size > max_bytes:
        report["missing"] = [s[:128] for s in report["missing"][:8]]
        for side in ("before", "after"):
            if report["cgroup"] and report["cgroup"][side]:
                report["cgroup"][side]["missing"] = []
        report["evidence"] = {
            k: (v[:128] if isinstance(v, str) else v) for k, v in report["evidence"].items()
        }
        truncated.append("missing, cgroup.*.missing, evidence: cut to fit")
        del truncated[LIST_MAX:]
        size = _size(report)
    # 6. Last resort (absurdly long caller notes): the fixed fields alone always fit.
    if size > max_bytes:
        report["executing"] = []
        report["missing"] = ["report cut to its fixed fields to fit"]
        report["evidence"] = {
            k: report["evidence"].get(k) for k in ("rule", "killer", "killer_summary")
        }
        if crash is not None:
            crash["text"] = ""
        if report["cgroup"]:
            report["cgroup"]["path"] = report["cgroup"]["path"][:128]
        truncated[:] = ["report cut to its fixed fields to fit"]


def build_report(
    *,
    worker: str,
    nanny: str,
    name: str,
    host: str,
    pid: int | None,
    exitcode: int | None,
    time: float,
    started: float | None,
    memory_limit: int | None,
    executing: list[dict],
    crash_text: str | None,
    cgroup_before: dict | None,
    cgroup_after: dict | None,
    cgroup_path: str | None,
    cgroup_version: int | None,
    rss_sampled: int | None,
    rss_time: float | None,
    host_memory: dict | None,
    nanny_memory_kill: dict | None,
    kernel_log_victim: dict | None,
    requested_close: bool,
    missing: list[str],
    max_bytes: int = MAX_REPORT_BYTES,
    cgroup_placement: dict | None = None,
    cgroup_reading: dict | None = None,
    signals: list | None = None,
    nanny_pid: int | None = None,
    host_reading: dict | None = None,
    killers: list | None = None,
    oomd: dict | None = None,
    environment: dict | None = None,
    flight_read: bool | None = None,
) -> dict[str, Any]:
    """Classify one death and build its schema-v1 report, capped to `max_bytes` encoded.

    `cgroup_placement` says how the worker was put into its cgroup (``own_group``,
    ``charge_moved``, ``rss_at_move``, ``note``); it reaches the report only through the
    evidence (what the group's peak covers), so the schema does not change. So does
    `cgroup_reading`, the group's last reading while the worker ran (``oom_kill``, ``age``
    in seconds before the death, ``others``: other processes in the group then,
    ``others_gone``: how many of them are no longer running).

    ``report["cause"]`` is None for a clean exit or a requested close: send nothing then.
    Malformed inputs are dropped with a note in ``missing``, long ones cut with a note in
    ``truncated``; it never raises for bad input (it runs in the nanny's exit hook).

    >>> r = build_report(**{**EXAMPLE_ARGS, "exitcode": -11,
    ...                     "crash_text": "Fatal Python error: Segmentation fault\\n"})
    >>> r["cause"], r["crash"]["signal"], r["evidence"]["rule"]
    ('native_crash', 'SIGSEGV', 'R3 exit signal SIGSEGV')
    """
    max_bytes = max(int(max_bytes), MIN_REPORT_BYTES)
    missing_out: list[str] = []
    truncated: list[str] = []
    notes = list(missing) if isinstance(missing, (list, tuple)) else []

    raw_text = crash_text if isinstance(crash_text, str) else None
    crash = None
    if raw_text is not None:
        # Cap the text right away so a 10 MB dump is not re-encoded on every fitting step.
        text = _truncate_crash(raw_text, max_bytes) if len(raw_text) > max_bytes // 4 else raw_text
        sig = crash_signal(raw_text) or describe_signal(exitcode)
        crash = {"signal": None if sig is None else _clip(sig, SIGNAL_MAX), "text": text}
    elif crash_text is not None:
        missing_out.append(f"crash: text is {type(crash_text).__name__}, not str; dropped")

    version = cgroup_version if cgroup_version in (1, 2) else None
    before = _build_counters(cgroup_before, "cgroup.before", missing_out)
    after = _build_counters(cgroup_after, "cgroup.after", missing_out)
    if version is None:
        versions = [c["version"] for c in (before, after) if c and c["version"] in (1, 2)]
        version = versions[0] if versions else None
    cgroup = None
    if version is not None:
        path = _clip(cgroup_path or "", PATH_MAX)
        cgroup = {"version": version, "path": path, "before": before, "after": after}
    elif before is not None or after is not None:
        missing_out.append("cgroup: version unknown, counters kept only in the evidence")

    host_mem = None
    if isinstance(host_memory, Mapping):
        host_mem = {k: _opt_int(host_memory.get(k), 0) for k in ("total", "available")}

    tasks: list[Any] = list(executing) if isinstance(executing, (list, tuple)) else []
    if len(tasks) > LIST_MAX:
        truncated.append(f"executing: kept {LIST_MAX} of {len(tasks)} entries (list cap)")
        tasks = tasks[:LIST_MAX]
    cuts: dict[str, int] = {}
    built = [_build_task(t, i, missing_out, cuts) for i, t in enumerate(tasks)]
    if cuts.get("keys"):
        truncated.append(f"executing[*].key: {cuts['keys']} keys cut to {KEY_MAX} characters")
    if cuts.get("stacks"):
        truncated.append(
            f"executing[*].stack: {cuts['stacks']} stacks cut to their innermost {LIST_MAX} "
            f"frames (longest had {cuts['longest']})"
        )

    the_time = _opt_float(time)
    if the_time is None:
        missing_out.append("time: not a finite number, set to 0.0")

    # Classification and evidence see the raw inputs, before anything was cut.
    report_like = {
        "pid": pid,
        "exitcode": exitcode,
        "time": time,
        "memory_limit": memory_limit,
        "flight_record": flight_read,
        "crash": {"text": raw_text} if raw_text is not None else None,
        "cgroup": {
            "version": version,
            "before": _as_map(cgroup_before),
            "after": _as_map(cgroup_after),
            "placement": cgroup_placement if isinstance(cgroup_placement, Mapping) else None,
            "reading": cgroup_reading if isinstance(cgroup_reading, Mapping) else None,
        },
        "rss_sampled": rss_sampled,
        "rss_time": rss_time,
        "host_memory": host_memory,
        "nanny_memory_kill": nanny_memory_kill,
        "kernel_log_victim": kernel_log_victim,
        "requested_close": requested_close,
    }
    facts: DeathFacts = facts_from(report_like)
    cause, rule = explain(facts)
    found = evidence(report_like)
    who = None
    if cause is not None:
        who = attribute(
            {
                **report_like,
                "cause": cause.value,
                "evidence": found,
                "signals": signals,
                "nanny_pid": nanny_pid,
                "host_reading": host_reading,
                "killers": killers,
                "oomd": oomd,
                "environment": environment,
            }
        )
        found.update(
            killer=who.killer,
            killer_how=who.how,
            killer_confidence=who.confidence,
            killer_summary=who.summary,
            **who.facts,
        )
    executing_out = [t for t in built if t is not None]
    if cause is not None and cause.value == "native_crash":  # which task's thread crashed
        found.update(mark_crashed(crash and crash["signal"], raw_text, executing_out, missing_out))
    ev = {_clip(k, EVIDENCE_KEY_MAX): _ev_value(v) for k, v in found.items()}
    ev["rule"] = rule

    # The report's own notes first: the caller's list can be long and is what gets cut.
    all_missing = [_clip(s, NOTE_MAX) for s in missing_out + notes]
    if len(all_missing) > LIST_MAX:
        more = len(all_missing) - LIST_MAX + 1
        all_missing = all_missing[: LIST_MAX - 1] + [f"... and {more} more"]

    report: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "worker": _clip(worker, IDENT_MAX),
        "nanny": _clip(nanny, IDENT_MAX),
        "name": _clip(name, IDENT_MAX),
        "host": _clip(host, IDENT_MAX),
        "pid": _opt_int(pid, 1),
        "exitcode": _opt_int(exitcode),
        "cause": None if cause is None else cause.value,
        "time": the_time if the_time is not None else 0.0,
        "started": _opt_float(started),
        "memory_limit": _opt_int(memory_limit, 0),
        "executing": executing_out,
        "crash": crash,
        "evidence": _cap_evidence(ev),
        "cgroup": cgroup,
        "rss_sampled": _opt_int(rss_sampled, 0),
        "rss_time": _opt_float(rss_time),
        "host_memory": host_mem,
        "killer": None
        if who is None
        else {**who.to_wire(), "summary": _clip(who.summary, SUMMARY_MAX)},
        "missing": all_missing,
        "truncated": truncated,
    }
    # Fit with room to spare for the crash note added below.
    _fit(report, max_bytes - 256, len(raw_text) if raw_text is not None else 0)
    if crash is not None and len(crash["text"]) < len(raw_text or ""):
        truncated.insert(
            0,
            f"crash.text: {len(raw_text or '')} -> {len(crash['text'])} characters "
            "(kept the header and the Current thread block)",
        )
    report["truncated"] = [_clip(s, NOTE_MAX) for s in truncated[:LIST_MAX]]
    return report


def _cap_evidence(ev: dict[str, Any]) -> dict[str, Any]:
    """At most EVIDENCE_MAX keys, the rule always among them."""
    if len(ev) <= EVIDENCE_MAX:
        return ev
    rule = ev.pop("rule", None)
    return {**dict(list(ev.items())[: EVIDENCE_MAX - 1]), "rule": rule}


def _ev_value(v: Any) -> Any:
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, int):
        return _opt_int(v)
    if isinstance(v, float):
        return _opt_float(v)
    return _clip(v, EVIDENCE_STR_MAX)


def _as_map(c: Any) -> Any:
    """A MemoryCounters (anything with to_dict) as its dict; other values unchanged."""
    if c is not None and not isinstance(c, Mapping) and callable(getattr(c, "to_dict", None)):
        try:
            return c.to_dict()
        except Exception:
            return None
    return c


#: Arguments for a small SIGKILL report, used by the examples here and in `wire`, and by
#: the benchmarks.
EXAMPLE_ARGS: dict[str, Any] = dict(
    worker="tcp://10.0.0.5:40001",
    nanny="tcp://10.0.0.5:40000",
    name="worker-0",
    host="node-5",
    pid=4242,
    exitcode=-9,
    time=1_760_000_000.0,
    started=1_759_999_000.0,
    memory_limit=2 * 2**30,
    executing=[],
    crash_text=None,
    cgroup_before=None,
    cgroup_after=None,
    cgroup_path=None,
    cgroup_version=None,
    rss_sampled=None,
    rss_time=None,
    host_memory=None,
    nanny_memory_kill=None,
    kernel_log_victim=None,
    requested_close=False,
    missing=[],
)
