"""Node and NodeSLO watchers against the in-repo API server through koordlet's API client (koordlet.kubeapi)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import kubernetes.client
import pytest

from koordlet.api.nodeslo import default_node_slo_spec
from koordlet.kubeapi import CoreV1, CustomObjects, KubeClient
from koordlet.kubeclient.budget import Budget
from koordlet.statesinformer.informer import StatesInformer
from koordlet.statesinformer.kube import KubeStates, node_info_from_node
from tests.support.apiserver import ApiServer
from tests.support.waiting import wait_for

NODE = "node-1"


class NoPods:
    name = "none"

    def list_pods(self) -> tuple:
        return ()


def node_object(cpu: str = "8") -> dict:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE},
                     "annotations": {"node.koordinator.sh/cpu-normalization-ratio": "1.0"}},
        "status": {"capacity": {"cpu": cpu, "memory": "32Gi", "kubernetes.io/batch-cpu": "4000"},
                   "allocatable": {"cpu": "7800m", "memory": "31Gi"},
                   "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}]},
    }


def node_slo(spec: dict) -> dict:
    return {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": NODE},
            "spec": spec}


def quick_client(api_client: kubernetes.client.ApiClient) -> KubeClient:
    """The koordlet's client with a pushback probation of 0.2 s instead of 12 (a watch cut here is a test's)."""
    return KubeClient(api_client, Budget(probation_s=0.2))


@pytest.fixture
def states(api_client: kubernetes.client.ApiClient) -> Iterator[tuple[StatesInformer, KubeStates, list[str]]]:
    errors: list[str] = []
    informer = StatesInformer(NoPods(), count_error=errors.append)
    client = quick_client(api_client)
    kube = KubeStates(NODE, CoreV1(client), CustomObjects(client), informer, backoff_initial_s=0.05,
                      backoff_max_s=0.4, watch_timeout_s=(30, 30), count_error=errors.append)
    kube.start()
    try:
        yield informer, kube, errors
    finally:
        kube.stop(2.0)


def test_node_info_parses_quantities_in_koordinator_units() -> None:
    info = node_info_from_node(node_object())
    assert info.capacity == {"cpu": 8000, "memory": 32 << 30, "kubernetes.io/batch-cpu": 4000}
    assert info.allocatable == {"cpu": 7800, "memory": 31 << 30}
    assert info.annotations["node.koordinator.sh/cpu-normalization-ratio"] == "1.0"


def test_node_and_node_slo_arrive_and_follow_updates(server: ApiServer, api_client: kubernetes.client.ApiClient,
                                                     states: tuple[StatesInformer, KubeStates, list[str]]) -> None:
    informer, kube, _ = states
    server.seed(node_object())
    server.seed(node_slo({"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 50}}))
    assert wait_for(lambda: informer.node() is not None and informer.node_slo() != default_node_slo_spec())
    informer.sync_pods()
    assert informer.has_synced()
    assert informer.node_slo().resource_used_threshold_with_be.cpu_suppress_threshold_percent == 50
    assert kube.raw_node is not None
    core = kubernetes.client.CoreV1Api(api_client)
    core.patch_node(NODE, {"metadata": {"labels": {"pool": "colo"}}})
    assert wait_for(lambda: informer.node().labels.get("pool") == "colo")
    custom = kubernetes.client.CustomObjectsApi(api_client)
    custom.patch_cluster_custom_object("slo.koordinator.sh", "v1alpha1", "nodeslos", NODE,
                                       {"spec": {"resourceUsedThresholdWithBE": {"cpuSuppressThresholdPercent": 40}}})
    assert wait_for(lambda: informer.node_slo().resource_used_threshold_with_be.cpu_suppress_threshold_percent == 40)
    custom.delete_cluster_custom_object("slo.koordinator.sh", "v1alpha1", "nodeslos", NODE)
    assert wait_for(lambda: informer.node_slo() == default_node_slo_spec())
    # Selected by name, each listed once at resourceVersion 0 (the watch cache), then only watched, with bookmarks.
    requests = server.requests("GET", r"/(nodes|nodeslos)$")
    assert requests and all(r.query.get("fieldSelector") == "metadata.name=node-1" for r in requests)
    lists = [r for r in requests if r.query.get("watch") != "true"]
    assert sorted(r.path.rsplit("/", 1)[1] for r in lists) == ["nodes", "nodeslos"]
    assert all(r.query.get("resourceVersion") == "0" for r in lists)
    watches = [r for r in requests if r.query.get("watch") == "true"]
    assert all(r.query.get("allowWatchBookmarks") == "true" and r.query.get("resourceVersion") for r in watches)


def test_invalid_node_slo_keeps_last_good_and_records_one_event(
        server: ApiServer, api_client: kubernetes.client.ApiClient,
        states: tuple[StatesInformer, KubeStates, list[str]]) -> None:
    informer, kube, errors = states
    server.seed(node_object())
    server.seed(node_slo({"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 50}}))
    assert wait_for(lambda: informer.node_slo() != default_node_slo_spec())
    good = informer.node_slo()
    bad = {"resourceQOSStrategy": {"beClass": {"resctrlQOS": {"catRangeStartPercent": 80,
                                                              "catRangeEndPercent": 20}}}}
    custom = kubernetes.client.CustomObjectsApi(api_client)
    custom.patch_cluster_custom_object("slo.koordinator.sh", "v1alpha1", "nodeslos", NODE, {"spec": bad})
    assert wait_for(lambda: kube.node_slo_handler.events_recorded == 1)
    assert informer.node_slo() == good
    assert "nodeslo" in errors
    (event,) = server.list_objects("events", "default")
    assert event["reason"] == "InvalidNodeSLO" and event["type"] == "Warning"
    assert event["involvedObject"]["kind"] == "Node" and event["involvedObject"]["name"] == NODE
    assert "catRangeStartPercent" in event["message"]


def test_a_broken_watch_resumes_from_its_version_through_failures_without_a_list(
        server: ApiServer, states: tuple[StatesInformer, KubeStates, list[str]]) -> None:
    informer, kube, errors = states
    assert wait_for(lambda: kube.node_slo_watcher._response is not None)
    server.fail_next("GET", r"/nodeslos$", status=500, count=2)
    server.seed(node_object())
    server.clear_requests()
    # Cut the current NodeSLO watch as a load balancer would: the loop resumes the watch through the injected
    # failures, from the version it had, and never lists again (only a 410 would).
    kube.node_slo_watcher._response.shutdown()  # noqa: SLF001 - simulate a dropped connection
    assert wait_for(lambda: kube.node_slo_reflector.failures >= 3 and kube.node_slo_reflector.watching)
    assert errors.count("nodeslo") >= 3
    server.seed(node_slo({"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 33}}))
    assert wait_for(lambda: informer.node_slo().resource_used_threshold_with_be.cpu_suppress_threshold_percent == 33)
    again = server.requests("GET", r"/nodeslos$")
    assert len(again) >= 3 and all(r.query.get("watch") == "true" for r in again)
    assert informer.node() is not None


def test_stop_returns_quickly_while_watching(api_client: kubernetes.client.ApiClient) -> None:
    informer = StatesInformer(NoPods())
    kube = KubeStates(NODE, CoreV1(api_client), CustomObjects(api_client), informer)
    kube.start()
    assert wait_for(lambda: kube.node_watcher.synced.is_set() and kube.node_watcher._response is not None)
    stopped = threading.Event()
    threading.Thread(target=lambda: (kube.stop(3.0), stopped.set()), daemon=True).start()
    assert stopped.wait(2.0)
