"""What the README and docs/ claim about the abort rules and run names matches the code
(issue 41: the README's headline left out the one-death rule, and the docs said repeated
runs are stored as `etl#2`, while every run is stored under its name with its start time:
tests/cluster/test_jobs.py checks the store)."""

from __future__ import annotations

import pathlib
import re

import dask
import distributed  # noqa: F401  (its config defaults: allowed-failures)
import pytest

from oomguard import _config

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
GETTING_STARTED = (ROOT / "docs" / "getting-started.md").read_text()
#: Each rule that aborts a pipeline, by the setting that governs it.
RULES = {
    "abort-on-repeat-signature": "oomguard.scheduler.abort-on-repeat-signature",
    "memory-retry-larger-only": "oomguard.scheduler.memory-retry-larger-only",
    "max-shard-infra-failures": "oomguard.scheduler.max-shard-infra-failures",
    "allowed-failures": "distributed.scheduler.allowed-failures",
}


def _headline(text: str) -> str:
    """The bullet on aborting pipelines, in the README's list of what oomguard does."""
    start = text.index("**Aborts a pipeline")
    return " ".join(text[start : text.index("\n- **", start)].split())


@pytest.mark.parametrize("doc", [README, GETTING_STARTED], ids=["README", "getting-started"])
@pytest.mark.parametrize("word", sorted(RULES))
def test_each_abort_rule_is_stated_with_its_setting(doc, word):
    text = _headline(doc) if doc is README else " ".join(doc.split())
    assert f"`{word}`" in text or f"({word})" in text, word
    key = RULES[word]
    assert key in _config.KNOWN_KEYS or dask.config.get(key, None) is not None, key


def test_the_one_death_rule_is_in_the_readme_headline():
    headline = _headline(README)
    assert "after **one** death" in headline and "no worker has a larger memory" in headline


def test_no_doc_says_a_run_is_stored_under_a_numbered_name():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    claims = [
        (p.name, m.group(0))
        for p in docs
        for m in re.finditer(r"stored as `[^`]*#\d+`", " ".join(p.read_text().split()))
    ]
    assert claims == []
    assert "Every run is stored under the name itself" in " ".join(GETTING_STARTED.split())
