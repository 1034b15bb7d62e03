"""Pod status -> death evidence, on recorded Kubernetes API responses.

The JSON under tests/fixtures/k8s/ has the exact shape the API server returns; it is turned
into the real `kubernetes` client's models by the client's own deserializer, and PodLookup
talks to a local HTTP server that answers with the same recordings.
"""

from __future__ import annotations

import inspect
import json
import pathlib
import threading
import urllib.parse
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes.client import ApiClient, Configuration, CoreV1Api

from oomguard._causes import Cause
from oomguard._lookups import kubernetes as _kubernetes
from oomguard._lookups.kubernetes import INSTALL_HINT, PodLookup, pod_death_evidence

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "k8s"


def recorded(name: str) -> str:
    return (FIXTURES / name).read_text()


def deserialize(text: str, kind: str):
    """The client's own response deserializer (its signature changed in kubernetes 37)."""
    api = ApiClient()
    if "content_type" in inspect.signature(api.deserialize).parameters:
        return api.deserialize(text, kind, "application/json")

    class Response:  # kubernetes < 37 reads `.data` off the urllib3 response
        data = text

    return api.deserialize(Response(), kind)


def pod(name: str):
    return deserialize(recorded(name), "V1Pod")


def unix(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_fixtures_deserialize_into_real_models():
    p = pod("pod-oomkilled.json")
    assert type(p).__name__ == "V1Pod"
    assert p.status.container_statuses[0].last_state.terminated.exit_code == 137
    assert isinstance(p.status.container_statuses[0].last_state.terminated.finished_at, datetime)


def test_oomkilled_container_last_state():
    cause, evidence = pod_death_evidence(pod("pod-oomkilled.json"), container="worker")
    assert cause == Cause.OOM_KILL
    assert evidence == {
        "source": "kubernetes pod status",
        "reason": "OOMKilled",
        "exit_code": 137,
        "container": "worker",
        "finished_at": "2026-11-30T07:12:41+00:00",
        "pod": "etl-oomguard-worker-7c9f6d8b5d-x2k4q",
        "killer": "kernel",
        "killer_how": "pod status",
        "killer_confidence": "confirmed",
        "killer_summary": "the kernel's OOM killer: container worker OOMKilled (pod status)",
        "killer_memory": True,
    }


def test_oomkilled_current_state_counts_too():
    data = json.loads(recorded("pod-oomkilled.json"))
    cs = data["status"]["containerStatuses"][0]
    cs["state"], cs["lastState"] = cs["lastState"], {}
    cause, evidence = pod_death_evidence(deserialize(json.dumps(data), "V1Pod"))
    assert (cause, evidence["reason"], evidence["container"]) == (
        "oom_kill",
        "OOMKilled",
        "worker",
    )


def test_oom_kill_of_an_earlier_restart_is_not_blamed_again():
    p = pod("pod-oomkilled.json")
    finished = unix("2026-11-30T07:12:41Z")
    assert pod_death_evidence(p, since=finished + 10)[0] == "oom_kill"
    # An hour later the pod runs normally again: that old OOM kill explains nothing new.
    assert pod_death_evidence(p, since=finished + 3600) is None


def test_other_container_is_not_read():
    assert pod_death_evidence(pod("pod-oomkilled.json"), container="sidecar") is None


def test_evicted_pod():
    cause, evidence = pod_death_evidence(pod("pod-evicted.json"), container="worker")
    # The container's 137/ContainerStatusUnknown is a side effect: the eviction is the cause.
    assert cause == Cause.WORKER_LOST
    assert evidence["reason"] == "Evicted"
    assert evidence["pod_phase"] == "Failed"
    assert evidence["message"].startswith("The node was low on resource: memory.")
    assert evidence["node"] == "ip-10-0-3-17.ec2.internal"
    # Who: the kubelet, from the pod status; the message names this worker's container
    # as the one using the most memory over its request, so it counts as a memory kill.
    assert (evidence["killer"], evidence["killer_how"]) == ("kubelet", "pod status")
    assert evidence["killer_confidence"] == "confirmed"
    assert evidence["disruption"] == "TerminationByKubelet"
    assert (evidence["offender_container"], evidence["offender_using"]) == ("worker", "3917312Ki")
    assert evidence["killer_memory"] is True
    assert "The node was low on resource: memory." in evidence["killer_summary"]


def test_eviction_of_another_containers_making_is_external():
    """The recorded eviction, with the kubelet naming a sidecar as the offender: the worker
    was evicted with its pod but did not cause it, so it is no memory kill of the worker."""
    data = json.loads(recorded("pod-evicted.json"))
    data["status"]["message"] = data["status"]["message"].replace(
        "Container worker was", "Container log-shipper was"
    )
    cause, evidence = pod_death_evidence(
        deserialize(json.dumps(data), "V1Pod"), container="worker"
    )
    assert cause == Cause.WORKER_LOST and evidence["killer"] == "kubelet"
    assert evidence["offender_container"] == "log-shipper"
    assert evidence["killer_memory"] is False


def test_oomkilled_container_names_the_kernel():
    _, evidence = pod_death_evidence(pod("pod-oomkilled.json"), container="worker")
    assert (evidence["killer"], evidence["killer_how"]) == ("kernel", "pod status")


def test_pod_being_deleted():
    cause, evidence = pod_death_evidence(pod("pod-terminating.json"))
    assert cause == Cause.WORKER_LOST
    assert evidence["reason"] == "deleted"
    assert evidence["deletion_timestamp"] == "2026-11-30T07:31:09+00:00"
    assert evidence["disruption"] == "PreemptionByScheduler"


def test_pod_gone():
    cause, evidence = pod_death_evidence(None)
    assert (cause, evidence["reason"], evidence["source"]) == (
        "worker_lost",
        "deleted",
        "kubernetes pod status",
    )


def test_running_pod_has_nothing_to_say():
    assert pod_death_evidence(pod("pod-running.json")) is None


def test_container_sigkilled_without_oom():
    cause, evidence = pod_death_evidence(pod("pod-sigkilled.json"))
    assert cause == Cause.SIGKILL
    assert (evidence["exit_code"], evidence["reason"]) == (137, "Error")


def test_evidence_is_plain_data():
    for name in (
        "pod-oomkilled.json",
        "pod-evicted.json",
        "pod-terminating.json",
        "pod-sigkilled.json",
    ):
        _, evidence = pod_death_evidence(pod(name))
        assert json.loads(json.dumps(evidence)) == evidence


# -- PodLookup against a local API server answering with the recordings --------------------


@pytest.fixture
def api_server():
    requests: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            requests.append(self.path)
            url = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(url.query)
            code, body = 404, recorded("status-404.json")
            if url.path == "/api/v1/namespaces/data/pods":
                code = 200
                ip = query.get("fieldSelector", [""])[0]
                body = recorded(
                    "podlist-oomkilled.json"
                    if ip == "status.podIP=10.42.1.23"
                    else "podlist-empty.json"
                )
                if ip == "status.podIP=10.42.3.4":  # the evicted pod, as a list
                    pod = json.loads(recorded("pod-evicted.json"))
                    body = json.dumps({"kind": "PodList", "apiVersion": "v1", "items": [pod]})
            elif url.path == "/api/v1/namespaces/data/pods/etl-oomguard-worker-7c9f6d8b5d-m8zfr":
                code, body = 200, recorded("pod-running.json")
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = Configuration()
    config.host = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield CoreV1Api(ApiClient(config)), requests
    finally:
        server.shutdown()
        server.server_close()


def test_lookup_by_pod_ip(api_server):
    api, requests = api_server
    selector = "app.kubernetes.io/instance=etl,app.kubernetes.io/component=worker"
    lookup = PodLookup("data", api, label_selector=selector, container="worker")
    cause, evidence = lookup.evidence("10.42.1.23")
    assert (cause, evidence["pod"]) == ("oom_kill", "etl-oomguard-worker-7c9f6d8b5d-x2k4q")
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(requests[-1]).query)
    assert query["fieldSelector"] == ["status.podIP=10.42.1.23"]
    assert query["labelSelector"] == [selector]


def test_lookup_of_a_vanished_pod(api_server):
    api, _ = api_server
    assert PodLookup("data", api).find("10.42.9.9") is None
    assert PodLookup("data", api).evidence("10.42.9.9")[1]["reason"] == "deleted"


def test_read_by_name_404_is_none(api_server):
    api, _ = api_server
    lookup = PodLookup("data", api)
    assert lookup.read("etl-oomguard-worker-7c9f6d8b5d-v5hcd") is None
    assert lookup.read("etl-oomguard-worker-7c9f6d8b5d-m8zfr").status.phase == "Running"


def test_missing_client_is_one_line_with_the_install_command(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "kubernetes", None)
    with pytest.raises(ImportError) as info:
        PodLookup.in_cluster(namespace="data")
    message = str(info.value)
    assert message == INSTALL_HINT
    assert "\n" not in message and 'pip install "dask-oomguard[kubernetes]"' in message
    assert _kubernetes.INSTALL_HINT.endswith('pip install "dask-oomguard[kubernetes]"')


@pytest.mark.parametrize("host, stored", [("10.42.3.4", True), ("10.42.9.9", False)])
def test_a_nanny_stopped_by_sigterm_is_an_event_only_when_evicted(
    api_server, tmp_path, host, stored
):
    """`dask worker` closed on SIGTERM: where the pod's status says the kubelet evicted it,
    one external event per task the worker ran, named kubelet; a pod with nothing to say
    (stopped in order, or gone) stores nothing."""
    import asyncio
    import logging

    from oomguard._decide import nanny_stop_record
    from oomguard._guard import Guard
    from oomguard._metrics import OomguardMetrics
    from oomguard._store import FailureStore
    from oomguard.scheduler_plugin._actions import DaskActions

    api, _ = api_server
    store = FailureStore(str(tmp_path / "s.sqlite3"), batch_interval=0.01)
    store.start()
    try:
        guard = Guard(None, logging.getLogger("test"))
        actions = DaskActions(None, store, OomguardMetrics(), guard, PodLookup("data", api))
        records = [
            nanny_stop_record(f"tcp://{host}:4000", host, k, "etl", 1_790_000_000.0)
            for k in ("('load', 1)", "('load', 2)")
        ]
        asyncio.run(actions._if_evicted(records))
        assert store.flush() and guard.count == 0
        events = store.events()
        if not stored:
            assert events == []
            return
        assert sorted(e.shard for e in events) == ["('load', 1)", "('load', 2)"]
        e = events[0]
        assert (e.cause, e.killer, e.killer_how, e.killer_confidence) == (
            "sigterm",
            "kubelet",
            "pod status",
            "confirmed",
        )
        assert e.evidence["external"] is True and e.evidence["reason"] == "Evicted"
        assert e.evidence["offender_container"] == "worker"
    finally:
        store.close()


def test_the_pods_verdict_amends_the_lost_death_by_its_id(api_server, tmp_path):
    """A worker lost with its nanny is decided `worker_lost`; the pod's status says the
    kernel OOM-killed it: the same death (its id), now oom_kill by the kernel, its events
    likewise; one death in the store, one count, and the metrics counted it once."""
    import asyncio
    import logging

    from prometheus_client import CollectorRegistry

    from oomguard import FailureEvent
    from oomguard._death.record import Attribution, Death, Role, Task
    from oomguard._decide import Record
    from oomguard._guard import Guard
    from oomguard._metrics import OomguardMetrics
    from oomguard._store import FailureStore
    from oomguard.scheduler_plugin._actions import DaskActions

    api, _ = api_server
    store = FailureStore(str(tmp_path / "s.sqlite3"), batch_interval=0.01)
    store.start()
    metrics, registry = OomguardMetrics(), CollectorRegistry()
    registry.register(metrics)
    try:
        guard = Guard(None, logging.getLogger("test"))
        actions = DaskActions(None, store, metrics, guard, PodLookup("data", api), cluster="k")
        when = unix("2026-11-30T07:12:30Z")
        death = Death(
            id="d1", worker="tcp://10.42.1.23:4000", host="10.42.1.23", cause="worker_lost",
            time=when, signature_id="lost", signature_title="worker_lost",
            tasks=(Task("('load', 1)", role=Role.CULPRIT, pipeline="etl"),),
            killer=Attribution("unknown", "inferred", "likely", "lost with its nanny"),
        )  # fmt: skip
        event = FailureEvent(
            "infra", "worker_lost", "('load', 1)", "etl", death.worker, death.host, "lost",
            "worker_lost", {"source": "no report"}, time=when, death="d1",
        )  # fmt: skip

        async def decide():
            actions.apply([Record((event,), death)])
            await asyncio.gather(*actions._lookups)

        asyncio.run(decide())
        assert store.flush() and guard.count == 0
        (got,) = store.deaths()
        assert (got.id, got.cluster, got.cause) == ("d1", "k", "oom_kill")
        assert (got.killer.name, got.killer.how, got.killer.confidence) == (
            "kernel",
            "pod status",
            "confirmed",
        )
        assert got.evidence["reason"] == "OOMKilled"
        assert got.evidence["source"] == "kubernetes pod status"
        (e,) = store.events()
        assert (e.death, e.cause, e.killer, e.evidence["reason"]) == (
            "d1",
            "oom_kill",
            "kernel",
            "OOMKilled",
        )
        assert store.signature("lost").count == 1  # amended once, counted once
        deaths = registry.get_sample_value(
            "oomguard_worker_deaths_total", {"cause": "worker_lost", "killer": "unknown"}
        )
        assert deaths == 1.0
    finally:
        store.close()
