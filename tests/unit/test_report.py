"""The death report: build, size caps, wire format, and validation of hostile input."""

from __future__ import annotations

import copy
import dataclasses
import math
import pickle

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oomguard import ReportError
from oomguard._death.build import EXAMPLE, build
from oomguard._death.record import MemoryCounters
from oomguard._death.wire import (
    MAX_REPORT_BYTES,
    MIN_REPORT_BYTES,
    REASONS,
    SCHEMA_VERSION,
    decode,
    to_wire,
    validate,
)
from oomguard._death.wire import encode as encode_death


def build_report(*, max_bytes=MAX_REPORT_BYTES, **seen):
    """What a nanny sends (its `Death` on the wire), from the fields it saw."""
    if "requested_close" in seen:
        seen["requested"] = seen.pop("requested_close")
    return to_wire(build(dataclasses.replace(EXAMPLE, **seen), max_bytes))


def encode(report):
    return msgpack.packb(report, use_bin_type=True)


def valid(report, **kw):
    """The report as the scheduler reads it, on the wire again."""
    return to_wire(validate(report, **kw))


HEADER = "Fatal Python error: Segmentation fault\n\n"
CURRENT = (
    "Current thread 0x00007f1c2a3b4700 (most recent call first):\n"
    '  File "/app/shard.py", line 88 in decode_shard\n'
    '  File "/venv/lib/python3.11/site-packages/distributed/worker.py", line 2990 in execute\n'
)


def _other_thread(i: int) -> str:
    frames = "".join(f'  File "/venv/lib/tornado/ioloop.py", line {n} in run\n' for n in range(30))
    return f"Thread 0x{i:016x} (most recent call first):\n{frames}"


def _stack(n: int, tag: str = "") -> list[tuple[str, int, str]]:
    return [(f"/app/mod{i}{tag}.py", i + 1, f"func{i}") for i in range(n)]


def _counters(oom_kill: int, peak: int) -> dict:
    return {
        "version": 2,
        "path": "/sys/fs/cgroup/dask/worker-0",
        "oom_kill": oom_kill,
        "oom": oom_kill,
        "oom_group_kill": 0,
        "failcnt": None,
        "peak": peak,
        "limit": 2**31,
        "usage": 10,
        "missing": ["memory.failcnt (cgroup v2 has none)"],
    }


def full_args(**over) -> dict:
    args = {}
    args.update(
        executing=[
            {
                "key": "('load-parquet', 7)",
                "prefix": "load-parquet",
                "start": 1.5,
                "thread": 77,
                "stack": _stack(30),
                "stack_time": 2.0,
            },
            {
                "key": "x-1",
                "prefix": "x",
                "start": 1.0,
                "thread": 78,
                "stack": None,
                "stack_time": None,
            },
        ],
        crash_text=None,
        cgroup_before=_counters(0, 100),
        cgroup_after=_counters(1, 2**31),
        cgroup_path="/sys/fs/cgroup/dask/worker-0",
        cgroup_version=2,
        rss_sampled=2**30,
        rss_time=1_759_999_999.5,
        host_memory={"total": 2**35, "available": 2**33},
        missing=["kernel log: dmesg not readable"],
    )
    args.update(over)
    return args


@pytest.fixture
def report() -> dict:
    return build_report(**full_args())


# ----------------------------------------------------------------------------- build


def test_build_classifies_and_fills_evidence(report):
    assert report["schema"] == SCHEMA_VERSION
    assert report["cause"] == "oom_kill"
    ev = report["evidence"]
    assert ev["oom_kill_delta"] == 1 and ev["oom_kill_source"].endswith("memory.events")
    assert ev["rule"].startswith("R5")
    assert report["cgroup"]["after"]["oom_kill"] == 1
    assert report["executing"][0]["stack"][-1] == ["/app/mod29.py", 30, "func29"]
    assert report["missing"] == ["kernel log: dmesg not readable"]
    assert report["truncated"] == []


def test_round_trip(report):
    data = encode(report)
    assert isinstance(data, bytes) and len(data) <= MAX_REPORT_BYTES
    assert to_wire(decode(data)) == report
    assert valid(report) == report


@pytest.mark.parametrize(
    "over",
    [dict(requested_close=True), dict(exitcode=0), dict(exitcode=0, requested_close=True)],
)
def test_clean_exit_or_requested_close_has_no_cause(over):
    r = build_report(**full_args(**over))
    assert r["cause"] == ""
    with pytest.raises(ReportError) as e:
        validate(r)  # nothing to send: a cause-less report is not a valid report
    assert e.value.field == "cause"


def test_build_caps_a_10mb_crash_and_1000_tasks():
    others = "\n".join(_other_thread(i) for i in range(4000))
    text = HEADER + others + "\n" + CURRENT + "\n" + others  # the crashing thread comes late
    assert len(text) > 10 * 2**20
    tasks = [
        {
            "key": f"('shard', {i})",
            "prefix": "shard",
            "start": float(i),
            "thread": i,
            "stack": _stack(100, tag=f"-{i}"),
            "stack_time": float(i),
        }
        for i in range(1000)
    ]
    r = build_report(**full_args(exitcode=-11, crash_text=text, executing=tasks))
    size = len(encode(r))
    assert size <= MAX_REPORT_BYTES
    assert valid(r) == r
    assert r["cause"] == "native_crash"
    kept = r["crash"]["text"]
    assert kept.startswith(HEADER) and CURRENT.strip() in kept and "oomguard:" in kept
    assert 0 < len(r["executing"]) <= 64
    assert r["executing"][0]["key"] == "('shard', 0)"
    # Stacks keep their innermost (last) frames.
    assert r["executing"][0]["stack"][-1] == ["/app/mod99-0.py", 100, "func99"]
    notes = " | ".join(r["truncated"])
    assert "crash.text" in notes
    assert "executing: kept 64 of 1000 entries" in notes
    assert "innermost" in notes


def test_build_drops_tasks_last_when_stacks_are_not_enough():
    tasks = [
        {
            "key": "k" * 1024,
            "prefix": "p",
            "start": 0.0,
            "thread": 1,
            "stack": [("/" + "f" * 1000, 1, "g" * 200)] * 64,
            "stack_time": None,
        }
        for _ in range(64)
    ]
    r = build_report(**full_args(executing=tasks), max_bytes=MIN_REPORT_BYTES)
    assert len(encode(r)) <= MIN_REPORT_BYTES
    assert valid(r, max_bytes=MIN_REPORT_BYTES) == r
    assert any(n.startswith("executing: dropped") for n in r["truncated"])


def test_small_crash_is_kept_whole():
    text = HEADER + CURRENT
    r = build_report(**full_args(exitcode=-11, crash_text=text))
    assert r["crash"] == {"signal": "SIGSEGV", "text": text}
    assert r["truncated"] == []


def test_build_never_raises_on_malformed_inputs():
    r = build_report(
        **full_args(
            time=math.nan,
            pid=True,
            name=7,
            executing=[
                "not a dict",
                {"key": ("tuple", 1), "start": "soon", "stack": [("f.py", 1), ("g.py", 2, "g")]},
            ],
            cgroup_before={**_counters(0, 5), "extra": 1},
            cgroup_after={"oom_kill": 2**80},
            crash_text=b"bytes",
            missing=[f"note {i}" for i in range(100)] + ["x" * 5000],
            host_memory={"total": -1, "available": "lots"},
        )
    )
    assert valid(r) == r
    assert r["time"] == 0.0 and r["pid"] is None and r["name"] == "7"
    assert r["executing"][0]["key"] == "('tuple', 1)"
    assert r["executing"][0]["stack"] == [["g.py", 2, "g"]]
    assert r["cgroup"]["before"]["oom_kill"] == 0 and r["cgroup"]["after"]["oom_kill"] is None
    assert len(r["missing"]) == 64 and r["missing"][-1].startswith("... and")
    text = " ".join(r["missing"])
    for phrase in ("executing[0]", "start", "malformed frames", "unknown keys dropped: extra"):
        assert phrase in text


def test_build_takes_memory_counters_from_the_cgroup_reader():
    before = MemoryCounters(1, "/sys/fs/cgroup/memory/w0", 0, None, None, 0, 10, 2**30, 5, ())
    after = MemoryCounters(
        1, "/sys/fs/cgroup/memory/w0", 1, None, None, 9, 2**30, 2**30, 0, ("memory.stat",)
    )
    for b, a in ((before, after), (before.to_dict(), after.to_dict())):
        r = build_report(
            **full_args(
                cgroup_before=b,
                cgroup_after=a,
                cgroup_version=1,
                cgroup_path="/sys/fs/cgroup/memory/w0",
            )
        )
        assert valid(r) == r
        assert r["cause"] == "oom_kill"
        assert r["cgroup"]["after"] == after.to_dict()
        assert r["evidence"]["oom_kill_source"] == "kernel cgroup counter memory.oom_control"


# ----------------------------------------------------------------------------- validate

# (id, mutate(report), field, reason)
BAD = [
    ("schema-missing", lambda r: r.pop("schema"), "schema", "missing_field"),
    ("schema-2", lambda r: r.update(schema=2), "schema", "schema_version"),
    ("schema-str", lambda r: r.update(schema="1"), "schema", "wrong_type"),
    ("worker-missing", lambda r: r.pop("worker"), "worker", "missing_field"),
    ("extra-key", lambda r: r.update(payload=1), "payload", "bad_value"),
    ("pid-str", lambda r: r.update(pid="42"), "pid", "wrong_type"),
    ("pid-bool", lambda r: r.update(pid=True), "pid", "wrong_type"),
    ("pid-zero", lambda r: r.update(pid=0), "pid", "bad_value"),
    ("exitcode-float", lambda r: r.update(exitcode=-9.0), "exitcode", "wrong_type"),
    ("huge-int", lambda r: r.update(memory_limit=2**70), "memory_limit", "bad_value"),
    ("time-nan", lambda r: r.update(time=math.nan), "time", "bad_value"),
    ("time-inf", lambda r: r.update(time=math.inf), "time", "bad_value"),
    ("time-none", lambda r: r.update(time=None), "time", "wrong_type"),
    ("rss-time-ninf", lambda r: r.update(rss_time=-math.inf), "rss_time", "bad_value"),
    ("cause-lost", lambda r: r.update(cause="worker_lost"), "cause", "bad_value"),
    ("cause-junk", lambda r: r.update(cause="bored"), "cause", "bad_value"),
    ("worker-long", lambda r: r.update(worker="w" * 300), "worker", "too_large"),
    ("worker-surrogate", lambda r: r.update(worker="a\ud800"), "worker", "bad_value"),
    ("worker-nested", lambda r: r.update(worker=[[["deep"]]]), "worker", "too_deep"),
    ("worker-pickle", lambda r: r.update(worker=pickle.dumps("x")), "worker", "pickled"),
    ("worker-bytes", lambda r: r.update(worker=b"tcp://x"), "worker", "wrong_type"),
    ("worker-ext", lambda r: r.update(worker=msgpack.ExtType(1, b"")), "worker", "undecodable"),
    ("executing-dict", lambda r: r.update(executing={}), "executing", "wrong_type"),
    (
        "executing-65",
        lambda r: r.update(executing=r["executing"][:1] * 65),
        "executing",
        "too_large",
    ),
    ("task-no-key", lambda r: r["executing"][0].pop("key"), "executing[0].key", "missing_field"),
    ("task-extra", lambda r: r["executing"][1].update(x=1), "executing[1].x", "bad_value"),
    (
        "task-key-long",
        lambda r: r["executing"][0].update(key="k" * 1025),
        "executing[0].key",
        "too_large",
    ),
    (
        "task-thread-neg",
        lambda r: r["executing"][0].update(thread=-1),
        "executing[0].thread",
        "bad_value",
    ),
    (
        "frame-short",
        lambda r: r["executing"][0]["stack"].__setitem__(2, ["f.py", 1]),
        "executing[0].stack[2]",
        "bad_value",
    ),
    (
        "frame-lineno",
        lambda r: r["executing"][0]["stack"][2].__setitem__(1, "1"),
        "executing[0].stack[2][1]",
        "wrong_type",
    ),
    (
        "frame-deep",
        lambda r: r["executing"][0]["stack"][2].__setitem__(0, {"f": [1]}),
        "executing[0].stack[2][0]",
        "too_deep",
    ),
    (
        "stack-65",
        lambda r: r["executing"][0].update(stack=[["f", 1, "g"]] * 65),
        "executing[0].stack",
        "too_large",
    ),
    (
        "crash-10mb",
        lambda r: r.update(crash={"signal": "SIGSEGV", "text": "x" * 10 * 2**20}),
        "crash.text",
        "too_large",
    ),
    ("crash-no-text", lambda r: r.update(crash={"signal": None}), "crash.text", "missing_field"),
    ("evidence-nested", lambda r: r["evidence"].update(sub={"a": 1}), "evidence.sub", "too_deep"),
    ("evidence-list", lambda r: r["evidence"].update(l=[1]), "evidence.l", "too_deep"),
    ("evidence-nan", lambda r: r["evidence"].update(x=math.nan), "evidence.x", "bad_value"),
    ("evidence-intkey", lambda r: r["evidence"].update({1: 2}), "evidence", "wrong_type"),
    (
        "evidence-97",
        lambda r: r["evidence"].update({f"k{i}": i for i in range(97)}),
        "evidence",
        "too_large",
    ),
    ("cgroup-v3", lambda r: r["cgroup"].update(version=3), "cgroup.version", "bad_value"),
    (
        "counters-no-peak",
        lambda r: r["cgroup"]["after"].pop("peak"),
        "cgroup.after.peak",
        "missing_field",
    ),
    (
        "counters-neg",
        lambda r: r["cgroup"]["before"].update(oom_kill=-1),
        "cgroup.before.oom_kill",
        "bad_value",
    ),
    ("host-neg", lambda r: r["host_memory"].update(total=-1), "host_memory.total", "bad_value"),
    ("missing-65", lambda r: r.update(missing=["m"] * 65), "missing", "too_large"),
    ("missing-long", lambda r: r.update(missing=["m" * 513]), "missing[0]", "too_large"),
    ("truncated-int", lambda r: r.update(truncated=[1]), "truncated[0]", "wrong_type"),
    ("timestamp", lambda r: r.update(started=msgpack.Timestamp(1, 0)), "started", "undecodable"),
    (
        "whole-too-large",
        lambda r: r.update(
            executing=[
                {
                    **r["executing"][0],
                    "key": "k" * 1024,
                    "stack": [["f" * 1024, 1, "g" * 256]] * 64,
                }
            ]
            * 64
        ),
        "report",
        "too_large",
    ),
]


@pytest.mark.parametrize("mutate, field, reason", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_validate_rejects(report, mutate, field, reason):
    bad = copy.deepcopy(report)
    mutate(bad)
    with pytest.raises(ReportError) as e:
        validate(bad)
    assert (e.value.field, e.value.reason) == (field, reason)
    assert reason in REASONS
    assert str(e.value).startswith(field + ": ")


@pytest.mark.parametrize("value", [[], "report", None, 3, b"\x80\x04"])
def test_validate_rejects_non_mappings(value):
    with pytest.raises(ReportError) as e:
        validate(value)
    assert (e.value.field, e.value.reason) == ("report", "not_a_mapping")


def test_validate_cleans_enums_tuples_and_ints(report):
    from oomguard import Cause

    messy = copy.deepcopy(report)
    messy["cause"] = Cause.OOM_KILL
    messy["time"] = 5  # an int is fine for a float field
    messy["executing"][0]["stack"] = [tuple(f) for f in messy["executing"][0]["stack"]]
    clean = validate(messy)
    assert type(clean.cause) is str and clean.cause == "oom_kill"
    assert type(clean.time) is float
    assert to_wire(clean.tasks[0].stack) == report["executing"][0]["stack"]
    assert clean.evidence is not messy["evidence"]


# ----------------------------------------------------------------------------- decode


class _Marker:
    """Unpickling this creates a file: proof that a payload was (not) loaded."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_decode_refuses_pickles_without_loading_them(tmp_path, protocol):
    marker = tmp_path / "unpickled"
    payload = pickle.dumps({"schema": 1, "x": _Marker(str(marker))}, protocol=protocol)
    pickle.loads(pickle.dumps(_Marker(str(tmp_path / "control"))))
    assert (tmp_path / "control").exists()  # the payload really would act if loaded
    with pytest.raises(ReportError) as e:
        decode(payload)
    assert e.value.reason == ("pickled" if protocol >= 2 else "undecodable")
    assert e.value.field == "report"
    assert not marker.exists()


def test_decode_refuses_a_pickle_inside_a_field(report):
    bad = copy.deepcopy(report)
    bad["host"] = pickle.dumps({"evil": True})
    with pytest.raises(ReportError) as e:
        decode(encode(bad))
    assert (e.value.field, e.value.reason) == ("host", "pickled")


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"", "undecodable"),
        (b"\xc1", "undecodable"),  # never-used msgpack byte
        (b"hello world", "undecodable"),
        (b"\x82\xa1a", "undecodable"),  # truncated
        (b"\xa2\xff\xfe", "undecodable"),  # invalid UTF-8 str
        (msgpack.packb(msgpack.ExtType(42, b"xx")), "undecodable"),
        (msgpack.packb({1: 2}), "undecodable"),  # non-str map key
        (b"\x91" * 100_000 + b"\xc0", "too_deep"),
        (msgpack.packb(list(range(2000))), "too_large"),
        (b"\x00" * (MAX_REPORT_BYTES + 1), "too_large"),
        (msgpack.packb([1, 2]), "not_a_mapping"),
        (b"\x80", "missing_field"),  # an empty map: msgpack, but no report
    ],
)
def test_decode_rejects_garbage(data, reason):
    with pytest.raises(ReportError) as e:
        decode(data)
    assert e.value.reason == reason


def test_decode_invalid_utf8_in_a_field(report):
    # The host value re-encoded as a msgpack str whose bytes are not UTF-8.
    raw = msgpack.packb(report["host"])
    invalid = bytes([raw[0]]) + b"\xff" * (len(raw) - 1)
    data = encode(report).replace(raw, invalid, 1)
    assert data != encode(report)
    with pytest.raises(ReportError) as e:
        decode(data)
    assert e.value.reason == "undecodable"


def test_decode_rejects_non_bytes():
    with pytest.raises(ReportError) as e:
        decode("a str")  # type: ignore[arg-type]
    assert e.value.reason == "undecodable"


def test_docstring_examples():
    import doctest

    from oomguard._death import build as _build
    from oomguard._death import cause as _classify
    from oomguard._death import facts as _facts
    from oomguard._death import wire as _wire

    for module in (_wire, _build, _classify, _facts):
        assert doctest.testmod(module).failed == 0


def test_counter_keys_come_from_memory_counters_as_schema_v1_has_them():
    # The wire form is derived from MemoryCounters' fields; reports are versioned, so the
    # set and order are fixed.
    names = tuple(f.name for f in dataclasses.fields(MemoryCounters))
    assert names == (
        "version",
        "path",
        "oom_kill",
        "oom",
        "oom_group_kill",
        "failcnt",
        "peak",
        "limit",
        "usage",
        "missing",
    )
    counts = build_report(**full_args())["cgroup"]["after"]
    assert tuple(counts) == names


def test_report_error_pickles_with_its_fields():
    err = ReportError("crash.text", "too long", "too_large")
    back = pickle.loads(pickle.dumps(err))
    assert (back.field, back.reason, str(back)) == ("crash.text", "too_large", str(err))


# ----------------------------------------------------------------------------- fuzz

_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
_nested = st.recursive(
    _leaves,
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.tuples(kids, kids)
        | st.dictionaries(st.text(max_size=8) | st.integers(), kids, max_size=4)
    ),
    max_leaves=30,
)
_wire_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
_wire = st.recursive(
    _wire_leaves,
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.dictionaries(
            st.sampled_from(["schema", "worker", "cause", "evidence", "x"]), kids, max_size=4
        )
    ),
    max_leaves=30,
)  # what a msgpack sender can actually put on the wire
_FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _only_report_errors(fn, *args):
    try:
        fn(*args)
    except ReportError as e:
        assert e.reason in REASONS
        assert e.__cause__ is None, "fell through to validate()'s catch-all"


@_FUZZ
@given(st.binary(max_size=2000))
def test_fuzz_decode_arbitrary_bytes(data):
    _only_report_errors(decode, data)


@_FUZZ
@given(_wire)
def test_fuzz_decode_arbitrary_msgpack(obj):
    _only_report_errors(decode, msgpack.packb(obj, use_bin_type=True))


@_FUZZ
@given(_nested)
def test_fuzz_validate_arbitrary_data(obj):
    _only_report_errors(validate, obj)


_PATHS = [
    ("worker",),
    ("pid",),
    ("time",),
    ("executing",),
    ("executing", 0),
    ("executing", 0, "stack"),
    ("executing", 0, "stack", 0),
    ("executing", 0, "stack", 0, 1),
    ("crash",),
    ("evidence",),
    ("evidence", "peak_bytes"),
    ("cgroup",),
    ("cgroup", "before"),
    ("cgroup", "after", "peak"),
    ("host_memory",),
    ("missing",),
    ("missing", 0),
]


@_FUZZ
@given(st.sampled_from(_PATHS), _nested)
def test_fuzz_validate_one_field_replaced(path, value):
    r = build_report(**full_args())
    target = r
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    try:
        out = validate(r)
    except ReportError as e:
        assert e.reason in REASONS and e.__cause__ is None
    else:
        assert decode(encode_death(out)) == out


@_FUZZ
@given(
    exitcode=st.none() | st.integers(-70, 300),
    text=st.none() | st.text(max_size=3000),
    n_tasks=st.integers(0, 80),
    frames=st.integers(0, 80),
    key=st.text(max_size=3000),
    before=st.none() | st.integers(0, 3),
    after=st.none() | st.integers(0, 3),
    nanny=st.none() | st.just({"rss": 10}),
    close=st.booleans(),
)
def test_fuzz_build_report_always_validates(
    exitcode, text, n_tasks, frames, key, before, after, nanny, close
):
    tasks = [
        {
            "key": key,
            "prefix": key[:5],
            "start": 1.0,
            "thread": 1,
            "stack": [(key, 1, key)] * frames,
            "stack_time": 1.0,
        }
        for _ in range(n_tasks)
    ]
    r = build_report(
        **full_args(
            exitcode=exitcode,
            crash_text=text,
            executing=tasks,
            cgroup_before=_counters(before, 1) if before is not None else None,
            cgroup_after={**_counters(0, 1), "oom_kill": after},
            nanny_memory_kill=nanny,
            requested_close=close,
        ),
        max_bytes=MIN_REPORT_BYTES,
    )
    assert len(encode(r)) <= MIN_REPORT_BYTES
    if r["cause"] == "":
        assert close or exitcode == 0
    else:
        assert valid(r, max_bytes=MIN_REPORT_BYTES) == r
