"""The Kubernetes examples in docs/: valid where they are applied, and wired for oomguard.

- docs/deploying/operator/daskcluster.yaml and the `make_cluster_spec` recipe in
  docs/deploying.md are checked against the DaskCluster CRD shipped in the installed
  dask-kubernetes wheel, and the Deployments and Service the operator builds from them (with
  its own builder functions) against the Kubernetes 1.28 and 1.37 schemas.
- docs/deploying/pod-lookup-rbac.yaml against the Kubernetes schemas, and against what the
  pod lookup calls (get and list pods).
- Every `DASK_OOMGUARD__*` variable in the examples, including the dask Helm chart overlay,
  names a real oomguard setting (Dask ignores a misspelled one without a word).

No cluster and no network: the CRD comes from the dask-kubernetes package (the `test` extra).
"""

from __future__ import annotations

import copy
import pathlib
import re
from collections.abc import Callable
from typing import Any

import dask.config
import jsonschema
import kubernetes_validate
import pytest
import yaml

from capabilities import require
from oomguard import _config

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "deploying"
MANIFEST = EXAMPLES / "operator" / "daskcluster.yaml"
RBAC = EXAMPLES / "pod-lookup-rbac.yaml"
OVERLAY = EXAMPLES / "dask-helm-chart" / "values-oomguard.yaml"
DOC = ROOT / "docs" / "deploying.md"
KUBE_VERSIONS = ["1.28.0", "1.37.0"]
#: Where the wheel keeps the CRDs of the operator's Helm chart (plain YAML, not templated).
CRD_DIR = "operator/deployment/helm/dask-kubernetes-operator/crds"
#: The marker in docs/deploying.md before the Python block this file runs.
DOC_MARKER = "<!-- tests/unit/test_operator_manifest.py runs the next block -->"


def dask_kubernetes():
    try:
        import dask_kubernetes
        from dask_kubernetes.operator.controller import controller
    except ImportError as e:
        require(False, f"dask-kubernetes does not import ({e}): pip install -e '.[test]'")
    return dask_kubernetes, controller


# -- the CRD as a strict JSON Schema --------------------------------------------------------

# Extensions that only say how the API server merges lists and maps: nothing to check.
_MERGE_ONLY = {"x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type"}
_HANDLED = _MERGE_ONLY | {"x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string"}


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """A CRD's OpenAPI v3 schema as a JSON Schema that rejects undeclared fields.

    The API server drops fields a structural schema does not declare, and kubectl's default
    strict field validation rejects them; here they are errors, so a misspelled key fails.
    """
    unknown = {k for k in schema if k.startswith("x-kubernetes-")} - _HANDLED
    if unknown:  # a newer CRD uses an extension this converter does not know: say so
        raise NotImplementedError(f"CRD schema extension(s) not handled: {sorted(unknown)}")
    out = {
        k: v
        for k, v in schema.items()
        if k not in _HANDLED and k not in ("properties", "items", "additionalProperties")
    }
    if "properties" in schema:
        out["properties"] = {name: strict(sub) for name, sub in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            out["additionalProperties"] = False
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = strict(schema["additionalProperties"])
    elif "additionalProperties" in schema:
        out["additionalProperties"] = schema["additionalProperties"]
    if "items" in schema:
        out["items"] = strict(schema["items"])
    if schema.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if schema.get("nullable") and "type" in out:
        out["type"] = [*([out["type"]] if isinstance(out["type"], str) else out["type"]), "null"]
    return out


def without_nulls(value: Any) -> Any:
    """What the API server validates: null fields of non-nullable schemas are dropped first."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def crd_errors(obj: dict[str, Any]) -> list[str]:
    """Every way `obj` breaks the schema of its kind's CRD in the installed dask-kubernetes,
    as "path: message"; [] when it is valid."""
    package, _ = dask_kubernetes()
    path = pathlib.Path(package.__file__).parent / CRD_DIR / f"{obj['kind'].lower()}.yaml"
    crd = yaml.safe_load(path.read_text())
    group = crd["spec"]["group"]
    served = {f"{group}/{v['name']}": v for v in crd["spec"]["versions"] if v.get("served")}
    if obj.get("apiVersion") not in served:
        return [
            f"apiVersion: {obj.get('apiVersion')!r} is not served by {path.name} "
            f"(served: {', '.join(sorted(served))})"
        ]
    if obj["kind"] != crd["spec"]["names"]["kind"]:
        return [f"kind: {obj['kind']!r} is not {crd['spec']['names']['kind']!r}"]
    schema = strict(served[obj["apiVersion"]]["schema"]["openAPIV3Schema"])
    # apiVersion, kind and metadata are implicit in every CRD (ObjectMeta is checked apart).
    schema["properties"].update(
        apiVersion={"type": "string"},
        kind={"type": "string"},
        metadata={"type": "object", "required": ["name"]},
    )
    jsonschema.Draft4Validator.check_schema(schema)
    errors = jsonschema.Draft4Validator(schema).iter_errors(without_nulls(obj))
    return sorted(
        f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors
    )


# -- the examples --------------------------------------------------------------------------


def manifest() -> dict[str, Any]:
    return yaml.safe_load(MANIFEST.read_text())


def from_python() -> dict[str, Any]:
    """The DaskCluster the docs' make_cluster_spec recipe makes (the block is run as is)."""
    dask_kubernetes()
    text = DOC.read_text()
    assert DOC_MARKER in text, f"{DOC.name} lost the marker {DOC_MARKER!r}"
    block = re.search(r"```python\n(.*?)```", text.split(DOC_MARKER, 1)[1], re.DOTALL)
    assert block, f"no ```python block after the marker in {DOC.name}"
    namespace: dict[str, Any] = {}
    exec(compile(block.group(1), f"{DOC.name} (make_cluster_spec recipe)", "exec"), namespace)
    return namespace["spec"]


SOURCES: dict[str, Callable[[], dict[str, Any]]] = {
    "daskcluster.yaml": manifest,
    "make_cluster_spec": from_python,
}


def containers(cluster: dict[str, Any], role: str) -> dict[str, Any]:
    (container,) = cluster["spec"][role]["spec"]["containers"]
    return container


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env") or []}


def oomguard_settings(variables: dict[str, str]) -> dict[str, Any]:
    """oomguard's scheduler settings as these environment variables make them, through Dask's
    own env handling; AssertionError naming any DASK_OOMGUARD__ variable that is no setting."""
    ours = {k: v for k, v in variables.items() if k.startswith("DASK_OOMGUARD__")}
    defaults = pathlib.Path(_config.__file__).with_name("oomguard.yaml")
    known = set(_leaves(yaml.safe_load(defaults.read_text())))
    collected = _leaves(dask.config.collect_env(ours))
    for key in collected:
        assert key.replace("_", "-") in known, f"{key} (from the environment) is no setting"
    with dask.config.set(collected):  # dotted keys: the other settings keep their values
        return _config.scheduler_settings()


def _leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a.b.c": value} for every leaf of a nested dict (lists are leaves)."""
    out = {}
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else key
        out.update(_leaves(value, path) if isinstance(value, dict) else {path: value})
    return out


def selects(selector: str, labels: dict[str, str]) -> bool:
    """An equality-based label selector ("a=b,c=d") against a pod's labels."""
    pairs = [term.split("=", 1) for term in selector.split(",")]
    assert all(len(p) == 2 for p in pairs), f"not an equality selector: {selector!r}"
    return all(labels.get(k.strip()) == v.strip() for k, v in pairs)


def built(cluster: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The objects the operator's controller builds from a DaskCluster, by its own functions."""
    _, controller = dask_kubernetes()
    name, spec = cluster["metadata"]["name"], cluster["spec"]
    group = controller.build_default_worker_group_spec(name, spec["worker"], {}, {})
    return {
        "workergroup": group,
        "scheduler": controller.build_scheduler_deployment_spec(
            name, spec["scheduler"]["spec"], {}, {}
        ),
        "service": controller.build_scheduler_service_spec(
            name, spec["scheduler"]["service"], {}, {}
        ),
        "worker": controller.build_worker_deployment_spec(
            group["metadata"]["name"],
            "data",
            name,
            "0123456789",
            group["spec"]["worker"]["spec"],
            {},
            {},
        ),
    }


# -- the operator's CRD ----------------------------------------------------------------------


@pytest.mark.parametrize("source", SOURCES)
def test_daskcluster_is_valid_for_the_operators_crd(source):
    cluster = SOURCES[source]()
    assert crd_errors(cluster) == []
    # The DaskWorkerGroup the operator makes from it is checked by that CRD too.
    assert crd_errors(built(cluster)["workergroup"]) == []


def _rename(d: dict, old: str, new: str) -> None:
    d[new] = d.pop(old)


MISTAKES: dict[str, tuple[Callable[[dict], None], str]] = {
    "misspelled container field": (
        lambda c: _rename(containers(c, "worker"), "env", "evn"),
        "spec/worker/spec/containers/0: Additional properties are not allowed ('evn'",
    ),
    "misspelled DaskCluster field": (
        lambda c: _rename(c["spec"]["worker"], "replicas", "replica"),
        "spec/worker: Additional properties are not allowed ('replica'",
    ),
    "pod field at the wrong level": (
        lambda c: c["spec"]["scheduler"].__setitem__("serviceAccountName", "dask-oomguard"),
        "spec/scheduler: Additional properties are not allowed ('serviceAccountName'",
    ),
    "wrong type": (
        lambda c: c["spec"]["worker"].__setitem__("replicas", "4"),
        "spec/worker/replicas: '4' is not of type 'integer'",
    ),
    "numeric targetPort (the CRD types it as a string)": (
        lambda c: c["spec"]["scheduler"]["service"]["ports"][0].__setitem__("targetPort", 8786),
        "spec/scheduler/service/ports/0/targetPort: 8786 is not of type 'string'",
    ),
    "required part missing": (
        lambda c: c["spec"]["scheduler"].pop("service"),
        "spec/scheduler: 'service' is a required property",
    ),
    "unserved apiVersion": (
        lambda c: c.__setitem__("apiVersion", "kubernetes.dask.org/v2"),
        "apiVersion: 'kubernetes.dask.org/v2' is not served",
    ),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_the_crd_check_rejects_a_broken_manifest(mistake):
    break_it, expected = MISTAKES[mistake]
    cluster = copy.deepcopy(manifest())
    break_it(cluster)
    errors = crd_errors(cluster)
    assert any(e.startswith(expected) for e in errors), errors


# -- what the operator makes of it: Kubernetes objects -------------------------------------------


@pytest.mark.parametrize("kube", KUBE_VERSIONS)
@pytest.mark.parametrize("source", SOURCES)
def test_the_operators_objects_are_valid_kubernetes(source, kube):
    objects = [o for k, o in built(SOURCES[source]()).items() if k != "workergroup"]
    objects += [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, kube, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = "/".join(str(p) for p in e.absolute_path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} at {where}: {e.message}")


def test_the_kubernetes_check_rejects_a_misspelled_pod_field():
    worker = built(manifest())["worker"]
    worker["spec"]["template"]["spec"]["serviceAcountName"] = "dask-oomguard"
    with pytest.raises(kubernetes_validate.ValidationError, match="serviceAcountName"):
        kubernetes_validate.validate(worker, KUBE_VERSIONS[-1], strict=True)


# -- wired for oomguard ---------------------------------------------------------------------------


def _follows(args: list[str], flag: str, value: str) -> bool:
    return any(args[i : i + 2] == [flag, value] for i in range(len(args) - 1))


@pytest.mark.parametrize("source", SOURCES)
def test_oomguard_is_loaded_on_the_scheduler_and_the_workers(source):
    cluster = SOURCES[source]()
    scheduler, worker = containers(cluster, "scheduler"), containers(cluster, "worker")
    # `dask scheduler` / `dask worker`: distributed 2026.6.0 and later have no dask-scheduler.
    assert scheduler["args"][:2] == ["dask", "scheduler"]
    assert worker["args"][:2] == ["dask", "worker"]
    assert _follows(scheduler["args"], "--preload", "oomguard.scheduler_plugin")
    assert _follows(worker["args"], "--preload-nanny", "oomguard.worker_plugin")
    assert "dask-oomguard[kubernetes]" in env(scheduler)["EXTRA_PIP_PACKAGES"].split()
    assert "dask-oomguard" in env(worker)["EXTRA_PIP_PACKAGES"].split()


@pytest.mark.parametrize("source", SOURCES)
def test_the_pod_lookup_finds_the_workers_pods_and_may_read_them(source):
    cluster = SOURCES[source]()
    objects = built(cluster)
    settings = oomguard_settings(env(containers(cluster, "scheduler")))
    assert settings["kubernetes.enabled"] is True
    selector = settings["kubernetes.label-selector"]
    worker_pod = objects["worker"]["spec"]["template"]
    scheduler_pod = objects["scheduler"]["spec"]["template"]
    assert selects(selector, worker_pod["metadata"]["labels"]), (selector, worker_pod["metadata"])
    assert not selects(selector, scheduler_pod["metadata"]["labels"])
    assert settings["kubernetes.container"] in {
        c["name"] for c in worker_pod["spec"]["containers"]
    }

    rbac = {d["kind"]: d for d in yaml.safe_load_all(RBAC.read_text()) if d}
    account = scheduler_pod["spec"]["serviceAccountName"]
    assert account == rbac["ServiceAccount"]["metadata"]["name"]
    binding = rbac["RoleBinding"]
    assert {"kind": "ServiceAccount", "name": account} in binding["subjects"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": rbac["Role"]["metadata"]["name"],
    }
    # oomguard._lookups.kubernetes.PodLookup: list_namespaced_pod (find) and read_namespaced_pod (read).
    (rule,) = rbac["Role"]["rules"]
    assert rule["apiGroups"] == [""] and rule["resources"] == ["pods"]
    assert {"get", "list"} <= set(rule["verbs"])
    # Workers never call the API: no token in their pods.
    assert worker_pod["spec"]["automountServiceAccountToken"] is False


def test_the_settings_check_rejects_a_misspelled_variable():
    with pytest.raises(AssertionError, match="label_selecter .* is no setting"):
        oomguard_settings({"DASK_OOMGUARD__SCHEDULER__KUBERNETES__LABEL_SELECTER": "a=b"})


# -- the dask Helm chart overlay ----------------------------------------------------------------

#: The overlay's keys, each checked by hand against dask/values.yaml and dask/templates/ of
#: dask/helm-chart at commit e25bf5116067684b0ca2f99924b3f0b183c2dcfd (the chart is not on a
#: registry CI reaches). A key added to the overlay must be checked there and added here.
CHECKED_CHART_KEYS = {
    "scheduler.extraArgs",
    "scheduler.env",
    "scheduler.serviceAccountName",
    "worker.extraArgs",
    "worker.env",
}


def test_dask_chart_overlay_uses_checked_keys_and_loads_oomguard():
    overlay = yaml.safe_load(OVERLAY.read_text())
    assert set(_leaves(overlay)) == CHECKED_CHART_KEYS
    scheduler, worker = overlay["scheduler"], overlay["worker"]
    assert _follows(scheduler["extraArgs"], "--preload", "oomguard.scheduler_plugin")
    assert _follows(worker["extraArgs"], "--preload-nanny", "oomguard.worker_plugin")
    settings = oomguard_settings(env(scheduler))
    assert settings["kubernetes.enabled"] is True
    # The chart's worker pods carry release=<release>, component=worker (templates/
    # dask-worker-deployment.yaml); its scheduler pods component=scheduler.
    labels = {"app": "dask", "release": "my-dask"}
    assert selects(settings["kubernetes.label-selector"], {**labels, "component": "worker"})
    assert not selects(settings["kubernetes.label-selector"], {**labels, "component": "scheduler"})
    assert (
        scheduler["serviceAccountName"]
        == next(d for d in yaml.safe_load_all(RBAC.read_text()) if d["kind"] == "ServiceAccount")[
            "metadata"
        ]["name"]
    )
    assert "dask-oomguard[kubernetes]" in env(scheduler)["EXTRA_PIP_PACKAGES"].split()
    assert "dask-oomguard" in env(worker)["EXTRA_PIP_PACKAGES"].split()
