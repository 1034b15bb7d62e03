"""charts/oomguard rendered and linted by the real Helm engine, checked against Kubernetes' schemas.

Built-in kinds are validated (strict: unknown fields fail) by kubernetes-validate against the
Kubernetes 1.28 and 1.37 OpenAPI schemas. The prometheus-operator CRDs (ServiceMonitor,
PodMonitor, PrometheusRule) are unknown to it, so they are checked structurally here.
"""

from __future__ import annotations

import copy
import json
import re

import dask.config
import kubernetes_validate
import pytest
import yaml
from dask.utils import parse_bytes

import oomguard._config  # noqa: F401  (oomguard's Dask config defaults)
from chartlib import (
    ALL_ON,
    CHART,
    NAMESPACE,
    RELEASE,
    by_kind,
    container,
    env_of,
    helm,
    manifests,
    render,
)

SCHED, WORKER = f"{RELEASE}-oomguard-scheduler", f"{RELEASE}-oomguard-worker"
CRDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
#: The metrics the rules and the dashboard use (tests/monitoring checks each against the
#: /metrics of a live scheduler).
METRICS = {
    "oomguard_failures_total",
    "oomguard_worker_deaths_total",
    "oomguard_pipeline_aborts_total",
    "oomguard_signatures",
    "oomguard_signature_max_hosts",
    "oomguard_signature_regressions_total",
    "oomguard_reports_rejected_total",
    "oomguard_report_latency_seconds_bucket",
    "oomguard_cgroup_workers",
}


@pytest.fixture(scope="module")
def default():
    return render()


@pytest.fixture(scope="module")
def all_on():
    return render(ALL_ON)


def errors(report: dict) -> list[str]:
    return [m["error"] for m in report["messages"] if m["severity"] >= 3] + report["errors"]


# -- Helm itself ------------------------------------------------------------------------


@pytest.mark.parametrize("values", [None, ALL_ON], ids=["default", "all-on"])
def test_helm_lint_has_no_errors(values):
    report = helm().lint(CHART, values, strict=False, namespace=NAMESPACE)
    assert report["total_charts_linted"] == 1
    assert errors(report) == []
    # Nothing above "info" either (the missing icon is Helm's only remark).
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_default_render_kinds(default):
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in manifests(default))
    assert kinds == sorted(
        [
            ("Deployment", SCHED),
            ("Deployment", WORKER),
            ("Service", SCHED),
            ("ServiceAccount", SCHED),
            ("Role", SCHED),
            ("RoleBinding", SCHED),
            ("Pod", f"{RELEASE}-oomguard-test"),
        ]
    )


def test_all_on_render_kinds(all_on):
    kinds = {o["kind"] for o in manifests(all_on)}
    assert (
        kinds
        == {
            "Deployment",
            "Service",
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "Pod",
            "PersistentVolumeClaim",
            "ConfigMap",
        }
        | CRDS
    )


# -- Kubernetes schemas -------------------------------------------------------------------


@pytest.mark.parametrize("kube", ["1.28.0", "1.37.0"])
@pytest.mark.parametrize("values", [None, ALL_ON], ids=["default", "all-on"])
def test_manifests_valid_against_kubernetes_schemas(values, kube):
    checked = 0
    for obj in manifests(render(values)):
        if obj["kind"] in CRDS:
            continue
        try:
            kubernetes_validate.validate(obj, kube, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = "/".join(str(p) for p in e.absolute_path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} at {where}: {e.message}")
        checked += 1
    assert checked >= 7


def test_servicemonitor_and_podmonitor_structure(all_on):
    objs = by_kind(manifests(all_on))
    service = objs[("Service", SCHED)]
    pod_labels = objs[("Deployment", SCHED)]["spec"]["template"]["metadata"]["labels"]
    port_names = {p["name"] for p in service["spec"]["ports"]}
    sm, pm = objs[("ServiceMonitor", SCHED)], objs[("PodMonitor", SCHED)]
    for mon, endpoints, target in (
        (sm, "endpoints", service["metadata"]["labels"]),
        (pm, "podMetricsEndpoints", pod_labels),
    ):
        assert mon["apiVersion"] == "monitoring.coreos.com/v1"
        assert set(mon["spec"]) == {"selector", "namespaceSelector", endpoints}
        assert mon["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
        # The selector picks the scheduler (and only it: the component label is in it).
        sel = mon["spec"]["selector"]["matchLabels"]
        assert sel.items() <= target.items() and sel["app.kubernetes.io/component"] == "scheduler"
        (ep,) = mon["spec"][endpoints]
        assert ep == {"port": "http-dashboard", "path": "/metrics", "interval": "30s"}
        assert ep["port"] in port_names
    assert sm["metadata"]["labels"]["release"] == "prometheus"


def test_prometheus_rule_structure(all_on):
    rule = by_kind(manifests(all_on))[("PrometheusRule", f"{RELEASE}-oomguard")]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    (group,) = rule["spec"]["groups"]
    alerts = {r["alert"]: r for r in group["rules"]}
    assert set(alerts) == {
        "OomguardPipelineAborted",
        "OomguardOomKillsHigh",
        "OomguardSignatureSpread",
        "OomguardSignatureRegressed",
        "OomguardUserspaceOomKills",
        "OomguardKubeletKills",
    }
    sel = f'namespace="{NAMESPACE}", pod=~"{SCHED}-.*"'
    assert alerts["OomguardPipelineAborted"]["expr"] == (
        f"sum(increase(oomguard_pipeline_aborts_total{{{sel}}}[15m])) > 0"
    )
    assert alerts["OomguardOomKillsHigh"]["expr"] == (
        f'sum(increase(oomguard_failures_total{{{sel}, cause=~"oom_kill|memory_terminate"}}[1h])) > 20'
    )
    assert alerts["OomguardSignatureSpread"]["expr"] == (
        f"max(oomguard_signature_max_hosts{{{sel}}}) > 4"
    )
    assert alerts["OomguardSignatureRegressed"]["expr"] == (
        f"sum(increase(oomguard_signature_regressions_total{{{sel}}}[1h])) > 0"
    )
    assert alerts["OomguardUserspaceOomKills"]["expr"] == (
        f'sum(increase(oomguard_worker_deaths_total{{{sel}, killer=~"earlyoom|systemd-oomd"}}[1h])) > 2'
    )
    assert alerts["OomguardKubeletKills"]["expr"] == (
        f'sum(increase(oomguard_worker_deaths_total{{{sel}, killer="kubelet"}}[1h])) > 1'
    )
    for r in group["rules"]:
        assert set(r) == {"alert", "expr", "labels", "annotations"}
        assert r["labels"] == {"severity": "warning"}
        assert r["annotations"]["summary"] and r["annotations"]["description"]
        assert set(re.findall(r"oomguard_\w+", r["expr"])) <= METRICS
    assert alerts["OomguardKubeletKills"]["annotations"]["summary"] == (
        f"the kubelet killed more than 1 workers in the last hour in {NAMESPACE}/{RELEASE}"
    )


def test_grafana_dashboard(all_on):
    cm = by_kind(manifests(all_on))[("ConfigMap", f"{RELEASE}-oomguard-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = json.loads(cm["data"]["oomguard.json"])
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"oomguard_\w+", e)}
    assert used == METRICS - {
        "oomguard_worker_deaths_total",
        "oomguard_signature_regressions_total",
    }
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])


# -- What the manifests say ---------------------------------------------------------------


def test_scheduler_and_worker_load_oomguard(default):
    objs = by_kind(manifests(default))
    s, w = container(objs[("Deployment", SCHED)]), container(objs[("Deployment", WORKER)])
    assert s["args"][:2] == ["dask", "scheduler"]
    assert s["args"][s["args"].index("--preload") + 1] == "oomguard.scheduler_plugin"
    assert {p["containerPort"] for p in s["ports"]} == {8786, 8787}
    assert w["args"][:3] == ["dask", "worker", f"tcp://{SCHED}:8786"]
    assert w["args"][w["args"].index("--preload-nanny") + 1] == "oomguard.worker_plugin"
    assert env_of(w)["EXTRA_PIP_PACKAGES"] == "dask-oomguard"
    assert env_of(s)["EXTRA_PIP_PACKAGES"] == "dask-oomguard[kubernetes]"
    assert s["image"] == w["image"] == "ghcr.io/dask/dask:2026.8.0"


@pytest.mark.parametrize("limit,nworkers", [("4Gi", 1), ("8Gi", 2), ("3000M", 3)])
def test_memory_limit_is_the_container_limit_split_per_worker(limit, nworkers):
    w = container(
        by_kind(manifests(render({"worker": {"memoryLimit": limit, "nworkers": nworkers}})))[
            ("Deployment", WORKER)
        ]
    )
    args = w["args"]
    assert w["resources"]["limits"]["memory"] == limit
    assert (
        int(args[args.index("--memory-limit") + 1])
        == parse_bytes(limit.replace("M", "MB") if limit.endswith("M") else limit) // nworkers
    )
    assert args[args.index("--nworkers") + 1] == str(nworkers)
    assert env_of(w)["OOMGUARD_CONTAINER_MEMORY_LIMIT"] == {
        "resourceFieldRef": {"containerName": "worker", "resource": "limits.memory"}
    }


def test_user_resources_keep_their_keys_but_not_memory_limit():
    values = {
        "worker": {"memoryLimit": "2Gi", "resources": {"limits": {"cpu": "2", "memory": "64Gi"}}}
    }
    w = container(by_kind(manifests(render(values)))[("Deployment", WORKER)])
    assert w["resources"]["limits"] == {"cpu": "2", "memory": "2Gi"}


def test_oomguard_values_become_env_vars_dask_reads(all_on):
    objs = by_kind(manifests(all_on))
    for deployment in (SCHED, WORKER):
        env = env_of(container(objs[("Deployment", deployment)]))
        generated = {
            k: v
            for k, v in env.items()
            if k.startswith("DASK_OOMGUARD__")
            and "__KUBERNETES__" not in k
            and not k.endswith("__STORE")
            and not k.endswith("__CLUSTER_NAME")
        }
        assert generated == {
            "DASK_OOMGUARD__SCHEDULER__MAX_SHARD_INFRA_FAILURES": "5",
            "DASK_OOMGUARD__SCHEDULER__REPORT_GRACE_TIMEOUT": "10s",
            "DASK_OOMGUARD__SCHEDULER__MAX_EVENTS": "1000000",
            "DASK_OOMGUARD__WORKER__CGROUP_LIMIT": "auto",
            "DASK_OOMGUARD__WORKER__SAMPLE_INTERVAL": "250ms",
            "DASK_OOMGUARD__WORKER__MAX_REPORT_SIZE": "128 KiB",
        }
    # And Dask maps them onto oomguard's kebab-case keys.
    with dask.config.set(dask.config.collect_env(generated)):
        assert oomguard._config.get_int("scheduler.max-shard-infra-failures") == 5
        assert oomguard._config.get_seconds("scheduler.report-grace-timeout") == 10
        assert oomguard._config.get_bytes("worker.max-report-size") == 128 * 1024


def test_every_oomguard_config_key_is_in_values_and_schema():
    """A key added to oomguard.yaml must be settable through the chart (and nothing else)."""
    defaults = yaml.safe_load((CHART.parents[1] / "src/oomguard/oomguard.yaml").read_text())[
        "oomguard"
    ]
    values = yaml.safe_load((CHART / "values.yaml").read_text())["oomguard"]
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["oomguard"]

    def camel(k):
        first, *rest = k.split("-")
        return first + "".join(p.title() for p in rest)

    assert {camel(k) for k in defaults} == set(values) == set(schema["properties"])
    for side, keys in defaults.items():
        if not isinstance(keys, dict):  # a general key (strict-config)
            continue
        # The pod lookup's keys (scheduler.kubernetes.*) are set by the chart from
        # kubernetesLookup and the release, not through the oomguard map.
        expected = {camel(k) for k in keys if k != "kubernetes"}
        assert set(values[side]) == expected, side
        assert set(schema["properties"][side]["properties"]) == expected, side


def test_persistent_store(all_on):
    objs = by_kind(manifests(all_on))
    pvc = objs[("PersistentVolumeClaim", f"{RELEASE}-oomguard-store")]
    assert pvc["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert pvc["spec"]["storageClassName"] == "standard"
    deploy = objs[("Deployment", SCHED)]
    s = container(deploy)
    assert deploy["spec"]["strategy"]["type"] == "Recreate"
    (mount,) = s["volumeMounts"]
    (volume,) = deploy["spec"]["template"]["spec"]["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert mount["name"] == volume["name"]
    assert env_of(s)["DASK_OOMGUARD__SCHEDULER__STORE"] == f"{mount['mountPath']}/oomguard.sqlite3"


def test_existing_claim_and_explicit_store_path():
    values = {
        "store": {"persistence": {"enabled": True, "existingClaim": "history"}},
        "oomguard": {"scheduler": {"store": "/var/lib/oomguard/prod.sqlite3"}},
    }
    objs = by_kind(manifests(render(values)))
    assert not any(k[0] == "PersistentVolumeClaim" for k in objs)
    deploy = objs[("Deployment", SCHED)]
    assert (
        deploy["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
        == "history"
    )
    env = container(deploy)["env"]
    stores = [e for e in env if e["name"] == "DASK_OOMGUARD__SCHEDULER__STORE"]
    assert stores == [
        {"name": "DASK_OOMGUARD__SCHEDULER__STORE", "value": "/var/lib/oomguard/prod.sqlite3"}
    ]


def test_a_postgresql_history_with_its_password_from_a_secret():
    """Issue 29: the URL as the store, the password only by reference, the spool on the
    claim; read back as Dask reads the env."""
    url = "postgresql://oomguard@db.data.svc:5432/oomguard?sslmode=verify-full"
    values = {
        "store": {
            "url": url,
            "passwordSecret": {"name": "oomguard-db", "key": "pw"},
            "persistence": {"enabled": True},
        }
    }
    objs = by_kind(manifests(render(values)))
    deploy = objs[("Deployment", SCHED)]
    env = {e["name"]: e for e in container(deploy)["env"]}
    assert env["DASK_OOMGUARD__SCHEDULER__STORE"]["value"] == url
    # Issue 39: the writer's credentials go to the scheduler only, never to a worker,
    # whose tasks run anyone's code.
    worker_pod = json.dumps(objs[("Deployment", WORKER)]["spec"]["template"])
    assert "PGPASSWORD" not in worker_pod and "oomguard-db" not in worker_pod
    assert "SCHEDULER__STORE" not in worker_pod
    assert env["PGPASSWORD"] == {
        "name": "PGPASSWORD",
        "valueFrom": {"secretKeyRef": {"name": "oomguard-db", "key": "pw"}},
    }
    (mount,) = container(deploy)["volumeMounts"]
    spool = f"{mount['mountPath']}/oomguard.sqlite3"
    assert env["DASK_OOMGUARD__SCHEDULER__SPOOL"]["value"] == spool
    plain = {k: v["value"] for k, v in env.items() if k.startswith("DASK_OOMGUARD")}
    with dask.config.set(dask.config.collect_env(plain)):
        settings = oomguard._config.scheduler_settings()
    assert (settings["store"], settings["spool"]) == (url, spool)


@pytest.mark.parametrize(
    "values, names",
    [
        ({"store": {"url": "postgresql://u:secret@db/h"}}, ["/store/url"]),
        ({"store": {"url": "mysql://db/h"}}, ["/store/url"]),
    ],
)
def test_a_history_url_with_a_password_or_another_scheme_is_refused(values, names):
    h = helm()
    with pytest.raises(h.HelmValuesError) as info:
        render(values)
    assert all(n in str(info.value) for n in names)


def test_a_store_named_twice_fails_the_render():
    values = {
        "store": {"url": "postgresql://db/h"},
        "oomguard": {"scheduler": {"store": "/var/lib/oomguard/x.sqlite3"}},
    }
    with pytest.raises(Exception, match="both name the failure store"):
        render(values)


def test_the_cluster_is_named_after_the_release_unless_named(default):
    # Issue 29: the scheduler stamps this name on what it stores; read as Dask reads env.
    env = container(by_kind(manifests(default))[("Deployment", SCHED)])["env"]
    named = [e for e in env if e["name"] == "DASK_OOMGUARD__SCHEDULER__CLUSTER_NAME"]
    assert named == [{"name": "DASK_OOMGUARD__SCHEDULER__CLUSTER_NAME", "value": RELEASE}]
    with dask.config.set(dask.config.collect_env({named[0]["name"]: named[0]["value"]})):
        assert oomguard._config.scheduler_settings()["cluster-name"] == RELEASE
    objs = by_kind(manifests(render({"oomguard": {"scheduler": {"clusterName": "etl-prod"}}})))
    env = container(objs[("Deployment", SCHED)])["env"]
    named = [e for e in env if e["name"] == "DASK_OOMGUARD__SCHEDULER__CLUSTER_NAME"]
    assert named == [{"name": "DASK_OOMGUARD__SCHEDULER__CLUSTER_NAME", "value": "etl-prod"}]


def test_rbac_for_the_pod_lookup(default):
    objs = by_kind(manifests(default))
    role = objs[("Role", SCHED)]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    binding = objs[("RoleBinding", SCHED)]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": SCHED,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": SCHED, "namespace": NAMESPACE}
    ]
    spec = objs[("Deployment", SCHED)]["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == SCHED and spec["automountServiceAccountToken"] is True
    env = env_of(container(objs[("Deployment", SCHED)]))
    assert env["DASK_OOMGUARD__SCHEDULER__KUBERNETES__ENABLED"] == "true"
    assert env["DASK_OOMGUARD__SCHEDULER__KUBERNETES__NAMESPACE"] == NAMESPACE
    # The selector the lookup uses matches the worker pods' labels.
    worker_labels = objs[("Deployment", WORKER)]["spec"]["template"]["metadata"]["labels"]
    selector = dict(
        kv.split("=")
        for kv in env["DASK_OOMGUARD__SCHEDULER__KUBERNETES__LABEL_SELECTOR"].split(",")
    )
    assert selector.items() <= worker_labels.items()
    assert (
        objs[("Deployment", WORKER)]["spec"]["template"]["spec"]["automountServiceAccountToken"]
        is False
    )


@pytest.mark.parametrize(
    "values,expected",
    [
        ({"kubernetesLookup": {"enabled": False}}, False),
        ({"kubernetesLookup": {"enabled": False}, "rbac": {"create": True}}, True),
        ({"rbac": {"create": False}}, False),
    ],
)
def test_rbac_follows_the_lookup_unless_set(values, expected):
    objs = by_kind(manifests(render(values)))
    assert (("Role", SCHED) in objs) is expected
    assert (("ServiceAccount", SCHED) in objs) is expected
    spec = objs[("Deployment", SCHED)]["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == (SCHED if expected else "default")
    if not values.get("kubernetesLookup", {"enabled": True})["enabled"]:
        env = env_of(container(objs[("Deployment", SCHED)]))
        assert not any("KUBERNETES" in k for k in env)
        assert env["EXTRA_PIP_PACKAGES"] == "dask-oomguard"


def test_notes_print_the_dashboard_page_and_metrics(default):
    notes = default["oomguard/templates/NOTES.txt"]
    assert f"kubectl --namespace {NAMESPACE} port-forward svc/{SCHED} 8787:8787" in notes
    assert "http://localhost:8787/individual-oomguard" in notes
    assert "curl -s http://localhost:8787/metrics | grep '^oomguard_'" in notes


def test_helm_test_pod(default):
    pod = by_kind(manifests(default))[("Pod", f"{RELEASE}-oomguard-test")]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = pod["spec"]["containers"][0]["command"][-1]
    compile(script, "test-pod", "exec")
    assert f'"{SCHED}"' in script and "8786" in script and '"oomguard_" not in body' in script


def test_names_are_cut_to_dns_labels():
    objs = manifests(render({"fullnameOverride": "x" * 80}))
    for o in objs:
        assert len(o["metadata"]["name"]) <= 63, o["metadata"]["name"]
    # And the worker/scheduler suffixes survive the cut.
    names = {o["metadata"]["name"] for o in objs if o["kind"] == "Deployment"}
    assert all(n.endswith(("-scheduler", "-worker")) for n in names)


# -- values.schema.json ---------------------------------------------------------------------


def test_schema_forbids_unknown_keys_everywhere():
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(node, path):
        if isinstance(node, dict) and node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, path
            for k, v in node["properties"].items():
                walk(v, f"{path}.{k}")

    walk(schema, "values")


@pytest.mark.parametrize(
    "values,names",
    [
        ({"worker": {"replicas": "two"}}, ["/worker/replicas", "want integer"]),
        ({"worker": {"replica": 2}}, ["/worker", "'replica'", "not allowed"]),
        (
            {"oomguard": {"scheduler": {"maxShardInfraFailure": 2}}},
            ["/oomguard/scheduler", "'maxShardInfraFailure'"],
        ),
        (
            {"oomguard": {"scheduler": {"maxShardInfraFailures": 0}}},
            ["/oomguard/scheduler/maxShardInfraFailures"],
        ),
        ({"worker": {"memoryLimit": "1.5Gi"}}, ["/worker/memoryLimit", "1.5Gi"]),
        ({"schduler": {}}, ["'schduler'", "not allowed"]),
        ({"image": {"pullPolicy": "Sometimes"}}, ["/image/pullPolicy"]),
        (
            {"oomguard": {"scheduler": {"clusterName": "x" * 201}}},
            ["/oomguard/scheduler/clusterName"],
        ),
        (
            {"oomguard": {"scheduler": {"clusterName": "etl\nprod"}}},
            ["/oomguard/scheduler/clusterName"],
        ),
    ],
)
def test_schema_rejects_bad_values_naming_the_key(values, names):
    h = helm()
    with pytest.raises(h.HelmValuesError) as info:
        render(values)
    for n in names:
        assert n in str(info.value)
    # Lint says the same.
    assert any(names[0] in e for e in errors(h.lint(CHART, values)))


def test_defaults_pass_the_schema():
    h = helm()
    with h.Chart.load(CHART) as chart:
        chart.validate_schema(copy.deepcopy(chart.values))
        chart.validate_schema(chart.merge_values(ALL_ON))
