"""Building a `Death` in the nanny (`build`): classify it, gather its evidence, name its
killer, and fit it to its size cap.

It never raises for bad input (it runs in the nanny's exit hook): malformed parts of what
the nanny read are dropped with a note in ``missing``, long ones cut with a note in
``truncated``. The records and their caps are in `record`, the wire form in `wire`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from .._safe_text import safe_name
from .cause import crash_signal, describe_signal, explain
from .facts import evidence, facts_from
from .killer import attribute
from .record import (
    EVIDENCE_KEY_MAX,
    EVIDENCE_MAX,
    EVIDENCE_STR_MAX,
    FILENAME_MAX,
    FUNCTION_MAX,
    IDENT_MAX,
    KEY_MAX,
    LIST_MAX,
    NOTE_MAX,
    PATH_MAX,
    SIGNAL_MAX,
    SUMMARY_MAX,
    Cgroup,
    Crash,
    Death,
    Environment,
    HostMemory,
    MemoryCounters,
    Seen,
    Task,
)
from .threads import mark_crashed
from .wire import MAX_REPORT_BYTES, MIN_REPORT_BYTES, encode
from .wire_check import INT_MAX, INT_MIN

_replace = dataclasses.replace


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


def _frame(f: Any) -> tuple | None:
    if isinstance(f, Mapping):
        f = (f.get("filename"), f.get("lineno"), f.get("function", f.get("name")))
    if not isinstance(f, (list, tuple)) or len(f) != 3:
        return None
    return (_clip(f[0], FILENAME_MAX), _opt_int(f[1], 0), _clip(f[2], FUNCTION_MAX))


def _task(t: Any, i: int, missing: list[str], cuts: dict[str, int]) -> Task | None:
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
    frames: tuple | None = None
    if isinstance(stack, (list, tuple)):
        if len(stack) > LIST_MAX:
            cuts["stacks"] = cuts.get("stacks", 0) + 1
            cuts["longest"] = max(cuts.get("longest", 0), len(stack))
            stack = stack[-LIST_MAX:]  # innermost last: the frames nearest the death
        frames = tuple(fr for fr in map(_frame, stack) if fr is not None)
        if len(frames) < len(stack):
            dropped = len(stack) - len(frames)
            missing.append(f"executing[{i}].stack: {dropped} malformed frames dropped")
    prefix = t.get("prefix")
    return Task(
        key=key,
        prefix=_clip(prefix if prefix is not None else "", IDENT_MAX),
        start=start if start is not None else 0.0,
        thread=_opt_int(t.get("thread"), 0) or 0,
        stack=frames,
        stack_time=_opt_float(t.get("stack_time")),
        grew=_opt_int(t.get("grew"), 0),
    )


def _environment(env: Any, missing: list[str]) -> Environment | None:
    """The worker's environment within its caps, each text one printable line (a label's
    value is whatever its variable held); None with a note for anything else."""
    if env is None:
        return None
    if not isinstance(env, Environment):
        missing.append(f"environment: not an Environment ({type(env).__name__}), dropped")
        return None
    out = {}
    for f in dataclasses.fields(Environment):
        value, meta = getattr(env, f.name), f.metadata
        if meta["keys"] is None:  # a text
            out[f.name] = safe_name(value, meta["cap"]) if isinstance(value, str) else ""
        else:  # labels, packages: {text: text}
            pairs = list(value.items())[: meta["cap"]] if isinstance(value, Mapping) else []
            out[f.name] = {
                safe_name(k, meta["keys"]): safe_name(v, meta["items"])
                for k, v in pairs
                if isinstance(k, str) and isinstance(v, str)
            }
    return Environment(**out)


def _counters(c: Any, field: str, missing: list[str]) -> MemoryCounters | None:
    if c is None:
        return None
    if isinstance(c, MemoryCounters):
        c = vars(c)
    if not isinstance(c, Mapping):
        missing.append(f"{field}: not a mapping ({type(c).__name__}), dropped")
        return None
    known = {f.name for f in dataclasses.fields(MemoryCounters)}
    extra = sorted(str(k) for k in c if k not in known)
    if extra:
        missing.append(_clip(f"{field}: unknown keys dropped: {', '.join(extra)}", NOTE_MAX))
    notes = c.get("missing")
    path = c.get("path")
    counts = {k: _opt_int(c.get(k), 0) for k in known - {"version", "path", "missing"}}
    return MemoryCounters(
        version=_opt_int(c.get("version")),
        path=None if path is None else _clip(path, PATH_MAX),
        missing=tuple(_clip(s, NOTE_MAX) for s in notes[:LIST_MAX])
        if isinstance(notes, (list, tuple))
        else (),
        **counts,
    )


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


def _fit(d: Death, max_bytes: int, original_crash_len: int) -> Death:
    """`d` shrunk until it encodes to <= max_bytes, each cut noted in `truncated`."""
    truncated = list(d.truncated)
    size = len(encode(d))
    if size <= max_bytes:
        return d

    def crash_cut(d: Death, budget: int) -> Death:
        text = _truncate_crash(d.crash.text, budget, original_crash_len)
        return _replace(d, crash=_replace(d.crash, text=text))

    # 1. The crash text, but not below an eighth of the cap yet.
    if d.crash is not None and d.crash.text:
        text_bytes = len(d.crash.text.encode("utf-8"))
        target = max(text_bytes - (size - max_bytes) - 512, max_bytes // 8)
        if target < text_bytes:
            d = crash_cut(d, target)
            size = len(encode(d))
    # 2. Stacks, keeping the innermost frames.
    keep, noted = LIST_MAX, False
    while size > max_bytes and keep > 0:
        keep //= 2
        if not any(t.stack and len(t.stack) > keep for t in d.tasks):
            continue
        tasks = tuple(
            _replace(t, stack=t.stack[-keep:] if keep else ()) if t.stack else t for t in d.tasks
        )
        d = _replace(d, tasks=tasks)
        if not noted:
            truncated.append("")
            noted = True
        truncated[-1] = f"executing[*].stack: kept the innermost {keep} frames to fit"
        size = len(encode(_replace(d, truncated=tuple(truncated))))
    # 3. Executing entries, from the end.
    n = len(d.tasks)
    if size > max_bytes and n:
        truncated.append("")
        while size > max_bytes and d.tasks:
            d = _replace(d, tasks=d.tasks[:-1])
            truncated[-1] = f"executing: dropped {n - len(d.tasks)} of {n} entries to fit"
            size = len(encode(_replace(d, truncated=tuple(truncated))))
    # 4. The crash text, all the way down.
    if size > max_bytes and d.crash is not None and d.crash.text:
        text_bytes = len(d.crash.text.encode("utf-8"))
        d = crash_cut(d, text_bytes - (size - max_bytes) - 512)
        size = len(encode(_replace(d, truncated=tuple(truncated))))
    # 5. Notes and paths: only huge caller-supplied notes get here.
    if size > max_bytes:
        cgroup = d.cgroup
        if cgroup is not None:
            cgroup = _replace(
                cgroup,
                before=cgroup.before and _replace(cgroup.before, missing=()),
                after=cgroup.after and _replace(cgroup.after, missing=()),
            )
        d = _replace(
            d,
            missing=tuple(s[:128] for s in d.missing[:8]),
            cgroup=cgroup,
            evidence={k: (v[:128] if isinstance(v, str) else v) for k, v in d.evidence.items()},
        )
        truncated.append("missing, cgroup.*.missing, evidence: cut to fit")
        del truncated[LIST_MAX:]
        size = len(encode(_replace(d, truncated=tuple(truncated))))
    # 6. Last resort (absurdly long caller notes): the fixed fields alone always fit.
    if size > max_bytes:
        d = _replace(
            d,
            tasks=(),
            missing=("report cut to its fixed fields to fit",),
            evidence={"rule": d.evidence.get("rule")},
            crash=d.crash and _replace(d.crash, text=""),
            cgroup=d.cgroup and _replace(d.cgroup, path=d.cgroup.path[:128]),
        )
        truncated[:] = ["report cut to its fixed fields to fit"]
    return _replace(d, truncated=tuple(truncated))


def build(seen: Seen, max_bytes: int = MAX_REPORT_BYTES) -> Death:
    """Classify one death and build its `Death`, capped to `max_bytes` encoded.

    ``cause`` is "" for a clean exit or a requested close: send nothing then. Malformed
    inputs are dropped with a note in ``missing``, long ones cut with a note in
    ``truncated``; it never raises for bad input (it runs in the nanny's exit hook).

    >>> d = build(dataclasses.replace(EXAMPLE, exitcode=-11,
    ...                               crash_text="Fatal Python error: Segmentation fault\\n"))
    >>> d.cause, d.crash.signal, d.evidence["rule"]
    ('native_crash', 'SIGSEGV', 'R3 exit signal SIGSEGV')
    """
    max_bytes = max(int(max_bytes), MIN_REPORT_BYTES)
    missing: list[str] = []
    truncated: list[str] = []

    raw_text = seen.crash_text if isinstance(seen.crash_text, str) else None
    crash = None
    if raw_text is not None:
        # Cap the text right away so a 10 MB dump is not re-encoded on every fitting step.
        text = _truncate_crash(raw_text, max_bytes) if len(raw_text) > max_bytes // 4 else raw_text
        sig = crash_signal(raw_text) or describe_signal(seen.exitcode)
        crash = Crash(None if sig is None else _clip(sig, SIGNAL_MAX), text)
    elif seen.crash_text is not None:
        missing.append(f"crash: text is {type(seen.crash_text).__name__}, not str; dropped")

    version = seen.cgroup_version if seen.cgroup_version in (1, 2) else None
    before = _counters(seen.cgroup_before, "cgroup.before", missing)
    after = _counters(seen.cgroup_after, "cgroup.after", missing)
    if version is None:
        versions = [c.version for c in (before, after) if c and c.version in (1, 2)]
        version = versions[0] if versions else None
    cgroup = None
    if version is not None:
        cgroup = Cgroup(version, _clip(seen.cgroup_path or "", PATH_MAX), before, after)
    elif before is not None or after is not None:
        missing.append("cgroup: version unknown, counters kept only in the evidence")

    host_memory = None
    if isinstance(seen.host_memory, Mapping):
        host_memory = HostMemory(
            _opt_int(seen.host_memory.get("total"), 0),
            _opt_int(seen.host_memory.get("available"), 0),
        )

    raw = list(seen.executing) if isinstance(seen.executing, (list, tuple)) else []
    if len(raw) > LIST_MAX:
        truncated.append(f"executing: kept {LIST_MAX} of {len(raw)} entries (list cap)")
        raw = raw[:LIST_MAX]
    cuts: dict[str, int] = {}
    tasks = [t for i, r in enumerate(raw) if (t := _task(r, i, missing, cuts)) is not None]
    if cuts.get("keys"):
        truncated.append(f"executing[*].key: {cuts['keys']} keys cut to {KEY_MAX} characters")
    if cuts.get("stacks"):
        truncated.append(
            f"executing[*].stack: {cuts['stacks']} stacks cut to their innermost {LIST_MAX} "
            f"frames (longest had {cuts['longest']})"
        )

    environment = _environment(seen.environment, missing)
    the_time = _opt_float(seen.time)
    if the_time is None:
        missing.append("time: not a finite number, set to 0.0")

    # Classification and evidence see what was read, before anything was cut.
    cause, rule = explain(facts_from(seen))
    found = evidence(seen)
    who = None
    if cause is not None:
        who = attribute(seen, cause.value, found)
        found.update(who.facts)
        who = _replace(who, summary=_clip(who.summary, SUMMARY_MAX), facts={})
        if cause.value == "native_crash":  # which task's thread crashed
            tasks, marked, notes = mark_crashed(crash and crash.signal, raw_text, tasks)
            found.update(marked)
            missing += notes
    ev = {_clip(k, EVIDENCE_KEY_MAX): _ev_value(v) for k, v in found.items()}
    ev["rule"] = rule

    # The report's own notes first: the caller's list can be long and is what gets cut.
    notes = list(seen.missing) if isinstance(seen.missing, (list, tuple)) else []
    all_missing = [_clip(s, NOTE_MAX) for s in missing + notes]
    if len(all_missing) > LIST_MAX:
        more = len(all_missing) - LIST_MAX + 1
        all_missing = all_missing[: LIST_MAX - 1] + [f"... and {more} more"]

    death = Death(
        worker=_clip(seen.worker, IDENT_MAX),
        nanny=_clip(seen.nanny, IDENT_MAX),
        name=_clip(seen.name, IDENT_MAX),
        host=_clip(seen.host, IDENT_MAX),
        pid=_opt_int(seen.pid, 1),
        exitcode=_opt_int(seen.exitcode),
        cause="" if cause is None else cause.value,
        time=the_time if the_time is not None else 0.0,
        started=_opt_float(seen.started),
        memory_limit=_opt_int(seen.memory_limit, 0),
        tasks=tuple(tasks),
        crash=crash,
        evidence=_cap_evidence(ev),
        cgroup=cgroup,
        rss_sampled=_opt_int(seen.rss_sampled, 0),
        rss_time=_opt_float(seen.rss_time),
        host_memory=host_memory,
        killer=who,
        missing=tuple(all_missing),
        truncated=tuple(truncated),
        environment=environment,
    )
    # Fit with room to spare for the crash note added below.
    death = _fit(death, max_bytes - 256, len(raw_text) if raw_text is not None else 0)
    truncated = list(death.truncated)
    if crash is not None and len(death.crash.text) < len(raw_text or ""):
        truncated.insert(
            0,
            f"crash.text: {len(raw_text or '')} -> {len(death.crash.text)} characters "
            "(kept the header and the Current thread block)",
        )
    return _replace(death, truncated=tuple(_clip(s, NOTE_MAX) for s in truncated[:LIST_MAX]))


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


#: A small SIGKILL death as its nanny saw it: the examples here and in `wire`, the tests
#: and the benchmarks start from it.
EXAMPLE = Seen(
    worker="tcp://10.0.0.5:40001",
    nanny="tcp://10.0.0.5:40000",
    name="worker-0",
    host="node-5",
    pid=4242,
    exitcode=-9,
    time=1_760_000_000.0,
    started=1_759_999_000.0,
    memory_limit=2 * 2**30,
)


def example_report(max_bytes: int = MAX_REPORT_BYTES, **seen: Any) -> dict[str, Any]:
    """What a nanny sends (a `Death` on the wire) for `EXAMPLE` with `seen` changed: for
    the examples, the tests that forge or mangle reports, and the benchmarks.

    >>> example_report(exitcode=-15)["cause"]
    'sigterm'
    """
    from .wire import to_wire

    return to_wire(build(dataclasses.replace(EXAMPLE, **seen), max_bytes))
