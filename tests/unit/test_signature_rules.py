"""One table per normalisation rule: input in, normalised output out."""

from __future__ import annotations

import pytest

from oomguard._signature import GROUPING_VERSION, Frame, fingerprint_stack, normalise_path, scrub
from oomguard._signature import _rules as rules
from oomguard._signature._paths import is_in_app


@pytest.mark.parametrize(
    "raw, expected",
    [
        # pseudo-files are kept as they are
        ("<dynamic-code>", "<dynamic-code>"),
        ("<string>", "<string>"),
        ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap>"),
        # installed packages: below site-packages / dist-packages
        ("/opt/conda/lib/python3.11/site-packages/distributed/worker.py", "distributed/worker.py"),
        ("/usr/lib/python3/dist-packages/shardapp/core.py", "shardapp/core.py"),
        (
            "/home/u/.venv/lib/python3.12/site-packages/shardapp/io/parquet.py",
            "shardapp/io/parquet.py",
        ),
        # the standard library: below lib/pythonX.Y (and lib-dynload)
        ("/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", "threading.py"),
        ("/usr/lib/python3.13t/ctypes/__init__.py", "ctypes/__init__.py"),
        (
            "/usr/lib/python3.11/lib-dynload/_ctypes.cpython-311-x86_64-linux-gnu.so",
            "_ctypes.cpython-311-x86_64-linux-gnu.so",
        ),
        # a src-layout project: below src/
        ("/home/u/proj/src/shardapp/core.py", "shardapp/core.py"),
        # Windows paths
        ("C:\\Users\\bob\\proj\\src\\shardapp\\core.py", "shardapp/core.py"),
        ("C:\\Python311\\Lib\\threading.py", "threading.py"),
        ("C:\\Python311\\Lib\\site-packages\\dask\\base.py", "dask/base.py"),
        # relative paths stay relative
        ("./shardapp/core.py", "shardapp/core.py"),
        ("../x/shardapp/core.py", "x/shardapp/core.py"),
        # an unknown root keeps package/module
        ("/tmp/pytest-of-root/pytest-7/one/shardapp/core.py", "shardapp/core.py"),
        ("/srv/build-17/shardapp/core.py", "shardapp/core.py"),
        # ... and drops home and scratch directories
        ("/home/alice/job.py", "job.py"),
        ("/tmp/job.py", "job.py"),
        ("/root/job.py", "job.py"),
    ],
)
def test_normalise_path(raw, expected):
    assert normalise_path(raw) == expected


@pytest.mark.parametrize(
    "raw, in_app",
    [
        ("/home/u/proj/src/shardapp/core.py", True),
        ("<dynamic-code>", True),
        ("<string>", True),
        ("<frozen runpy>", False),
        ("/usr/lib/python3.11/threading.py", False),
        ("/usr/lib/python3.11/ctypes/__init__.py", False),
        ("/venv/lib/python3.11/site-packages/distributed/worker.py", False),
        ("/venv/lib/python3.11/site-packages/dask/_task_spec.py", False),
        ("/venv/lib/python3.11/site-packages/tornado/ioloop.py", False),
        ("/venv/lib/python3.11/site-packages/cloudpickle/cloudpickle.py", False),
        ("/venv/lib/python3.11/site-packages/toolz/functoolz.py", False),
        ("/venv/lib/python3.11/site-packages/pandas/core/frame.py", True),
        # scrubbed (already reduced) paths still name the stdlib and the plumbing
        ("ctypes/__init__.py", False),
        ("threading.py", False),
        ("concurrent/futures/thread.py", False),
        ("asyncio/base_events.py", False),
        ("distributed/worker.py", False),
        ("shardapp/core.py", True),
    ],
)
def test_in_app(raw, in_app):
    assert is_in_app(raw) is in_app


def _recs(*frames):
    return [(f, n, fn, a) for f, n, fn, a in frames]


@pytest.mark.parametrize(
    "rule, frame_in, frame_out",
    [
        (
            rules.mark_in_app,
            ("/usr/lib/python3.11/threading.py", "run", False),
            ("/usr/lib/python3.11/threading.py", "run", False),
        ),
        (rules.mark_in_app, ("/p/src/app/m.py", "f", False), ("/p/src/app/m.py", "f", True)),
        (
            rules.mark_in_app,
            ("/v/lib/python3.11/site-packages/distributed/worker.py", "execute", False),
            ("/v/lib/python3.11/site-packages/distributed/worker.py", "execute", False),
        ),
        (rules.reduce_path, ("/p/src/app/m.py", "f", True), ("app/m.py", "f", True)),
        (rules.reduce_path, ("<dynamic-code>", "task", True), ("<dynamic-code>", "task", True)),
        (rules.short_function, ("app/m.py", "Loader.read", True), ("app/m.py", "read", True)),
        (rules.short_function, ("app/m.py", "<lambda>", True), ("app/m.py", "<lambda>", True)),
    ],
)
def test_frame_rule(rule, frame_in, frame_out):
    assert rule(frame_in) == frame_out


def test_frame_rules_compose():
    assert rules.normalise_frame("/home/u/proj/src/shardapp/core.py", "Parser.parse_record") == (
        "shardapp/core.py",
        "parse_record",
        True,
    )


@pytest.mark.parametrize(
    "rule, frames_in, frames_out",
    [
        (
            rules.drop_comprehensions,
            [
                ("app/m.py", 2, "run", True),
                ("app/m.py", 2, "<listcomp>", True),
                ("app/m.py", 5, "<genexpr>", True),
            ],
            [("app/m.py", 2, "run", True), ("app/m.py", 5, "<genexpr>", True)],
        ),
        # direct recursion: the repeated frame counts once, whatever its depth
        (
            rules.collapse_recursion,
            [("app/m.py", 1, "main", True)] + [("app/m.py", 9, "rec", True)] * 50,
            [("app/m.py", 1, "main", True), ("app/m.py", 9, "rec", True)],
        ),
        # mutual recursion: the repeated run a->b counts once
        (
            rules.collapse_recursion,
            [("m.py", 1, "main", True)]
            + [("m.py", 3, "a", True), ("m.py", 6, "b", True)] * 7
            + [("m.py", 8, "leaf", True)],
            [
                ("m.py", 1, "main", True),
                ("m.py", 3, "a", True),
                ("m.py", 6, "b", True),
                ("m.py", 8, "leaf", True),
            ],
        ),
        # a run longer than MAX_PERIOD frames is not taken for recursion
        (
            rules.collapse_recursion,
            [("m.py", i, f"f{i}", True) for i in range(9)] * 2,
            [("m.py", i, f"f{i}", True) for i in range(9)] * 2,
        ),
        # the same function called from two places that are not a repeat stays twice
        (
            rules.collapse_recursion,
            [("m.py", 1, "a", True), ("m.py", 2, "b", True), ("m.py", 3, "a", True)],
            [("m.py", 1, "a", True), ("m.py", 2, "b", True), ("m.py", 3, "a", True)],
        ),
        (
            rules.cap_depth,
            [("m.py", i, "f", True) for i in range(rules.MAX_FRAMES + 5)],
            [("m.py", i, "f", True) for i in range(5, rules.MAX_FRAMES + 5)],
        ),
    ],
)
def test_stack_rule(rule, frames_in, frames_out):
    assert rule(_recs(*frames_in)) == _recs(*frames_out)


def test_hashed_frames_are_in_app_or_all():
    recs = [("threading.py", 1, "run", False), ("app/m.py", 2, "f", True)]
    assert rules.hashed_frames(recs) == (Frame("app/m.py", "f", 2, True),)
    assert rules.hashed_frames(recs[:1]) == (Frame("threading.py", "run", 1, False),)


@pytest.mark.parametrize(
    "message, expected",
    [
        ("key 17 not found", "key <n> not found"),
        ("key 99 not found", "key <n> not found"),
        ("17", "<n>"),
        ("'user-42'", "<str>"),
        ('can\'t parse "abc" as int', "can't parse <str> as int"),
        ("object at 0x7f3a2b1c00d0 is gone", "object at <hex> is gone"),
        ("cannot read /data/shards/17.parquet", "cannot read <path>"),
        ("GET https://bucket.example.com/a/b?x=1 failed: 503", "GET <url> failed: <n>"),
        ("task load-6f1c2b3a-76e8-4b76-9fb4-cd7794bc796e lost", "task load-<uuid> lost"),
        ("token 9fb4cd7794bc796e2d17d3c4 differs", "token <hex> differs"),
        ("shard-17 failed", "shard-<n> failed"),
        ("float64 overflow 1.5e+300", "float64 overflow <n>"),
        ("  two\n  lines  ", "two lines"),
        ("", ""),
    ],
)
def test_normalise_message(message, expected):
    assert rules.normalise_message(message) == expected


def test_message_is_capped():
    assert len(rules.normalise_message("x" * 100_000)) == rules.MAX_MESSAGE


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            '  File "/home/alice/proj/src/shardapp/core.py", line 3, in f',
            '  File "shardapp/core.py", line 3, in f',
        ),
        (
            "Current thread 0x00007f30a37e6b80 (most recent call first):",
            "Current thread 0x0000000000000000 (most recent call first):",
        ),
        ("wrote /home/alice/out/x.csv", "wrote out/x.csv"),
        ("cwd is /home/alice", "cwd is ~"),
        ("see https://example.com/a/b", "see https://example.com/a/b"),
        ("run by alice on host", "run by <user> on host"),
    ],
)
def test_scrub(text, expected):
    assert scrub(text, users=["alice"]) == expected


def test_stack_title_and_version():
    sig = fingerprint_stack(
        "oom_kill",
        [("/srv/shardapp/core.py", 30, "process_shard"), ("/srv/shardapp/core.py", 12, "explode")],
    )
    assert sig.title == "oom_kill in shardapp.core.explode \u2190 process_shard"
    assert sig.input_kind == "stack_sample" and sig.grouping_version == GROUPING_VERSION == 2
    assert len(sig.id) == 16 and int(sig.id, 16) >= 0


def test_stack_bad_frame_is_unparsed_not_raised():
    sig = fingerprint_stack("oom_kill", [("a.py", 1)])  # type: ignore[list-item]
    assert sig.input_kind == "unparsed" and "index 0" in sig.reason


def test_grouping_version_is_hashed(monkeypatch):
    from oomguard._signature import _records

    frames = [("/srv/shardapp/core.py", 12, "explode")]
    before = fingerprint_stack("oom_kill", frames).id
    monkeypatch.setattr(_records, "GROUPING_VERSION", GROUPING_VERSION + 1)
    assert fingerprint_stack("oom_kill", frames).id != before
