"""Nodes, pods, events and discovery through the real kubernetes client."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from tests.support.apiserver import MAX_REQUEST_BYTES, ApiServer, ssl_context


def _node(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"zone": "a"}},
            "status": {"capacity": {"cpu": "8", "memory": "16Gi"}, "allocatable": {"cpu": "7"},
                       "conditions": [{"type": "Ready", "status": "True"},
                                      {"type": "MemoryPressure", "status": "False"}]}}


def _pod(name: str, node: str, namespace: str = "default", labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {"app": name}},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "localhost/busybox",
                                                      "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                                                    "limits": {"cpu": "1", "memory": "1Gi"}}}]}}


def test_node_create_get_list_keeps_status_and_sets_metadata(core: kubernetes.client.CoreV1Api) -> None:
    created = core.create_node(_node("node-1"))
    assert created.metadata.uid and int(created.metadata.resource_version) > 0
    node = core.read_node("node-1")
    assert node.status.capacity == {"cpu": "8", "memory": "16Gi"}
    assert [n.metadata.name for n in core.list_node(label_selector="zone=a").items] == ["node-1"]
    assert core.list_node(label_selector="zone!=a").items == []


def test_node_strategic_merge_patch_merges_labels_and_deletes_with_null(core: kubernetes.client.CoreV1Api) -> None:
    core.create_node(_node("node-1"))
    core.patch_node("node-1", {"metadata": {"labels": {"gpu": "true"},
                                            "annotations": {"node.koordinator.sh/reservation": "{}"}}})
    patched = core.patch_node("node-1", {"metadata": {"labels": {"zone": None}}})
    assert patched.metadata.labels == {"gpu": "true"}
    assert patched.metadata.annotations == {"node.koordinator.sh/reservation": "{}"}


def test_node_merge_patch_and_json_patch_are_both_understood(core: kubernetes.client.CoreV1Api) -> None:
    core.create_node(_node("node-1"))
    core.patch_node("node-1", {"metadata": {"annotations": {"a": "1"}}},
                    _content_type="application/merge-patch+json")
    patched = core.patch_node("node-1", [{"op": "add", "path": "/metadata/annotations/b~1c", "value": "2"}])
    assert patched.metadata.annotations == {"a": "1", "b/c": "2"}


def test_node_status_patch_merges_conditions_by_type_and_main_patch_ignores_status(
        core: kubernetes.client.CoreV1Api) -> None:
    core.create_node(_node("node-1"))
    status = core.patch_node_status("node-1", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    assert [(c.type, c.status) for c in status.status.conditions] == [("Ready", "False"),
                                                                      ("MemoryPressure", "False")]
    core.patch_node("node-1", {"status": {"allocatable": {"cpu": "1"}}})
    assert core.read_node("node-1").status.allocatable == {"cpu": "7"}


def test_replace_with_stale_resource_version_is_a_409_conflict(core: kubernetes.client.CoreV1Api) -> None:
    stale = core.create_node(_node("node-1"))
    core.patch_node("node-1", {"metadata": {"labels": {"x": "1"}}})
    stale.metadata.labels = {"y": "2"}
    with pytest.raises(ApiException) as caught:
        core.replace_node("node-1", stale)
    assert caught.value.status == 409
    fresh = core.read_node("node-1")
    fresh.metadata.labels = {"y": "2"}
    assert core.replace_node("node-1", fresh).metadata.labels == {"y": "2"}


def test_patch_carrying_a_stale_resource_version_is_rejected(core: kubernetes.client.CoreV1Api) -> None:
    created = core.create_node(_node("node-1"))
    core.patch_node("node-1", {"metadata": {"labels": {"x": "1"}}})
    with pytest.raises(ApiException) as caught:
        core.patch_node("node-1", {"metadata": {"resourceVersion": created.metadata.resource_version,
                                                "labels": {"x": "2"}}})
    assert caught.value.status == 409


def test_no_op_patch_keeps_the_resource_version(core: kubernetes.client.CoreV1Api) -> None:
    created = core.create_node(_node("node-1"))
    again = core.patch_node("node-1", {"metadata": {"labels": {"zone": "a"}}})
    assert again.metadata.resource_version == created.metadata.resource_version


def test_pod_create_resets_status_to_pending_with_qos_class(core: kubernetes.client.CoreV1Api) -> None:
    pod = core.create_namespaced_pod("default", _pod("web", "node-1"))
    assert (pod.status.phase, pod.status.qos_class) == ("Pending", "Guaranteed")
    running = core.patch_namespaced_pod_status("web", "default", {"status": {"phase": "Running"}})
    assert running.status.phase == "Running"


def test_pods_list_across_namespaces_by_node_name(core: kubernetes.client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", _pod("a", "node-1"))
    core.create_namespaced_pod("batch", _pod("b", "node-1", namespace="batch"))
    core.create_namespaced_pod("batch", _pod("c", "node-2", namespace="batch"))
    on_node = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=node-1")
    assert sorted((p.metadata.namespace, p.metadata.name) for p in on_node.items) == [("batch", "b"),
                                                                                      ("default", "a")]
    assert [p.metadata.name for p in core.list_namespaced_pod("batch").items] == ["b", "c"]
    assert "batch" in {ns.metadata.name for ns in core.list_namespace().items}


def test_pod_annotation_patch_get_and_delete(core: kubernetes.client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", _pod("web", "node-1"))
    core.patch_namespaced_pod("web", "default", {"metadata": {"annotations": {"koordinator.sh/cpuBurst": "{}"}}})
    assert core.read_namespaced_pod("web", "default").metadata.annotations == {"koordinator.sh/cpuBurst": "{}"}
    deleted = core.delete_namespaced_pod("web", "default")
    assert deleted.metadata.name == "web"
    with pytest.raises(ApiException) as caught:
        core.read_namespaced_pod("web", "default")
    assert caught.value.status == 404


def test_delete_with_finalizers_only_marks_the_object(core: kubernetes.client.CoreV1Api) -> None:
    pod = _pod("web", "node-1")
    pod["metadata"]["finalizers"] = ["example.com/keep"]
    core.create_namespaced_pod("default", pod)
    core.delete_namespaced_pod("web", "default")
    assert core.read_namespaced_pod("web", "default").metadata.deletion_timestamp is not None
    core.patch_namespaced_pod("web", "default", [{"op": "remove", "path": "/metadata/finalizers"}])
    assert core.list_namespaced_pod("default").items == []


def test_create_existing_object_is_409_already_exists(core: kubernetes.client.CoreV1Api) -> None:
    core.create_node(_node("node-1"))
    with pytest.raises(ApiException) as caught:
        core.create_node(_node("node-1"))
    assert caught.value.status == 409 and "AlreadyExists" in caught.value.body


def test_events_create_and_list_by_involved_object(core: kubernetes.client.CoreV1Api) -> None:
    event = {"metadata": {"generateName": "web."}, "involvedObject": {"kind": "Pod", "name": "web",
                                                                     "namespace": "default"},
             "reason": "evictPodSuccess", "message": "trigger by koordlet feature BEMemoryEvict",
             "type": "Warning", "source": {"component": "koordlet"}}
    created = core.create_namespaced_event("default", event)
    assert created.metadata.name.startswith("web.")
    found = core.list_namespaced_event("default", field_selector="involvedObject.name=web,reason=evictPodSuccess")
    assert [e.message for e in found.items] == ["trigger by koordlet feature BEMemoryEvict"]


def test_discovery_endpoints_answer_the_client(api_client: kubernetes.client.ApiClient) -> None:
    assert kubernetes.client.CoreApi(api_client).get_api_versions().versions == ["v1"]
    groups = {g.name for g in kubernetes.client.ApisApi(api_client).get_api_versions().groups}
    assert {"policy", "slo.koordinator.sh", "scheduling.koordinator.sh"} <= groups
    resources = kubernetes.client.CoreV1Api(api_client).get_api_resources()
    assert {"nodes", "nodes/status", "pods", "pods/eviction", "events"} <= {r.name for r in resources.resources}
    assert kubernetes.client.VersionApi(api_client).get_code().major == "1"


def test_seed_stores_objects_with_status_and_helpers_read_them(server: ApiServer,
                                                               core: kubernetes.client.CoreV1Api) -> None:
    pod = _pod("web", "node-1")
    pod["status"] = {"phase": "Running"}
    server.seed(pod)
    assert core.read_namespaced_pod("web", "default").status.phase == "Running"
    assert server.get_object("pods", "web", "default")["status"] == {"phase": "Running"}
    assert [p["metadata"]["name"] for p in server.list_objects("pods")] == ["web"]


@pytest.mark.parametrize(("method", "path", "code"), [
    ("GET", "/api/v1/namespaces/default/pods/web/log", 404), ("GET", "/api/v1/namespaces/default/nodes", 404),
    ("GET", "/apis/slo.koordinator.sh/v1alpha1/nodeslos/x/scale", 404), ("GET", "/nonsense", 404),
    ("GET", "/api/v1/namespaces/default/pods/web/eviction", 405), ("DELETE", "/api/v1/nodes", 405)])
def test_unknown_paths_and_verbs_answer_a_status_error(server: ApiServer, method: str, path: str,
                                                       code: int) -> None:
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(urllib.request.Request(server.url + path, method=method), timeout=5,
                               context=ssl_context(server))
    assert caught.value.code == code
    assert json.loads(caught.value.read())["kind"] == "Status"


def _post_chunked(server: ApiServer, path: str, chunks: list[bytes]) -> tuple[int, bytes]:
    """POST ``chunks`` as they go on the wire after the headers (Transfer-Encoding: chunked, as Go's client sends a
    body of unknown length, e.g. `kubectl create --raw -f FILE`)."""
    address = urllib.parse.urlsplit(server.url)
    connection = http.client.HTTPSConnection(address.hostname, address.port, timeout=10, context=ssl_context(server))
    try:
        connection.putrequest("POST", path)
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Transfer-Encoding", "chunked")
        connection.endheaders()
        for chunk in chunks:
            connection.send(chunk)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def _chunked(body: bytes, size: int) -> list[bytes]:
    pieces = [body[i:i + size] for i in range(0, len(body), size)]
    return [b"%x;ext=1\r\n%s\r\n" % (len(piece), piece) for piece in pieces] + [b"0\r\nTrailer: x\r\n\r\n"]


def test_a_chunked_request_body_is_read_whole_and_a_bad_or_oversized_one_is_refused(server: ApiServer) -> None:
    body = json.dumps(_node("chunked")).encode()
    status, answer = _post_chunked(server, "/api/v1/nodes", _chunked(body, 7))
    assert status == 201, answer
    assert server.get_object("nodes", "chunked")["metadata"]["labels"] == {"zone": "a"}
    # Each refused at its chunk-size line, before anything else is sent: nothing is left unread when the server closes.
    status, answer = _post_chunked(server, "/api/v1/nodes", [b"zz\r\n"])
    assert status == 400 and b"bad chunk size" in answer
    status, answer = _post_chunked(server, "/api/v1/nodes", [b"%x\r\n" % (MAX_REQUEST_BYTES + 1)])
    assert status == 413 and str(MAX_REQUEST_BYTES).encode() in answer
    assert [node["metadata"]["name"] for node in server.list_objects("nodes")] == ["chunked"]
