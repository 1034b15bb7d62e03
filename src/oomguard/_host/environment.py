"""What a worker runs on and with (`read`), once per worker start: by its nanny, for the
worker's death reports, and by its worker plugin, for the scheduler's count of the
cluster's workers; and the versions of the packages a crash's stack names
(`PackageVersions`), looked up by the nanny once each.

What is read, and nothing else (docs/security.md, "What an environment reveals"):
- the versions of Python, dask, distributed and oomguard installed (`importlib.metadata`,
  so a worker restarted after an upgrade in place says the new ones), and the kernel's
  release (`os.uname`);
- the container image, from the first of `IMAGE_VARIABLES` the worker's environment sets:
  no container runtime tells a process its image (Kubernetes' downward API has no field
  for it, and /proc/self/cgroup names a container id, not an image), so a deployment says
  it, as JupyterHub's KubeSpawner does for its pods;
- the values of the environment variables `oomguard.worker.labels` names, and of no other.

Every text is made one printable line and capped (`_safe_text.safe_name`): the door of
what a worker's environment variables say.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import threading
from collections.abc import Mapping, Sequence

from .. import _config
from .._death.environment import FIELDS
from .._death.record import ENV_VALUE_MAX, IMAGE_MAX, LABELS_MAX, Environment
from .._safe_text import safe_name

#: Where a worker's environment names its container image, first set first: oomguard's own
#: (set it in the pod spec to the image, as the chart's values say), then the variables
#: KubeSpawner sets in the pods it starts.
IMAGE_VARIABLES = ("OOMGUARD_IMAGE", "JUPYTER_IMAGE_SPEC", "JUPYTER_IMAGE")
_DISTRIBUTIONS = (("dask", "dask"), ("distributed", "distributed"), ("oomguard", "dask-oomguard"))


def configured_labels() -> tuple[str, ...]:
    """`oomguard.worker.labels`, checked (ConfigError naming it): the nanny's and the
    worker's, which start with the same config."""
    return _config.get_labels("worker.labels", FIELDS, LABELS_MAX)


def read(environ: Mapping[str, str], labels: Sequence[str]) -> Environment:
    """The environment of a worker whose environment variables are `environ`, labelled by
    the variables `labels` names (those it does not set are left out).

    >>> read({"NODE_POOL": "spot", "SECRET": "x"}, ["NODE_POOL", "ZONE"]).labels
    {'NODE_POOL': 'spot'}
    """
    versions = {field: _version(dist) for field, dist in _DISTRIBUTIONS}
    image = next((environ[v] for v in IMAGE_VARIABLES if environ.get(v)), "")
    return Environment(
        python=platform.python_version(),
        kernel=safe_name(os.uname().release, ENV_VALUE_MAX),
        image=safe_name(image, IMAGE_MAX),
        labels={
            name: safe_name(environ[name], ENV_VALUE_MAX)
            for name in labels[:LABELS_MAX]
            if name in environ
        },
        **versions,
    )


def _version(distribution: str) -> str:
    try:
        return safe_name(importlib.metadata.version(distribution), ENV_VALUE_MAX)
    except Exception:  # not installed as a distribution (a source tree on sys.path)
        return ""


class PackageVersions:
    """The installed version of a top-level package, by its import name, each looked up
    once (a few hundred microseconds each); "" where none is known. An import name that no
    distribution is called (`sklearn`, `yaml`) is looked up in the map of every installed
    distribution's top-level names, built once, at the first such name (about 0.1 s on
    a large environment)."""

    def __init__(self) -> None:
        self._known: dict[str, str] = {}
        self._tops: Mapping[str, list[str]] | None = None
        self._lock = threading.Lock()  # deaths are built on threads

    def __call__(self, name: str) -> str:
        with self._lock:
            if name not in self._known:
                self._known[name] = self._look_up(name)
            return self._known[name]

    def _look_up(self, name: str) -> str:
        try:
            return safe_name(importlib.metadata.version(name), ENV_VALUE_MAX)
        except Exception:
            pass
        if self._tops is None:
            try:
                self._tops = importlib.metadata.packages_distributions()
            except Exception:
                self._tops = {}
        for distribution in self._tops.get(name, ())[:1]:
            return _version(distribution)
        return ""
