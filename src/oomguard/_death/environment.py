"""Where a crash lives: the values of a worker's environment a death is compared by, the
packages a crash's stack names, and which values a signature's deaths have much more often
than the cluster's workers (`suspects`). Pure: no I/O; both sides use it (the nanny names
the packages, the scheduler and the store find the suspects).

The test (docs/reading-a-report.md, "Where a crash lives"). A value (`NODE_POOL=spot`,
`kernel=6.1.0-18-amd64`) is a suspect of a signature when, among its deaths whose
environment names that label or field:

- at least `MIN_DEATHS` (3) deaths had the value, on at least `MIN_WORKERS` (2) workers
  (one worker dying again and again is that worker, which its hosts already name);
- its share of those deaths is at least `RATIO` (2) times its share of the workers; and
- chance does not explain it: if deaths fell on workers regardless of the value, each would
  have it with the probability of its share of the workers, so the count of deaths with it
  would be binomial; the chance of that many or more (one-sided) is at most `ALPHA` (0.05).

A worker is a slot: its nanny's address (its own without a nanny), which a restart keeps,
so a pool whose workers die and restart is not counted once per restart; each slot counts
with its latest environment, and with the values it died with (a dying worker the baseline
lacks, or whose environment changed since, counts as its deaths say).
The stack's packages are not tested: no worker says which packages its tasks will import.

>>> workers = {f"n{i}": {"NODE_POOL": "spot" if i < 2 else "ondemand"} for i in range(5)}
>>> deaths = [("n0", {"NODE_POOL": "spot"}), ("n1", {"NODE_POOL": "spot"})] * 2
>>> [(s.name, s.value, s.deaths, s.of_workers) for s in suspects(deaths, workers)]
[('NODE_POOL', 'spot', 4, 5)]
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .record import LIST_MAX, PACKAGES_MAX

#: The fields of an `Environment` compared as values, besides its labels (a label by one of
#: these names is refused: `oomguard.worker.labels`).
FIELDS = ("python", "dask", "distributed", "oomguard", "kernel", "image")
#: Packages an environment has already: not repeated among the stack's.
_BASE_PACKAGES = frozenset({"dask", "distributed", "oomguard"})

MIN_DEATHS = 3
MIN_WORKERS = 2
RATIO = 2.0
ALPHA = 0.05
#: Suspects kept per signature, the most significant first.
SUSPECTS_MAX = 5


def values(environment: Any) -> dict[str, str]:
    """The values a death or a worker is compared by: each field of `FIELDS` that is known,
    and each label; from an `Environment` or its plain form (a stored one), {} for
    anything else.

    >>> values({"python": "3.11.9", "kernel": "", "labels": {"NODE_POOL": "spot"}})
    {'python': '3.11.9', 'NODE_POOL': 'spot'}
    """
    if dataclasses.is_dataclass(environment):
        environment = {f: getattr(environment, f) for f in (*FIELDS, "labels")}
    if not isinstance(environment, Mapping):
        return {}
    out = {f: v for f in FIELDS if isinstance(v := environment.get(f), str) and v}
    labels = environment.get("labels")
    if isinstance(labels, Mapping):
        for name, value in labels.items():
            if isinstance(name, str) and isinstance(value, str) and name not in FIELDS:
                out[name] = value
    return out


# --------------------------------------------------------------------------- the stack

# faulthandler's frame line: `  File "/x/site-packages/pyarrow/lib.py", line 12 in read`.
_FRAME_FILE = re.compile(r'^\s+File "([^"\n]+)", line', re.MULTILINE)
# A module under an installed tree: the first name below the last site- or dist-packages.
_INSTALLED = re.compile(r".*[/\\](?:site|dist)-packages[/\\]([A-Za-z0-9_][A-Za-z0-9_.\-]*)")


def package_of(path: str) -> str | None:
    """The top-level package of an installed module's file, None for any other file (the
    standard library, the user's own code, `<dynamic-code>`).

    >>> package_of("/v/lib/python3.11/site-packages/pyarrow/parquet/core.py")
    'pyarrow'
    >>> package_of("/usr/lib/python3/dist-packages/six.py"), package_of("/usr/lib/python3.11/json/x.py")
    ('six', None)
    """
    m = _INSTALLED.match(path)
    if m is None:
        return None
    name = m.group(1).split(".", 1)[0]  # six.py, _cffi_backend.cpython-311-...so
    return name or None


def stack_paths(crash_text: Any, executing: Any) -> list[str]:
    """The files of a crash's frames, innermost first: the crashing thread's in the crash
    text ("Current thread", innermost first as faulthandler writes it), then each
    executing task's last sampled stack (innermost last there). Malformed parts skipped."""
    paths: list[str] = []
    if isinstance(crash_text, str):
        start = crash_text.find("Current thread")
        if start != -1:
            end = crash_text.find("\n\n", start)
            block = crash_text[start : end if end != -1 else len(crash_text)]
            paths += _FRAME_FILE.findall(block)
    for task in executing if isinstance(executing, list | tuple) else ():
        stack = task.get("stack") if isinstance(task, Mapping) else None
        for frame in reversed(stack if isinstance(stack, list | tuple) else ()):
            if isinstance(frame, list | tuple) and frame and isinstance(frame[0], str):
                paths.append(frame[0])
    return paths[: LIST_MAX * 8]


def stack_packages(paths: Iterable[str], version: Callable[[str], str]) -> dict[str, str]:
    """{package: version} of the packages `paths` name, in order, each once, at most
    `PACKAGES_MAX`, without dask, distributed and oomguard (the environment has them);
    `version(name)` gives "" where it is not known.

    >>> stack_packages(["/s/site-packages/pyarrow/a.py", "/s/site-packages/dask/b.py"],
    ...                lambda name: "17.0.0")
    {'pyarrow': '17.0.0'}
    """
    out: dict[str, str] = {}
    for path in paths:
        name = package_of(path)
        if name is None or name in out or name in _BASE_PACKAGES:
            continue
        out[name] = version(name)
        if len(out) == PACKAGES_MAX:
            break
    return out


# --------------------------------------------------------------------------- the suspects


@dataclass(frozen=True)
class Suspect:
    """A value a signature's deaths have much more often than the workers: `deaths` of the
    `of_deaths` deaths whose environment names `name` had it, against `workers` of the
    `of_workers` workers that name it; `p`: the chance of that many deaths or more if the
    value did not matter (see the module docstring)."""

    name: str
    value: str
    deaths: int
    of_deaths: int
    workers: int
    of_workers: int
    p: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Baseline:
    """The workers' values, indexed once by name ({name: {slot: value}} and the count of
    each value): every signature a query or an abort reads compares with the same."""

    def __init__(self, workers: Mapping[Hashable, Mapping[str, str]]) -> None:
        self.said: dict[str, dict[Hashable, str]] = {}
        for at, its in workers.items():
            for name, value in its.items():
                self.said.setdefault(name, {})[at] = value
        self.counts = {name: Counter(by_slot.values()) for name, by_slot in self.said.items()}


def suspects(
    deaths: Iterable[tuple[Hashable, Mapping[str, str]]],
    workers: Baseline | Mapping[Hashable, Mapping[str, str]],
) -> list[Suspect]:
    """The suspects of one signature: `deaths` as (slot, `values`) of each, `workers` the
    baseline ({slot: `values`}, or indexed already); at most `SUSPECTS_MAX`, the least
    likely by chance first. O(the deaths' values), past indexing the baseline.

    A worker has a value when the baseline says so or it died with it (its environment may
    have changed since, or the baseline never heard of it): a dying worker always counts."""
    # Deaths of one worker with one environment (the same values object, as the callers
    # keep one per distinct environment) are counted together.
    groups: Counter[tuple[Hashable, int]] = Counter()
    shared: dict[int, Mapping[str, str]] = {}
    for at, its in deaths:
        groups[at, id(its)] += 1
        shared[id(its)] = its
    named: Counter[str] = Counter()  # deaths whose environment names the label or field
    having: Counter[tuple[str, str]] = Counter()
    slots: dict[tuple[str, str], set] = {}  # the workers that died with a value
    naming: dict[str, set] = {}  # the workers that died with the label or field
    for (at, key), times in groups.items():
        for name, value in shared[key].items():
            named[name] += times
            having[name, value] += times
            slots.setdefault((name, value), set()).add(at)
            naming.setdefault(name, set()).add(at)
    candidates = [
        nv for nv, n in having.items() if n >= MIN_DEATHS and len(slots[nv]) >= MIN_WORKERS
    ]
    if not candidates:
        return []
    baseline = workers if isinstance(workers, Baseline) else Baseline(workers)
    out = []
    for name, value in candidates:
        k, n = having[name, value], named[name]
        by_slot = baseline.said.get(name, {})
        w = baseline.counts[name][value] if by_slot else 0
        w += sum(by_slot.get(at) != value for at in slots[name, value])
        total = len(by_slot) + sum(at not in by_slot for at in naming[name])
        share = w / total
        if k / n < RATIO * share:
            continue
        p = binomial_tail(k, n, share)
        if p <= ALPHA:
            out.append(Suspect(name, value, k, n, w, total, p))
    out.sort(key=lambda s: (s.p, -s.deaths / s.of_deaths, s.name, s.value))
    return out[:SUSPECTS_MAX]


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed in log space (n is a few hundred at most).

    >>> round(binomial_tail(4, 4, 0.4), 4), binomial_tail(0, 5, 0.1)
    (0.0256, 1.0)
    """
    if k <= 0 or p >= 1.0:
        return 1.0
    if p <= 0.0:
        return 0.0
    lp, lq, top = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    total = sum(
        math.exp(top - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq)
        for i in range(k, n + 1)
    )
    return min(total, 1.0)
