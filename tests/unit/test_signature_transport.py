"""Traces as logs deliver them: the same crash in every wrapping is one signature, two
crashes are two, whatever the wrapping.

The dumps and tracebacks below are laid out as the ones quoted in public issue threads are
(a Dask worker's segfault in pandas, a SIGABRT under pytest, a NumPy allocation failure);
each is then wrapped as a log pipeline delivers it: journald and syslog headers,
`kubectl logs --timestamps`, a CRI log file, Loki, Dask's own log prefix, a CI log's
bracketed time, ANSI colours, CRLF line ends, and the indentation a GitHub paste loses.
"""

from __future__ import annotations

import pathlib
import re
import time

import pytest

from oomguard._signature import GROUPING_VERSION, fingerprint

ENV = "/usr/share/miniconda3/envs/etl/lib/python3.11"

# A Dask worker killed by a segfault inside pandas, with an idle profiler thread and the
# event loop's thread around the crashing one.
SEGV = f"""\
Fatal Python error: Segmentation fault

Thread 0x00007f7d50ff0700 (most recent call first):
  File "{ENV}/site-packages/distributed/profile.py", line 275 in _watch
  File "{ENV}/threading.py", line 975 in run
  File "{ENV}/threading.py", line 1038 in _bootstrap_inner
  File "{ENV}/threading.py", line 995 in _bootstrap

Current thread 0x00007f8c1bfff700 (most recent call first):
  File "{ENV}/site-packages/pandas/core/arrays/datetimelike.py", line 1176 in _sub_datetimelike
  File "{ENV}/site-packages/pandas/core/arrays/datetimelike.py", line 1397 in __sub__
  File "/srv/jobs/src/tidal/grid.py", line 88 in regrid_block
  File "{ENV}/site-packages/dask/_task_spec.py", line 759 in __call__
  File "{ENV}/site-packages/distributed/worker.py", line 2989 in _run_task_simple
  File "{ENV}/site-packages/distributed/worker.py", line 2949 in _run_task
  File "{ENV}/site-packages/distributed/utils.py", line 1485 in <lambda>
  File "{ENV}/site-packages/distributed/_concurrent_futures_thread.py", line 65 in run
  File "{ENV}/site-packages/distributed/threadpoolexecutor.py", line 57 in _worker
  File "{ENV}/threading.py", line 975 in run
  File "{ENV}/threading.py", line 1038 in _bootstrap_inner
  File "{ENV}/threading.py", line 995 in _bootstrap

Thread 0x00007f8c8b3fe700 (most recent call first):
  File "{ENV}/selectors.py", line 468 in select
  File "{ENV}/asyncio/base_events.py", line 1898 in _run_once
  File "{ENV}/asyncio/base_events.py", line 607 in run_forever
  File "{ENV}/site-packages/tornado/platform/asyncio.py", line 205 in start
  File "{ENV}/site-packages/distributed/utils.py", line 516 in run_loop
  File "{ENV}/threading.py", line 975 in run
  File "{ENV}/threading.py", line 1038 in _bootstrap_inner
  File "{ENV}/threading.py", line 995 in _bootstrap

Extension modules: numpy.core._multiarray_umath, pandas._libs.tslibs.np_datetime (total: 2)
"""

# The same worker, the same threads, but the segfault one frame further: another crash.
SEGV_NEIGHBOUR = SEGV.replace("line 1176 in _sub_datetimelike", "line 1254 in _add_timedeltalike")

# A C++ abort under pytest (Current thread only).
ABORT = """\
Fatal Python error: Aborted

Current thread 0x00007ff957150740 (most recent call first):
  File "/consumer-testing/substrait_consumer/context.py", line 26 in produce_isthmus_substrait
  File "/consumer-testing/substrait_consumer/producers.py", line 122 in produce_substrait
  File "/consumer-testing/substrait_consumer/functional/common.py", line 137 in substrait_producer_function_test
  File "/consumer-testing/substrait_consumer/tests/functional/test_boolean_functions.py", line 54 in test_producer_boolean_functions
  File "/opt/conda/envs/arrow/lib/python3.10/site-packages/_pytest/python.py", line 194 in pytest_pyfunc_call
  File "/opt/conda/envs/arrow/lib/python3.10/site-packages/pluggy/_callers.py", line 39 in _multicall
  File "/opt/conda/envs/arrow/lib/python3.10/site-packages/pluggy/_manager.py", line 80 in _hookexec
  File "/opt/conda/envs/arrow/lib/python3.10/site-packages/pluggy/_hooks.py", line 265 in __call__
  File "/opt/conda/envs/arrow/lib/python3.10/site-packages/_pytest/python.py", line 1792 in runtest
  File "/opt/conda/envs/arrow/lib/python3.10/site-packages/_pytest/main.py", line 317 in _main
  File "/opt/conda/envs/arrow/lib/python3.10/site-packages/pytest/__main__.py", line 5 in <module>
  File "/opt/conda/envs/arrow/lib/python3.10/runpy.py", line 86 in _run_code
  File "/opt/conda/envs/arrow/lib/python3.10/runpy.py", line 196 in _run_module_as_main
"""

# A chained traceback (3.11, with caret lines).
CHAINED = """\
Traceback (most recent call last):
  File "/srv/jobs/src/shardapp/core.py", line 44, in load_shard
    return lookup({}, n)
           ^^^^^^^^^^^^^
  File "/srv/jobs/src/shardapp/core.py", line 23, in lookup
    return table[key]
           ~~~~~^^^^^
KeyError: 17

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/srv/jobs/run_pipeline.py", line 17, in <module>
    run([17])
  File "/srv/jobs/run_pipeline.py", line 9, in run
    return [shardapp.core.load_shard(n) for n in shards]
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/srv/jobs/src/shardapp/core.py", line 46, in load_shard
    raise ValueError(f"cannot load shard {n} from shards/{n}.parquet") from exc
ValueError: cannot load shard 17 from shards/17.parquet
"""

# The same frames, another exception type: another crash.
CHAINED_TYPE = CHAINED.replace("raise ValueError(f", "raise LookupError(f").replace(
    "\nValueError: ", "\nLookupError: "
)

# NumPy's allocation failure, qualified exception name with a leading underscore.
ALLOC = """\
Traceback (most recent call last):
  File "/srv/jobs/src/tidal/run.py", line 41, in <module>
    main()
  File "/srv/jobs/src/tidal/run.py", line 37, in main
    grid = regrid(ds)
           ^^^^^^^^^^
  File "/srv/jobs/src/tidal/grid.py", line 90, in regrid
    out = np.empty((ny, nx, nt), dtype="float64")
          ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
numpy.core._exceptions._ArrayMemoryError: Unable to allocate 61.0 GiB for an array with shape (4320, 8640, 219) and data type float64
"""

# `python -c`: frames without source lines, so nothing but the exception follows the last one.
NO_SOURCE = """\
Traceback (most recent call last):
  File "<string>", line 1, in <module>
  File "<string>", line 1, in f
ZeroDivisionError: division by zero
"""

CRASHES = {
    "segv": SEGV,
    "segv_neighbour": SEGV_NEIGHBOUR,
    "abort": ABORT,
    "chained": CHAINED,
    "chained_type": CHAINED_TYPE,
    "alloc": ALLOC,
    "no_source": NO_SOURCE,
}

EXPECTED_TITLES = {
    "segv": "SIGSEGV in pandas.core.arrays.datetimelike._sub_datetimelike \u2190 __sub__",
    "segv_neighbour": "SIGSEGV in pandas.core.arrays.datetimelike._add_timedeltalike \u2190 __sub__",
    "abort": "SIGABRT in substrait_consumer.context.produce_isthmus_substrait \u2190 produce_substrait",
    "chained": "ValueError in shardapp.core.load_shard \u2190 run",
    "chained_type": "LookupError in shardapp.core.load_shard \u2190 run",
    "alloc": "numpy.core._exceptions._ArrayMemoryError in tidal.grid.regrid \u2190 main",
    "no_source": "ZeroDivisionError in f \u2190 <module>",
}


def _lines(text: str) -> list[str]:
    return text.split("\n")


def journald(text: str) -> str:
    # `journalctl -u dask-worker`: one entry per line written to stderr.
    return "\n".join(
        f"Nov 30 12:00:{i % 60:02d} node-7 python3[4242]: {line}"
        for i, line in enumerate(_lines(text))
    )


def journald_one_entry(text: str) -> str:
    # One multi-line entry (a JournalHandler): journalctl indents the continuation lines.
    head = "Nov 30 12:00:01 node-7 dask-worker[4242]: "
    first, *rest = _lines(text)
    return "\n".join([head + first] + [" " * len(head) + line if line else "" for line in rest])


def syslog_file(text: str) -> str:
    # rsyslog's RFC 3339 file format (/var/log/syslog on current distributions).
    return "\n".join(
        f"2026-11-30T12:00:01.{i:06d}+00:00 node-7 python3[4242]: {line}"
        for i, line in enumerate(_lines(text))
    )


def syslog_rfc5424(text: str) -> str:
    # What a syslog collector receives: PRI, version, time, host, app, procid, msgid, SD.
    return "\n".join(
        f"<11>1 2026-11-30T12:00:01.003Z node-7 python3 4242 - - {line}" for line in _lines(text)
    )


def kubectl(text: str) -> str:
    # `kubectl logs --timestamps` (and `docker logs --timestamps`): RFC 3339, nanoseconds.
    return "\n".join(
        f"2026-11-30T12:00:{i % 60:02d}.{i * 7919 % 10**9:09d}Z {line}"
        for i, line in enumerate(_lines(text))
    )


def cri_file(text: str) -> str:
    # /var/log/containers/*.log as containerd and CRI-O write it.
    return "\n".join(
        f"2026-11-30T12:00:01.{i:09d}Z stderr F {line}" for i, line in enumerate(_lines(text))
    )


def loki(text: str) -> str:
    # `logcli query` output: time, labels, line.
    labels = '{container="worker", namespace="etl", pod="dask-worker-7f9c8d-x2lqp"}'
    return "\n".join(f"2026-11-30T12:00:01Z {labels} {line}" for line in _lines(text))


def dask_prefix(text: str) -> str:
    # Dask's default log format, "%(asctime)s - %(name)s - %(levelname)s - %(message)s".
    return "\n".join(
        f"2026-11-30 12:00:01,{i % 1000:03d} - distributed.worker - ERROR - {line}"
        for i, line in enumerate(_lines(text))
    )


def ci_brackets(text: str) -> str:
    # A CI log's time stamper, as in a pyarrow build log quoted in apache/arrow#47275.
    return "\n".join(f"[2025/08/07 20:32:59.260 GMT+08:00] {line}" for line in _lines(text))


_FRAME_PARTS = re.compile(r'^(\s*File ")([^"]*)(", line )(\d+)(,? in )(.*)$', re.M)


def ansi(text: str) -> str:
    # A colouring log formatter: headers in bold red, paths, numbers and functions coloured.
    text = _FRAME_PARTS.sub("\\1\x1b[35m\\2\x1b[0m\\3\x1b[1m\\4\x1b[0m\\5\x1b[32m\\6\x1b[0m", text)
    return "\n".join(
        f"\x1b[1;31m{line}\x1b[0m" if line[:1].isalpha() else line for line in _lines(text)
    )


def crlf(text: str) -> str:
    return text.replace("\n", "\r\n")


def indentation_lost(text: str) -> str:
    # A trace pasted into a GitHub comment outside a code block, copied back from the page.
    return "\n".join(line.lstrip() for line in _lines(text))


WRAPPINGS = {
    "journald": journald,
    "journald_one_entry": journald_one_entry,
    "syslog_file": syslog_file,
    "syslog_rfc5424": syslog_rfc5424,
    "kubectl": kubectl,
    "cri_file": cri_file,
    "loki": loki,
    "dask_prefix": dask_prefix,
    "ci_brackets": ci_brackets,
    "ansi": ansi,
    "crlf": crlf,
    "indentation_lost": indentation_lost,
    "kubectl+dask_prefix": lambda t: kubectl(dask_prefix(t)),
    "journald+crlf": lambda t: crlf(journald(t)),
    "kubectl+ansi": lambda t: kubectl(ansi(t)),
    "indentation_lost+crlf": lambda t: crlf(indentation_lost(t)),
    "indentation_lost+kubectl": lambda t: kubectl(indentation_lost(t)),
}


def test_raw_crashes_parse_as_themselves():
    for name, text in CRASHES.items():
        sig = fingerprint(text)
        assert sig.title == EXPECTED_TITLES[name], name
        assert sig.grouping_version == GROUPING_VERSION and not sig.reason
    assert len({fingerprint(t).id for t in CRASHES.values()}) == len(CRASHES)


@pytest.mark.parametrize("wrapping", list(WRAPPINGS))
@pytest.mark.parametrize("crash", list(CRASHES))
def test_wrapped_crash_has_the_raw_id(crash, wrapping):
    raw = fingerprint(CRASHES[crash])
    wrapped_text = WRAPPINGS[wrapping](CRASHES[crash])
    assert wrapped_text != CRASHES[crash]
    wrapped = fingerprint(wrapped_text)
    assert (wrapped.id, wrapped.title, wrapped.input_kind) == (raw.id, raw.title, raw.input_kind)
    assert wrapped.error == raw.error and wrapped.frames == raw.frames
    assert wrapped.message == raw.message


@pytest.mark.parametrize("wrapping", list(WRAPPINGS))
def test_two_crashes_never_share_an_id_in_any_wrapping(wrapping):
    ids = {name: fingerprint(WRAPPINGS[wrapping](text)).id for name, text in CRASHES.items()}
    assert len(set(ids.values())) == len(CRASHES), ids


def test_no_id_is_shared_across_crashes_over_all_wrappings():
    seen: dict[str, str] = {}
    for name, text in CRASHES.items():
        for wrap in [lambda t: t, *WRAPPINGS.values()]:
            sid = fingerprint(wrap(text)).id
            assert seen.setdefault(sid, name) == name, (sid, name, seen[sid])


def test_bytes_as_read_from_a_log_file():
    data = crlf(kubectl(SEGV)).encode()
    assert fingerprint(data).id == fingerprint(SEGV).id


def test_header_glued_to_pytest_progress():
    # stderr is unbuffered: faulthandler's header lands after pytest's progress dots.
    text = "tests/test_io.py ....s......" + ABORT
    assert fingerprint(text).id == fingerprint(ABORT).id
    assert fingerprint(ci_brackets(text)).id == fingerprint(ABORT).id


def test_dask_compute_failed_block_in_journald():
    block = (
        "2026-11-30 07:26:49,801 - distributed.worker - ERROR - Compute Failed\n"
        "Key:       load_shard-2d17d3c4-76e8-4b76-9fb4-cd7794bc796e\n"
        "State:     executing\n"
        "Exception: \"ValueError('cannot load shard 17 from shards/17.parquet')\"\n"
        "Traceback: '  File \"shardapp/core.py\", line 46, in load_shard\\n'\n"
    )
    raw = fingerprint(block)
    assert (
        raw.input_kind == "dask_traceback"
        and raw.title == "ValueError in shardapp.core.load_shard"
    )
    for wrap in (journald, kubectl, crlf, loki):
        assert fingerprint(wrap(block)).id == raw.id


def test_a_timestamp_inside_a_message_is_kept():
    # Only a line's leading decoration goes; the same text later in a line is the message.
    text = CHAINED.replace("ValueError: cannot", "ValueError: 2026-11-30T12:00:01Z cannot")
    raw = fingerprint(text)
    assert raw.message == "<n>-<n>-30T12:<n>:01Z cannot load shard <n> from shards/<n>.parquet"
    assert fingerprint(kubectl(text)).message == raw.message


# -- what cannot be parsed keeps its own text -------------------------------------------------

NOT_A_TRACE_1 = "Segmentation fault (core dumped)\n"
NOT_A_TRACE_2 = "Killed\n"
KERNEL = (
    "[10091.246585] python3.6[24625]: segfault at 11 ip 00007efe055d3c1a sp 00007ffc8450a070 "
    "error 4 in libffi.so.6.0.4[7efe055ce000+7000]\n"
)
KERNEL_OTHER_LIB = KERNEL.replace("libffi.so.6.0.4", "libarrow.so.1500")


def test_unparsed_texts_are_not_one_bucket():
    sigs = [fingerprint(t) for t in (NOT_A_TRACE_1, NOT_A_TRACE_2, KERNEL, KERNEL_OTHER_LIB)]
    assert all(s.input_kind == "unparsed" for s in sigs)
    assert len({s.id for s in sigs}) == 4


@pytest.mark.parametrize("wrapping", ["journald", "kubectl", "crlf", "ansi", "loki"])
def test_unparsed_text_has_the_same_id_in_every_wrapping(wrapping):
    for text in (NOT_A_TRACE_1, KERNEL):
        assert fingerprint(WRAPPINGS[wrapping](text)).id == fingerprint(text).id


def test_unparsed_ids_ignore_addresses_and_pids_only():
    again = KERNEL.replace("24625", "31337").replace("00007efe055d3c1a", "00007f11aa2b3c1a")
    assert fingerprint(again).id == fingerprint(KERNEL).id
    # A number may be what tells two crashes apart (a line, a signal, an exit code): kept.
    assert (
        fingerprint("worker exited with code 137\n").id
        != fingerprint("worker exited with code 139\n").id
    )


def test_truncated_tracebacks_with_other_text_are_not_one_bucket():
    a = fingerprint("job 7 of etl crashed\nTraceback (most recent call last):\n")
    b = fingerprint("job 9 of ingest crashed\nTraceback (most recent call last):\n")
    assert a.input_kind == b.input_kind == "unparsed" and a.id != b.id


def test_dumps_without_a_current_thread_are_not_one_bucket():
    # A segfault in a thread Python does not know: every thread is listed as "Thread".
    no_current = SEGV.replace("Current thread", "Thread")
    other = no_current.replace("/srv/jobs/src/tidal/grid.py", "/srv/jobs/src/tidal/mesh.py")
    a, b = fingerprint(no_current), fingerprint(other)
    assert a.error == b.error == "SIGSEGV" and a.reason.startswith("no thread marked")
    assert a.id != b.id
    assert fingerprint(kubectl(no_current)).id == a.id


def test_frameless_exceptions_are_told_apart_by_their_message():
    a = fingerprint("Traceback (most recent call last):\nKeyError: 'user'\n")
    b = fingerprint("Traceback (most recent call last):\nKeyError: 17\n")
    c = fingerprint("Traceback (most recent call last):\nKeyError: 18\n")
    assert a.id != b.id and b.id == c.id


# -- the examples shipped in docs/examples, as logs deliver them -------------------------------

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "docs" / "examples"
TRACE_EXAMPLES = [
    "faulthandler-sigsegv-dask-worker.txt",
    "faulthandler-abort.txt",
    "python-chained-traceback.txt",
    "dask-worker-compute-failed.log",
]


@pytest.mark.parametrize("wrapping", list(WRAPPINGS))
def test_examples_keep_their_ids_in_every_wrapping(wrapping):
    ids = set()
    for name in TRACE_EXAMPLES:
        text = (EXAMPLES / name).read_text()
        raw = fingerprint(text)
        assert raw.input_kind != "unparsed", name
        assert fingerprint(WRAPPINGS[wrapping](text)).id == raw.id, name
        ids.add(raw.id)
    assert len(ids) == len(TRACE_EXAMPLES)


def test_exception_group_in_kubectl_logs():
    text = (
        "  + Exception Group Traceback (most recent call last):\n"
        '  |   File "/srv/jobs/src/shardapp/batch.py", line 12, in run_all\n'
        '  |     raise ExceptionGroup("shards failed", errors)\n'
        "  | ExceptionGroup: shards failed (2 sub-exceptions)\n"
        "  +-+---------------- 1 ----------------\n"
        "    | Traceback (most recent call last):\n"
        '    |   File "/srv/jobs/src/shardapp/core.py", line 23, in lookup\n'
        "    |     return table[key]\n"
        "    | KeyError: 17\n"
        "    +------------------------------------\n"
    )
    raw = fingerprint(text)
    assert raw.title == "ExceptionGroup in shardapp.batch.run_all"
    for wrap in (kubectl, journald, crlf, ansi, dask_prefix):
        assert fingerprint(wrap(text)).id == raw.id


def test_a_trace_as_python_wrote_it_is_not_stripped(monkeypatch):
    # The common case pays a few substring searches, never the stripping.
    from oomguard._signature import _transport

    def fail(text):
        raise AssertionError("stripped a plain trace")

    monkeypatch.setattr(_transport, "strip", fail)
    for name in TRACE_EXAMPLES[:3]:
        assert fingerprint((EXAMPLES / name).read_text()).input_kind != "unparsed"
    for text in (SEGV, ABORT, CHAINED, ALLOC, NO_SOURCE):
        assert not fingerprint(text).reason


# -- each rule on its own: line in, line out ---------------------------------------------------


@pytest.mark.parametrize(
    "line, expected",
    [
        (
            'Nov 30 12:00:01 node-7 python3[4242]:   File "a.py", line 1 in f',
            '  File "a.py", line 1 in f',
        ),
        ("Nov  3 02:00:01.123456 node-7 kernel: Killed process 4242", "Killed process 4242"),
        ("2026-11-30T12:00:01+0000 node-7 python3[4242]: x", "x"),
        ("<11>1 2026-11-30T12:00:01.003Z node-7 python3 4242 - - x", "x"),
        ('<11>1 2026-11-30T12:00:01Z node-7 python3 4242 ID47 [origin ip="10.0.0.7"] x', "x"),
        ("2026-11-30T12:00:01.123456789Z   File", "  File"),
        ("2026-11-30T12:00:01.123456789Z stderr F x", "x"),
        ('2026-11-30T12:00:01Z {pod="w-1", container="worker"} x', "x"),
        (
            "2026-11-30 12:00:01,123 - distributed.worker - ERROR - Compute Failed",
            "Compute Failed",
        ),
        ("2026-11-30T12:00:01Z 2026-11-30 12:00:01,123 - distributed.nanny - WARNING - x", "x"),
        ("[2025/08/07 20:32:59.260 GMT+08:00] x", "x"),
        ("[2025-08-07T12:32:59.260Z] x", "x"),
        ("[10091.246585] python3.6[24625]: segfault", "python3.6[24625]: segfault"),
        ("2026-11-30T12:00:01Z", ""),  # an empty line, its trailing space trimmed
        # not decorations: kept as they are
        ("KeyError: 2026-11-30T12:00:01Z", "KeyError: 2026-11-30T12:00:01Z"),
        ("Extension modules: numpy.core", "Extension modules: numpy.core"),
        ("2026-11-30T12:00:01Z Extension modules: numpy", "Extension modules: numpy"),
        ("Nov 30 is the day", "Nov 30 is the day"),
    ],
)
def test_line_headers(line, expected):
    from oomguard._signature._transport import line_headers

    assert line_headers([line]) == [expected]


def test_journalctl_continuation_lines():
    from oomguard._signature._transport import line_headers

    head = "Nov 30 12:00:01 node-7 w[1]: "
    lines = [
        head + "Traceback (most recent call last):",
        " " * len(head) + '  File "a.py", line 1, in f',
        " " * len(head) + "KeyError: 1",
    ]
    assert line_headers(lines) == [
        "Traceback (most recent call last):",
        '  File "a.py", line 1, in f',
        "KeyError: 1",
    ]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a\r\nb\rc", "a\nb\nc"),
        ("\x1b[1;31mKeyError\x1b[0m: 1", "KeyError: 1"),
        ("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", "link"),
    ],
)
def test_text_rules(text, expected):
    from oomguard._signature._transport import TEXT_RULES

    for rule in TEXT_RULES:
        text = rule(text)
    assert text == expected


@pytest.mark.parametrize(
    "lines, expected",
    [
        # a traceback: frames get two spaces, their source four, the exception none
        (
            [
                'File "a.py", line 1, in <module>',
                "main()",
                'File "a.py", line 9, in main',
                "return d[k]",
                "~^^^",
                "KeyError: 'k'",
            ],
            [
                '  File "a.py", line 1, in <module>',
                "    main()",
                '  File "a.py", line 9, in main',
                "    return d[k]",
                "    ~^^^",
                "KeyError: 'k'",
            ],
        ),
        # no source lines: the line after the last frame is the exception
        (
            ['File "<string>", line 1, in <module>', "ZeroDivisionError: division by zero"],
            ['  File "<string>", line 1, in <module>', "ZeroDivisionError: division by zero"],
        ),
        # a source line that reads like a name is not taken for the exception
        (
            ['File "a.py", line 3, in f', "raise", "socket.timeout: timed out"],
            ['  File "a.py", line 3, in f', "    raise", "socket.timeout: timed out"],
        ),
        # a dump: frames only
        (
            ['File "a.py", line 3 in f', "<no Python frame>"],
            ['  File "a.py", line 3 in f', "  <no Python frame>"],
        ),
        # indented as Python does: untouched
        (
            ['  File "a.py", line 3, in f', "    g()", "KeyError: 1"],
            ['  File "a.py", line 3, in f', "    g()", "KeyError: 1"],
        ),
    ],
)
def test_frame_indentation(lines, expected):
    from oomguard._signature._transport import frame_indentation

    assert frame_indentation(list(lines)) == expected


def test_glued_fatal_header():
    from oomguard._signature._transport import glued_fatal_header

    assert glued_fatal_header(["tests/x.py ..sF.Fatal Python error: Aborted"]) == [
        "Fatal Python error: Aborted"
    ]
    # quoted in a message, it stays a message
    line = "RuntimeError: worker said: Fatal Python error: Aborted"
    assert glued_fatal_header([line]) == [line]


# -- bounded work --------------------------------------------------------------------------------


def _cpu(fn, arg) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.thread_time()
        fn(arg)
        best = min(best, time.thread_time() - start)
    return best


def test_stripping_is_linear_in_the_input():
    unit = kubectl(journald(CHAINED + SEGV + NOT_A_TRACE_1))
    small = unit * (150_000 // len(unit))
    large = small * 4  # both below the 1 MiB cap
    assert len(large) < (1 << 20)
    t_small, t_large = _cpu(fingerprint, small), _cpu(fingerprint, large)
    assert t_large < 8 * t_small, (t_small, t_large)
    assert t_large < 5.0
    assert fingerprint(large).id == fingerprint(SEGV).id
