"""Failure injection and the request log, as reporters and evictors use them in their tests."""

from __future__ import annotations

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from tests.support.apiserver import ApiServer

METRIC = ("slo.koordinator.sh", "v1alpha1", "nodemetrics")


def _create_metric(custom: kubernetes.client.CustomObjectsApi) -> None:
    custom.create_cluster_custom_object(*METRIC, {"apiVersion": "slo.koordinator.sh/v1alpha1",
                                                  "kind": "NodeMetric", "metadata": {"name": "node-1"}})


def test_next_n_matching_requests_fail_then_succeed(server: ApiServer,
                                                    custom: kubernetes.client.CustomObjectsApi) -> None:
    _create_metric(custom)
    failure = server.fail_next("PATCH", r"/nodemetrics/node-1/status$", status=409, count=2)
    patch = {"status": {"updateTime": "2026-01-02T03:04:05Z"}}
    for _ in range(2):
        with pytest.raises(ApiException) as caught:
            custom.patch_cluster_custom_object_status(*METRIC, "node-1", patch)
        assert caught.value.status == 409
    assert custom.patch_cluster_custom_object_status(*METRIC, "node-1", patch)["status"] == patch["status"]
    assert failure.remaining == 0
    assert [r.status for r in server.requests("PATCH", r"/status$")] == [409, 409, 200]
    assert server.requests("PATCH")[-1].body == patch


def test_injected_failure_only_hits_matching_verb_and_path(server: ApiServer,
                                                           core: kubernetes.client.CoreV1Api) -> None:
    server.fail_next("POST", r"/nodes$", status=500)
    core.list_node()  # GET is not matched
    with pytest.raises(ApiException) as caught:
        core.create_node({"metadata": {"name": "node-1"}})
    assert caught.value.status == 500
    core.create_node({"metadata": {"name": "node-1"}})


def test_429_carries_retry_after(server: ApiServer, core: kubernetes.client.CoreV1Api) -> None:
    server.fail_next("*", r"/pods/web/eviction$", status=429, retry_after_seconds=3, message="slow down")
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod_eviction("web", "default", {"apiVersion": "policy/v1", "kind": "Eviction",
                                                               "metadata": {"name": "web"}})
    assert caught.value.status == 429 and caught.value.headers["Retry-After"] == "3"
    assert "slow down" in caught.value.body


def test_clear_failures_and_clear_requests(server: ApiServer, core: kubernetes.client.CoreV1Api) -> None:
    server.fail_next("GET", r"/nodes", status=503, count=5)
    server.clear_failures()
    assert core.list_node().items == []
    assert len(server.requests("GET", r"/nodes$")) == 1
    server.clear_requests()
    assert server.requests() == []


def test_concurrent_clients_get_distinct_increasing_resource_versions(
        server: ApiServer, core: kubernetes.client.CoreV1Api) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=8) as pool:
        created = list(pool.map(lambda i: core.create_node({"metadata": {"name": f"node-{i}"}}), range(32)))
    versions = sorted(int(node.metadata.resource_version) for node in created)
    assert len(set(versions)) == 32 and versions[-1] <= server.resource_version


def test_requests_are_recorded_with_their_headers_and_the_user_the_server_saw(server: ApiServer) -> None:
    from tests.support.apiserver import Credentials, kube_client_config

    config = kube_client_config(server, Credentials("nobody"))  # neither a certificate nor a token
    with kubernetes.client.ApiClient(config) as anonymous:
        with pytest.raises(ApiException) as caught:
            kubernetes.client.CoreV1Api(anonymous).list_node()
        assert caught.value.status == 401 and '"reason": "Unauthorized"' in caught.value.body
    server.add_token("s3cret", "probe")
    config = kube_client_config(server, Credentials("probe", token="s3cret"))
    with kubernetes.client.ApiClient(config) as authorized:
        authorized.user_agent = "probe/1"
        with pytest.raises(ApiException) as caught:
            kubernetes.client.CoreV1Api(authorized).list_node()
        assert caught.value.status == 403
    denied, refused = server.requests("GET", r"/nodes$")
    assert (denied.status, denied.user) == (401, "") and "Authorization" not in denied.headers
    assert (refused.status, refused.user) == (403, "probe")
    assert refused.headers["Authorization"] == "Bearer s3cret" and refused.headers["User-Agent"] == "probe/1"
