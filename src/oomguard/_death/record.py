"""One worker death, declared once (pure: no Dask, no I/O).

A `Death` is built by the worker's nanny (`build`) from what it read after the worker
process ended, travels to the scheduler as its wire form (`wire`, whose schema is derived
from the declarations here: each field's type, and the caps in its metadata), is decided
there (its `tasks` get their `Role`, and it gets its `id` and signature) and is stored. The
scheduler builds the deaths no report described (a worker lost with its nanny, an unasked
clean exit) with the same record.

Field metadata (`spec`): ``cap`` (longest str, most items of a tuple or keys of a mapping),
``min`` (smallest int), ``items`` (the cap of each str in a tuple, or of each value of a
mapping of str), ``keys`` (the cap of each key of a mapping of str), ``choices`` (the values
a str or int may take), ``safe`` (a str made one printable line on arrival,
`_safe_text.safe_name`, as every key and value of a mapping of str is), ``optional`` (absent
from reports of older nannies: read as the default) and ``wire=False`` (decided by the
scheduler, never sent by a nanny).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .._causes import Cause, Confidence, Killer, Known
from .._display import clock, shorten

IDENT_MAX = 256
KEY_MAX = 1024
FILENAME_MAX = 1024
FUNCTION_MAX = 256
SIGNAL_MAX = 32
PATH_MAX = 1024
NOTE_MAX = 512
LIST_MAX = 64
SUMMARY_MAX = 512
EVIDENCE_KEY_MAX = 128
EVIDENCE_STR_MAX = 1024
EVIDENCE_MAX = 96  # keys; 64 before issue 26 added the killer's facts
REPORT_MAX = 256 * 1024  # bytes of a whole report, encoded (`wire.MAX_REPORT_BYTES`)


def spec(
    *,
    cap: int | None = None,
    min: int | None = None,
    items: int | None = None,
    keys: int | None = None,
    choices: frozenset | None = None,
    safe: bool = False,
    optional: bool = False,
    wire: bool = True,
) -> dict[str, Any]:
    """A field's wire rules (see the module docstring)."""
    return {
        "cap": cap,
        "min": min,
        "items": items,
        "keys": keys,
        "choices": choices,
        "safe": safe,
        "optional": optional,
        "wire": wire,
    }


#: One frame of a sampled stack, innermost last: (filename, lineno, function).
Frame = tuple[str, int | None, str]
FRAME_CAPS = (FILENAME_MAX, None, FUNCTION_MAX)


class Role(StrEnum):
    """What a task had to do with a death, as the scheduler decided it."""

    CULPRIT = "culprit"  # the death is its: alone there, its thread crashed, or it grew most
    SUSPECT = "suspect"  # executing at a death that names no single task
    DISPLACED = "displaced"  # executing beside the culprit: its work was lost, no blame
    QUEUED = "queued"  # sent to the worker, not started: moved without a count


#: The roles that carry the death's signature and count as the shard's own failure.
BLAMED = frozenset({Role.CULPRIT, Role.SUSPECT})


@dataclass(frozen=True)
class Task:
    """A task of the dead worker: one it was executing (its flight record, with the last
    sampled stack) or, once decided, one Dask had only queued there. `role` and
    `pipeline` are the scheduler's."""

    key: str = field(default="", metadata=spec(cap=KEY_MAX))  # str(key)
    prefix: str = field(default="", metadata=spec(cap=IDENT_MAX))
    start: float = 0.0  # when it started executing; 0.0 for a queued one
    thread: int = field(default=0, metadata=spec(min=0))  # its executor thread's ident
    stack: tuple[Frame, ...] | None = field(default=None, metadata=spec(cap=LIST_MAX))
    stack_time: float | None = None  # when that stack was sampled
    # Its estimated share of the worker's RSS growth since it started (`_host.growth`).
    grew: int | None = field(default=None, metadata=spec(min=0, optional=True))
    # A native crash's dump named this task's thread (`threads`).
    crashed: bool | None = field(default=None, metadata=spec(optional=True))
    role: Role | None = field(default=None, metadata=spec(wire=False))
    pipeline: str = field(default="", metadata=spec(wire=False))


@dataclass(frozen=True)
class Crash:
    """The worker's faulthandler crash file: the fatal signal it names, and its text (cut
    to fit the report, keeping the header and the crashing thread)."""

    signal: str | None = field(default=None, metadata=spec(cap=SIGNAL_MAX))
    text: str = field(default="", metadata=spec(cap=REPORT_MAX))


@dataclass(frozen=True)
class MemoryCounters:
    """One reading of a memory cgroup's OOM counters and sizes (bytes).

    `failcnt` is v1 `memory.failcnt` (times usage hit the limit) and, on v2, the `max` line
    of `memory.events` (times usage was about to exceed `memory.max`): the nearest v2 count.
    `oom` and `oom_group_kill` exist only on v2 (v1 `under_oom` is a state, not a count).

    >>> MemoryCounters(1, "/g", 0, None, None, 0, 10, None, 5, ()).to_dict()["usage"]
    5
    """

    version: int | None
    path: str | None = field(metadata=spec(cap=PATH_MAX))
    oom_kill: int | None = field(metadata=spec(min=0))
    oom: int | None = field(metadata=spec(min=0))
    oom_group_kill: int | None = field(metadata=spec(min=0))
    failcnt: int | None = field(metadata=spec(min=0))
    peak: int | None = field(metadata=spec(min=0))
    limit: int | None = field(metadata=spec(min=0))
    usage: int | None = field(metadata=spec(min=0))
    missing: tuple[str, ...] = field(default=(), metadata=spec(cap=LIST_MAX, items=NOTE_MAX))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["missing"] = list(self.missing)
        return d


@dataclass(frozen=True)
class Cgroup:
    """The worker's memory cgroup and its counters at the worker's start and after its
    death."""

    version: int = field(metadata=spec(choices=frozenset({1, 2})))
    path: str = field(metadata=spec(cap=PATH_MAX))
    before: MemoryCounters | None = None
    after: MemoryCounters | None = None


@dataclass(frozen=True)
class HostMemory:
    """The host's memory after the death (/proc/meminfo), bytes."""

    total: int | None = field(default=None, metadata=spec(min=0))
    available: int | None = field(default=None, metadata=spec(min=0))


KILLERS = frozenset(k.value for k in Killer)
KNOWN = frozenset(k.value for k in Known)
CONFIDENCES = frozenset(c.value for c in Confidence)


@dataclass(frozen=True)
class Attribution:
    """Who ended the worker: `name` (a `Killer`), `how` that is known (a `Known`), its
    `confidence`, one `summary` sentence, and `memory`: whether the kill counts as a memory
    kill of this worker for blame. `facts`, the evidence it rests on, travel in the death's
    evidence, not here."""

    name: str = field(metadata=spec(choices=KILLERS))
    how: str = field(metadata=spec(choices=KNOWN))
    confidence: str = field(metadata=spec(choices=CONFIDENCES))
    summary: str = field(metadata=spec(cap=SUMMARY_MAX))
    facts: Mapping[str, Any] = field(default_factory=dict, metadata=spec(wire=False))
    memory: bool = False


#: An environment's caps: a version or a kernel release, a container image, the labels
#: (`oomguard.worker.labels`: names and values) and the packages a crash's stack names.
ENV_VALUE_MAX = 128
IMAGE_MAX = 256
LABELS_MAX = 16
LABEL_NAME_MAX = 64
PACKAGES_MAX = 8


@dataclass(frozen=True)
class Environment:
    """What a worker ran on and with, read once per worker start (`_host.environment`):
    the versions of Python, dask, distributed and oomguard, the kernel release, the
    container image where the worker's environment names one, and its `labels`: the values
    of the environment variables `oomguard.worker.labels` names ({"NODE_POOL": "spot"}). A
    death's also has `packages`: the versions of the packages its crash's stack names
    (`_death.environment.stack_packages`). Every text is one printable line, capped.

    >>> Environment(python="3.11.9", labels={"NODE_POOL": "spot"}).labels["NODE_POOL"]
    'spot'
    """

    python: str = field(default="", metadata=spec(cap=ENV_VALUE_MAX, safe=True))
    dask: str = field(default="", metadata=spec(cap=ENV_VALUE_MAX, safe=True))
    distributed: str = field(default="", metadata=spec(cap=ENV_VALUE_MAX, safe=True))
    oomguard: str = field(default="", metadata=spec(cap=ENV_VALUE_MAX, safe=True))
    kernel: str = field(default="", metadata=spec(cap=ENV_VALUE_MAX, safe=True))
    image: str = field(default="", metadata=spec(cap=IMAGE_MAX, safe=True))
    labels: Mapping[str, str] = field(
        default_factory=dict,
        metadata=spec(cap=LABELS_MAX, keys=LABEL_NAME_MAX, items=ENV_VALUE_MAX),
    )
    packages: Mapping[str, str] = field(
        default_factory=dict,
        metadata=spec(cap=PACKAGES_MAX, keys=LABEL_NAME_MAX, items=ENV_VALUE_MAX),
    )


SCHEMA_VERSION = 1
#: The causes a nanny reports: `worker_lost` is the scheduler's (no report came).
REPORT_CAUSES = frozenset(c.value for c in Cause if c not in (Cause.WORKER_LOST,))


@dataclass(frozen=True)
class Death:
    """One worker death. The fields up to `truncated`, and `environment`, are what the
    worker's nanny saw and sent (schema 1); the rest is the scheduler's decision (for a
    death no report described, `environment` too: what its worker said at its start).

    >>> d = Death(worker="tcp://10.0.0.5:40001", cause="oom_kill", time=1.0,
    ...           tasks=(Task("('load', 7)", "load"),))
    >>> d.tasks[0].key, d.tasks[0].role is None
    ("('load', 7)", True)
    """

    schema: int = field(default=SCHEMA_VERSION, metadata=spec(choices=frozenset({1})))
    worker: str = field(default="", metadata=spec(cap=IDENT_MAX))  # the worker's address
    nanny: str = field(default="", metadata=spec(cap=IDENT_MAX))  # its nanny's address
    name: str = field(default="", metadata=spec(cap=IDENT_MAX))  # the worker's name
    host: str = field(default="", metadata=spec(cap=IDENT_MAX))
    pid: int | None = field(default=None, metadata=spec(min=1))
    exitcode: int | None = None  # exit status; -N: signal N
    cause: str = field(default=Cause.EXIT.value, metadata=spec(choices=REPORT_CAUSES))
    time: float = 0.0  # when the nanny saw the death, seconds since the epoch
    started: float | None = None  # when the worker process started
    memory_limit: int | None = field(default=None, metadata=spec(min=0))
    # On the wire "executing": the tasks its flight record names; decided, every task the
    # death touched, each with its role.
    tasks: tuple[Task, ...] = field(default=(), metadata=spec(cap=LIST_MAX))
    crash: Crash | None = None
    evidence: Mapping[str, Any] = field(
        default_factory=dict, metadata=spec(cap=EVIDENCE_MAX, items=EVIDENCE_STR_MAX)
    )
    cgroup: Cgroup | None = None
    rss_sampled: int | None = field(default=None, metadata=spec(min=0))
    rss_time: float | None = None
    host_memory: HostMemory | None = None
    killer: Attribution | None = field(default=None, metadata=spec(optional=True))
    missing: tuple[str, ...] = field(default=(), metadata=spec(cap=LIST_MAX, items=NOTE_MAX))
    truncated: tuple[str, ...] = field(default=(), metadata=spec(cap=LIST_MAX, items=NOTE_MAX))
    # --- decided by the scheduler
    id: str = field(default="", metadata=spec(wire=False))  # `death_id`, unique per death
    cluster: str = field(default="", metadata=spec(wire=False))
    signature_id: str = field(default="", metadata=spec(wire=False))
    signature_title: str = field(default="", metadata=spec(wire=False))
    #: Tasks the death touched past the `LIST_MAX` kept in `tasks`, by role.
    more: Mapping[str, int] = field(default_factory=dict, metadata=spec(wire=False))
    # The worker's environment (issue 40): sent by the nanny.
    environment: Environment | None = field(default=None, metadata=spec(optional=True))
    #: The incident it is part of: the id of that incident's first death (its own id when
    #: it is alone; `oomguard._decide.incidents`). An amend keeps it.
    incident: str = field(default="", metadata=spec(wire=False))
    #: Its signature's crash sites (`oomguard._signature.crash_sites`): what relates its
    #: signature to others that crashed in the same place.
    sites: tuple[str, ...] = field(default=(), metadata=spec(wire=False))

    def role_of(self, key: str) -> Role | None:
        return next((t.role for t in self.tasks if t.key == key), None)

    def with_role(self, role: Role) -> tuple[Task, ...]:
        return tuple(t for t in self.tasks if t.role is role)

    def __repr__(self) -> str:
        """<Death 2026-05-01 14:03:07 oom_kill killer=kernel worker=tcp://10.0.3.11:40211
        culprit=('load', 17) tasks=3>, one line: the culprit, or how many suspects."""
        killer = f" killer={shorten(self.killer.name, 16)}" if self.killer else ""
        culprits = self.with_role(Role.CULPRIT)
        suspects = self.with_role(Role.SUSPECT)
        if len(culprits) == 1:
            blamed = f" culprit={shorten(culprits[0].key, 48) or repr('')}"
        else:
            blamed = f" suspects={len(culprits) + len(suspects)}" if culprits or suspects else ""
        tasks = len(self.tasks) + sum(self.more.values())
        return (
            f"<Death {clock(self.time)} {shorten(self.cause, 20)}{killer} "
            f"worker={shorten(self.worker, 32) or repr('')}{blamed} tasks={tasks}>"
        )

    def to_dict(self, *, compact: bool = False) -> dict[str, Any]:
        """Plain data (JSON and msgpack): every field, records as dicts, tuples as lists;
        `compact`: fields at their default left out (as a store keeps it), which
        `from_dict` reads back as they were."""
        return _plain(self, compact)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Death:
        """The death `to_dict` wrote, read leniently, as a history may hold one written by an
        older or newer oomguard: unknown keys are ignored, a missing or malformed value is
        the field's default (a record that cannot be read, None).

        >>> Death.from_dict({"cause": "oom_kill", "tasks": [{"key": "x", "role": "culprit",
        ...                  "future": 1}], "killer": {"name": "kernel"}}).tasks[0].role
        <Role.CULPRIT: 'culprit'>
        """
        return _lenient(cls, d)


_ATOMS = frozenset({str, int, float, bool, type(None)})


def _plain(value: Any, compact: bool = False) -> Any:
    if type(value) in _ATOMS:
        return value
    if dataclasses.is_dataclass(value):
        out = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if not (compact and _is_default(f, v)):
                out[f.name] = _plain(v, compact)
        return out
    if isinstance(value, tuple | list):
        return [_plain(v, compact) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v, compact) for k, v in value.items()}
    if isinstance(value, str) and type(value) is not str:
        return str.__str__(value)  # an enum's value
    return value


def _is_default(f: dataclasses.Field, v: Any) -> bool:
    if f.default is not dataclasses.MISSING:
        return type(v) is type(f.default) and v == f.default
    if f.default_factory is not dataclasses.MISSING:
        return v == f.default_factory()
    return False


_BAD = object()  # a value that does not fit its field: the field keeps its default


def _lenient(cls: type, d: Any) -> Any:
    if not isinstance(d, Mapping):
        raise TypeError(f"a {cls.__name__} is a mapping, not {type(d).__name__}")
    fields, out = _fields(cls), {}
    for name, value in d.items():
        field = fields.get(name)
        if field is None:
            continue  # a newer oomguard's
        plain, read = field
        if type(value) is plain:  # the usual case, read as it is
            out[name] = value
        elif (v := read(value)) is not _BAD:
            out[name] = v
    return cls(**out)  # TypeError when a field without a default is missing


@functools.cache
def _fields(cls: type) -> dict[str, tuple[type | None, Any]]:
    """{name: (the plain type its value has as it is, or None; its reader)} of a record
    type's fields, made once."""
    hints = typing.get_type_hints(cls, globals())  # its module, whatever __module__ says
    out = {}
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        plain = [a for a in (*typing.get_args(tp), tp) if a in (str, int, float, bool)]
        out[f.name] = (plain[0] if plain else None, _reader(tp))
    return out


@functools.cache
def _reader(tp: Any) -> Any:
    """A function that reads a value as type `tp`, or returns _BAD."""
    args = typing.get_args(tp)
    if type(None) in args:
        inner = _reader(next(a for a in args if a is not type(None)))
        return lambda v: None if v is None else inner(v)
    if dataclasses.is_dataclass(tp):

        def record(v: Any) -> Any:
            try:
                return _lenient(tp, v)
            except (TypeError, ValueError):
                return _BAD

        return record
    origin = typing.get_origin(tp)
    if origin is tuple and args[-1] is not Ellipsis:  # a Frame: (filename, lineno, function)
        return lambda v: tuple(v) if isinstance(v, list | tuple) and len(v) == len(args) else _BAD
    if origin is tuple:
        item = _reader(args[0])

        def items(v: Any) -> Any:
            if not isinstance(v, list | tuple):
                return _BAD
            return tuple(x for x in map(item, v) if x is not _BAD)

        return items
    if origin is Mapping:
        return lambda v: dict(v) if isinstance(v, Mapping) else _BAD
    if isinstance(tp, type) and issubclass(tp, StrEnum):
        known = tp._value2member_map_
        return lambda v: known.get(v, _BAD) if isinstance(v, str) else _BAD
    if tp is float:
        return lambda v: float(v) if type(v) in (int, float) and math.isfinite(v) else _BAD
    if tp in (str, int, bool):
        return lambda v: v if type(v) is tp else _BAD
    return lambda v: v if not isinstance(v, Mapping | list) else _BAD  # pragma: no cover


#: The wire name of a field that the record calls otherwise (schema 1 kept its names).
WIRE_NAMES = {"tasks": "executing"}


@dataclass(frozen=True)
class Seen:
    """What a nanny read after its worker process ended: everything one `Death` is built
    from (`build.build`), and what the cause and killer rules decide on. Values read from
    /proc, /sys and files stay as their readers return them (mappings, lists), and any of
    them may be missing or malformed: the rules read them defensively."""

    # The process and its exit
    worker: str = ""  # its address (the nanny's latest knowledge of it)
    nanny: str = ""
    name: str = ""
    host: str = ""
    pid: int | None = None
    exitcode: int | None = None
    time: float = 0.0  # when the nanny saw the exit
    started: float | None = None
    memory_limit: int | None = None
    requested: bool = False  # the nanny or the user asked for the close
    nanny_pid: int | None = None
    # The worker's own records: its flight record (executing tasks joined with the last
    # sample's stacks; whether it was read at all; the senders of signals it received),
    # its crash file, its last sampled RSS
    executing: tuple[Mapping[str, Any], ...] = ()
    flight_read: bool | None = None
    signals: tuple[Mapping[str, Any], ...] | None = None
    crash_text: str | None = None
    rss_sampled: int | None = None
    rss_time: float | None = None
    # Its memory cgroup: counters at its start and after its death, how it was placed
    # there, and the nanny's last reading of it while it ran
    cgroup_path: str | None = None
    cgroup_version: int | None = None
    cgroup_before: MemoryCounters | None = None
    cgroup_after: MemoryCounters | None = None
    cgroup_placement: Mapping[str, Any] | None = None
    cgroup_reading: Mapping[str, Any] | None = None
    # The host: memory after the death and at the last reading while it ran, the nanny's
    # own memory kill of it, the kernel log's OOM victim, the userspace killers running
    # there, systemd-oomd's counters, the SLURM job its environment names
    host_memory: Mapping[str, Any] | None = None
    host_reading: Mapping[str, Any] | None = None
    nanny_memory_kill: Mapping[str, Any] | None = None
    kernel_log_victim: Mapping[str, Any] | None = None
    killers: tuple[Mapping[str, Any], ...] | None = None
    oomd: Mapping[str, Any] | None = None
    slurm_job: Mapping[str, Any] | None = None
    missing: tuple[str, ...] = ()  # what could not be read
    # The worker's environment at its start, with the packages its crash's stack names
    environment: Environment | None = None
