"""Fuzzing: fingerprint never raises, says "unparsed" for what is no trace, stays linear."""

from __future__ import annotations

import pathlib
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oomguard._signature import GROUPING_VERSION, Signature, fingerprint, fingerprint_dask

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "docs" / "examples"
DUMP = (EXAMPLES / "faulthandler-sigsegv-dask-worker.txt").read_text()
TRACEBACK = (EXAMPLES / "python-chained-traceback.txt").read_text()
TRACE_MARKERS = ('File "', "Traceback", "most recent call", "Fatal Python error", "exception_text")
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _valid(sig: Signature) -> None:
    assert isinstance(sig, Signature) and len(sig.id) == 16
    assert sig.input_kind in ("python_traceback", "faulthandler", "dask_traceback", "unparsed")
    assert sig.to_dict()["grouping_version"] == GROUPING_VERSION
    if sig.input_kind == "unparsed":
        assert sig.reason


@FUZZ
@given(st.text())
def test_arbitrary_text(text):
    sig = fingerprint(text)
    _valid(sig)
    if not any(m in text for m in TRACE_MARKERS):
        assert sig.input_kind == "unparsed"


@FUZZ
@given(st.binary())
def test_arbitrary_bytes(data):
    _valid(fingerprint(data))


@FUZZ
@given(st.text(), st.text())
def test_arbitrary_dask_texts(exc, tb):
    _valid(fingerprint_dask(exc, tb))


@FUZZ
@given(st.integers(0, len(DUMP)))
def test_truncated_dumps(cut):
    sig = fingerprint(DUMP[:cut])
    _valid(sig)
    block_end = DUMP.index("\n\n", DUMP.index("Current thread"))
    if cut > block_end:
        # The crashing thread is whole: the rest of the dump does not matter.
        assert sig.id == fingerprint(DUMP).id
    elif cut > DUMP.index("Fatal Python error: Segmentation fault") + 40:
        assert sig.input_kind == "faulthandler" and sig.error == "SIGSEGV"


@FUZZ
@given(st.integers(0, len(TRACEBACK)))
def test_truncated_tracebacks(cut):
    _valid(fingerprint(TRACEBACK[:cut]))


@FUZZ
@given(st.binary(min_size=1, max_size=64), st.integers(0, len(DUMP)))
def test_invalid_utf8_inside_a_dump(junk, at):
    data = DUMP.encode()
    _valid(fingerprint(data[:at] + b"\xff\xfe" + junk + data[at:]))


def test_invalid_utf8_garbage_is_unparsed():
    sig = fingerprint(bytes(range(256)) * 64)
    assert sig.input_kind == "unparsed" and "binary" in sig.reason


def test_ten_megabytes_is_bounded():
    big = ("x" * 99 + "\n") * 100_000 + TRACEBACK
    start = time.perf_counter()
    sig = fingerprint(big)
    assert sig.error == "ValueError"  # the crash at the end is still found
    assert time.perf_counter() - start < 5
    assert fingerprint(big.encode()).id == sig.id


def _best_time(text: str) -> float:
    best = float("inf")
    for _ in range(5):
        # CPU time of this thread, not wall time: another process on the core (a busy CI
        # machine) must not look like parsing time.
        start = time.thread_time()
        fingerprint(text)
        best = min(best, time.thread_time() - start)
    return best


def test_time_is_linear_in_input():
    # Hostile-looking lines: unterminated frames, headers, quotes, thread lines, numbers.
    unit = (
        '  File "/a/b/c.py", line 1, in f\n  File "/x/' + "y" * 40 + "\n"
        "Traceback (most recent call last):\n"
        "Thread 0x7f00 (most recent call first):\n"
        '  File "' + '", line ' * 8 + "\n"
        "Exception: 'x' 0x1f " + "1" * 30 + "\n"
    )
    small = unit * (200_000 // len(unit))
    large = small * 4  # both below the 1 MiB cap
    for text in (small + TRACEBACK, small + DUMP):
        t_small = _best_time(text)
        t_large = _best_time(small * 4 + text[len(small) :])
        assert t_large < 8 * t_small, (t_small, t_large)
    assert len(large) < (1 << 20)
