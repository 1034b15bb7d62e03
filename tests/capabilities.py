"""Capability checks for tests: skip where a machine lacks something, fail in strict mode."""

from __future__ import annotations

import os

import pytest


def strict() -> bool:
    return os.environ.get("OOMGUARD_STRICT", "") not in ("", "0")


def require(condition: object, reason: str) -> None:
    """Skip the calling test unless `condition` holds; under OOMGUARD_STRICT=1, fail instead.

    `reason` names the missing capability, e.g. "no writable memory cgroup (not root?)".
    """
    if condition:
        return
    if strict():
        pytest.fail(f"missing capability in strict mode: {reason}", pytrace=False)
    pytest.skip(reason)
