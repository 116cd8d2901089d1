"""pods/eviction (policy/v1) honours PodDisruptionBudgets stored in the server."""

from __future__ import annotations

import json

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from tests.support.apiserver import ApiServer


def _running_pod(server: ApiServer, name: str, app: str = "web", ready: bool = True) -> None:
    server.seed({"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
                 "spec": {"nodeName": "node-1", "containers": [{"name": "main", "image": "localhost/busybox"}]},
                 "status": {"phase": "Running",
                            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}})


def _evict(core: kubernetes.client.CoreV1Api, name: str) -> None:
    core.create_namespaced_pod_eviction(name, "default", {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": "default"}})


def _budget(policy: kubernetes.client.PolicyV1Api, **spec: object) -> None:
    policy.create_namespaced_pod_disruption_budget("default", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web-pdb"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, **spec}})


def test_eviction_without_budget_deletes_the_pod(server: ApiServer, core: kubernetes.client.CoreV1Api) -> None:
    _running_pod(server, "web-0")
    _evict(core, "web-0")
    assert server.get_object("pods", "web-0", "default") is None
    assert server.requests("POST", r"/pods/web-0/eviction$")[0].status == 201


def test_eviction_violating_min_available_is_429_and_keeps_the_pod(
        server: ApiServer, core: kubernetes.client.CoreV1Api, policy: kubernetes.client.PolicyV1Api) -> None:
    _running_pod(server, "web-0")
    _running_pod(server, "web-1")
    _budget(policy, minAvailable=2)
    with pytest.raises(ApiException) as caught:
        _evict(core, "web-0")
    assert caught.value.status == 429
    status = json.loads(caught.value.body)
    assert status["reason"] == "TooManyRequests"
    assert status["details"]["causes"][0]["reason"] == "DisruptionBudget"
    assert server.get_object("pods", "web-0", "default") is not None


def test_max_unavailable_percent_allows_two_evictions_then_refuses(
        server: ApiServer, core: kubernetes.client.CoreV1Api, policy: kubernetes.client.PolicyV1Api) -> None:
    for index in range(3):
        _running_pod(server, f"web-{index}")
    _running_pod(server, "other", app="other")
    _budget(policy, maxUnavailable="34%")  # ceil(3 × 0.34) = 2 of the 3 pods may be down
    _evict(core, "web-0")
    _evict(core, "web-1")
    with pytest.raises(ApiException) as caught:
        _evict(core, "web-2")
    assert caught.value.status == 429
    _evict(core, "other")  # not selected by the budget
    budget = policy.read_namespaced_pod_disruption_budget("web-pdb", "default")
    assert budget.status.disruptions_allowed == 0 and "web-1" in budget.status.disrupted_pods


def test_unready_and_pending_pods_can_be_evicted_despite_the_budget(
        server: ApiServer, core: kubernetes.client.CoreV1Api, policy: kubernetes.client.PolicyV1Api) -> None:
    _running_pod(server, "web-0")
    _running_pod(server, "web-1", ready=False)
    core.create_namespaced_pod("default", {"metadata": {"name": "web-2", "labels": {"app": "web"}},
                                           "spec": {"containers": [{"name": "main", "image": "x"}]}})
    _budget(policy, minAvailable=1)
    _evict(core, "web-1")  # unhealthy, and the healthy count still meets the budget
    _evict(core, "web-2")  # Pending
    assert [p["metadata"]["name"] for p in server.list_objects("pods", "default")] == ["web-0"]


def test_evicting_a_missing_pod_is_404(core: kubernetes.client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as caught:
        _evict(core, "ghost")
    assert caught.value.status == 404
