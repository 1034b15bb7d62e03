"""A real headless browser for the dashboard tests: Debian's chromium driven by playwright
(never a browser downloaded by `playwright install`), and the screenshot in the docs.

docs/images/dashboard.png is made by tests/cluster/test_getting_started.py, the tour's own
dashboard page: run with OOMGUARD_DOCS_IMAGES=1 it writes the picture there, and records in
it (a PNG text chunk) a digest of the modules that draw the page, which
tests/unit/test_docs_images.py compares with the current ones: a change to the page fails
that test until the picture is made again.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import pathlib
import struct
import zlib
from collections.abc import Iterator

from capabilities import require

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS_IMAGE = ROOT / "docs" / "images" / "dashboard.png"
#: The modules that draw the dashboard page: the picture is current while they are.
PAGE_SOURCES = ("scheduler_plugin/_dashboard.py", "scheduler_plugin/_dashboard_data.py")
DIGEST_KEY = b"oomguard-page-sources"
REMAKE = "OOMGUARD_DOCS_IMAGES=1 ./dev test tests/cluster/test_getting_started.py"


@contextlib.contextmanager
def browser() -> Iterator:
    """A headless chromium (playwright's Browser), closed after; the test is skipped, or
    failed under OOMGUARD_STRICT=1, where either is missing."""
    require(os.path.exists(CHROMIUM), "no chromium: apt-get install chromium")
    require(
        importlib.util.find_spec("playwright") is not None,
        "playwright is not installed (the test extra has it)",
    )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def page_digest() -> str:
    """A digest of the modules that draw the page (PAGE_SOURCES), as they are now."""
    src = ROOT / "src" / "oomguard"
    h = hashlib.sha256()
    for rel in PAGE_SOURCES:
        h.update(rel.encode() + b"\0" + (src / rel).read_bytes())
    return h.hexdigest()[:16]


def with_text(png: bytes, key: bytes, value: str) -> bytes:
    """`png` with a tEXt chunk key=value before its IEND chunk (the last 12 bytes)."""
    data = key + b"\0" + value.encode("latin-1")
    chunk = struct.pack(">I", len(data)) + b"tEXt" + data
    chunk += struct.pack(">I", zlib.crc32(b"tEXt" + data))
    return png[:-12] + chunk + png[-12:]


def text_of(png: bytes) -> dict[bytes, str]:
    """The tEXt chunks of `png`, key -> value."""
    out, i = {}, 8
    while i + 8 <= len(png):
        (length,), kind = struct.unpack(">I", png[i : i + 4]), png[i + 4 : i + 8]
        if kind == b"tEXt":
            key, _, value = png[i + 8 : i + 8 + length].partition(b"\0")
            out[key] = value.decode("latin-1")
        i += 12 + length
    return out


def save_for_docs(png: bytes) -> bool:
    """Write `png` as docs/images/dashboard.png, with the page's digest, when the run asks
    for it (OOMGUARD_DOCS_IMAGES=1); whether it did."""
    if os.environ.get("OOMGUARD_DOCS_IMAGES", "") in ("", "0"):
        return False
    DOCS_IMAGE.parent.mkdir(parents=True, exist_ok=True)
    DOCS_IMAGE.write_bytes(with_text(png, DIGEST_KEY, page_digest()))
    return True
