"""Rendering charts/oomguard with the real Helm engine (helm-python-sdk embeds Helm's Go SDK).

Shared by test_chart.py and test_chart_smoke.py; no cluster and no network are used.
"""

from __future__ import annotations

import pathlib
from typing import Any

import yaml

from capabilities import require

CHART = pathlib.Path(__file__).resolve().parents[1] / "charts" / "oomguard"
RELEASE, NAMESPACE = "etl", "data"

#: Every optional part switched on.
ALL_ON: dict[str, Any] = {
    "oomguard": {
        "scheduler": {
            "maxShardInfraFailures": 5,
            "reportGraceTimeout": "10s",
            "maxEvents": 1000000,
        },
        "worker": {"cgroupLimit": "auto", "sampleInterval": "250ms", "maxReportSize": "128 KiB"},
    },
    "worker": {
        "replicas": 3,
        "nworkers": 2,
        "nthreads": 2,
        "memoryLimit": "8Gi",
        "extraArgs": ["--lifetime", "2h"],
        "env": [{"name": "TZ", "value": "UTC"}],
    },
    "scheduler": {
        "extraArgs": ["--idle-timeout", "1h"],
        "resources": {"limits": {"memory": "2Gi"}},
    },
    "store": {"persistence": {"enabled": True, "storageClassName": "standard", "size": "5Gi"}},
    "kubernetesLookup": {"enabled": True},
    "rbac": {"create": True, "serviceAccountAnnotations": {"iam.example.com/role": "oomguard"}},
    "metrics": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "podMonitor": {"enabled": True},
        "prometheusRule": {
            "enabled": True,
            "oomKillsPerHour": 20,
            "signatureHosts": 4,
            "oomKillCauses": ["oom_kill", "memory_terminate"],
            "userspaceOomKillsPerHour": 2,
            "kubeletKillsPerHour": 1,
        },
    },
    "grafana": {"dashboard": {"enabled": True}},
}


def helm():
    """The helm_python module, or skip (fail in strict mode) where it cannot load."""
    try:
        import helm_python
    except (ImportError, OSError) as e:  # OSError: the embedded libhelm_c.so did not load
        require(False, f"no Helm engine: helm-python-sdk does not load ({e})")
    return helm_python


def render(values: dict[str, Any] | None = None) -> dict[str, str]:
    """Template path -> rendered text, as `helm template` would produce it."""
    h = helm()
    with h.Chart.load(CHART) as chart:
        return chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)


def manifests(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Every Kubernetes object rendered (NOTES.txt and empty documents left out)."""
    out = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        out.extend(d for d in yaml.safe_load_all(text) if d)
    return out


def by_kind(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    """name -> value (or the valueFrom mapping)."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}
