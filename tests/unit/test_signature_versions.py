"""Versioned signatures (issue 40): two versions of the grouping rules, the shipped one (2)
and a test-only third that hashes the innermost frame alone (coarser: two callers of one
crash site become one signature). Signed with 3 while 2 is still computed, a crash carries
its version-2 id; the store (both backends) makes that old id an alias of the new one: the
old ids find the new signature, its count includes the old deaths, a resolve made under the
old id holds and its crash coming back is a regression, and a death signed by an oomguard
still on version 2 counts in the new signature."""

from __future__ import annotations

import dataclasses

import pytest
from test_signature_states import T0, death, record, store  # noqa: F401 (the fixture)

from oomguard._decide import accounts, signatures
from oomguard._signature import _records as R
from oomguard._signature import _versions as V
from oomguard._signature import fingerprint, fingerprint_dask, fingerprint_stack

V2 = V.CURRENT


def _innermost(sig: R.Signature) -> R.Signature:
    """Version 3 of the rules (test only): the error and the innermost frame are hashed."""
    frames = sig.frames[-1:]
    material = f"3\x1e{R.error_key(sig.error)}\x1e{R.frames_material(frames)}"
    title = R.make_title(sig.error, frames, sig.input_kind)
    return dataclasses.replace(
        sig, id=R._digest(material), title=title, frames=frames, grouping_version=3
    )


V3 = V.Grouping(
    3,
    lambda text: _innermost(V2.fingerprint(text)),
    lambda exc, tb: _innermost(V2.fingerprint_dask(exc, tb)),
    lambda error, frames: _innermost(V2.fingerprint_stack(error, frames)),
)


def trace(caller: str) -> str:
    return (
        "Traceback (most recent call last):\n"
        f'  File "/srv/app/shardapp/core.py", line 30, in {caller}\n    parse_block(b)\n'
        '  File "/srv/app/shardapp/core.py", line 12, in parse_block\n    raise KeyError(k)\n'
        "KeyError: 17\n"
    )


@pytest.fixture
def version_3():
    """Sign with version 3, version 2 computed beside it (the decision core's caches
    dropped around it)."""
    signatures._DASK_SIGNATURES.clear()
    signatures._prefix_signature.cache_clear()
    with V.use(V3, [V2]):
        yield
    signatures._DASK_SIGNATURES.clear()
    signatures._prefix_signature.cache_clear()


def test_the_new_rules_carry_the_ids_the_old_rules_give(version_3):
    old_a, old_b = (V2.fingerprint(trace(c)) for c in ("process_a", "process_b"))
    assert old_a.id != old_b.id and old_a.grouping_version == 2
    a, b = (fingerprint(trace(c)) for c in ("process_a", "process_b"))
    assert (
        a.id == b.id
        and a.grouping_version == 3
        and a.title == "KeyError in shardapp.core.parse_block"
    )
    assert a.previous_ids == ((old_a.id, 2),) and b.previous_ids == ((old_b.id, 2),)
    assert fingerprint_dask("KeyError(17)", trace("p").split("\n", 1)[1]).previous_ids
    stack = [("/srv/app/shardapp/core.py", 3, "f"), ("/srv/app/shardapp/core.py", 9, "g")]
    assert fingerprint_stack("oom_kill", stack).previous_ids[0][1] == 2
    assert a.to_dict()["previous_ids"] == [[old_a.id, 2]]


def test_the_shipped_rules_have_no_previous_version():
    sig = fingerprint(trace("process_a"))
    assert sig.grouping_version == R.GROUPING_VERSION == 2 and sig.previous_ids == ()
    assert V.PREVIOUS == ()


def test_the_decision_core_records_the_old_ids(version_3):
    rec = accounts.task_record(
        "x-1", "etl", "w", "h", 1, T0, "KeyError(17)", trace("p").split("\n", 1)[1], 0
    )
    assert rec.grouping_version == 3 and rec.aliases and rec.aliases[0][1] == 2
    assert rec.aliases[0][0] != rec.events[0].signature_id


def test_old_ids_reach_the_new_signature_and_counts_are_continuous(store, version_3):  # noqa: F811
    old_a, old_b = (V2.fingerprint(trace(c)).id for c in ("process_a", "process_b"))
    # Before the upgrade: two signatures, one resolved.
    record(store, death(1, T0 + 1, old_a), death(2, T0 + 2, old_a), death(3, T0 + 3, old_b))
    store.resolve(old_a, note="fixed", by="alice", at=T0 + 10)
    # After: the same crashes, signed by version 3 with version 2 beside it.
    new = fingerprint(trace("process_a"))
    record(store, death(4, T0 + 20, new.id), aliases=new.previous_ids, grouping_version=3)
    b = fingerprint(trace("process_b"))
    record(store, death(5, T0 + 30, b.id), aliases=b.previous_ids, grouping_version=3)
    assert [s.id for s in store.signatures()] == [new.id]  # the old rows were folded in
    for asked in (old_a, old_b, new.id):
        row = store.signature(asked)
        assert (row.id, row.grouping_version, row.count) == (new.id, 3, 5)
        assert row.aliases == sorted([old_a, old_b])
        assert (row.first_seen, row.last_seen) == (T0 + 1, T0 + 30)
        assert {h for h in row.hosts} == {"node-0", "node-1", "node-2", "node-3"}
        assert len(store.deaths(signature=asked)) == 5
        assert len(store.events(signature=asked)) == 5
        assert store.known("signature", asked)[0]
    assert store.distinct_counts(old_a)["hosts"] == 4
    # The resolve made under the old id holds; its crash came back: one regression.
    row = store.signature(new.id)
    assert (row.state, row.resolved_by, row.regressed_at) == ("regressed", "alice", T0 + 20)
    assert store.regressions == 1
    # An oomguard still on version 2 (another cluster not upgraded yet): its death counts
    # in the new signature, and no old row comes back.
    record(store, death(6, T0 + 40, old_b))
    assert [(s.id, s.count) for s in store.signatures()] == [(new.id, 6)]
    assert store.signature(old_b).last_seen == T0 + 40
