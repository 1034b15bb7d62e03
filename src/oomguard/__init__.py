"""oomguard: why your Dask workers died, and no more burning a cluster on a doomed shard.

The public surface; everything else is private (`oomguard._*`).
"""

from . import _config  # noqa: F401  (registers oomguard's Dask config defaults)
from ._admission.needs import memory
from ._causes import Cause, Confidence, Killer, Kind, Known
from ._client.api import Failures
from ._client.install import install, uninstall
from ._death.record import Death, Role, Task
from ._exceptions import (
    AdmissionTimeout,
    CgroupError,
    ConfigError,
    OomguardError,
    PipelineAborted,
    ReportError,
    ReportFailed,
    StoreError,
    TraceParseError,
)
from ._models import FailureEvent, Incident, PipelineStatus, SignatureRow

__version__ = "0.1.0.dev0"

__all__ = [
    "AdmissionTimeout",
    "Cause",
    "CgroupError",
    "Confidence",
    "ConfigError",
    "Death",
    "FailureEvent",
    "Failures",
    "Incident",
    "Killer",
    "Kind",
    "Known",
    "OomguardError",
    "PipelineAborted",
    "PipelineStatus",
    "ReportError",
    "ReportFailed",
    "Role",
    "SignatureRow",
    "StoreError",
    "Task",
    "TraceParseError",
    "__version__",
    "install",
    "memory",
    "uninstall",
]

# Tracebacks and reprs say `oomguard.PipelineAborted`, not the private module it lives in
# (as httpx does); pickles name the same importable path.
for _name in __all__:
    if not _name.startswith("__"):
        globals()[_name].__module__ = "oomguard"
del _name
