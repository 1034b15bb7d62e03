"""Trace formats and their corners: exception groups, "During handling", SyntaxError,
faulthandler dumps without a fatal header, timeouts, `<no Python frame>`, Dask records."""

from __future__ import annotations

import faulthandler
import json
import subprocess
import sys
import traceback

import pytest

from oomguard._signature import fingerprint, fingerprint_dask


def _format(fn) -> str:
    try:
        fn()
    except BaseException:  # noqa: BLE001 - the formatted text is the point
        return traceback.format_exc()
    raise AssertionError("no exception")


def _lookup(n):
    return {}[n]


def _shard(n):
    return _lookup(n)


def test_caret_lines_and_during_handling():
    def handler():
        try:
            _shard(1)
        except KeyError:
            int("x")

    text = _format(handler)
    assert "During handling of the above exception" in text and "^^^" in text
    sig = fingerprint(text)
    assert sig.error == "ValueError"
    assert [f.function for f in sig.frames] == ["_format", "handler"]
    assert sig.message == "invalid literal for int() with base <n>: <str>"


def test_exception_group_signed_by_the_group():
    def group():
        raise ExceptionGroup("shards failed", [KeyError(1), KeyError(2)])

    text = _format(group)
    assert "Exception Group Traceback" in text
    sig = fingerprint(text)
    assert sig.error == "ExceptionGroup" and sig.frames[-1].function == "group"
    assert sig.message == "shards failed (<n> sub-exceptions)"


def test_syntax_error_frame_without_function():
    text = _format(lambda: compile("x = = 1", "/srv/app/shardapp/gen.py", "exec"))
    sig = fingerprint(text)
    assert sig.error == "SyntaxError"
    assert sig.frames[-1] == sig.frames[-1].__class__("shardapp/gen.py", "", 1, True)
    assert sig.title.startswith("SyntaxError in shardapp.gen \u2190 ")


def test_qualified_exception_type_hashes_like_dask_repr():
    tb = '  File "/srv/shardapp/core.py", line 3, in lookup\n'
    text = (
        "Traceback (most recent call last):\n"
        + tb
        + "shardapp.errors.ShardError: shard 4 is bad\n"
    )
    assert fingerprint(text).id == fingerprint_dask("ShardError('shard 4 is bad')", tb).id


def test_dump_without_fatal_header(tmp_path):
    # faulthandler.register(signal) and dump_traceback() write threads only.
    path = tmp_path / "dump.txt"
    with open(path, "w") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
    sig = fingerprint(path.read_text())
    assert sig.input_kind == "faulthandler" and sig.error == "DUMP"
    assert sig.frames[-1].function == "test_dump_without_fatal_header"


def test_timeout_dump_of_one_thread(tmp_path):
    # In a fresh process: dump_traceback_later dumps every thread, and this test process
    # may still have threads left by earlier tests.
    path = tmp_path / "timeout.txt"
    code = (
        "import faulthandler, time\n"
        "def test_timeout_dump_of_one_thread():\n"
        f"    with open({str(path)!r}, 'w') as f:\n"
        "        faulthandler.dump_traceback_later(0.01, file=f)\n"
        "        time.sleep(0.3)\n"
        "        faulthandler.cancel_dump_traceback_later()\n"
        "test_timeout_dump_of_one_thread()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
    text = path.read_text()
    assert text.startswith("Timeout (")
    sig = fingerprint(text)
    assert sig.error == "TIMEOUT" and sig.frames[-1].function == "test_timeout_dump_of_one_thread"


@pytest.mark.parametrize(
    "text, error, title, reason",
    [
        (
            "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f01 (most recent call first):\n"
            "  <no Python frame>\n\nThread 0x00007f02 (most recent call first):\n"
            '  File "/srv/shardapp/core.py", line 9 in idle\n',
            "SIGSEGV",
            "SIGSEGV (no Python frame)",
            "",
        ),
        (
            "Fatal Python error: Bus error\n\nCurrent thread 0x01 (most recent call first):\n"
            '  File "/srv/shardapp/mm.py", line 9 in read_map\n',
            "SIGBUS",
            "SIGBUS in shardapp.mm.read_map",
            "",
        ),
        (
            "Fatal Python error: Floating-point exception\n\nStack (most recent call first):\n"
            '  File "/srv/shardapp/m.py", line ??? in div\n',
            "SIGFPE",
            "SIGFPE in shardapp.m.div",
            "",
        ),
        (
            "Fatal Python error: _enter_buffered_busy: could not acquire lock for "
            "<_io.BufferedWriter name='<stderr>'> at interpreter shutdown\n\n"
            "Current thread 0x01 (most recent call first):\n  <no Python frame>\n",
            "FATAL:_enter_buffered_busy",
            "FATAL:_enter_buffered_busy (no Python frame)",
            "",
        ),
        (
            "Windows fatal exception: access violation\n\nCurrent thread 0x0000 (most recent call first):\n"
            '  File "C:\\app\\shardapp\\core.py", line 9 in parse_record\n',
            "EXCEPTION_ACCESS_VIOLATION",
            "EXCEPTION_ACCESS_VIOLATION in shardapp.core.parse_record",
            "",
        ),
        (
            "Fatal Python error: Segmentation fault\n\nThread 0x01 (most recent call first):\n"
            '  File "/srv/a.py", line 1 in f\n\nThread 0x02 (most recent call first):\n'
            '  File "/srv/b.py", line 1 in g\n',
            "SIGSEGV",
            "SIGSEGV (no Python frame)",
            "no thread marked",
        ),
    ],
)
def test_dump_corners(text, error, title, reason):
    sig = fingerprint(text)
    assert (sig.input_kind, sig.error, sig.title) == ("faulthandler", error, title)
    assert sig.reason.startswith(reason)


def test_fatal_message_is_not_hashed():
    a = (
        "Fatal Python error: Aborted\n\nCurrent thread 0x1 (most recent call first):\n"
        '  File "/srv/shardapp/core.py", line 9 in abort_record\n'
    )
    assert (
        fingerprint(a).id == fingerprint(a.replace("0x1", "0x2").replace("line 9", "line 99")).id
    )


def test_dask_record_as_json_and_as_worker_log():
    record = {
        "exception_text": "KeyError('user-17')",
        "traceback_text": '  File "<dynamic-code>", line 8, in lookup\n',
    }
    log = (
        "2026-11-30 07:26:49,801 - distributed.worker - ERROR - Compute Failed\n"
        "Key:       lookup-2d17d3c4\nState:     executing\n"
        f"Exception: {record['exception_text']!r}\nTraceback: {record['traceback_text']!r}\n"
    )
    a, b = fingerprint(json.dumps(record)), fingerprint(log)
    c = fingerprint_dask(record["exception_text"], record["traceback_text"])
    assert a.id == b.id == c.id and a.input_kind == "dask_traceback"
    assert (c.title, c.message) == ("KeyError in lookup", "<str>")


def test_dask_truncated_exception():
    # distributed's truncate_exception: type(e)("Long error message", str(e)[:max_len])
    sig = fingerprint_dask("ValueError('Long error message', 'x at 0x7f...')", "")
    assert sig.error == "ValueError" and sig.frames == ()


@pytest.mark.parametrize(
    "data, reason",
    [
        ("", "empty input"),
        (b"   \n", "empty input"),
        ("hello world", "no Python traceback"),
        ("Traceback (most recent call last):\n", "truncated traceback"),
        (b"\x00\x01\x02" * 100, "binary input"),
    ],
)
def test_unparsed_reasons_and_stable_ids(data, reason):
    sig = fingerprint(data)
    assert sig.input_kind == "unparsed" and sig.reason.startswith(reason)
    assert fingerprint(data).id == sig.id


def test_non_text_input_does_not_raise():
    assert fingerprint(12345).input_kind == "unparsed"  # type: ignore[arg-type]
    assert fingerprint_dask(None, None).input_kind == "unparsed"  # type: ignore[arg-type]


def test_running_python_version_parses_itself():
    sig = fingerprint(_format(lambda: _shard(5)))
    assert sig.title == "KeyError in unit.test_signature_formats._lookup \u2190 _shard"
    assert [f.lineno for f in sig.frames][-1] == _lookup.__code__.co_firstlineno + 1
