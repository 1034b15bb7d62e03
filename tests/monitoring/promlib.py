"""The chart's monitoring as Prometheus sees it: the rendered PrometheusRule as a plain rules
file, the Grafana dashboard's queries, what a PromQL query names, promtool, and a real
Prometheus server (Debian's package, 2.42) on a loopback port it chose itself, stopped after.

Shared by the tests in this folder; the chart is rendered by the real Helm engine
(`chartlib`).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from capabilities import require
from chartlib import manifests, render
from labs import listening_ports, stop_process

#: The rules and the dashboard with every other monitoring value at its default.
MONITORING_ON: dict[str, Any] = {
    "metrics": {"prometheusRule": {"enabled": True}},
    "grafana": {"dashboard": {"enabled": True}},
}
#: Labels that come from the scrape (Kubernetes' service discovery), not from the scheduler.
TARGET_LABELS = frozenset({"namespace", "pod", "job", "instance"})


def merged(over: dict[str, Any] | None) -> dict[str, Any]:
    """MONITORING_ON with `over` merged into it, key by key."""

    def merge(a: dict, b: dict) -> dict:
        out = dict(a)
        for k, v in b.items():
            out[k] = (
                merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
            )
        return out

    return merge(MONITORING_ON, over or {})


def rule_groups(values: dict[str, Any] | None = None) -> dict[str, Any]:
    """The chart's PrometheusRule as a Prometheus rules file: `{"groups": [...]}`."""
    (rule,) = [o for o in manifests(render(merged(values))) if o["kind"] == "PrometheusRule"]
    return {"groups": rule["spec"]["groups"]}


def write_rules(path: Path, values: dict[str, Any] | None = None) -> Path:
    path.write_text(yaml.safe_dump(rule_groups(values), sort_keys=False))
    return path


def alerts_of(groups: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in groups["groups"] for r in g["rules"] if "alert" in r}


def dashboard(values: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Grafana dashboard JSON as the chart ships it (its ConfigMap)."""
    (cm,) = [
        o
        for o in manifests(render(merged(values)))
        if o["kind"] == "ConfigMap" and "oomguard.json" in o.get("data", {})
    ]
    return json.loads(cm["data"]["oomguard.json"])


def panel_queries(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and every templating query."""
    out = [
        (f"panel {p['id']} {p['title']!r}", t["expr"])
        for p in dash["panels"]
        for t in p.get("targets", [])
    ]
    for var in dash.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", var["query"])
            assert m, f"templating query {var['query']!r} is not label_values(SELECTOR, LABEL)"
            out.append((f"variable ${var['name']}", m.group(1)))
    return out


_SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?")
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
#: PromQL words that look like metric names in the selector pattern above.
_PROMQL_WORDS = frozenset(
    "sum max min avg count rate increase irate delta by without histogram_quantile "
    "le label_values and or unless on ignoring group_left group_right offset bool".split()
)


def selectors(expr: str) -> list[tuple[str, dict[str, tuple[str, str]]]]:
    """(metric name, {label: (operator, value)}) of every series selector in `expr`.

    >>> selectors('sum(rate(a_total{x="1", y=~"b|c"}[5m])) by (x)')
    [('a_total', {'x': ('=', '1'), 'y': ('=~', 'b|c')})]
    """
    out = []
    text = re.sub(r"\[[^\]]*\]", "", expr)  # ranges: [5m], [$__range]
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", text)
    for m in _SELECTOR.finditer(text):
        name, braces = m.group(1), m.group(2)
        rest = text[m.end(1) :].lstrip()
        if name in _PROMQL_WORDS or (rest.startswith("(") and not braces):
            continue  # a function call or a keyword
        if text[: m.start(1)].count('"') % 2:
            continue  # inside a string
        out.append((name, dict((k, (op, v)) for k, op, v in _MATCHER.findall(braces or ""))))
    return out


def grouping_labels(expr: str) -> set[str]:
    """Labels named in `by (...)` / `without (...)` clauses."""
    return {
        label.strip()
        for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
        for label in group.split(",")
        if label.strip()
    }


# -- promtool and prometheus ---------------------------------------------------------------


def binary(name: str) -> str:
    """The path of Debian's `prometheus` or `promtool`, or skip (fail in strict mode)."""
    path = shutil.which(name)
    require(path, f"no {name} (Debian's prometheus package: apt-get install prometheus)")
    return path


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [binary("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def epoch(rfc3339: str) -> float:
    """Unix time of Prometheus's RFC 3339 time with nanoseconds, in any zone.

    >>> epoch("1970-01-01T01:00:01.5+01:00")
    1.5
    """
    m = re.fullmatch(r"([^.Z+]+?)(\.\d+)?(Z|[+-]\d\d:\d\d)", rfc3339)
    assert m, rfc3339
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    return datetime.fromisoformat(m.group(1) + zone).timestamp() + float(m.group(2) or 0)


class Prometheus:
    """A real Prometheus on 127.0.0.1 (port 0: the port it got is read back from the kernel
    once it runs, so no other process can have taken it; its storage in `directory`), scraping
    `targets` ((host:port, labels)) every second and evaluating `rules` every second.

        with Prometheus(tmp_path, rules, [("127.0.0.1:8787", {"namespace": "data"})]) as prom:
            prom.alerts()
    """

    def __init__(self, directory: Path, rules: Path, targets: list[tuple[str, dict]]) -> None:
        self.directory = directory
        self.port = 0
        self.url = ""
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {
                    "job_name": "oomguard",
                    "metrics_path": "/metrics",
                    "static_configs": [
                        {"targets": [t], "labels": labels} for t, labels in targets
                    ],
                }
            ],
        }
        self.config = directory / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))
        self.log = directory / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Prometheus:
        self.proc = subprocess.Popen(
            [
                binary("prometheus"),
                f"--config.file={self.config}",
                f"--storage.tsdb.path={self.directory / 'data'}",
                "--web.listen-address=127.0.0.1:0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(self.log, "w"),
            cwd=self.directory,
        )
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, f"prometheus exited: {self.text()}"
            if not self.port:  # the port it got, once it listens
                ports = listening_ports(self.proc.pid)
                assert len(ports) <= 1, f"prometheus listens on {ports}"
                if ports:
                    self.port = ports.pop()
                    self.url = f"http://127.0.0.1:{self.port}"
            if self.url:
                try:
                    with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                        if r.status == 200:
                            return self
                except OSError:
                    pass
            assert time.monotonic() < deadline, f"prometheus not ready in 60 s: {self.text()}"
            time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        stop_process(self.proc, timeout=20)

    def text(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def api(self, path: str, **params: str) -> Any:
        """`data` of a /api/v1 answer; fails with Prometheus's own error text."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            body = json.load(e)
        assert body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        return self.api("query", query=promql)["result"]

    def evaluated_since(self, t: float) -> bool:
        """Whether every rule is healthy and was evaluated after the Unix time `t`."""
        rules = [r for g in self.api("rules")["groups"] for r in g["rules"]]
        return bool(rules) and all(
            r["health"] == "ok" and epoch(r["lastEvaluation"]) > t for r in rules
        )

    def alerts(self) -> dict[str, dict[str, Any]]:
        """Alert name -> the alert (state "pending" or "firing") as /api/v1/alerts has it."""
        return {a["labels"]["alertname"]: a for a in self.api("alerts")["alerts"]}
