"""Signatures of real crashes from real processes.

One module (tests/fixtures/shardapp) is copied under two directories laid out differently,
lines are added above its crash sites, idle threads and message values vary: the signature
must not move. A different crashing function, exception type or fatal signal must move it.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

from oomguard._signature import fingerprint, fingerprint_dask

FIXTURE = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "shardapp"

# Run in the child: faulthandler to a file, N idle threads, then the crash.
CHILD = textwrap.dedent(
    """
    import faulthandler, sys, threading, traceback
    faulthandler.enable(file=open(sys.argv[1], "w"), all_threads=True)
    stop = threading.Event()
    for _ in range(int(sys.argv[2])):
        threading.Thread(target=stop.wait, daemon=True).start()
    import shardapp.core as core
    try:
        {call}
    except Exception:
        sys.stdout.write(traceback.format_exc())
    """
)


def install(root: pathlib.Path, extra_lines: int) -> pathlib.Path:
    """Copy shardapp under `root`, with `extra_lines` comment lines above every function."""
    shutil.copytree(FIXTURE, root / "shardapp", ignore=shutil.ignore_patterns("__pycache__"))
    core = root / "shardapp" / "core.py"
    padding = "".join(f"# padding line {i}\n" for i in range(extra_lines))
    core.write_text(core.read_text().replace("\ndef ", f"\n{padding}def "))
    return root


@pytest.fixture(scope="module")
def homes(tmp_path_factory):
    base = tmp_path_factory.mktemp("installs")
    return {
        "plain": install(base / "one", 0),
        "venv": install(base / "two" / "venv" / "lib" / "python3.11" / "site-packages", 25),
        "src": install(base / "home" / "bob" / "proj" / "src", 7),
    }


def crash_all(homes, cases: dict[str, tuple[str, str, int]]) -> dict[str, str]:
    """Run every case concurrently: name -> (home, call, idle threads); return the trace."""
    procs = {}
    for name, (home, call, threads) in cases.items():
        dump = homes[home].parent / f"{name}.dump"
        procs[name] = (
            subprocess.Popen(
                [sys.executable, "-c", CHILD.format(call=call), str(dump), str(threads)],
                env={"PYTHONPATH": str(homes[home]), "PATH": "/usr/bin:/bin"},
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            ),
            dump,
        )
    traces = {}
    for name, (proc, dump) in procs.items():
        out, _ = proc.communicate(timeout=60)
        traces[name] = dump.read_text() if proc.returncode < 0 else out
        assert traces[name], f"{name}: the child left no trace (exit {proc.returncode})"
    return traces


@pytest.fixture(scope="module")
def traces(homes):
    return crash_all(
        homes,
        {
            "segv_a": ("plain", "core.process_shard(1)", 0),
            "segv_b": ("venv", "core.process_shard(99)", 6),
            "segv_c": ("src", "core.process_shard(5)", 2),
            "segv_other_fn": ("plain", "core.process_header(1)", 0),
            "abort_a": ("plain", "core.abort_shard(1)", 3),
            "abort_b": ("venv", "core.abort_shard(2)", 0),
            "key_a": ("plain", "core.lookup_shard(17)", 0),
            "key_b": ("venv", "core.lookup_shard(99)", 4),
            "index": ("plain", "core.lookup_shard(3, table=[])", 0),
            "convert": ("plain", "core.convert_shard(17)", 0),
            "chain_a": ("plain", "core.load_shard(17)", 0),
            "chain_b": ("src", "core.load_shard(4242)", 1),
        },
    )


def test_same_segfault_one_signature(traces):
    sigs = [fingerprint(traces[n]) for n in ("segv_a", "segv_b", "segv_c")]
    assert all(s.input_kind == "faulthandler" and s.error == "SIGSEGV" for s in sigs)
    assert len({s.id for s in sigs}) == 1
    assert sigs[0].title == "SIGSEGV in shardapp.core.parse_record \u2190 process_shard"
    # The idle threads were in the dump, and did not count.
    assert traces["segv_b"].count("Thread 0x") >= 6
    # Line numbers are shown: the padded copy crashed lower in its file.
    assert sigs[0].frames[-1].lineno != sigs[1].frames[-1].lineno


def test_other_crashing_function_other_signature(traces):
    a, other = fingerprint(traces["segv_a"]), fingerprint(traces["segv_other_fn"])
    assert other.error == "SIGSEGV" and other.id != a.id
    assert other.title == "SIGSEGV in shardapp.core.parse_header \u2190 process_header"


def test_abort_one_signature_and_other_than_segfault(traces):
    a, b = fingerprint(traces["abort_a"]), fingerprint(traces["abort_b"])
    assert a.error == "SIGABRT" and a.id == b.id
    assert a.title == "SIGABRT in shardapp.core.abort_record \u2190 abort_shard"
    assert a.id != fingerprint(traces["segv_a"]).id


def test_python_exception_same_bug_other_values(traces):
    a, b = fingerprint(traces["key_a"]), fingerprint(traces["key_b"])
    assert a.input_kind == "python_traceback" and a.error == "KeyError"
    assert a.id == b.id and a.message == b.message == "<n>"
    assert a.title == "KeyError in shardapp.core.lookup \u2190 lookup_shard"


def test_python_exception_other_type_or_function(traces):
    key = fingerprint(traces["key_a"])
    index = fingerprint(traces["index"])
    convert = fingerprint(traces["convert"])
    # Same frames, other exception type.
    assert [f.function for f in index.frames] == [f.function for f in key.frames]
    assert index.error == "IndexError" and index.id != key.id
    assert convert.error == "ValueError" and convert.id not in (key.id, index.id)


def test_chained_traceback_keeps_the_last_exception(traces):
    a, b = fingerprint(traces["chain_a"]), fingerprint(traces["chain_b"])
    assert "The above exception was the direct cause" in traces["chain_a"]
    assert a.error == "ValueError" and a.id == b.id
    assert a.message == "cannot load shard <n> from <path>"
    assert a.title.startswith("ValueError in shardapp.core.load_shard")


def test_worker_log_traceback_and_dask_record_agree(traces):
    # Dask keeps format_tb of the last exception and repr(exception): same signature.
    text = traces["key_a"]
    frames = text[
        text.rindex("Traceback (most recent call last):\n") + 35 : text.rindex("KeyError")
    ]
    sig = fingerprint_dask("KeyError(17)", frames)
    assert sig.input_kind == "dask_traceback"
    assert sig.id == fingerprint(text).id


def test_truncated_dump_keeps_the_signal(traces):
    text = traces["segv_b"]
    head = text[: text.index("Current thread")]
    sig = fingerprint(head)
    assert sig.input_kind == "faulthandler" and sig.error == "SIGSEGV"
    assert sig.frames == () and "truncated" in sig.reason


def test_recursion_counts_once(tmp_path):
    code = textwrap.dedent(
        """
        import sys, traceback
        sys.setrecursionlimit(int(sys.argv[1]))
        def walk(n):
            return walk(n + 1)
        try:
            walk(0)
        except RecursionError:
            sys.stdout.write(traceback.format_exc())
        """
    )
    script = tmp_path / "shardwalk.py"
    script.write_text(code)
    outs = [
        subprocess.run(
            [sys.executable, str(script), str(limit)], capture_output=True, text=True
        ).stdout
        for limit in (120, 700)
    ]
    assert "[Previous line repeated" in outs[0]
    sigs = [fingerprint(o) for o in outs]
    assert sigs[0].id == sigs[1].id
    assert [f.function for f in sigs[0].frames] == ["<module>", "walk"]


def test_real_crashes_as_logs_deliver_them(traces):
    # journald, `kubectl logs --timestamps`, Dask's log prefix, a paste that lost indentation.
    wrappings = [
        lambda t: "\n".join(f"Nov 30 12:00:01 node-7 python3[4242]: {x}" for x in t.split("\n")),
        lambda t: "\n".join(
            f"2026-11-30T12:00:01.{i:09d}Z {x}" for i, x in enumerate(t.split("\n"))
        ),
        lambda t: "\n".join(
            f"2026-11-30 12:00:01,{i % 1000:03d} - distributed.worker - ERROR - {x}"
            for i, x in enumerate(t.split("\n"))
        ),
        lambda t: "\r\n".join(x.lstrip() for x in t.split("\n")),
    ]
    raw = {name: fingerprint(text).id for name, text in traces.items()}
    for wrap in wrappings:
        assert {name: fingerprint(wrap(text)).id for name, text in traces.items()} == raw
    # ... and the grouping is still the one above: same bug one id, other bugs other ids.
    groups = [
        ("segv_a", "segv_b", "segv_c"),
        ("segv_other_fn",),
        ("abort_a", "abort_b"),
        ("key_a", "key_b"),
        ("index",),
        ("convert",),
        ("chain_a", "chain_b"),
    ]
    assert [len({raw[n] for n in g}) for g in groups] == [1] * len(groups)
    assert len({raw[g[0]] for g in groups}) == len(groups)
