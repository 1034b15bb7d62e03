"""The `oomguard` command: `demo`, `report`, `fingerprint`, `doctor` (`python -m oomguard._cli`)."""

from .main import main

__all__ = ["main"]
