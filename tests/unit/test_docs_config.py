"""docs/configuration.md documents exactly the keys of oomguard.yaml, each with its default
and an environment variable that Dask really maps onto that key."""

from __future__ import annotations

import pathlib
import re

import dask.config
import pytest
import yaml

import oomguard

ROOT = pathlib.Path(__file__).resolve().parents[2]
YAML = pathlib.Path(oomguard.__file__).with_name("oomguard.yaml")
DOC = ROOT / "docs" / "configuration.md"


def leaves(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            out.update(leaves(value, path))
        else:
            out[path] = value
    return out


KEYS = leaves(yaml.safe_load(YAML.read_text()))


def sections() -> dict[str, str]:
    """`### \\`oomguard.x.y\\`` heading -> the text up to the next heading."""
    text = DOC.read_text()
    parts = re.split(r"^### `([^`]+)`[ \t]*$", text, flags=re.MULTILINE)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def env_var(key: str) -> str:
    return "DASK_" + "__".join(p.replace("-", "_").upper() for p in key.split("."))


def shown(value: object) -> str:
    words = {None: "null", True: "true", False: "false"}
    return words[value] if value is None or isinstance(value, bool) else str(value)


def test_every_key_is_documented_and_nothing_else():
    documented = set(sections())
    assert sorted(set(KEYS) - documented) == [], "keys in oomguard.yaml missing from the docs"
    assert sorted(documented - set(KEYS)) == [], "keys in the docs that oomguard.yaml lacks"


@pytest.mark.parametrize("key", sorted(KEYS))
def test_each_key_names_its_default_and_env_var(key):
    body = sections().get(key, "")
    default = re.search(r"Default: `([^`]*)`", body)
    assert default and default.group(1) == shown(KEYS[key]), f"{key}: default"
    env = re.search(r"Env: `([A-Z0-9_]+)=", body)
    assert env and env.group(1) == env_var(key), f"{key}: env var"
    # Dask maps that variable onto exactly this key.
    collected = dask.config.collect_env({env.group(1): "x"})
    assert dask.config.get(key, config=collected) == "x"
    assert len(body.split()) >= 25, f"{key}: say what it means"


def _boolean_words() -> tuple[list[str], list[str]]:
    """The (true, false) words docs/configuration.md says booleans take: its "booleans
    `true`/`false`, `yes`/`no`, ..." sentence."""
    text = " ".join(DOC.read_text().split())
    sentence = re.search(r"booleans (`[^`]+`/`[^`]+`(?:,? (?:or )?`[^`]+`/`[^`]+`)*)", text)
    assert sentence, "docs/configuration.md: no sentence says what booleans take"
    pairs = re.findall(r"`([^`]+)`/`([^`]+)`", sentence.group(1))
    return [t for t, _ in pairs], [f for _, f in pairs]


def test_booleans_take_exactly_the_words_the_docs_name():
    from oomguard import _config

    true, false = _boolean_words()
    assert (tuple(true), tuple(false)) == (_config.TRUE_WORDS, _config.FALSE_WORDS)
    booleans = [k for k, v in KEYS.items() if isinstance(v, bool)]
    assert "oomguard.worker.signal-senders" in booleans
    for words, value in ((true, True), (false, False)):
        for word in words + [w.upper() for w in words]:
            for key in booleans:
                with dask.config.set({key: word}):
                    assert _config.get_bool(key.removeprefix("oomguard.")) is value, (key, word)
            # cgroup-limit (auto, true, false) takes them too, as the docs say.
            with dask.config.set({"oomguard.worker.cgroup-limit": word}):
                got = _config.get_choice("worker.cgroup-limit", ("auto", "true", "false"))
                assert got == str(value).lower(), word
