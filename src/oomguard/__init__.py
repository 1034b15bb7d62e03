"""oomguard: why your Dask workers died, and no more burning a cluster on a doomed shard.

The public surface; everything else is private (`oomguard._*`).
"""

from . import _config  # noqa: F401  (registers oomguard's Dask config defaults)
from ._client.api import Failures, install, uninstall
from ._causes import Cause, Kind
from ._exceptions import (
    CgroupError,
    ConfigError,
    OomguardError,
    PipelineAborted,
    ReportError,
    TraceParseError,
)
from ._admission.needs import memory
from ._models import FailureEvent, PipelineStatus, SignatureRow

__version__ = "0.1.0.dev0"

__all__ = [
    "Cause",
    "CgroupError",
    "ConfigError",
    "FailureEvent",
    "Failures",
    "Kind",
    "OomguardError",
    "PipelineAborted",
    "PipelineStatus",
    "ReportError",
    "SignatureRow",
    "TraceParseError",
    "__version__",
    "install",
    "memory",
    "uninstall",
]
