"""The signature record and how its id and title are made from normalised frames."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

# Bump when a rule changes what is hashed: it is hashed too, so old and new ids never collide
# and history can tell "same crash, new rules" from "new crash".
GROUPING_VERSION: int = 1

# Input kinds, as stored in `Signature.input_kind`.
PYTHON = "python_traceback"
FAULTHANDLER = "faulthandler"
DASK = "dask_traceback"
STACK = "stack_sample"
UNPARSED = "unparsed"


@dataclass(frozen=True)
class Frame:
    """One normalised stack frame.

    >>> Frame("shardapp/core.py", "parse_record", 15, True).dotted
    'shardapp.core.parse_record'
    """

    filename: str  # normalised, see `normalise_path`
    function: str
    lineno: int | None  # for display only; never hashed
    in_app: bool

    @property
    def module(self) -> str:
        """The dotted module of `filename` ("" for pseudo-files such as `<dynamic-code>`)."""
        return _dotted_module(self.filename)

    @property
    def dotted(self) -> str:
        module = self.module
        if module and self.function:
            return f"{module}.{self.function}"
        return module or self.function


@dataclass(frozen=True)
class Signature:
    """A crash signature: a stable id, a title for people, and what was hashed.

    >>> from oomguard._signature import fingerprint
    >>> sig = fingerprint('Traceback (most recent call last):\\n'
    ...                   '  File "/srv/app/shardapp/core.py", line 3, in lookup\\n'
    ...                   'KeyError: 17\\n')
    >>> sig.title, sig.message, len(sig.id)
    ('KeyError in shardapp.core.lookup', '<n>', 16)
    """

    id: str
    title: str
    input_kind: str
    error: str
    message: str
    frames: tuple[Frame, ...]
    grouping_version: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (frames as a list of dicts)."""
        d = dataclasses.asdict(self)
        d["frames"] = [dataclasses.asdict(f) for f in self.frames]
        return d


def _dotted_module(filename: str) -> str:
    if not filename or filename.startswith("<"):
        return ""
    stem = filename.rsplit(".", 1)[0] if filename.rsplit("/", 1)[-1].count(".") else filename
    parts = [p for p in stem.split("/") if p]
    if len(parts) > 1 and parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def error_key(error: str) -> str:
    # A traceback prints `pkg.mod.Error`, Dask's repr only `Error`: hash the class name alone.
    return error.rsplit(".", 1)[-1]


def signature_id(error: str, frames: tuple[Frame, ...]) -> str:
    head = [str(GROUPING_VERSION), error_key(error)]
    material = "\x1e".join(head + [f"{f.filename}\x1f{f.function}" for f in frames])
    return hashlib.blake2b(material.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def make_title(error: str, frames: tuple[Frame, ...], kind: str) -> str:
    head = error or "crash"
    if not frames:
        return f"{head} (no Python frame)" if kind == FAULTHANDLER else head
    title = f"{head} in {frames[-1].dotted}"
    if len(frames) > 1:
        title += f" \u2190 {frames[-2].function}"
    return title


def make_signature(
    kind: str, error: str, message: str, frames: tuple[Frame, ...], reason: str = ""
) -> Signature:
    return Signature(
        id=signature_id(error, frames),
        title=make_title(error, frames, kind),
        input_kind=kind,
        error=error,
        message=message,
        frames=frames,
        grouping_version=GROUPING_VERSION,
        reason=reason,
    )


def unparsed(reason: str) -> Signature:
    """The signature of input that is not a trace: its id depends on the reason alone."""
    material = f"{GROUPING_VERSION}\x1e{UNPARSED}\x1e{reason}"
    return Signature(
        id=hashlib.blake2b(material.encode(), digest_size=8).hexdigest(),
        title=f"unparsed input ({reason})",
        input_kind=UNPARSED,
        error="",
        message="",
        frames=(),
        grouping_version=GROUPING_VERSION,
        reason=reason,
    )
