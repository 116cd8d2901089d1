"""NodeSLO, NodeMetric and Device through CustomObjectsApi: schema validation, pruning, status."""

from __future__ import annotations

import copy
import json

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from tests.support.apiserver import ApiServer

SLO = ("slo.koordinator.sh", "v1alpha1", "nodeslos")
METRIC = ("slo.koordinator.sh", "v1alpha1", "nodemetrics")
DEVICE = ("scheduling.koordinator.sh", "v1alpha1", "devices")


def _qos_class(group_identity: int, wmark_min_adj: int) -> dict:
    return {
        "cpuQOS": {"enable": True, "groupIdentity": group_identity, "schedIdle": 0, "coreExpeller": False},
        "memoryQOS": {"enable": False, "minLimitPercent": 0, "lowLimitPercent": 0, "throttlingPercent": 0,
                      "wmarkRatio": 95, "wmarkScalePermill": 20, "wmarkMinAdj": wmark_min_adj,
                      "priorityEnable": 0, "priority": 0, "oomKillGroup": 0, "pageCacheEnable": False,
                      "pageCacheLimitPercent": 0, "pageCacheLimitSize": 0, "pageCacheReclaimSync": False},
        "resctrlQOS": {"enable": False, "catRangeStartPercent": 0, "catRangeEndPercent": 100, "mbaPercent": 100},
        "blkioQOS": {"enable": False, "blocks": [{"name": "/dev/vda", "type": "device",
                                                  "ioCfg": {"readIOPS": 1000, "ioWeightPercent": 100}}]},
        "networkQOS": {"enable": False, "ingressRequest": 0, "ingressLimit": "100M", "egressRequest": "10%",
                       "egressLimit": 100},
    }


def koordinator_node_slo(name: str = "node-1") -> dict:
    """A NodeSLO with the full docs/koordinator.md §5.2 field set, as koord-manager's slo-controller writes it."""
    return {
        "apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": name},
        "spec": {
            "resourceUsedThresholdWithBE": {
                "enable": True, "cpuSuppressThresholdPercent": 65, "cpuSuppressMinPercent": 0,
                "cpuSuppressPolicy": "cpuset", "memoryEvictThresholdPercent": 70,
                "memoryEvictLowerPercent": 68, "memoryAllocatableEvictThresholdPercent": 120,
                "memoryAllocatableEvictLowerPercent": 110, "cpuEvictBESatisfactionUpperPercent": 80,
                "cpuEvictBESatisfactionLowerPercent": 60, "cpuEvictBEUsageThresholdPercent": 90,
                "cpuEvictTimeWindowSeconds": 300, "cpuEvictThresholdPercent": 90, "cpuEvictLowerPercent": 88,
                "cpuAllocatableEvictThresholdPercent": 120, "cpuAllocatableEvictLowerPercent": 110,
                "cpuEvictPolicy": "evictByRealLimit", "evictEnabledPriorityThreshold": 5999,
                "allocatableEvictPriorityThreshold": 7999},
            "resourceQOSStrategy": {
                "policies": {"cpuPolicy": "groupIdentity", "netQOSPolicy": "tc"},
                "lsrClass": _qos_class(2, -25), "lsClass": _qos_class(2, -25), "beClass": _qos_class(-1, 50),
                "systemClass": _qos_class(0, 0), "cgroupRoot": {"blkioQOS": {"enable": False}}},
            "cpuBurstStrategy": {"policy": "none", "cpuBurstPercent": 1000, "cfsQuotaBurstPercent": 300,
                                 "cfsQuotaBurstPeriodSeconds": -1, "sharePoolThresholdPercent": 50},
            "systemStrategy": {"minFreeKbytesFactor": 100, "watermarkScaleFactor": 150, "memcgReapBackGround": 0,
                               "schedGroupIdentityEnabled": 1, "schedIdleSaverWmark": 0,
                               "schedFeatures": {"ID_ABSOLUTE_EXPEL": True}, "pageCacheLimitEnabled": 0,
                               "totalNetworkBandwidth": "0"},
            "extensions": {"gpuPolicy": {"enable": True, "nested": [1, "x"]}},
            "hostApplications": [{"name": "nginx", "priority": "koord-prod", "qos": "LS",
                                  "cgroupPath": {"base": "CgroupRoot", "parentDir": "host-latency-sensitive",
                                                 "relativePath": "nginx"},
                                  "strategy": {}}]},  # Koordinator's HostApplicationStrategy has no field
    }


def _node_metric(name: str = "node-1") -> dict:
    return {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": {"name": name},
            "spec": {"metricCollectPolicy": {"aggregateDurationSeconds": 300, "reportIntervalSeconds": 60,
                                             "nodeAggregatePolicy": {"durations": ["5m0s", "10m0s", "30m0s"]},
                                             "nodeMemoryCollectPolicy": "usageWithoutPageCache"}}}


def _metric_status() -> dict:
    usage = {"resources": {"cpu": "1500m", "memory": "2Gi"}}
    return {"updateTime": "2026-01-02T03:04:05Z",
            "nodeMetric": {"nodeUsage": usage, "systemUsage": {"resources": {"cpu": "100m", "memory": 1024}},
                           "aggregatedNodeUsages": [{"usage": {"avg": usage, "p50": usage, "p90": usage,
                                                               "p95": usage, "p99": usage},
                                                     "duration": "5m0s"}],
                           "numaUsages": [{"numaNodeID": 0, "nodeUsage": usage}]},
            "podsMetric": [{"name": "web", "namespace": "default", "podUsage": usage, "priority": "koord-prod",
                            "qos": "LS"}],
            "hostApplicationMetric": [{"name": "nginx", "usage": usage, "priority": "koord-prod", "qos": "LS"}],
            "prodReclaimableMetric": {"resource": usage}, "prodPeakMetric": {"resource": usage}}


def test_koordinator_node_slo_is_accepted_unchanged(custom: kubernetes.client.CustomObjectsApi) -> None:
    body = koordinator_node_slo()
    created = custom.create_cluster_custom_object(*SLO, body)
    assert created["spec"] == body["spec"]
    assert custom.get_cluster_custom_object(*SLO, "node-1")["spec"] == body["spec"]


@pytest.mark.parametrize(("path", "value", "field", "reason"), [
    (("resourceQOSStrategy", "lsrClass", "memoryQOS", "wmarkRatio"), 101,
     "spec.resourceQOSStrategy.lsrClass.memoryQOS.wmarkRatio", "FieldValueInvalid"),
    (("resourceUsedThresholdWithBE", "cpuSuppressThresholdPercent"), "65",
     "spec.resourceUsedThresholdWithBE.cpuSuppressThresholdPercent", "FieldValueTypeInvalid"),
    (("resourceQOSStrategy", "beClass", "memoryQOS", "wmarkScalePermill"), 0,
     "spec.resourceQOSStrategy.beClass.memoryQOS.wmarkScalePermill", "FieldValueInvalid"),
    (("cpuBurstStrategy", "cpuBurstPercent"), 10001, "spec.cpuBurstStrategy.cpuBurstPercent", "FieldValueInvalid"),
    (("systemStrategy", "totalNetworkBandwidth"), "fast", "spec.systemStrategy.totalNetworkBandwidth",
     "FieldValueInvalid"),
])
def test_invalid_node_slo_is_rejected_422_naming_the_field(
        custom: kubernetes.client.CustomObjectsApi, path: tuple[str, ...], value: object, field: str,
        reason: str) -> None:
    body = koordinator_node_slo()
    node = body["spec"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ApiException) as caught:
        custom.create_cluster_custom_object(*SLO, body)
    assert caught.value.status == 422
    status = json.loads(caught.value.body)
    assert status["reason"] == "Invalid" and field in status["message"]
    assert [(c["field"], c["reason"]) for c in status["details"]["causes"]] == [(field, reason)]


def test_unknown_fields_are_pruned_with_a_warning_or_rejected_when_strict(
        server: ApiServer, custom: kubernetes.client.CustomObjectsApi) -> None:
    body = koordinator_node_slo()
    body["spec"]["cpuBurstStrategy"]["futureKnob"] = 1
    body["spec"]["extensions"]["free"] = {"form": True}
    created, _, headers = custom.create_cluster_custom_object_with_http_info(*SLO, body)
    assert headers["Warning"] == '299 - "unknown field \\"spec.cpuBurstStrategy.futureKnob\\""'
    assert "futureKnob" not in created["spec"]["cpuBurstStrategy"]
    assert created["spec"]["extensions"]["free"] == {"form": True}  # preserve-unknown-fields
    with pytest.raises(ApiException) as caught:
        custom.create_cluster_custom_object(*SLO, koordinator_node_slo("node-2") | {"bogus": 1},
                                            field_validation="Strict")
    assert caught.value.status == 400
    assert json.loads(caught.value.body)["message"] == 'strict decoding error: unknown field "bogus"'


def test_strategic_merge_patch_is_unsupported_for_custom_objects(
        custom: kubernetes.client.CustomObjectsApi) -> None:
    custom.create_cluster_custom_object(*SLO, koordinator_node_slo())
    with pytest.raises(ApiException) as caught:
        custom.patch_cluster_custom_object(*SLO, "node-1", {"spec": {}},
                                           _content_type="application/strategic-merge-patch+json")
    assert caught.value.status == 415
    patched = custom.patch_cluster_custom_object(*SLO, "node-1",
                                                 {"spec": {"cpuBurstStrategy": {"policy": "auto"}}})
    assert patched["spec"]["cpuBurstStrategy"]["policy"] == "auto"
    assert patched["metadata"]["generation"] == 2


def test_node_metric_create_and_main_endpoint_ignore_status(custom: kubernetes.client.CustomObjectsApi) -> None:
    body = _node_metric() | {"status": _metric_status()}
    created = custom.create_cluster_custom_object(*METRIC, body)
    assert "status" not in created
    created["status"] = _metric_status()
    replaced = custom.replace_cluster_custom_object(*METRIC, "node-1", created)
    assert "status" not in replaced


def test_node_metric_status_subresource_updates_status_only(custom: kubernetes.client.CustomObjectsApi) -> None:
    created = custom.create_cluster_custom_object(*METRIC, _node_metric())
    update = copy.deepcopy(created)
    update["status"] = _metric_status()
    update["spec"]["metricCollectPolicy"]["reportIntervalSeconds"] = 999
    reported = custom.replace_cluster_custom_object_status(*METRIC, "node-1", update)
    assert reported["status"]["nodeMetric"]["nodeUsage"]["resources"]["cpu"] == "1500m"
    assert reported["spec"]["metricCollectPolicy"]["reportIntervalSeconds"] == 60
    assert reported["metadata"]["generation"] == 1
    patched = custom.patch_cluster_custom_object_status(*METRIC, "node-1",
                                                        {"status": {"updateTime": "2026-01-02T03:05:05Z"}})
    assert patched["status"]["updateTime"] == "2026-01-02T03:05:05Z"
    assert patched["status"]["podsMetric"][0]["name"] == "web"


def test_node_metric_status_update_with_stale_resource_version_conflicts(
        custom: kubernetes.client.CustomObjectsApi) -> None:
    stale = custom.create_cluster_custom_object(*METRIC, _node_metric())
    custom.patch_cluster_custom_object_status(*METRIC, "node-1", {"status": {"updateTime": "2026-01-02T03:04:05Z"}})
    stale["status"] = _metric_status()
    with pytest.raises(ApiException) as caught:
        custom.replace_cluster_custom_object_status(*METRIC, "node-1", stale)
    assert caught.value.status == 409 and "the object has been modified" in caught.value.body
    fresh = custom.get_cluster_custom_object_status(*METRIC, "node-1")
    fresh["status"] = _metric_status()
    assert custom.replace_cluster_custom_object_status(*METRIC, "node-1", fresh)["status"] == _metric_status()


def test_node_metric_status_is_validated(custom: kubernetes.client.CustomObjectsApi) -> None:
    custom.create_cluster_custom_object(*METRIC, _node_metric())
    with pytest.raises(ApiException) as caught:
        custom.patch_cluster_custom_object_status(*METRIC, "node-1", {"status": {"updateTime": "yesterday"}})
    assert caught.value.status == 422 and "status.updateTime" in caught.value.body


def test_an_enum_refuses_a_value_it_does_not_list(custom: kubernetes.client.CustomObjectsApi) -> None:
    body = _node_metric()
    body["spec"]["metricCollectPolicy"]["nodeMemoryCollectPolicy"] = "usageWithEverything"
    with pytest.raises(ApiException) as caught:
        custom.create_cluster_custom_object(*METRIC, body)
    status = json.loads(caught.value.body)
    assert [(c["field"], c["reason"]) for c in status["details"]["causes"]] == [
        ("spec.metricCollectPolicy.nodeMemoryCollectPolicy", "FieldValueNotSupported")]


def test_device_with_gpus_is_accepted_and_health_defaults_to_false(
        custom: kubernetes.client.CustomObjectsApi) -> None:
    """Koordinator's Device CRD: no status subresource (status is written with the object, as its scheduler does),
    any device type (Koordinator's Go API names gpu, fpga and rdma; its schema lists none), condition types as
    Kubernetes' condition pattern allows."""
    gpu = {"type": "gpu", "id": "GPU-4c3b", "minor": 0, "health": True,
           "labels": {"node.koordinator.sh/gpu-model": "H100"},
           "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "85899345920",
                         "koordinator.sh/gpu-memory-ratio": "100"},
           "topology": {"socketID": -1, "nodeID": 0, "pcieID": "pci0000:17", "busID": "0000:18:00.0"},
           "conditions": [{"type": "Healthy", "status": "True", "reason": "DeviceHealthy", "message": "",
                           "lastTransitionTime": "2026-01-02T03:04:05Z"}]}
    unhealthy = {"type": "gpu", "id": "GPU-9f1a", "minor": 1}
    body = {"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Device",
            "metadata": {"name": "node-1", "ownerReferences": [{"apiVersion": "v1", "kind": "Node",
                                                                "name": "node-1", "uid": "u-1",
                                                                "controller": True,
                                                                "blockOwnerDeletion": True}]},
            "spec": {"devices": [gpu, unhealthy]}}
    created = custom.create_cluster_custom_object(*DEVICE, body)
    assert created["spec"]["devices"][0] == gpu
    assert created["spec"]["devices"][1]["health"] is False
    allocations = {"allocations": [{"type": "gpu", "entries": [{"name": "job", "namespace": "default",
                                                                "uuid": "p-1", "minors": [0]}]}]}
    patched = custom.patch_cluster_custom_object(*DEVICE, "node-1", {"status": allocations})
    assert patched["status"] == allocations
    with pytest.raises(ApiException) as no_subresource:
        custom.patch_cluster_custom_object_status(*DEVICE, "node-1", {"status": allocations})
    assert no_subresource.value.status == 404
    other = copy.deepcopy(body) | {"metadata": {"name": "node-2"}}
    other["spec"]["devices"][0]["type"] = "npu"
    assert custom.create_cluster_custom_object(*DEVICE, other)["spec"]["devices"][0]["type"] == "npu"
    bad = copy.deepcopy(body) | {"metadata": {"name": "node-3"}}
    bad["spec"]["devices"][0]["conditions"][0]["type"] = "not a condition type"
    with pytest.raises(ApiException) as caught:
        custom.create_cluster_custom_object(*DEVICE, bad)
    assert caught.value.status == 422 and "spec.devices[0].conditions[0].type" in caught.value.body


def test_custom_objects_list_and_delete(custom: kubernetes.client.CustomObjectsApi) -> None:
    custom.create_cluster_custom_object(*SLO, koordinator_node_slo("node-1"))
    custom.create_cluster_custom_object(*SLO, koordinator_node_slo("node-2"))
    listed = custom.list_cluster_custom_object(*SLO)
    assert listed["kind"] == "NodeSLOList" and [o["metadata"]["name"] for o in listed["items"]] == ["node-1",
                                                                                                    "node-2"]
    custom.delete_cluster_custom_object(*SLO, "node-1")
    with pytest.raises(ApiException) as caught:
        custom.get_cluster_custom_object(*SLO, "node-1")
    assert caught.value.status == 404
