"""Signatures of real crashes inside real Dask workers (LocalCluster with nannies)."""

from __future__ import annotations

import os
import pathlib

import pytest
from distributed import Client, LocalCluster

from cluster_helpers import wait_for
from oomguard._signature import fingerprint, fingerprint_dask

FIXTURES = str(pathlib.Path(__file__).resolve().parent.parent / "fixtures")


@pytest.fixture
def shardapp(monkeypatch):
    # Importable here (so tasks pickle by reference) and in the spawned worker processes.
    monkeypatch.syspath_prepend(FIXTURES)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [FIXTURES, os.environ.get("PYTHONPATH")]))
    )
    import shardapp.core
    import shardapp.debug

    return shardapp


def _wait_for_dump(path: pathlib.Path, timeout: float = 30) -> str:
    def text() -> str:
        return path.read_text() if path.exists() else ""

    def dump() -> str:
        # faulthandler writes the crashing thread, then the others, then "Extension modules".
        got = text()
        return got if "Current thread" in got and "Extension modules" in got else ""

    return wait_for(
        dump, lambda: f"no faulthandler dump in {path}: {text()!r}", timeout, interval=0.1
    )


@pytest.mark.timeout(120)
def test_worker_segfault_dumps_share_one_signature(shardapp, tmp_path):
    dumps = tmp_path / "dumps"  # outside the worker directories, which the nanny deletes
    dumps.mkdir()
    with (
        LocalCluster(
            n_workers=2, processes=True, threads_per_worker=1, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        pids = client.run(shardapp.debug.enable_faulthandler, str(dumps))
        assert len(pids) == 2
        texts = []
        for i, (addr, pid) in enumerate(sorted(pids.items())):
            fut = client.submit(
                shardapp.core.process_shard,
                i,
                workers=[addr],
                allow_other_workers=False,
                pure=False,
            )
            texts.append(_wait_for_dump(dumps / f"{pid}.txt"))
            fut.cancel()
    sigs = [fingerprint(t) for t in texts]
    assert all(s.input_kind == "faulthandler" and s.error == "SIGSEGV" for s in sigs)
    assert sigs[0].id == sigs[1].id
    # The title names the crashing function and the task function that called it.
    assert sigs[0].title == "SIGSEGV in shardapp.core.parse_record \u2190 process_shard"
    # The dump was thread-rich (event loop, nanny pipe watchers); only the crashing one counted.
    assert all(t.count("Thread 0x") >= 2 for t in texts)
    assert all("distributed/" in t for t in texts)
    assert not any(f.filename.startswith(("distributed/", "dask/")) for f in sigs[0].frames)


@pytest.mark.timeout(120)
def test_erred_task_texts_on_the_scheduler(shardapp):
    with (
        LocalCluster(
            n_workers=1, processes=True, threads_per_worker=1, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        futs = [client.submit(shardapp.core.lookup_shard, n, pure=False) for n in (17, 99)]
        futs.append(client.submit(shardapp.core.convert_shard, 17, pure=False))
        for fut in futs:
            with pytest.raises((KeyError, ValueError)):
                fut.result()

        def texts(dask_scheduler, keys=[f.key for f in futs]):  # noqa: B006 (shipped by value)
            return [
                (dask_scheduler.tasks[k].exception_text, dask_scheduler.tasks[k].traceback_text)
                for k in keys
            ]

        records = client.run_on_scheduler(texts)
    # What Dask 2026.8.0 keeps: the exception's repr, and format_tb without Dask's own frames.
    assert records[0][0] == "KeyError(17)"
    assert records[0][1].startswith('  File "') and "distributed" not in records[0][1]
    key17, key99, convert = (fingerprint_dask(e, t) for e, t in records)
    assert key17.input_kind == "dask_traceback"
    assert key17.id == key99.id != convert.id
    assert key17.title == "KeyError in shardapp.core.lookup \u2190 lookup_shard"
    assert convert.title == "ValueError in shardapp.core.convert_shard"
    assert convert.message == "invalid literal for int() with base <n>: <str>"
