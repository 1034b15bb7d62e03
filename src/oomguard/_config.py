"""oomguard's Dask config: defaults from oomguard.yaml, read and validated in one place.

Keys live under `oomguard.` in Dask's config, so `DASK_OOMGUARD__SCHEDULER__MAX_SHARD_INFRA_FAILURES=5`
works through Dask's environment handling. Every getter raises `ConfigError` naming the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import re
import threading
from typing import Any

import dask.config
import yaml
from dask.utils import parse_bytes, parse_timedelta

from ._exceptions import ConfigError

_fn = os.path.join(os.path.dirname(__file__), "oomguard.yaml")
with open(_fn) as f:
    _defaults = yaml.safe_load(f)

dask.config.update_defaults(_defaults)


_MISSING = object()


def get(key: str) -> Any:
    """The raw value of `oomguard.<key>`; the packaged default where Dask's config lost it
    (`distributed.utils_test` and others reset `dask.config.config` to a copy taken before
    oomguard was imported)."""
    value = dask.config.get(f"oomguard.{key}", default=_MISSING)
    if value is _MISSING:
        value = _defaults
        for part in f"oomguard.{key}".split("."):
            if not isinstance(value, dict) or part not in value:
                raise ConfigError(f"oomguard.{key} is not an oomguard setting.")
            value = value[part]
    return value


#: The words a boolean setting takes (any case), and a choice among "true" and "false" too
#: (`worker.cgroup-limit`): docs/configuration.md lists exactly these.
TRUE_WORDS = ("true", "yes", "on", "1")
FALSE_WORDS = ("false", "no", "off", "0")


def _bool_word(value: Any) -> str | None:
    """ "true" or "false" for a boolean or one of its words, else None."""
    if isinstance(value, bool):  # YAML and env vars turn true/yes/on into booleans
        return "true" if value else "false"
    word = str(value).strip().lower()
    return "true" if word in TRUE_WORDS else "false" if word in FALSE_WORDS else None


def get_choice(key: str, choices: tuple[str, ...]) -> str:
    value = get(key)
    word = str(value).strip().lower()
    if "true" in choices and "false" in choices:
        word = _bool_word(value) or word
    if word not in choices:
        close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(
            f"oomguard.{key} is {value!r}; expected one of {', '.join(choices)}{hint}."
        )
    return word


def get_bool(key: str) -> bool:
    value = get(key)
    word = _bool_word(value)
    if word is None:
        raise ConfigError(
            f"oomguard.{key} is {value!r}; expected true or false "
            f"({'/'.join(TRUE_WORDS[1:])} or {'/'.join(FALSE_WORDS[1:])} too)."
        )
    return word == "true"


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


def get_store(key: str) -> str | None:
    """A path (expanded) or a postgresql:// URL; a URL of another scheme is refused."""
    from ._urls import check, scheme

    value = get_optional_path(key) if scheme(str(get(key) or "")) is None else get(key)
    if value is None or scheme(value) is None:
        return value
    try:
        return check(value, f"oomguard.{key}")
    except ValueError as e:
        raise ConfigError(str(e)) from None


def get_optional_seconds(key: str) -> float | None:
    if get(key) in (None, "", "null", "None"):
        return None
    return get_seconds(key)


def get_optional_str(key: str) -> str | None:
    value = get(key)
    if value in (None, "", "null", "None"):
        return None
    if not isinstance(value, str):
        raise ConfigError(f"oomguard.{key} is {value!r}; expected a string or null.")
    return value


#: A label's name: an environment variable's (`oomguard.worker.labels`).
_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def get_labels(key: str, reserved: tuple[str, ...] = (), most: int = 16) -> tuple[str, ...]:
    """Names of environment variables whose values label a worker: a list, or one string
    of names separated by commas or spaces (as an environment variable gives it), each
    once, at most `most`, none of `reserved`.

    >>> with dask.config.set({"oomguard.worker.labels": "NODE_POOL, INSTANCE_TYPE"}):
    ...     get_labels("worker.labels")
    ('NODE_POOL', 'INSTANCE_TYPE')
    """
    value = get(key)
    if value in (None, "", "null", "None"):
        return ()
    names = value.replace(",", " ").split() if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise ConfigError(
            f"oomguard.{key} is {value!r}; expected a list of environment variable names."
        )
    names = tuple(dict.fromkeys(n.strip() for n in names))
    for name in names:
        if not _LABEL_NAME.fullmatch(name) or name in reserved:
            raise ConfigError(
                f"oomguard.{key} names {name!r}; expected the name of an environment "
                "variable (letters, digits and _, at most 64, not starting with a digit)"
                + (f", none of {', '.join(reserved)}." if reserved else ".")
            )
    if len(names) > most:
        raise ConfigError(f"oomguard.{key} names {len(names)} variables; at most {most}.")
    return names


#: The longest cluster name (oomguard.scheduler.cluster-name): a label, not a document.
CLUSTER_NAME_MAX = 200


def get_cluster_name(key: str) -> str | None:
    """A cluster's name: printable text of 1 to CLUSTER_NAME_MAX characters, spaces at
    either end dropped; None when unset (null or empty)."""
    value = get(key)
    if value in (None, "", "null", "None"):
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)  # Dask reads DASK_..._CLUSTER_NAME=2026 as a number
    if not isinstance(value, str):
        raise ConfigError(f"oomguard.{key} is {value!r}; expected a name (text) or null.")
    name = value.strip()
    if not name:
        raise ConfigError(f"oomguard.{key} is {value!r}; expected a name, not only spaces.")
    if len(name) > CLUSTER_NAME_MAX:
        raise ConfigError(
            f"oomguard.{key} is {len(name)} characters long ({name[:40]!r}...); "
            f"a cluster name has at most {CLUSTER_NAME_MAX}."
        )
    if not name.isprintable():
        raise ConfigError(
            f"oomguard.{key} is {value!r}; a cluster name holds printable characters only "
            "(no control characters or line breaks)."
        )
    return name


def scheduler_keys() -> frozenset[str]:
    """Every key under oomguard.scheduler, dotted below it ("kubernetes.enabled")."""

    def walk(d: dict, prefix: str):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from walk(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"

    return frozenset(walk(_defaults["oomguard"]["scheduler"], ""))


#: oomguard.scheduler.* keys a running plugin can take from `install(client, **settings)`;
#: the others (the store, the pod lookup) are fixed once it runs.
LIVE_SCHEDULER_KEYS = frozenset(
    {
        "report-grace-timeout",
        "max-shard-infra-failures",
        "abort-on-repeat-signature",
        "memory-retry-larger-only",
        "run-alone-timeout",
        "max-events",
        "max-signatures",
    }
)

_SCHEDULER_GETTERS: dict[str, tuple[Any, tuple]] = {
    "report-grace-timeout": (get_seconds, ()),
    "max-shard-infra-failures": (get_int, (1,)),
    "abort-on-repeat-signature": (get_bool, ()),
    "memory-retry-larger-only": (get_bool, ()),
    "run-alone-timeout": (get_seconds, ()),
    "store": (get_store, ()),
    "spool": (get_optional_path, ()),
    "max-age": (get_optional_seconds, ()),
    "cluster-name": (get_cluster_name, ()),
    "max-events": (get_int, (1,)),
    "store-errors": (get_choice, (("recover", "fail"),)),
    "max-signatures": (get_int, (1,)),
    "store-queue-limit": (get_bytes, ()),
    "kubernetes.enabled": (get_bool, ()),
    "kubernetes.namespace": (get_optional_str, ()),
    "kubernetes.label-selector": (get_optional_str, ()),
    "kubernetes.container": (get_optional_str, ()),
}


def scheduler_settings(
    overrides: dict[str, Any] | None = None, only: frozenset[str] | None = None
) -> dict[str, Any]:
    """Every oomguard.scheduler.* setting, validated once: `overrides` (keys with dashes)
    over Dask's config. `only`: validate just these keys. Raises ConfigError naming the key,
    the value and what is expected.

    >>> scheduler_settings({"max-shard-infra-failures": "2"})["max-shard-infra-failures"]
    2
    >>> scheduler_settings({"max-shard-infra-failures": "abc"})
    Traceback (most recent call last):
    oomguard.ConfigError: oomguard.scheduler.max-shard-infra-failures is 'abc'; expected an integer.
    """
    overrides = overrides or {}
    unknown = sorted(set(overrides) - set(_SCHEDULER_GETTERS))
    if unknown:
        close = difflib.get_close_matches(unknown[0], _SCHEDULER_GETTERS, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"unknown oomguard scheduler setting {unknown[0]!r}{hint}; expected one of "
            f"{', '.join(sorted(_SCHEDULER_GETTERS))}."
        )
    out = {}
    with dask.config.set({f"oomguard.scheduler.{k}": v for k, v in overrides.items()}):
        for key, (getter, args) in _SCHEDULER_GETTERS.items():
            if only is None or key in only:
                out[key] = getter(f"scheduler.{key}", *args)
    return out


# --------------------------------------------------------------------------- unknown keys


def _leaves(tree: Any, prefix: str) -> list[str]:
    if not isinstance(tree, dict) or not tree:
        return [prefix]
    return [leaf for k, v in tree.items() for leaf in _leaves(v, f"{prefix}.{k}")]


#: Every key oomguard reads, dotted from the top: "oomguard.scheduler.store".
KNOWN_KEYS: tuple[str, ...] = tuple(_leaves(_defaults["oomguard"], "oomguard"))


@dataclasses.dataclass(frozen=True)
class UnknownKey:
    """A key under `oomguard.` that no setting has: a typo, or a setting of another
    version. `closest` is the known key it most resembles ("" when none is close); `env`
    the environment variable that set it, where one did."""

    key: str
    closest: str
    env: str

    def message(self, strict: bool = False) -> str:
        where = f" (set by {self.env})" if self.env else ""
        hint = f"; did you mean {self.closest}?" if self.closest else ""
        if strict:
            hint = f"; did you mean {self.closest}?" if self.closest else "."
            return f"{self.key}{where} is not an oomguard setting (strict-config){hint}"
        return (
            f"{self.key}{where} is not an oomguard setting and is ignored{hint} "
            "(oomguard.strict-config: true makes this an error)"
        )


def _walk(tree: Any, known: Any, prefix: str) -> list[str]:
    """Keys of `tree` (Dask's config, spelt with dashes or underscores) not in `known`."""
    if not isinstance(tree, dict) or not isinstance(known, dict):
        return []
    out = []
    for k, v in tree.items():
        name = str(k).replace("_", "-")
        if name in known:
            out += _walk(v, known[name], f"{prefix}.{name}")
        else:
            out += _leaves(v, f"{prefix}.{name}")
    return out


def _env_var(key: str) -> str:
    """The variable Dask maps onto `key`, where one is set (Dask lower-cases names)."""
    want = key.lower().replace("-", "_").split(".")
    for name in os.environ:
        if name.startswith("DASK_") and name[5:].lower().split("__") == want:
            return name
    return ""


def unknown_keys() -> list[UnknownKey]:
    """The keys under `oomguard.` in Dask's config that oomguard does not know, and those
    under a top-level key that looks like a misspelt `oomguard` (`oomgaurd:`, `oom-guard:`),
    which Dask keeps and nobody reads.

    >>> with dask.config.set({"oomguard.worker.sample-intervl": "1s"}):
    ...     [u.closest for u in unknown_keys()]
    ['oomguard.worker.sample-interval']
    >>> with dask.config.set({"oomgaurd.worker.sample-interval": "1s"}):
    ...     [(u.key, u.closest) for u in unknown_keys()]
    [('oomgaurd.worker.sample-interval', 'oomguard.worker.sample-interval')]
    """
    given = dask.config.get("oomguard", default={})
    out = []
    for key in _walk(given, _defaults["oomguard"], "oomguard"):
        close = difflib.get_close_matches(key, KNOWN_KEYS, n=1, cutoff=0.6)
        out.append(UnknownKey(key, close[0] if close else "", _env_var(key)))
    for section in misspelt_sections():
        for leaf in _leaves(dask.config.config[section], section):
            key = leaf.replace("_", "-")  # as Dask spells a key either way
            meant = "oomguard" + key[len(section) :]
            close = difflib.get_close_matches(meant, KNOWN_KEYS, n=1, cutoff=0.6)
            out.append(UnknownKey(key, close[0] if close else "oomguard", _env_var(key)))
    return out


def misspelt_sections() -> list[str]:
    """Top-level keys of Dask's config that are not `oomguard` but close to it: a typo in a
    config file (`oomgaurd:`) or a variable (DASK_OOMGAURD__...). Close: a similarity of at
    least 0.8 ("oomgard" 0.93, "oomgaurd" 0.88; Dask's own keys at most 0.31, "guard" 0.77)."""
    return [
        key
        for key in dask.config.config
        if isinstance(key, str)
        and key != "oomguard"
        and difflib.SequenceMatcher(None, key.lower().replace("_", "-"), "oomguard").ratio() >= 0.8
    ]


_warned: set[str] = set()  # keys this process already warned about
_warned_lock = threading.Lock()


def check_keys(logger: logging.Logger) -> None:
    """Warn once per process (on `logger`) about each unknown key under `oomguard.`;
    with `oomguard.strict-config: true`, raise ConfigError naming the first instead."""
    unknown = unknown_keys()
    if not unknown:
        return
    if get_bool("strict-config"):
        raise ConfigError(unknown[0].message(strict=True))
    for u in unknown:
        with _warned_lock:
            if u.key in _warned:
                continue
            _warned.add(u.key)
        logger.warning("oomguard: %s", u.message())
