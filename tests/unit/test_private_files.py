"""Private directories and files on a shared host (issue 28, items 1 and 13): a directory
another user made or can write is refused, no file is written through a symlink, a flight
record is read within its declared size, and dead processes' files are cleared."""

import logging
import os
import subprocess
import sys
import textwrap
import time

import pytest

from capabilities import require
from oomguard import _private
from oomguard._admission.ledger_file import LedgerFile
from oomguard._host.flight import FlightRecorder, read_flight_record
from oomguard._host.paths import private_crash_dir
from oomguard.worker_plugin._reporting import _read_text

OTHER_UID = 54321  # no such user needed: chown takes any uid


def _victim(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file\n")
    return victim


def _refused(caplog, path, why):
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"oomguard: not using crash dir {path}: {why}")
    return lines[0]


def test_a_private_directory_is_used_and_made(tmp_path, caplog):
    path = str(tmp_path / "made" / "crash")
    assert _private.private_dir(path, "crash dir") == path
    assert os.stat(path).st_mode & 0o777 == 0o700
    assert _private.private_dir(path, "crash dir") == path
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize(
    "make, why",
    [
        (lambda p, t: os.symlink(t, p), "it is a symlink"),
        (lambda p, t: (os.mkdir(p), os.chmod(p, 0o777)), "it is writable by its group or others"),
        (lambda p, t: (os.mkdir(p), os.chmod(p, 0o770)), "it is writable by its group or others"),
        (lambda p, t: (os.mkdir(p, 0o700), os.chown(p, OTHER_UID, -1)), "it is owned by uid"),
        (lambda p, t: open(p, "w").close(), "it is not a directory"),
    ],
    ids=["symlink", "world-writable", "group-writable", "foreign-owner", "a-file"],
)
def test_a_directory_others_reach_is_refused_for_a_fresh_one(tmp_path, caplog, make, why):
    require(os.geteuid() == 0 or "owner" not in why, "chown to another uid needs root")
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    path = str(tmp_path / "oomguard-crash")
    make(path, str(target))
    caplog.set_level(logging.WARNING, logger="oomguard")
    instead = _private.private_dir(path, "crash dir")
    assert instead != path and _private.why_not_private(instead) is None
    _refused(caplog, path, why)
    # The same refused path in the same process: the same fresh directory, no new line.
    assert _private.private_dir(path, "crash dir") == instead
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    assert list(target.iterdir()) == []


def test_xdg_runtime_dir_is_the_fallback_where_private(tmp_path, monkeypatch):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    bad = tmp_path / "bad"
    bad.mkdir()
    bad.chmod(0o777)
    assert _private.private_dir(str(bad), "crash dir") == str(runtime / "oomguard")
    runtime.chmod(0o777)  # itself not private: not used
    worse = tmp_path / "worse"
    worse.mkdir()
    worse.chmod(0o777)
    assert not _private.private_dir(str(worse), "crash dir").startswith(str(runtime))


def test_the_nanny_hands_its_choice_to_its_workers_config(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    bad.chmod(0o777)
    configs = ({}, {"oomguard": {"worker": {"crash-dir": str(bad)}}}, None)
    chosen = private_crash_dir(str(bad), configs)
    assert chosen != str(bad)
    assert [c["oomguard"]["worker"]["crash-dir"] for c in configs[:2]] == [chosen, chosen]


def test_the_handed_config_shares_nothing_with_the_process_config(tmp_path):
    # A nanny's config is dask.config.merge(dask.config.config, ...): its nested dicts are
    # the process's own. An in-process nanny must not change the global config.
    glob = {"oomguard": {"worker": {"crash-dir": None, "sample-interval": "1s"}}}
    nanny_config = dict(glob)  # what merge gives: a new top level, shared sections
    chosen = private_crash_dir(str(tmp_path / "crash"), (nanny_config,))
    assert nanny_config["oomguard"]["worker"] == {"crash-dir": chosen, "sample-interval": "1s"}
    assert glob == {"oomguard": {"worker": {"crash-dir": None, "sample-interval": "1s"}}}


def test_no_file_is_written_through_a_symlink(tmp_path):
    victim = _victim(tmp_path)
    flight = tmp_path / "123.flight"
    flight.symlink_to(victim)
    rec = FlightRecorder.create(str(flight))
    rec.close()
    assert victim.read_text() == "the user's own file\n"
    assert not flight.is_symlink() and flight.stat().st_mode & 0o777 == 0o600
    crash = tmp_path / "123.crash"
    crash.symlink_to(victim)
    os.close(_private.create(str(crash)))
    assert victim.read_text() == "the user's own file\n"


def test_the_ledger_refuses_a_world_writable_directory_and_symlinks(tmp_path):
    victim = _victim(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "memory-ledger.json").symlink_to(victim)
    ledger = LedgerFile(str(shared / "memory-ledger.json"))
    ledger.update(lambda state: True)
    ledger.close()
    assert victim.read_text() == "the user's own file\n"
    assert os.path.dirname(ledger.path) != str(shared)
    # In a private directory, a symlink in the ledger's place is refused, not followed.
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "memory-ledger.json").symlink_to(victim)
    ledger = LedgerFile(str(private / "memory-ledger.json"))
    with pytest.raises(OSError):
        ledger.update(lambda state: True)
    assert victim.read_text() == "the user's own file\n"


def test_a_flight_record_linked_to_dev_zero_is_refused_not_read(tmp_path):
    # In a child with 1 GiB of address space: read unbounded, each of these exhausts it
    # (or, the FIFO, waits for ever).
    link = tmp_path / "99.flight"
    link.symlink_to("/dev/zero")
    fifo = tmp_path / "98.flight"
    os.mkfifo(fifo)
    sparse = tmp_path / "97.flight"
    FlightRecorder.create(str(sparse), nslots=2).close()
    with open(sparse, "r+b") as f:
        f.truncate(4 << 30)  # a sparse 4 GiB tail after the record
    code = textwrap.dedent(
        f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        from oomguard._host.flight import read_flight_record
        print(read_flight_record({str(link)!r})["missing"])
        print(read_flight_record({str(fifo)!r})["missing"])
        print(read_flight_record({str(sparse)!r})["pid"])
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == [
        "['flight record: Too many levels of symbolic links']",
        "['flight record: not a regular file']",
        str(os.getpid()),
    ]


def test_a_flight_record_declaring_too_much_is_refused(tmp_path):
    huge = tmp_path / "8.flight"
    FlightRecorder.create(str(huge), nslots=2).close()
    with open(huge, "r+b") as f:
        f.seek(24)  # the slot count: 2**31 slots of 1088 bytes declared
        f.write((1 << 31).to_bytes(4, "little"))
    (why,) = read_flight_record(str(huge))["missing"]
    assert why.startswith("flight record: header declares ") and "(not read)" in why


def test_the_crash_file_read_is_bounded_and_regular_only(tmp_path):
    link = tmp_path / "5.crash"
    link.symlink_to("/dev/zero")
    missing: list[str] = []
    assert _read_text(str(link), missing) is None
    assert missing == ["crash file: Too many levels of symbolic links"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_files_of_dead_processes_are_removed(tmp_path):
    dead, alive = _dead_pid(), os.getpid()
    old = time.time() - 2 * _private.STALE_AFTER
    names = [f"{dead}.crash", f"{dead}.flight", f"{alive}.crash", f"{alive}.flight"]
    names += ["notes.txt", f"{dead}.crash.bak", "memory-ledger.json"]
    for name in names:
        (tmp_path / name).write_text("x")
        os.utime(tmp_path / name, (old, old))
    recent = _dead_pid()
    (tmp_path / f"{recent}.flight").write_text("x")  # its nanny may be reading it now
    assert _private.remove_stale(str(tmp_path)) == [f"{dead}.crash", f"{dead}.flight"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(set(names[2:]) | {f"{recent}.flight"})


def test_stale_files_of_another_user_are_left(tmp_path):
    require(os.geteuid() == 0, "chown to another uid needs root")
    dead = _dead_pid()
    old = time.time() - 2 * _private.STALE_AFTER
    path = tmp_path / f"{dead}.flight"
    path.write_text("x")
    os.chown(path, OTHER_UID, -1)
    os.utime(path, (old, old))
    assert _private.remove_stale(str(tmp_path)) == []
    assert path.exists()


def test_the_nanny_start_clears_dead_processes_files(tmp_path):
    dead = _dead_pid()
    old = time.time() - 2 * _private.STALE_AFTER
    crash_dir = tmp_path / "crash"
    crash_dir.mkdir(mode=0o700)
    for ext in ("crash", "flight"):
        (crash_dir / f"{dead}.{ext}").write_text("x")
        os.utime(crash_dir / f"{dead}.{ext}", (old, old))
    assert private_crash_dir(str(crash_dir)) == str(crash_dir)
    assert list(crash_dir.iterdir()) == []
