"""The memory peaks the workers learned, read back for `oomguard report --peaks`.

Worker-side admission (`worker_plugin/_admission.py`) keeps, per task prefix, the largest RSS
growth a task showed while alone in its worker, in the host's memory ledger
(`{"version": 1, "leases": [...], "peaks": {prefix: bytes}}`, `ledger_file.py`). This module only
reads such files: open, read, parse. It never creates, locks or writes one, so reading a
ledger that workers are using never delays them. A writer rewrites the file in place under
its lock for tens of microseconds; a read that lands mid-write does not parse and is read
again. A file still unreadable after that, or another program's, gives no peaks and a note.

    >>> suggested(100 * 2**20 + 1)
    'oomguard.memory("112 MiB")'
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .ledger_file import STARTUP_PEAK, VERSION  # STARTUP_PEAK: a worker process's start-up

STARTUP_LABEL = "worker start-up (nanny start-up lease)"
#: Suggested annotations are the peak rounded up to a multiple of this.
SUGGEST_STEP = 16 * 2**20
_MiB, _GiB = 2**20, 2**30
_REREADS = 3  # reads of a file that does not parse: a writer may be mid-write


@dataclass(frozen=True)
class LedgerPeaks:
    """The peaks one ledger file held. `note`: why some or all were not read; `missing`:
    there is no file (no worker on the host has taken a lease or learned a peak yet)."""

    host: str
    path: str
    peaks: dict[str, int] = field(default_factory=dict)
    note: str | None = None
    missing: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "path": self.path,
            "peaks": dict(self.peaks),
            "note": self.note,
            "missing": self.missing,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LedgerPeaks:
        return cls(
            str(d["host"]),
            str(d["path"]),
            dict(d.get("peaks") or {}),
            d.get("note"),
            bool(d.get("missing")),
        )


@dataclass(frozen=True)
class PeakRow:
    """The largest peak learned for one task prefix, and the hosts whose ledgers hold it."""

    prefix: str
    peak: int
    hosts: tuple[str, ...]

    @property
    def label(self) -> str:
        return STARTUP_LABEL if self.prefix == STARTUP_PEAK else self.prefix

    @property
    def suggested(self) -> str | None:
        # The start-up peak is leased by the nanny, not by an annotation.
        return None if self.prefix == STARTUP_PEAK else suggested(self.peak)

    def to_dict(self) -> dict[str, Any]:
        return {
            "prefix": self.prefix,
            "peak": self.peak,
            "hosts": list(self.hosts),
            "suggested": self.suggested,
        }


def suggested(peak: int) -> str:
    """The annotation for a peak: rounded up to a multiple of 16 MiB, written exactly (a
    rounded "1.03 GiB" could be less than the peak).

    >>> suggested(1), suggested(16 * 2**20), suggested(16 * 2**20 + 1)
    ('oomguard.memory("16 MiB")', 'oomguard.memory("16 MiB")', 'oomguard.memory("32 MiB")')
    >>> suggested(2**30), suggested(2**30 + 1)
    ('oomguard.memory("1 GiB")', 'oomguard.memory("1040 MiB")')
    """
    n = -(-max(int(peak), 1) // SUGGEST_STEP) * SUGGEST_STEP
    size = f"{n // _GiB} GiB" if n % _GiB == 0 else f"{n // _MiB} MiB"
    return f'oomguard.memory("{size}")'


def _peaks_of(raw: bytes, path: str) -> tuple[dict[str, int], str | None]:
    """(peaks, note) of a ledger file's bytes; ValueError when it is no ledger of ours."""
    if not raw.strip():
        return {}, None  # just created by a worker, not yet written
    try:
        state = json.loads(raw)
    except (ValueError, RecursionError):
        raise ValueError("it is not JSON (torn, or another program's file)") from None
    if not isinstance(state, dict):
        raise ValueError("it is not a JSON object")
    if state.get("version") != VERSION:
        raise ValueError(f"its version is {state.get('version')!r}, not {VERSION}")
    peaks = state.get("peaks", {})
    if not isinstance(peaks, dict):
        raise ValueError('its "peaks" is not an object')
    good = {
        k: v for k, v in peaks.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0
    }
    skipped = len(peaks) - len(good)
    note = (
        f"{path}: {skipped} peak(s) that are not a positive number of bytes skipped"
        if skipped
        else None
    )
    return good, note


def read_ledger(path: str, host: str | None = None) -> LedgerPeaks:
    """The peaks in the ledger file at `path`, read only. A missing file has none; a file
    that is no ledger (torn past re-reading, another program's) has none and a note. OSError
    when the path exists but cannot be read (a directory, no permission)."""
    host = host or socket.gethostname()
    note = ""
    for attempt in range(_REREADS):
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return LedgerPeaks(host, path, missing=True)
        try:
            peaks, note_ = _peaks_of(raw, path)
            return LedgerPeaks(host, path, peaks, note_)
        except ValueError as e:
            note = str(e)
        if attempt + 1 < _REREADS:
            time.sleep(0.005 * (attempt + 1))
    return LedgerPeaks(
        host, path, note=f"{path} is not an oomguard memory ledger: {note}; no peaks read from it"
    )


def configured_ledger() -> str:
    """The ledger path this process's Dask config gives a worker, resolved as admission
    resolves it (`oomguard.worker.admission.ledger`, else `<crash-dir>/memory-ledger.json`).
    ConfigError names a bad setting."""
    from .._host.paths import configured_crash_dir
    from .config import AdmissionConfig

    return AdmissionConfig.from_dask(configured_crash_dir()).ledger


def worker_ledger_peaks() -> dict[str, Any]:
    """Run on a worker (`client.run`): the peaks of the ledger its config names, as a dict
    (`LedgerPeaks.to_dict`). Never raises for a bad file or setting: it says so in `note`."""
    host = socket.gethostname()
    try:
        path = configured_ledger()
    except Exception as e:  # ConfigError, or an oomguard whose config is broken
        return LedgerPeaks(host, "?", note=f"{host}: no ledger path: {e}").to_dict()
    try:
        return read_ledger(path, host).to_dict()
    except OSError as e:
        return LedgerPeaks(
            host, path, note=f"{host}: cannot read {path}: {e.strerror or e}"
        ).to_dict()


def merge(ledgers: Iterable[LedgerPeaks]) -> list[PeakRow]:
    """One row per prefix: its largest peak across ledgers, and the hosts whose ledger holds
    that largest peak. Ledgers read twice (several workers on a host share one file) count
    once. The start-up peak comes first, then the largest first."""
    best: dict[str, tuple[int, set[str]]] = {}
    seen: set[tuple[str, str]] = set()
    for ledger in ledgers:
        if (ledger.host, ledger.path) in seen:
            continue
        seen.add((ledger.host, ledger.path))
        for prefix, peak in ledger.peaks.items():
            top, hosts = best.get(prefix, (0, set()))
            if peak > top:
                best[prefix] = (peak, {ledger.host})
            elif peak == top:
                hosts.add(ledger.host)
    rows = [PeakRow(p, n, tuple(sorted(h))) for p, (n, h) in best.items()]
    rows.sort(key=lambda r: (r.prefix != STARTUP_PEAK, -r.peak, r.prefix))
    return rows


def notes(ledgers: Iterable[LedgerPeaks]) -> list[str]:
    """The notes of the ledgers, each once."""
    return list(dict.fromkeys(lg.note for lg in ledgers if lg.note))


def from_workers(results: dict[str, Any]) -> list[LedgerPeaks]:
    """`client.run(worker_ledger_peaks, on_error="return")` as LedgerPeaks; a worker that
    could not run it (no oomguard there, an error) gives a note."""
    out = []
    for worker, result in sorted(results.items()):
        if isinstance(result, dict):
            try:
                out.append(LedgerPeaks.from_dict(result))
                continue
            except (KeyError, TypeError, ValueError) as e:
                result = e
        why = (
            f"{type(result).__name__}: {result}"
            if isinstance(result, BaseException)
            else repr(result)
        )
        out.append(
            LedgerPeaks(
                worker,
                "?",
                note=f"worker {worker}: could not read its ledger: {' '.join(why.split())}",
            )
        )
    return out
