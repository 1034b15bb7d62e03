import os
import signal
import subprocess
import sys
import textwrap

from oomguard._host.flight import SIGNALS_RECORDING, FlightRecorder, read_flight_record


def test_executing_slots_and_latest_sample(tmp_path):
    path = str(tmp_path / "1.flight")
    rec = FlightRecorder.create(path, nslots=4)
    rec.signals_state(SIGNALS_RECORDING)  # else missing says the senders were not recorded
    a = rec.task_started("('load', 1)", start=10.0)
    b = rec.task_started("('load', 2)", start=11.0)
    rec.write_sample({"time": 1.0, "rss": 5, "tasks": {}})
    rec.write_sample({"time": 2.0, "rss": 7, "tasks": {"('load', 2)": {"thread": 3}}})
    rec.task_finished(a)
    out = read_flight_record(path)
    assert out["executing"] == [{"key": "('load', 2)", "start": 11.0, "thread": 0}]
    assert out["sample"]["rss"] == 7 and out["sample"]["time"] == 2.0
    assert out["pid"] == os.getpid()
    assert out["missing"] == [] and out["read"] is True
    rec.task_finished(b)
    assert read_flight_record(path)["executing"] == []
    rec.close(remove=True)
    assert not os.path.exists(path)


def test_slots_run_out_and_come_back(tmp_path):
    rec = FlightRecorder.create(str(tmp_path / "f"), nslots=2)
    s1, s2, s3 = (rec.task_started(k) for k in "abc")
    assert s3 == -1 and rec.dropped_tasks == 1
    rec.task_finished(s3)  # a dropped task's finish is harmless
    rec.task_finished(s1)
    assert rec.task_started("d") == s1
    assert sorted(t["key"] for t in read_flight_record(rec.path)["executing"]) == ["b", "d"]


def test_long_keys_are_truncated_not_spilled(tmp_path):
    rec = FlightRecorder.create(str(tmp_path / "f"), nslots=2)
    rec.task_started("x" * 5000)
    rec.task_started("y")
    keys = [t["key"] for t in read_flight_record(rec.path)["executing"]]
    assert sorted(keys) == ["x" * 1024, "y"]


def test_oversized_sample_is_dropped_and_counted(tmp_path):
    rec = FlightRecorder.create(str(tmp_path / "f"), sample_capacity=1024)
    assert rec.write_sample({"time": 1.0}) is True
    assert rec.write_sample({"blob": "z" * 4096}) is False
    assert rec.dropped_samples == 1
    assert read_flight_record(rec.path)["sample"] == {"time": 1.0}


def test_missing_and_corrupt_files_are_named(tmp_path):
    out = read_flight_record(str(tmp_path / "nope"))
    # Not read: an empty `executing` then says nothing about what ran.
    assert out["executing"] == [] and out["read"] is False
    assert "flight record" in out["missing"][0]
    bad = tmp_path / "bad"
    bad.write_bytes(b"garbage" * 100)
    out = read_flight_record(str(bad))
    assert "bad header" in out["missing"][0] and out["read"] is False
    rec = FlightRecorder.create(str(tmp_path / "empty"))
    assert "no stack sample" in read_flight_record(rec.path)["missing"][0]


def test_record_survives_sigkill(tmp_path):
    """The point of the mapping: what was written before a SIGKILL is still there."""
    path = tmp_path / "k.flight"
    code = textwrap.dedent(
        f"""
        import os, sys, time
        from oomguard._host.flight import FlightRecorder
        rec = FlightRecorder.create({str(path)!r})
        rec.task_started("doomed-task", start=123.0)
        rec.write_sample({{"time": 5.0, "tasks": {{"doomed-task": {{"stack": [["a.py", 1, "f"]]}}}}}})
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        proc.kill()
    out = read_flight_record(str(path))
    assert out["executing"] == [{"key": "doomed-task", "start": 123.0, "thread": 0}]
    assert out["sample"]["tasks"]["doomed-task"]["stack"] == [["a.py", 1, "f"]]
