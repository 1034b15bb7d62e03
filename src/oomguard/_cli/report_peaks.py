"""The peaks section of `oomguard report`: per task prefix, the largest memory growth
admission learned, read from the workers' ledger files through `client.run` or from one
ledger file on this host (`oomguard._admission.peaks`), and the table that prints them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .._admission import peaks as _peaks
from .._display import one_line
from .._exceptions import ReportFailed
from .._units import format_bytes
from .layout import Column, Layout, key_line, lay_out, wrap


class PeaksRead(NamedTuple):
    """The peaks section: its rows (`_peaks.PeakRow`), where they were read (a ledger path,
    or the scheduler whose workers were asked), the ledgers read, and notes on what was not."""

    rows: list
    source: str
    ledgers: list
    notes: list[str]
    from_workers: bool


def peaks_from_file(path: str) -> PeaksRead:
    """The peaks of one ledger file on this host; ReportFailed when it cannot be read."""
    try:
        ledger = _peaks.read_ledger(path)
    except OSError as e:
        raise ReportFailed(
            f"cannot read the memory ledger {path}: {e.strerror or one_line(e)}"
        ) from e
    return PeaksRead(_peaks.merge([ledger]), path, [ledger], _peaks.notes([ledger]), False)


def peaks_from_workers(client: Any, address: str, timeout: float) -> PeaksRead:
    """The peaks of every worker host's ledger, each file read once (`client.run`)."""
    try:
        results = client.run(
            _peaks.worker_ledger_peaks, on_error="return", callback_timeout=timeout
        )
    except TimeoutError as e:
        raise ReportFailed(
            f"the workers of the scheduler at {address} did not answer within "
            f"{timeout:g} s (try a larger --timeout)"
        ) from e
    ledgers = _peaks.from_workers(results)
    return PeaksRead(_peaks.merge(ledgers), address, ledgers, _peaks.notes(ledgers), True)


_PEAK_COLUMNS = [
    Column("PREFIX"),
    Column("PEAK", right=True),
    Column("HOSTS", "hosts"),
    Column("SUGGESTED", "suggested"),
]
#: A long prefix keeps its place in the row longest; the suggestion and hosts move under it.
_PEAK_LAYOUTS = [
    Layout(("PREFIX", "PEAK", "HOSTS", "SUGGESTED")),
    Layout(("PREFIX", "PEAK", "SUGGESTED"), below=("HOSTS",)),
    Layout(("PREFIX", "PEAK"), below=("SUGGESTED", "HOSTS")),
    Layout(("PEAK", "SUGGESTED"), above=("PREFIX",), below=("HOSTS",)),
    Layout(("PEAK",), above=("PREFIX",), below=("SUGGESTED", "HOSTS")),
]


def render_peaks(read: PeaksRead, *, width: int | None = None) -> list[str]:
    """The peaks section: the start-up peak first, then the largest first; notes under it."""
    if read.from_workers:
        hosts = len({lg.host for lg in read.ledgers if lg.path != "?"})
        lines = [
            f"PEAKS: {len(read.rows)}, largest first, from the memory ledgers of {hosts} "
            f"worker host{'s' if hosts != 1 else ''}"
        ]
    else:
        lines = key_line(f"PEAKS: {len(read.rows)}, largest first, from", read.source, width)
    if read.rows:
        body = [[r.label, format_bytes(r.peak), ",".join(r.hosts), r.suggested] for r in read.rows]
        _, header, blocks = lay_out(_PEAK_COLUMNS, body, _PEAK_LAYOUTS, width)
        lines += [*header, *(line for block in blocks for line in block)]
        if any(r.suggested for r in read.rows):
            lines += wrap(
                "(SUGGESTED: the peak rounded up to 16 MiB; add a margin for larger inputs)",
                width,
                "  ",
            )
    elif not read.ledgers:
        lines.append("  no workers to ask")
    elif all(lg.missing for lg in read.ledgers):
        where = "no worker host has a memory ledger" if read.from_workers else "no such file"
        lines += wrap(f"no peaks learned yet: {where}", width, "  ")
    elif all(lg.missing or lg.note for lg in read.ledgers):
        lines.append("  no peaks read: see the notes")
    else:
        lines += wrap(
            "no peaks learned yet: a peak is learned from a task that ran alone in its "
            "worker and grew its memory by at least "
            "oomguard.worker.admission.min-estimate",
            width,
            "  ",
        )
    for note in read.notes:
        lines += wrap(f"note: {note}", width, "  ")
    return lines
