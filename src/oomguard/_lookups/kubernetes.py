"""What Kubernetes says about a worker that died with its nanny (no death report came).

On Kubernetes a container OOM kills every process in the container, the nanny included
(cgroup v2 ``memory.oom.group=1``, Kubernetes 1.28+), so no exit code is ever reported; an
eviction or a pod deletion takes the nanny down too. What is left is the pod's status.
`pod_death_evidence` reads it from the `kubernetes` client's ``V1Pod`` model (pure: no API
calls); `PodLookup` is the thin part that fetches the pod for a worker's host.

Needs the optional extra: ``pip install "dask-oomguard[kubernetes]"``.
"""

from __future__ import annotations

import os
import re
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubernetes.client import CoreV1Api, V1Pod

INSTALL_HINT = (
    "oomguard's Kubernetes pod lookup needs the kubernetes client: "
    'pip install "dask-oomguard[kubernetes]"'
)
SOURCE = "kubernetes pod status"
_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

Evidence = tuple[str, dict[str, Any]]


def pod_death_evidence(
    pod: V1Pod | None,
    *,
    container: str | None = None,
    since: float | None = None,
    slack: float = 60.0,
) -> Evidence | None:
    """The cause and evidence the pod's status gives for a worker death, or None.

    ``pod`` is the worker's pod as the API returned it, or None when it no longer exists.
    ``container`` limits the container statuses read (None: all of them). ``since`` (Unix
    time of the death) ignores container terminations that finished more than ``slack``
    seconds before it, so an OOM kill from an earlier restart is not blamed again.

    Order matters: a container OOM kill is the most specific evidence (the pod may be
    deleted or evicted afterwards), then an eviction, then a deletion, then a container
    killed by a signal.

    >>> pod_death_evidence(None)
    ('worker_lost', {'source': 'kubernetes pod status', 'reason': 'deleted', 'message': 'the pod no longer exists'})
    """
    if pod is None:
        return "worker_lost", {
            "source": SOURCE,
            "reason": "deleted",
            "message": "the pod no longer exists",
        }
    meta, status = pod.metadata, pod.status
    name = getattr(meta, "name", None)
    terminated = _terminations(status, container, since, slack)
    for cname, term in terminated:
        if term.reason == "OOMKilled":
            return "oom_kill", {
                "source": SOURCE,
                "reason": "OOMKilled",
                "exit_code": term.exit_code if term.exit_code is not None else 137,
                "container": cname,
                "finished_at": _iso(term.finished_at),
                "pod": name,
                **_killer(
                    "kernel",
                    f"the kernel's OOM killer: container {cname} OOMKilled (pod status)",
                    memory=True,
                ),
            }
    disruption = _disruption(status)
    if status is not None and (status.reason == "Evicted" or disruption == "TerminationByKubelet"):
        message = status.message or ""
        offender = _offender(message)
        ours = offender is not None and (container is None or offender[0] == container)
        said = f": {message.strip()}" if message else ""
        return "worker_lost", {
            "source": SOURCE,
            "pod_phase": status.phase,
            "reason": status.reason or "",
            "message": message,
            "disruption": disruption,
            "pod": name,
            "node": _node(pod),
            **({} if offender is None else {"offender_container": offender[0]}),
            **({} if offender is None else {"offender_using": offender[1]}),
            **_killer("kubelet", f"the kubelet evicted pod {name}{said}", memory=ours),
        }
    if meta is not None and meta.deletion_timestamp is not None:
        return "worker_lost", {
            "source": SOURCE,
            "reason": "deleted",
            "pod_phase": getattr(status, "phase", None),
            "deletion_timestamp": _iso(meta.deletion_timestamp),
            # Kubernetes 1.26+ says why it is taking the pod away (preemption, drain, ...).
            "disruption": _disruption(status),
            "pod": name,
            "node": _node(pod),
        }
    for cname, term in terminated:
        # 128 + signal: 137 SIGKILL, 143 SIGTERM, from outside the pod's own processes.
        cause = {137: "sigkill", 143: "sigterm"}.get(term.exit_code)
        if cause is not None or (term.exit_code or 0) != 0:
            return cause or "exit", {
                "source": SOURCE,
                "reason": term.reason or "",
                "exit_code": term.exit_code,
                "container": cname,
                "finished_at": _iso(term.finished_at),
                "pod": name,
            }
    return None


#: The kubelet's eviction message names the container with the largest use over its request.
_OFFENDER = re.compile(r"Container (\S+) was using (\S+), request is (\S+)")


def _offender(message: str) -> tuple[str, str] | None:
    """(container, its use) that an eviction message names, or None.

    >>> _offender("The node was low on resource: memory. Threshold quantity: 100Mi, "
    ...           "available: 91872Ki. Container worker was using 3917312Ki, request is 0, "
    ...           "has larger consumption of memory. ")
    ('worker', '3917312Ki')
    """
    m = _OFFENDER.search(message or "")
    return (m.group(1), m.group(2)) if m else None


def _killer(killer: str, summary: str, *, memory: bool) -> dict[str, Any]:
    """The killer fields a worker_lost event is amended with (the pod status confirms it);
    `memory`: the eviction named this worker's container as the offender, so it counts
    like a memory kill of the worker (see `oomguard._death.killer`)."""
    return {
        "killer": killer,
        "killer_how": "pod status",
        "killer_confidence": "confirmed",
        "killer_summary": summary[:512],
        "killer_memory": memory,
    }


def _terminations(status, container, since, slack) -> list[tuple[str, Any]]:
    """(container name, terminated state) for each recent termination, current state first."""
    out = []
    for cs in getattr(status, "container_statuses", None) or []:
        if container is not None and cs.name != container:
            continue
        for state in (cs.state, cs.last_state):
            term = getattr(state, "terminated", None)
            if term is None:
                continue
            if since is not None and term.finished_at is not None:
                if term.finished_at.timestamp() < since - slack:
                    continue
            out.append((cs.name, term))
    return out


def _disruption(status) -> str | None:
    for cond in getattr(status, "conditions", None) or []:
        if cond.type == "DisruptionTarget" and str(cond.status) == "True":
            return cond.reason
    return None


def _node(pod) -> str | None:
    return getattr(pod.spec, "node_name", None) if pod.spec is not None else None


def _iso(t: datetime | str | None) -> str | None:
    return t.isoformat() if isinstance(t, datetime) else t


def _kubernetes():
    try:
        import kubernetes
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return kubernetes


class PodLookup:
    """Finds a worker's pod by its IP (the host in the worker's address).

    Blocking: the scheduler plugin calls it in a thread, never on the event loop. Needs
    RBAC ``get``/``list`` on pods in ``namespace`` (the chart's Role grants it).

    >>> lookup = PodLookup.in_cluster()                  # doctest: +SKIP
    >>> lookup.evidence("10.1.2.3", since=time.time())   # doctest: +SKIP
    ('oom_kill', {'source': 'kubernetes pod status', 'reason': 'OOMKilled', ...})
    """

    def __init__(
        self,
        namespace: str,
        api: CoreV1Api,
        *,
        label_selector: str | None = None,
        container: str | None = None,
        timeout: float = 5.0,
    ):
        self.namespace = namespace
        self.api = api
        self.label_selector = label_selector or None
        self.container = container or None
        self.timeout = timeout

    @classmethod
    def in_cluster(cls, namespace: str | None = None, **kwargs: Any) -> PodLookup:
        """A lookup with the pod's ServiceAccount (or ~/.kube/config outside a cluster)."""
        k8s = _kubernetes()
        try:
            k8s.config.load_incluster_config()
        except k8s.config.ConfigException:
            k8s.config.load_kube_config()
        if namespace is None:
            namespace = os.environ.get("POD_NAMESPACE") or _read(_NAMESPACE_FILE) or "default"
        return cls(namespace, k8s.client.CoreV1Api(), **kwargs)

    def find(self, host: str) -> V1Pod | None:
        """The pod whose IP is ``host``; None when no such pod exists any more."""
        pods = self.api.list_namespaced_pod(
            self.namespace,
            field_selector=f"status.podIP={host}",
            label_selector=self.label_selector,
            _request_timeout=self.timeout,
        ).items
        # Several match only with hostNetwork (they share the node's IP): prefer one that
        # has something to say.
        for pod in pods:
            if pod_death_evidence(pod, container=self.container) is not None:
                return pod
        return pods[0] if pods else None

    def read(self, name: str) -> V1Pod | None:
        """The pod called ``name``; None on 404."""
        k8s = _kubernetes()
        try:
            return self.api.read_namespaced_pod(
                name, self.namespace, _request_timeout=self.timeout
            )
        except k8s.client.ApiException as e:
            if e.status == 404:
                return None
            raise

    def evidence(self, host: str, *, since: float | None = None) -> Evidence | None:
        """`pod_death_evidence` for the pod at ``host`` (see there)."""
        return pod_death_evidence(self.find(host), container=self.container, since=since)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None
