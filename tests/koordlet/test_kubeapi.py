"""koordlet.kubeapi against the project's API server (tests/support/apiserver.py): every call koordlet makes, what
goes on the wire (the same request as the generated kubernetes client's method of that name), the errors, watches
and timeouts; and that the agent never loads the generated API classes or models (checked in a fresh process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import urllib3
from kubernetes.client.exceptions import (
    ApiException,
    ConflictException,
    NotFoundException,
    ServiceException,
    UnauthorizedException,
    UnprocessableEntityException,
)
from kubernetes.watch.watch import iter_resp_lines

from koordlet.kubeapi import AuthV1, CoreV1, CustomObjects, section
from tests.support.apiserver import ApiServer, Credentials, RecordedRequest, kube_client_config, write_kubeconfig

REPO = Path(__file__).resolve().parents[2]
NODE = "node-1"
TOKEN = "t0ken"
METRIC = ("slo.koordinator.sh", "v1alpha1", "nodemetrics")
SLO = ("slo.koordinator.sh", "v1alpha1", "nodeslos")


def node_object(name: str = NODE, labels: dict[str, str] | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(labels or {})},
            "status": {"capacity": {"cpu": "4", "memory": "8Gi"}}}


def pod_object(name: str, namespace: str = "default", node: str = NODE) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": "batch"}},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "localhost/busybox"}]},
            "status": {"phase": "Running", "qosClass": "BestEffort"}}


def node_metric(name: str = NODE) -> dict:
    return {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": {"name": name},
            "spec": {"metricCollectPolicy": {"reportIntervalSeconds": 60}}}


def event_body(namespace: str = "default") -> dict:
    """An Event as koordlet builds one: camelCase fields, RFC3339 times."""
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"generateName": "web.", "namespace": namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "web", "namespace": namespace,
                               "uid": "uid-1"},
            "type": "Warning", "reason": "Probe", "message": "a test event",
            "source": {"component": "koordlet", "host": NODE}, "reportingComponent": "koordlet",
            "reportingInstance": NODE, "firstTimestamp": "2026-01-02T03:04:05+00:00",
            "lastTimestamp": "2026-01-02T03:04:05.123456+00:00", "count": 1}


EVICTION = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web", "namespace": "default"}}


@pytest.fixture
def core(api_client: kubernetes.client.ApiClient) -> CoreV1:
    return CoreV1(api_client)


@pytest.fixture
def custom(api_client: kubernetes.client.ApiClient) -> CustomObjects:
    return CustomObjects(api_client)


def drain(response: Any) -> bytes:
    """Read a raw (``_preload_content=False``) answer to its end and give its connection back."""
    try:
        return response.read()
    finally:
        response.release_conn()


# ------------------------------------------------------------------------------------------ the wire


@pytest.fixture
def token_server() -> Iterator[ApiServer]:
    """A server where TOKEN is a static token of a user who may do anything (the wire is what is compared)."""
    with ApiServer() as running:
        running.add_token(TOKEN, "koordlet", ("system:masters",))
        yield running


@pytest.fixture
def token_client(token_server: ApiServer) -> Iterator[kubernetes.client.ApiClient]:
    config = kube_client_config(token_server, Credentials("koordlet", token=TOKEN))
    with kubernetes.client.ApiClient(config) as client:
        client.user_agent = "koordlet"
        yield client


def _wire(request: RecordedRequest) -> tuple:
    """What a request carried that the server acts on (names of the headers in canonical form)."""
    headers = {name: request.headers.get(name) for name in ("Accept", "Content-Type", "Authorization", "User-Agent")}
    return request.verb, request.path, request.query, request.body, headers


def _calls(seeded: dict[str, dict]) -> list[tuple[str, str, tuple, dict]]:
    """(client, method, args, kwargs) of every call koordlet makes, with the arguments its callers pass."""
    metric = seeded["metric"]
    return [
        ("core", "read_node", (NODE,), {}),
        ("core", "read_node", ("missing",), {}),
        ("core", "patch_node", (NODE, {"metadata": {"labels": {"gpu": "yes"}}}), {}),
        ("core", "patch_node", (NODE, {"metadata": {"resourceVersion": "1", "annotations": {"lock": None}}}), {}),
        ("core", "patch_node", (NODE, [{"op": "add", "path": "/metadata/labels/pool", "value": "colo"}]), {}),
        ("core", "list_node", (), {"field_selector": f"metadata.name={NODE}", "_preload_content": False,
                                   "_request_timeout": (5, 30)}),
        ("core", "list_node", (), {"field_selector": f"metadata.name={NODE}", "watch": True,
                                   "resource_version": seeded["node"]["metadata"]["resourceVersion"],
                                   "allow_watch_bookmarks": True, "timeout_seconds": 1, "_preload_content": False,
                                   "_request_timeout": (5, 31)}),
        ("core", "read_namespaced_pod", ("web", "default"), {"_request_timeout": 10}),
        ("core", "patch_namespaced_pod", ("web", "default", {"metadata": {"annotations": {"bound": "{}"}}}),
         {"_request_timeout": 10}),
        ("core", "list_pod_for_all_namespaces", (), {"field_selector": f"spec.nodeName={NODE}",
                                                     "_request_timeout": 10}),
        ("core", "create_namespaced_event", ("default", event_body()), {}),
        ("core", "create_namespaced_pod_eviction", ("web", "default", EVICTION), {}),
        ("custom", "get_cluster_custom_object", (*METRIC, NODE), {}),
        ("custom", "create_cluster_custom_object", (*METRIC, node_metric("node-2")), {}),
        ("custom", "replace_cluster_custom_object", (*METRIC, NODE, metric), {}),
        ("custom", "replace_cluster_custom_object_status", (*METRIC, NODE, {**metric, "status": {}}), {}),
        ("custom", "list_cluster_custom_object", SLO, {"field_selector": f"metadata.name={NODE}",
                                                       "_preload_content": False, "_request_timeout": (5, 30)}),
        ("custom", "list_cluster_custom_object", SLO, {"field_selector": f"metadata.name={NODE}", "watch": True,
                                                       "allow_watch_bookmarks": True, "timeout_seconds": 1,
                                                       "_preload_content": False}),
        ("authn", "create_token_review", ({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                                           "spec": {"token": "some-token"}},), {"_request_timeout": 5}),
        ("authz", "create_subject_access_review", ({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": "alice", "groups": ["ops"], "uid": "u-1", "extra": {},
                     "resourceAttributes": {"verb": "get", "group": "", "version": "v1", "resource": "nodes",
                                            "subresource": "proxy", "name": NODE}}},), {"_request_timeout": 5}),
    ]


def test_every_call_sends_what_the_generated_client_sends(token_server: ApiServer,
                                                          token_client: kubernetes.client.ApiClient) -> None:
    """Each call made by the generated method of the same name and then by ours, against the same server: the
    same verb, path, query, JSON body, Accept and Content-Type (a dict patch is a strategic merge patch, a list one
    a JSON patch; a POST or PUT carries no Content-Type), the bearer token and the user agent."""
    seeded = {"node": token_server.seed(node_object()), "metric": token_server.seed(node_metric())}
    token_server.seed(pod_object("web"))
    reference = {"core": kubernetes.client.CoreV1Api(token_client),
                 "custom": kubernetes.client.CustomObjectsApi(token_client),
                 "authn": kubernetes.client.AuthenticationV1Api(token_client),
                 "authz": kubernetes.client.AuthorizationV1Api(token_client)}
    auth = AuthV1(token_client)
    ours = {"core": CoreV1(token_client), "custom": CustomObjects(token_client), "authn": auth, "authz": auth}
    for kind, method, args, kwargs in _calls(seeded):
        sent = []
        for clients in (reference, ours):
            token_server.clear_requests()
            try:
                answer = getattr(clients[kind], method)(*args, **kwargs)
                if kwargs.get("_preload_content") is False:
                    drain(answer)
            except ApiException:
                pass  # the same request may fail the second time (already created, evicted): compared anyway
            (request,) = token_server.requests()
            sent.append(_wire(request))
        assert sent[0] == sent[1], method
        assert sent[1][4]["Authorization"] == f"Bearer {TOKEN}" and sent[1][4]["User-Agent"] == "koordlet"


def test_patch_content_types(server: ApiServer, core: CoreV1) -> None:
    server.seed(node_object(labels={"a": "1"}))
    core.patch_node(NODE, {"metadata": {"labels": {"b": "2"}}})
    core.patch_node(NODE, [{"op": "add", "path": "/metadata/labels/c", "value": "3"}])
    assert [r.content_type for r in server.requests("PATCH")] == [
        "application/strategic-merge-patch+json", "application/json-patch+json"]
    assert server.get_object("nodes", NODE)["metadata"]["labels"] == {"a": "1", "b": "2", "c": "3"}


def test_without_the_token_the_server_answers_401(token_server: ApiServer) -> None:
    token_server.seed(node_object())
    with kubernetes.client.ApiClient(kube_client_config(token_server, Credentials("anonymous"))) as anonymous:
        with pytest.raises(UnauthorizedException) as caught:
            CoreV1(anonymous).read_node(NODE)
    assert caught.value.status == 401


# ------------------------------------------------------------------------------------------ core/v1


def test_read_node_is_the_json_and_a_missing_one_is_404(server: ApiServer, core: CoreV1) -> None:
    stored = server.seed(node_object(labels={"zone": "a"}))
    node = core.read_node(NODE)
    assert isinstance(node, dict) and node["metadata"]["uid"] == stored["metadata"]["uid"]
    assert node["metadata"]["labels"] == {"zone": "a"} and node["status"]["capacity"]["cpu"] == "4"
    assert section(node, "metadata", "annotations") == {}  # absent: reads as empty
    with pytest.raises(NotFoundException) as caught:
        core.read_node("node-9")
    assert caught.value.status == 404 and caught.value.reason == "Not Found"
    assert json.loads(caught.value.body)["reason"] == "NotFound"


def test_patch_node_merges_removes_with_null_and_checks_the_resource_version(server: ApiServer,
                                                                              core: CoreV1) -> None:
    server.seed({**node_object(), "metadata": {"name": NODE, "annotations": {"lock": "x", "keep": "y"}}})
    version = core.read_node(NODE)["metadata"]["resourceVersion"]
    patched = core.patch_node(NODE, {"metadata": {"resourceVersion": version, "annotations": {"lock": None}}})
    assert patched["metadata"]["annotations"] == {"keep": "y"}
    with pytest.raises(ConflictException) as caught:
        core.patch_node(NODE, {"metadata": {"resourceVersion": version, "annotations": {"lock": "z"}}})
    assert caught.value.status == 409
    with pytest.raises(ApiException) as missing:
        core.patch_node("node-9", {"metadata": {"labels": {"a": "b"}}})
    assert missing.value.status == 404


def test_list_node_with_a_field_selector_raw_and_decoded(server: ApiServer, core: CoreV1) -> None:
    server.seed(node_object())
    server.seed(node_object("node-2"))
    listed = core.list_node(field_selector=f"metadata.name={NODE}")
    assert [n["metadata"]["name"] for n in listed["items"]] == [NODE]
    assert listed["metadata"]["resourceVersion"] == str(server.resource_version)
    raw = core.list_node(label_selector="missing=label", _preload_content=False, _request_timeout=(5, 30))
    assert isinstance(raw, urllib3.BaseHTTPResponse) and raw.status == 200
    assert json.loads(drain(raw))["items"] == []
    assert [r.query for r in server.requests("GET", r"/nodes$")] == [
        {"fieldSelector": f"metadata.name={NODE}"}, {"labelSelector": "missing=label"}]


def test_a_raw_answer_that_is_not_2xx_raises(server: ApiServer, core: CoreV1) -> None:
    server.fail_next("GET", r"/nodes$", status=503, message="etcd is down")
    with pytest.raises(ServiceException) as caught:
        core.list_node(field_selector=f"metadata.name={NODE}", _preload_content=False)
    assert caught.value.status == 503 and "etcd is down" in caught.value.body


def test_watch_streams_the_changes_after_the_listed_version(server: ApiServer, core: CoreV1) -> None:
    server.seed(node_object())
    version = core.list_node(field_selector=f"metadata.name={NODE}")["metadata"]["resourceVersion"]
    core.patch_node(NODE, {"metadata": {"labels": {"step": "1"}}})
    core.patch_node(NODE, {"metadata": {"labels": {"step": "2"}}})
    server.seed(node_object("node-2"))  # not selected
    response = core.list_node(field_selector=f"metadata.name={NODE}", watch=True, resource_version=version,
                              allow_watch_bookmarks=True, timeout_seconds=1, _preload_content=False)
    try:
        events = [json.loads(line) for line in iter_resp_lines(response)]
    finally:
        response.release_conn()
    assert [(e["type"], e["object"]["metadata"]["labels"]["step"]) for e in events] == [
        ("MODIFIED", "1"), ("MODIFIED", "2")]
    (watch,) = [r for r in server.requests("GET", r"/nodes$") if r.query.get("watch")]
    assert watch.query == {"fieldSelector": f"metadata.name={NODE}", "watch": "true", "resourceVersion": version,
                           "allowWatchBookmarks": "true", "timeoutSeconds": "1"}


def test_pods_read_patch_list_and_missing(server: ApiServer, core: CoreV1) -> None:
    server.seed(pod_object("web"))
    server.seed(pod_object("job", namespace="batch"))
    server.seed(pod_object("elsewhere", node="node-2"))
    pod = core.read_namespaced_pod("web", "default", _request_timeout=5)
    assert pod["status"]["qosClass"] == "BestEffort" and pod["spec"]["containers"][0]["name"] == "main"
    patched = core.patch_namespaced_pod("web", "default", {"metadata": {"annotations": {"bound": "{}"}}},
                                        _request_timeout=5)
    assert patched["metadata"]["annotations"] == {"bound": "{}"} and patched["metadata"]["labels"] == {"app": "batch"}
    assert server.requests("PATCH")[-1].content_type == "application/strategic-merge-patch+json"
    listed = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}", _request_timeout=5)
    assert sorted((p["metadata"]["namespace"], p["metadata"]["name"]) for p in listed["items"]) == [
        ("batch", "job"), ("default", "web")]
    with pytest.raises(NotFoundException):
        core.read_namespaced_pod("web", "batch")
    with pytest.raises(NotFoundException):
        core.patch_namespaced_pod("gone", "default", {"metadata": {"labels": {"a": "b"}}})


def test_event_is_created_with_its_camel_case_fields(server: ApiServer, core: CoreV1) -> None:
    created = core.create_namespaced_event("default", event_body())
    assert created["metadata"]["name"].startswith("web.")
    (stored,) = server.list_objects("events", "default")
    assert stored["involvedObject"] == event_body()["involvedObject"]
    assert (stored["reportingComponent"], stored["firstTimestamp"], stored["count"]) == (
        "koordlet", "2026-01-02T03:04:05+00:00", 1)
    assert server.requests("POST")[-1].content_type == ""  # as the generated client: the server takes JSON


def test_eviction_removes_the_pod_a_budget_answers_429_and_a_missing_pod_404(server: ApiServer,
                                                                            core: CoreV1) -> None:
    server.seed(pod_object("web"))
    server.seed(pod_object("web-2"))
    server.seed({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                 "metadata": {"name": "pdb", "namespace": "default"},
                 "spec": {"selector": {"matchLabels": {"app": "batch"}}, "minAvailable": 2}})
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod_eviction("web", "default", EVICTION)
    assert caught.value.status == 429
    assert server.get_object("pods", "web", "default") is not None
    server.seed(pod_object("web-3"))
    answer = core.create_namespaced_pod_eviction("web", "default", EVICTION)
    assert answer["kind"] == "Status" and answer["status"] == "Success"
    assert server.get_object("pods", "web", "default") is None
    with pytest.raises(NotFoundException):
        core.create_namespaced_pod_eviction("web", "default", EVICTION)


def test_empty_names_are_refused_before_any_request(server: ApiServer, core: CoreV1, custom: CustomObjects) -> None:
    with pytest.raises(ValueError, match="name"):
        core.read_node("")
    with pytest.raises(ValueError, match="namespace"):
        core.read_namespaced_pod("web", "")
    with pytest.raises(ValueError, match="plural"):
        custom.get_cluster_custom_object("slo.koordinator.sh", "v1alpha1", "", NODE)
    assert server.requests() == []


# ------------------------------------------------------------------------------------- custom objects


def test_custom_object_create_get_replace_status_and_list(server: ApiServer, custom: CustomObjects) -> None:
    created = custom.create_cluster_custom_object(*METRIC, node_metric())
    assert created["metadata"]["name"] == NODE and created["spec"]["metricCollectPolicy"]["reportIntervalSeconds"] == 60
    with pytest.raises(ConflictException) as exists:
        custom.create_cluster_custom_object(*METRIC, node_metric())
    assert exists.value.status == 409 and json.loads(exists.value.body)["reason"] == "AlreadyExists"
    got = custom.get_cluster_custom_object(*METRIC, NODE)
    assert got == created
    with pytest.raises(NotFoundException):
        custom.get_cluster_custom_object(*METRIC, "node-9")
    got["spec"]["metricCollectPolicy"]["reportIntervalSeconds"] = 30
    replaced = custom.replace_cluster_custom_object(*METRIC, NODE, got)
    assert replaced["spec"]["metricCollectPolicy"]["reportIntervalSeconds"] == 30
    with pytest.raises(ConflictException):  # got's resourceVersion is stale now
        custom.replace_cluster_custom_object(*METRIC, NODE, got)
    replaced["status"] = {"updateTime": "2026-01-02T03:04:05Z"}
    with_status = custom.replace_cluster_custom_object_status(*METRIC, NODE, replaced)
    assert with_status["status"] == {"updateTime": "2026-01-02T03:04:05Z"}
    assert server.get_object("nodemetrics", NODE)["status"] == with_status["status"]
    custom.create_cluster_custom_object(*METRIC, node_metric("node-2"))
    listed = custom.list_cluster_custom_object(*METRIC, field_selector=f"metadata.name={NODE}")
    assert [o["metadata"]["name"] for o in listed["items"]] == [NODE]
    assert len(custom.list_cluster_custom_object(*METRIC)["items"]) == 2


def test_an_object_the_crd_schema_rejects_is_422(server: ApiServer, custom: CustomObjects) -> None:
    bad = node_metric()
    bad["spec"]["metricCollectPolicy"]["reportIntervalSeconds"] = "often"
    with pytest.raises(UnprocessableEntityException) as caught:
        custom.create_cluster_custom_object(*METRIC, bad)
    assert caught.value.status == 422
    assert "reportIntervalSeconds" in caught.value.body


def test_custom_object_watch_lines(server: ApiServer, custom: CustomObjects) -> None:
    response = custom.list_cluster_custom_object(*SLO, field_selector=f"metadata.name={NODE}", _preload_content=False)
    version = json.loads(drain(response))["metadata"]["resourceVersion"]
    server.seed({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": NODE},
                 "spec": {}})
    watch = custom.list_cluster_custom_object(*SLO, field_selector=f"metadata.name={NODE}", watch=True,
                                              resource_version=version, allow_watch_bookmarks=True, timeout_seconds=1,
                                              _preload_content=False)
    try:
        events = [json.loads(line) for line in iter_resp_lines(watch)]
    finally:
        watch.release_conn()
    assert [(e["type"], e["object"]["kind"]) for e in events] == [("ADDED", "NodeSLO")]


# ------------------------------------------------------------------------------------------ timeouts


def test_the_request_timeout_reaches_the_socket(server: ApiServer, core: CoreV1) -> None:
    """A watch the server keeps open for 30 s, read with a 0.5 s timeout: the read gives up in time."""
    server.seed(node_object())
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        core.list_node(watch=True, timeout_seconds=30, _request_timeout=0.5)  # total, whole body read
    assert time.monotonic() - started < 5
    response = core.list_node(watch=True, resource_version=str(server.resource_version), timeout_seconds=30,
                              _preload_content=False, _request_timeout=(5, 0.5))  # (connect, read)
    started = time.monotonic()
    try:
        with pytest.raises(urllib3.exceptions.HTTPError):
            list(iter_resp_lines(response))
    finally:
        response.close()
    assert time.monotonic() - started < 5


def test_an_unreachable_server_is_a_transport_error(core: CoreV1) -> None:
    config = kubernetes.client.Configuration()
    config.host = "http://127.0.0.1:9"  # discard: nothing listens
    config.retries = False
    with kubernetes.client.ApiClient(config) as client:
        with pytest.raises(urllib3.exceptions.HTTPError):
            CoreV1(client).read_node(NODE, _request_timeout=2)


# --------------------------------------------------------------- the agent does not load generated code

_AGENT_CALLS = textwrap.dedent(
    """
    import json, sys, time

    def generated() -> list:
        return sorted(m for m in sys.modules if m == "kubernetes.client.api"
                      or m.startswith(("kubernetes.client.api.", "kubernetes.client.models.")))

    import koordlet.main
    after_import = generated()

    from koordlet.api.keys import LABEL_QOS_CLASS
    from koordlet.api.pod import PodMeta
    from koordlet.api.qos import KubeQoS
    from koordlet.config import parse_config
    from koordlet.events import PodEvents
    from koordlet.eviction import Evictor
    from koordlet.gpu.reporter import sync_node_labels
    from koordlet.kubeapi import CoreV1, CustomObjects
    from koordlet.metriccache import MetricCache
    from koordlet.nodelock import NodeLocker
    from koordlet.reporters.nodemetric import NodeMetricReporter
    from koordlet.statesinformer.informer import StatesInformer
    from koordlet.statesinformer.kube import KubeStates
    from kubernetes.client.exceptions import ApiException
    from kubernetes.watch.watch import iter_resp_lines

    kubeconfig, node, pod_uid = sys.argv[1:4]
    client = koordlet.agent.lifecycle.new_api_client(parse_config([f"-kubeconfig={kubeconfig}"], {"NODE_NAME": node}))
    core, custom = CoreV1(client), CustomObjects(client)
    out = {}

    class NoPods:
        name = "none"
        def list_pods(self):
            return ()

    # The agent's code paths: node and NodeSLO list + watch (an invalid NodeSLO: an Event), the evictor (read,
    # eviction, Event), pod Events, the node lock, the GPU labels, the NodeMetric status.
    informer = StatesInformer(NoPods())
    kube = KubeStates(node, core, custom, informer, resync_s=30)
    kube.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (informer.node() and kube.node_slo_handler.events_recorded):
        time.sleep(0.05)
    out["node_seen"] = informer.node() is not None
    out["slo_events"] = kube.node_slo_handler.events_recorded
    out["watchers_stopped"] = kube.stop(3.0)
    pod = PodMeta(name="web", namespace="default", uid=pod_uid, labels={LABEL_QOS_CLASS: "BE"},
                  kube_qos=KubeQoS.BESTEFFORT, phase="Running")
    out["evicted"] = Evictor(node, api_client=client).evict(pod, "BEMemoryEvict", "test").outcome.value
    PodEvents(node, client).warning(pod, "Probe", "a pod event")
    locker = NodeLocker(core)
    out["lock"] = locker.lock(node, "default", "web").owner
    out["released"] = locker.release(node, "default", "web")
    out["labelled"] = sync_node_labels(core, node, {"kubernetes.io/gpu-model": "H100"})
    out["nodemetric"] = NodeMetricReporter(node, MetricCache(), lambda: (), custom_api=custom,
                                           create_missing=True).report_once().value
    from koordlet.debug.authz import ApiAuthorizer
    from koordlet.kubeapi import AuthV1
    out["debug_authz"] = ApiAuthorizer(AuthV1(client), node).decide("reader").status  # reviewed, not granted

    # Every method once more, directly, with its errors and raw answers.
    core.read_node(node)
    core.patch_node(node, {"metadata": {"labels": {"direct": "yes"}}})
    core.list_node(field_selector=f"metadata.name={node}")
    watch = core.list_node(field_selector=f"metadata.name={node}", watch=True, timeout_seconds=1,
                           _preload_content=False)
    out["watch_lines"] = sum(1 for _ in iter_resp_lines(watch))
    watch.release_conn()
    core.read_namespaced_pod("other", "default")
    core.patch_namespaced_pod("other", "default", {"metadata": {"annotations": {"a": "b"}}})
    out["pods"] = len(core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")["items"])
    core.create_namespaced_event("default", {"apiVersion": "v1", "kind": "Event",
                                             "metadata": {"generateName": "x.", "namespace": "default"},
                                             "involvedObject": {"kind": "Node", "name": node}})
    core.create_namespaced_pod_eviction("other", "default", {"apiVersion": "policy/v1", "kind": "Eviction",
                                                             "metadata": {"name": "other"}})
    group, version, plural = "slo.koordinator.sh", "v1alpha1", "nodemetrics"
    metric = custom.get_cluster_custom_object(group, version, plural, node)
    custom.replace_cluster_custom_object(group, version, plural, node, metric)
    metric = custom.get_cluster_custom_object(group, version, plural, node)
    custom.replace_cluster_custom_object_status(group, version, plural, node, metric)
    custom.create_cluster_custom_object(group, version, plural, {"apiVersion": f"{group}/{version}",
                                                                 "kind": "NodeMetric", "metadata": {"name": "n2"}})
    custom.list_cluster_custom_object(group, version, plural)
    errors = []
    for call in (lambda: core.read_node("missing"), lambda: core.read_namespaced_pod("other", "default"),
                 lambda: custom.get_cluster_custom_object(group, version, plural, "missing"),
                 lambda: custom.create_cluster_custom_object(group, version, plural, metric)):
        try:
            call()
        except ApiException as exc:
            errors.append(exc.status)
    out["errors"] = errors
    out["after_calls"] = generated()
    out["after_import"] = after_import
    client.close()

    import kubernetes.client
    kubernetes.client.CoreV1Api  # the control: the check does see the generated modules once they load
    out["control"] = len(generated())
    print(json.dumps(out))
    """
)


def test_the_agent_never_loads_the_generated_api_classes_or_models(tmp_path: Path) -> None:
    with ApiServer() as server:
        server.add_token(TOKEN, "koordlet", ("system:masters",))
        path = write_kubeconfig(server, tmp_path / "kubeconfig", Credentials("koordlet", token=TOKEN))
        server.seed(node_object())
        server.seed({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": NODE},
                     "spec": {"resourceQOSStrategy": {"beClass": {"resctrlQOS": {"catRangeStartPercent": 80,
                                                                                 "catRangeEndPercent": 20}}}}})
        web = server.seed({**pod_object("web"), "metadata": {"name": "web", "namespace": "default",
                                                             "labels": {"koordinator.sh/qosClass": "BE"}}})
        server.seed(pod_object("other"))
        server.add_token("reader", "alice")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("KUBECONFIG", None)
        done = subprocess.run([sys.executable, "-c", _AGENT_CALLS, str(path), NODE, web["metadata"]["uid"]],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout.splitlines()[-1])
        methods_seen = {(r.verb, r.path) for r in server.requests() if r.status < 400}
    assert out["after_import"] == [] and out["after_calls"] == []
    assert out["control"] > 100
    assert out["node_seen"] and out["slo_events"] == 1 and out["watchers_stopped"]
    assert out["evicted"] == "evicted"
    assert out["lock"] == "default/web" and out["released"] is True and out["labelled"] is True
    assert out["nodemetric"] == "updated" and out["debug_authz"] == 403
    assert out["watch_lines"] >= 1 and out["pods"] == 1
    assert out["errors"] == [404, 404, 404, 409]
    assert {("PATCH", "/api/v1/namespaces/default/pods/other"), ("POST", "/api/v1/namespaces/default/events"),
            ("POST", "/api/v1/namespaces/default/pods/web/eviction"),
            ("PUT", f"/apis/slo.koordinator.sh/v1alpha1/nodemetrics/{NODE}/status")} <= methods_seen
