"""Host-wide memory admission's settings: ``oomguard.worker.admission.*``, read once."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .. import _config
from .host import CgroupAvailable
from .ledger import HostLedger


@dataclass(frozen=True)
class AdmissionConfig:
    enabled: bool
    floor: int
    max_wait: float
    ledger: str
    poll: float
    min_estimate: int
    cgroup: str | None  # a memory cgroup the workers share; None: the host's MemAvailable
    startup: bool = False  # nannies take a start-up lease before starting a worker
    startup_initial: int = 0  # that lease before any start-up peak is known on the host
    startup_max_wait: float = 0.0  # then the worker starts anyway

    @classmethod
    def from_dask(cls, crash_dir: str) -> AdmissionConfig:
        """Read ``oomguard.worker.admission.*`` (ConfigError names a bad key)."""
        p = "worker.admission."
        return cls(
            enabled=_config.get_bool(p + "enabled"),
            floor=_floor(),
            max_wait=_config.get_seconds(p + "max-wait"),
            ledger=_config.get_optional_path(p + "ledger")
            or os.path.join(crash_dir, "memory-ledger.json"),
            poll=_config.get_seconds(p + "poll-interval"),
            min_estimate=_config.get_bytes(p + "min-estimate"),
            cgroup=_config.get_optional_path(p + "cgroup"),
            startup=_config.get_bool(p + "startup.enabled"),
            startup_initial=_config.get_bytes(p + "startup.initial"),
            startup_max_wait=_config.get_seconds(p + "startup.max-wait"),
        )

    def open_ledger(self) -> HostLedger:
        """The host ledger these settings describe (one per process that uses it)."""
        available = CgroupAvailable(self.cgroup) if self.cgroup else None
        return HostLedger(self.ledger, floor=self.floor, available=available)


def _floor() -> int:
    # 0 is a valid floor; get_bytes insists on positive sizes.
    raw = _config.get("worker.admission.floor")
    if raw in (0, "0"):
        return 0
    return _config.get_bytes("worker.admission.floor")
