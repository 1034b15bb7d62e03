"""The signature record and how its id and title are made from normalised frames."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

# Bump when a rule changes what is hashed: it is hashed too, so old and new ids never collide
# and history can tell "same crash, new rules" from "new crash".
# 2: transport decorations are stripped before parsing; what cannot be parsed (or has no
#    frame) is told apart by its own normalised text instead of sharing one id per reason.
GROUPING_VERSION: int = 2

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
    #: The ids older grouping versions still computed give this input, newest first, as
    #: (id, version): where an upgrade moved it (`_versions.py`).
    previous_ids: tuple[tuple[str, int], ...] = ()
    # The innermost frame of the stack, in-app or not (never hashed): for a native crash,
    # the Python function that called into native code, its crash site (`crash_sites`).
    top: Frame | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (frames as a list of dicts)."""
        d = dataclasses.asdict(self)
        d["frames"] = [dataclasses.asdict(f) for f in self.frames]
        d["previous_ids"] = [list(p) for p in self.previous_ids]
        return d


@lru_cache(maxsize=8192)  # a title is made for every trace; the same files recur
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


def frames_material(frames: tuple[Frame, ...]) -> str:
    """What of `frames` is hashed: each one's module path and function."""
    return "\x1e".join([f"{f.filename}\x1f{f.function}" for f in frames])


def signature_id(
    error: str, frames: tuple[Frame, ...], extra: str = "", material: str | None = None
) -> str:
    """`extra` is hashed only when given: what tells apart crashes that have no frame.
    `material` is `frames_material(frames)` when the caller has it already."""
    if material is None:
        material = frames_material(frames)
    text = f"{GROUPING_VERSION}\x1e{error_key(error)}"
    if frames:
        text += "\x1e" + material
    if extra:
        text += "\x1d" + extra
    return _digest(text)


def _digest(material: str) -> str:
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
    kind: str,
    error: str,
    message: str,
    frames: tuple[Frame, ...],
    reason: str = "",
    extra: str = "",
    material: str | None = None,
    top: Frame | None = None,
) -> Signature:
    return Signature(
        id=signature_id(error, frames, extra, material),
        title=make_title(error, frames, kind),
        input_kind=kind,
        error=error,
        message=message,
        frames=frames,
        grouping_version=GROUPING_VERSION,
        reason=reason,
        top=top,
    )


def unparsed(reason: str, text: str | None = None) -> Signature:
    """The signature of input that is not a trace. Its id is made of `text`, the input's own
    normalised text, so two different inputs never share it; of the reason alone only when
    there is no text (input that is not text at all).
    """
    own = f"reason\x1e{reason}" if text is None else f"text\x1e{text}"
    return Signature(
        id=_digest(f"{GROUPING_VERSION}\x1e{UNPARSED}\x1e{own}"),
        title=f"unparsed input ({reason})",
        input_kind=UNPARSED,
        error="",
        message="",
        frames=(),
        grouping_version=GROUPING_VERSION,
        reason=reason,
    )
