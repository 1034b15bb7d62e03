"""The name this cluster goes by in the failure history (`oomguard.scheduler.cluster-name`),
resolved once when the plugin starts: the setting, else what the deployment names the
cluster, else the scheduler's host:port. Only what the scheduler's process can see is read:
its environment and its host name, never the Kubernetes API.

What each deployment gives the scheduler (checked in their sources):
- dask-gateway sets DASK_GATEWAY_CLUSTER_NAME in the scheduler's environment (on Kubernetes
  "<namespace>.<name>", elsewhere the cluster's name).
- The Dask Kubernetes operator puts the DaskCluster's name in labels only
  (`dask.org/cluster-name`) and names the scheduler's Deployment "<name>-scheduler"; it sets
  no variable in the scheduler's container. A pod's host name is its own name,
  "<name>-scheduler-<replicaset hash>-<5 chars>" (a bare Pod "<name>-scheduler" before
  2023), so the name is read from there (docs/configuration.md shows how to pass the label
  itself through the downward API instead).
- oomguard's chart sets the setting to its `clusterName` value, by default the release name.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._config import CLUSTER_NAME_MAX
from . import _setup

if TYPE_CHECKING:
    from distributed import Scheduler

GATEWAY_ENV = "DASK_GATEWAY_CLUSTER_NAME"

# Kubernetes' random suffixes use these characters only (apimachinery's rand.SafeEncodeString).
_SAFE = "[bcdfghjklmnpqrstvwxz2456789]"
# A DNS-1123 label, as the operator requires of a DaskCluster's name.
_OPERATOR_POD = re.compile(
    rf"(?P<name>[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)-scheduler(?:-{_SAFE}{{1,10}}-{_SAFE}{{5}})?"
)


def detect(
    configured: str | None, environ: Mapping[str, str], hostname: str, port: Any
) -> tuple[str, str]:
    """(name, where it came from) for the log line; every name is `clean`.

    >>> detect(None, {"DASK_GATEWAY_CLUSTER_NAME": "dask.3f9a"}, "h", 8786)
    ('dask.3f9a', 'DASK_GATEWAY_CLUSTER_NAME')
    >>> detect(None, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "etl-scheduler-7d9c5b8f4-x2k9q", 8786)
    ('etl', 'the scheduler pod etl-scheduler-7d9c5b8f4-x2k9q (Dask Kubernetes operator)')
    >>> detect(None, {}, "node-3", 8786)
    ('node-3:8786', "the scheduler's host and port")
    """
    if configured:
        return clean(configured), "oomguard.scheduler.cluster-name"
    gateway = clean(environ.get(GATEWAY_ENV) or "")
    if gateway:
        return gateway, GATEWAY_ENV
    if environ.get("KUBERNETES_SERVICE_HOST"):  # set in every pod
        match = _OPERATOR_POD.fullmatch(hostname)
        if match:
            return (
                match["name"],
                f"the scheduler pod {hostname} (Dask Kubernetes operator)",
            )
    if isinstance(port, int) and not isinstance(port, bool):
        return clean(f"{hostname}:{port}"), "the scheduler's host and port"
    return clean(hostname) or "unnamed", "the scheduler's host"


def clean(name: str) -> str:
    """A name as events carry it: spaces at either end dropped, a character that is not
    printable as "?", at most CLUSTER_NAME_MAX characters.

    >>> clean(" etl\\n ")
    'etl'
    >>> clean("a\\tb")
    'a?b'
    """
    name = name.strip()
    if not name.isprintable():
        name = "".join(c if c.isprintable() else "?" for c in name)
    return name[:CLUSTER_NAME_MAX]


def resolve(configured: str | None, scheduler: Scheduler) -> tuple[str, str]:
    """`detect` for this process and `scheduler` (its port; none for an inproc one)."""
    try:
        port = scheduler.port
    except Exception:  # ValueError: not an IP address (inproc://)
        port = None
    return detect(configured, os.environ, _setup.own_hostname(), port)
