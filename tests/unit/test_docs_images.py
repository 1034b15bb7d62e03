"""docs/images/dashboard.png is the tour's page as the browser test saw it (tests/chromium.py),
made from the modules that draw the page as they are now: a change to the page fails here
until the picture is made again, so the docs never show a page that is gone."""

from __future__ import annotations

from chromium import DIGEST_KEY, DOCS_IMAGE, REMAKE, ROOT, page_digest, text_of, with_text


def test_the_docs_show_the_dashboard_picture():
    assert DOCS_IMAGE.is_file(), f"no {DOCS_IMAGE}: make it with {REMAKE}"
    assert "](images/dashboard.png)" in (ROOT / "docs" / "getting-started.md").read_text()


def test_the_picture_is_of_the_page_as_it_is_now():
    made_from = text_of(DOCS_IMAGE.read_bytes()).get(DIGEST_KEY)
    assert made_from == page_digest(), (
        "docs/images/dashboard.png was made from other versions of "
        "scheduler_plugin/_dashboard.py and _dashboard_data.py: make it again with "
        f"{REMAKE} and commit it"
    )


def test_a_text_chunk_round_trips():
    png = DOCS_IMAGE.read_bytes()
    assert text_of(with_text(png, b"k", "v"))[b"k"] == "v"
    assert with_text(png, b"k", "v")[-12:] == png[-12:]  # IEND stays last
