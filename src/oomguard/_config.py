"""oomguard's Dask config: defaults from oomguard.yaml, read and validated in one place.

Keys live under `oomguard.` in Dask's config, so `DASK_OOMGUARD__SCHEDULER__MAX_SHARD_INFRA_FAILURES=5`
works through Dask's environment handling. Every getter raises `ConfigError` naming the key.
"""

from __future__ import annotations

import os
from typing import Any

import dask.config
import yaml
from dask.utils import parse_bytes, parse_timedelta

from ._exceptions import ConfigError

_fn = os.path.join(os.path.dirname(__file__), "oomguard.yaml")
with open(_fn) as f:
    _defaults = yaml.safe_load(f)

dask.config.update_defaults(_defaults)


def get(key: str) -> Any:
    """The raw value of `oomguard.<key>`."""
    return dask.config.get(f"oomguard.{key}")


def get_choice(key: str, choices: tuple[str, ...]) -> str:
    value = get(key)
    # YAML and env vars turn "true"/"false" into booleans.
    if isinstance(value, bool):
        value = "true" if value else "false"
    value = str(value).strip().lower()
    if value not in choices:
        raise ConfigError(
            f"oomguard.{key} is {get(key)!r}; expected one of {', '.join(choices)}."
        )
    return value


def get_bool(key: str) -> bool:
    value = get(key)
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in ("1", "true", "yes", "on"):
        return True
    if str(value).strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"oomguard.{key} is {value!r}; expected true or false.")


def get_seconds(key: str) -> float:
    value = get(key)
    try:
        seconds = float(parse_timedelta(value, default="seconds"))
    except (TypeError, ValueError, KeyError) as e:
        raise ConfigError(
            f"oomguard.{key} is {value!r}; expected a duration such as '500ms' or '5s'."
        ) from e
    if seconds <= 0:
        raise ConfigError(f"oomguard.{key} is {value!r}; it must be positive.")
    return seconds


def get_bytes(key: str) -> int:
    value = get(key)
    try:
        n = int(parse_bytes(value)) if isinstance(value, str) else int(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"oomguard.{key} is {value!r}; expected a size such as '256 KiB'."
        ) from e
    if n <= 0:
        raise ConfigError(f"oomguard.{key} is {value!r}; it must be positive.")
    return n


def get_int(key: str, minimum: int = 0) -> int:
    value = get(key)
    try:
        if isinstance(value, bool):
            raise TypeError
        n = int(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"oomguard.{key} is {value!r}; expected an integer.") from e
    if n < minimum:
        raise ConfigError(f"oomguard.{key} is {value!r}; it must be at least {minimum}.")
    return n


def get_optional_path(key: str) -> str | None:
    value = get(key)
    if value in (None, "", "null", "None"):
        return None
    if not isinstance(value, str):
        raise ConfigError(f"oomguard.{key} is {value!r}; expected a path or null.")
    return os.path.expanduser(value)


def get_optional_str(key: str) -> str | None:
    value = get(key)
    if value in (None, "", "null", "None"):
        return None
    if not isinstance(value, str):
        raise ConfigError(f"oomguard.{key} is {value!r}; expected a string or null.")
    return value


def scheduler_keys() -> frozenset[str]:
    """Every key under oomguard.scheduler, dotted below it ("kubernetes.enabled")."""

    def walk(d: dict, prefix: str):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from walk(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"

    return frozenset(walk(_defaults["oomguard"]["scheduler"], ""))
