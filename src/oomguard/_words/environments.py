"""Where a crash lives, in words: a worker's environment on one line, and the values a
signature's deaths have much more often than the workers (its suspects,
`oomguard._death.environment`), each given as plain data (a stored environment, a suspect's
dict)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# `_death.environment.FIELDS`, in the order a line says them (words sit below _death).
_FIELDS = ("python", "dask", "distributed", "oomguard", "kernel", "image")


def suspect_phrase(s: Mapping[str, Any]) -> str:
    """One suspect: its value and the counts behind it.

    >>> suspect_phrase({"name": "NODE_POOL", "value": "spot", "deaths": 4, "of_deaths": 4,
    ...                 "workers": 2, "of_workers": 5, "p": 0.0256})
    'NODE_POOL=spot (4 of 4 deaths, 2 of 5 workers)'
    """
    return (
        f"{s.get('name')}={s.get('value')} ({s.get('deaths')} of {s.get('of_deaths')} deaths, "
        f"{s.get('workers')} of {s.get('of_workers')} workers)"
    )


def suspects_phrase(suspects: Sequence[Mapping[str, Any]]) -> str:
    """Every suspect, the most telling first, "; " between them ("" for none)."""
    return "; ".join(suspect_phrase(s) for s in suspects)


def suspects_sentence(suspects: Sequence[Mapping[str, Any]]) -> str:
    """The sentence an abort message gives the suspects of its signature ("" for none).

    >>> suspects_sentence([{"name": "NODE_POOL", "value": "spot", "deaths": 4,
    ...                     "of_deaths": 4, "workers": 2, "of_workers": 5}])
    "Where it lives: this signature's deaths had NODE_POOL=spot far more often than the \
cluster's workers do (4 of 4 deaths, 2 of 5 workers). "
    """
    if not suspects:
        return ""
    return (
        "Where it lives: this signature's deaths had "
        + "; ".join(
            f"{s.get('name')}={s.get('value')}"
            + (" far more often than the cluster's workers do" if i == 0 else "")
            + f" ({s.get('deaths')} of {s.get('of_deaths')} deaths, {s.get('workers')} of "
            f"{s.get('of_workers')} workers)"
            for i, s in enumerate(suspects)
        )
        + ". "
    )


def environment_line(env: Any) -> str:
    """A stored environment on one line: its versions, kernel, image, labels, and the
    packages its crash's stack named ("" for none).

    >>> environment_line({"python": "3.11.9", "dask": "2026.8.0", "kernel": "6.1.0",
    ...                   "labels": {"NODE_POOL": "spot"}, "packages": {"pyarrow": "17.0.0"}})
    'python 3.11.9, dask 2026.8.0, kernel 6.1.0; NODE_POOL=spot; packages pyarrow 17.0.0'
    """
    if not isinstance(env, Mapping):
        return ""
    known = [f for f in _FIELDS if isinstance(env.get(f), str) and env[f]]
    parts = [", ".join(f"{f} {env[f]}" for f in known)]
    labels = env.get("labels")
    if isinstance(labels, Mapping) and labels:
        parts.append(", ".join(f"{k}={v}" for k, v in labels.items()))
    packages = env.get("packages")
    if isinstance(packages, Mapping) and packages:
        parts.append("packages " + ", ".join(f"{k} {v}".rstrip() for k, v in packages.items()))
    return "; ".join(p for p in parts if p)
