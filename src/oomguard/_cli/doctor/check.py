"""One fact `oomguard doctor` states about the host (`Check`), and the word for how the
workers' memory is grouped there (`layout_label`): what every check module returns.

>>> Check("kernel-log", "ok", "/dev/kmsg is readable").to_dict()["fix"]
''
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    """One fact about the host: `status` is "ok", "warn" or "no"; `fix` is "" when ok."""

    name: str
    status: str
    detail: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def layout_label(version: int | None, usable: bool, per_worker: bool) -> str:
    """One word for how workers' memory is grouped (`_doctor_text.LAYOUTS`: what each means).

    >>> layout_label(1, usable=True, per_worker=True), layout_label(2, False, False)
    ('v1', 'none')
    """
    if version is None or not usable:
        return "none"
    if version == 1:
        return "v1" if per_worker else "v1-shared"
    return "v2-delegated" if per_worker else "v2-shared"
