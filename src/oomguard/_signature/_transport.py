"""Transport decorations: what log pipelines add to the lines of a trace, and taking it off.

A trace seldom arrives as Python wrote it. journald and syslog put a header before each
line; `kubectl logs --timestamps`, container runtimes and Loki an RFC 3339 time (and a
stream, or labels); Dask's logging its time, logger and level; terminals and log viewers
keep ANSI colours, Windows tools CRLF, and a trace pasted into a web page loses its
indentation. `plain` tells from a few marker positions whether a trace is as Python wrote
it (the common case, and then nothing here runs); `strip` applies TEXT_RULES to the whole
text and LINE_RULES to its lines. Every pattern is matched at a line start and bounded, so
the work stays linear in the input.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Callable

# -- telling a plain trace from a decorated one -----------------------------------------------

# Exception groups draw a margin of "|" and "+" before their lines.
_GROUP_MARGIN = re.compile(r"(?: *[|+] *)*")
_THREAD_LINES = ("Current thread ", "Thread 0x", "Stack (")


def _line_prefix(text: str, i: int) -> str:
    return text[text.rfind("\n", 0, i) + 1 : i]


def _plain_frame(prefix: str) -> bool:
    return prefix == "  " or ("|" in prefix and bool(_GROUP_MARGIN.fullmatch(prefix[:-2])))


def _plain_header(prefix: str) -> bool:
    return not prefix or bool(_GROUP_MARGIN.fullmatch(prefix.removesuffix("Exception Group ")))


def _plain_marker(text: str, marker: str) -> bool:
    i = text.find(marker)
    if i < 0:
        return True
    if marker == "(most recent call first):":
        return text.startswith(_THREAD_LINES, text.rfind("\n", 0, i) + 1)
    prefix = _line_prefix(text, i)
    return _plain_header(prefix) if marker[9] == " " else not prefix


_MARKERS = (
    "Fatal Python error: ",
    "(most recent call first):",
    "Traceback (most recent call last):",
    "Traceback: ",
)


def plain(text: str, dump: bool) -> bool:
    """True when the trace in `text` reads as Python wrote it: no CR, no escape codes, frame
    lines indented by two spaces, headers at line starts. `dump` says that a faulthandler
    thread line was found at a line start.

    >>> t = '\\nTraceback (most recent call last):\\n  File "a.py", line 1, in f\\nKeyError: 1\\n'
    >>> plain(t, False), plain(t.replace("\\n  File", "\\nFile"), False)
    (True, False)
    """
    if "\r" in text or "\x1b" in text:
        return False
    first_frame = text.find('File "')
    if first_frame < 0:
        # No frame line to judge by: every marker must start its line, wherever it is.
        return all(_plain_marker(text, marker) for marker in _MARKERS)
    if not (
        _plain_frame(_line_prefix(text, first_frame))
        and _plain_frame(_line_prefix(text, text.rfind('File "')))
    ):
        return False
    header = text.rfind("Traceback (most recent call last):")
    if header >= 0 and not _plain_header(_line_prefix(text, header)):
        return False
    # A dump's thread lines start their lines; its fatal header may not (glued to other output).
    return not dump or _plain_marker(text, "Fatal Python error: ")


# -- text rules -------------------------------------------------------------------------------


# CRLF and lone CR line ends (Windows tools, a browser's copy) are plain "\n".
def line_ends(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


_ANSI = re.compile(
    r"\x1b(?:\[[0-?]{0,32}[ -/]{0,8}[@-~]"  # CSI: colours, cursor moves
    r"|\][^\x07\x1b\n]{0,1024}(?:\x07|\x1b\\)?"  # OSC: titles, hyperlinks
    r"|[@-Z\\-_])"  # two-character sequences
)


# ANSI escape sequences (a colouring log formatter, a terminal capture) carry no text.
def ansi_codes(text: str) -> str:
    return _ANSI.sub("", text) if "\x1b" in text else text


TEXT_RULES: tuple[Callable[[str], str], ...] = (line_ends, ansi_codes)


# -- line rules -------------------------------------------------------------------------------

# Atomic groups: a time that matched is not tried again shorter when what follows fails.
_RFC3164_TIME = r"(?>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d{1,9})?)"
_RFC3339_TIME = r"(?>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?)"
_END = r"(?:[ \t]|$)"  # exactly one separator: the message's own indentation is kept
_HOST = r"[\w.\-]{1,255}"
_TAG = r"[\w.\-/@]{1,128}"
_LEVEL = r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)"

_HEADER = re.compile(
    # journalctl (short, short-precise), RFC 3164 syslog files: "Nov 30 12:00:01 host tag[pid]: "
    rf"(?P<syslog>(?:<\d{{1,3}}>)?{_RFC3164_TIME} {_HOST} {_TAG}(?:\[\d{{1,10}}\])?:{_END})"
    # an RFC 3339 time first: the time is read once, then what follows it tells the source
    rf"|{_RFC3339_TIME}(?:"
    # journalctl -o short-iso, rsyslog's RFC 3339 files (a pid, so no message is taken for one)
    rf"(?P<iso_syslog> {_HOST} {_TAG}\[\d{{1,10}}\]:{_END})"
    # Dask's (and logging's usual) "%(asctime)s - %(name)s - %(levelname)s - "
    rf"| - [\w.\-]{{1,200}} - {_LEVEL} - "
    # kubectl/docker --timestamps, CRI log files ("stderr F"), Loki's logcli ("{labels}")
    rf"|(?: (?:stdout|stderr) [FP])?(?: \{{[^{{}}\n]{{0,2048}}\}})?{_END})"
    # RFC 5424 as a collector receives it: "<11>1 time host app procid msgid sd "
    rf"|(?P<rfc5424><\d{{1,3}}>\d{{1,2}} (?:{_RFC3339_TIME}|-) \S{{1,255}} \S{{1,48}} \S{{1,128}}"
    rf" \S{{1,32}} (?:-|(?:\[[^\]\n]{{0,1024}}\]){{1,16}}){_END})"
    # a CI log's time stamper: "[2025/08/07 20:32:59.260 GMT+08:00] ", "[2025-08-07T12:32:59Z] "
    r"|\[\d{4}[-/]\d\d[-/]\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?"
    rf"(?: ?[A-Z]{{1,5}})?(?:[+-]\d\d(?::?\d\d)?)?\]{_END}"
    # the kernel's log (dmesg, dmesg -T)
    rf"|\[ {{0,12}}\d{{1,12}}\.\d{{1,9}}\]{_END}"
    rf"|\[[A-Z][a-z]{{2}} {_RFC3164_TIME} \d{{4}}\]{_END}"
)
# Headers that journalctl continues on the next lines, indented by their width.
_SYSLOG_GROUPS = ("syslog", "iso_syslog", "rfc5424")
_MAX_LAYERS = 4  # decorations stack (kubectl's time before Dask's prefix); this many at most
_HEADER_START = frozenset("<[0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ")  # what a header starts with


# Transport headers before a line, stacked or not; journalctl's continuation lines lose the
# indentation it gave them (the width of the header they continue).
def line_headers(lines: list[str]) -> list[str]:
    out = []
    width = 0
    for line in lines:
        pos = 0
        for _ in range(_MAX_LAYERS):
            if line[pos : pos + 1] not in _HEADER_START:
                break
            m = _HEADER.match(line, pos)
            if m is None or m.end() == pos:
                break
            if m.lastgroup in _SYSLOG_GROUPS:
                width = m.end() - pos
            pos = m.end()
        if pos:
            line = line[pos:]
        elif width and line[:width].isspace() and len(line) > width:
            line = line[width:]
        elif line:
            width = 0
        out.append(line)
    return out


_PYTEST_PROGRESS = re.compile(r"(?:\S{1,512} )?[.sFExX]{1,4096}")


# faulthandler writes unbuffered: its header can land after pytest's progress dots.
def glued_fatal_header(lines: list[str]) -> list[str]:
    for i, line in enumerate(lines):
        at = line.find("Fatal Python error: ")
        if at > 0 and _PYTEST_PROGRESS.fullmatch(line, 0, at):
            lines[i] = line[at:]
    return lines


_FRAME = re.compile(r'[ \t]*(File "[^\n]*", line (?:\d{1,9}|\?+)((,)? in [^\n]*)?)$')
_SOURCE_WINDOW = 12  # source and caret lines of one frame (3.13 prints multi-line statements)
_CARETS = re.compile(r"[\s~^]+")
_SECTION = ("Traceback (", "During handling of", "The above exception")
# An exception line: a dotted class name whose last part is CapWords, "Name: message" or "Name".
_EXC_STRICT = re.compile(r"(?:[A-Za-z_]\w*\.)*_*[A-Z]\w*(?::(?: [^\n]*)?)?")
_EXC_LOOSE = re.compile(r"([A-Za-z_][\w.]*)(?::(?: [^\n]*)?)?")


def _exception_line(block: list[str]) -> int:
    """Index of the exception line among the lines after a traceback's last frame."""
    for i, line in enumerate(block):
        if _EXC_STRICT.fullmatch(line) and not keyword.iskeyword(line.split(":", 1)[0]):
            return i
    for i, line in enumerate(block):
        m = _EXC_LOOSE.fullmatch(line)
        if m and not keyword.iskeyword(m[1]) and (i > 0 or len(block) == 1):
            return i
    return len(block)


def _frame_at(lines: list[str], i: int) -> re.Match[str] | None:
    return _FRAME.match(lines[i]) if 'File "' in lines[i] else None


# Frames whose indentation was lost (a web page's copy) or changed get Python's back; so do
# the source and caret lines under them, so the exception line is again the first one not
# indented.
def frame_indentation(lines: list[str]) -> list[str]:
    i, n = 0, len(lines)
    while i < n:
        m = _frame_at(lines, i)
        if m is None:
            if lines[i].strip() == "<no Python frame>":
                lines[i] = "  <no Python frame>"
            i += 1
            continue
        if lines[i].startswith("  File"):
            i += 1
            continue
        lines[i] = "  " + m[1]
        j = i + 1
        if m[2] and not m[3]:
            i = j  # a faulthandler frame ("line 9 in f"): no source line follows
            continue
        while (
            j < n
            and j - i <= _SOURCE_WINDOW
            and lines[j].strip()
            and _frame_at(lines, j) is None
            and not lines[j].startswith(_SECTION)
        ):
            j += 1
        block = [line.strip() for line in lines[i + 1 : j]]
        if j < n and _frame_at(lines, j) is not None:
            source = len(block)  # another frame follows: all of it is source
        else:
            rows = [k for k, b in enumerate(block) if not _CARETS.fullmatch(b)]
            exc = _exception_line([block[k] for k in rows])
            source = rows[exc] if exc < len(rows) else len(block)
        for k in range(i + 1, i + 1 + source):
            lines[k] = "    " + lines[k].strip()
        i = j
    return lines


LINE_RULES: tuple[Callable[[list[str]], list[str]], ...] = (
    line_headers,
    glued_fatal_header,
    frame_indentation,
)


def strip(text: str) -> str:
    """`text` without its transport decorations.

    >>> strip('2026-11-30T12:00:01.5Z Traceback (most recent call last):\\n'
    ...       '2026-11-30T12:00:01.6Z   File "a.py", line 1, in f\\n')
    'Traceback (most recent call last):\\n  File "a.py", line 1, in f\\n'
    """
    for rule in TEXT_RULES:
        text = rule(text)
    lines = text.split("\n")
    for line_rule in LINE_RULES:
        lines = line_rule(lines)
    return "\n".join(lines)
