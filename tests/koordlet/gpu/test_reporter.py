"""The Device object through a real API server that validates it against deploy/chart/koordlet-py/files/crds."""


import pytest
from kubernetes.client.exceptions import ApiException

from koordlet.api import device as api
from koordlet.gpu.reporter import DeviceReporter, ReportResult, sync_node_labels
from koordlet.gpu.service import GPUService
from tests.koordlet.gpu.fake_nvml import FakeNvml

NODE = "node-a"


def stored(kube) -> dict:
    return kube.custom.get_cluster_custom_object(api.DEVICE_GROUP, api.DEVICE_VERSION, api.DEVICE_PLURAL, NODE)


def test_device_is_created_accepted_by_the_crd_schema_and_then_left_alone(kube, service) -> None:
    node = kube.node(NODE)
    reporter = DeviceReporter(NODE, custom_api=kube.agent_custom)
    assert service.report(reporter, node_uid=node["metadata"]["uid"]) is ReportResult.CREATED
    obj = stored(kube)
    assert [d["minor"] for d in obj["spec"]["devices"]] == [0, 1]
    assert obj["spec"]["devices"][0]["resources"][api.RESOURCE_GPU_MEMORY] == "81559Mi"
    assert obj["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    assert not any(r.status >= 300 for r in kube.server.requests("POST")), "no warnings or rejections"
    kube.server.clear_requests()
    assert service.report(reporter) is ReportResult.UNCHANGED
    assert kube.server.requests("PUT") == []


def test_health_flip_updates_the_device_and_keeps_foreign_labels(kube, service) -> None:
    kube.node(NODE)
    reporter = DeviceReporter(NODE, custom_api=kube.agent_custom)
    service.report(reporter)
    obj = stored(kube)
    obj["metadata"]["labels"]["team.example.com/owner"] = "ml"
    kube.custom.replace_cluster_custom_object(api.DEVICE_GROUP, api.DEVICE_VERSION, api.DEVICE_PLURAL, NODE, obj)
    service.board.set(service.inventory.gpus[1].uuid, False, "Xid79", "GPU has fallen off the bus")
    assert service.report(reporter) is ReportResult.UPDATED
    obj = stored(kube)
    entry = obj["spec"]["devices"][1]
    assert entry["health"] is False
    assert entry["conditions"][0]["reason"] == "Xid79"
    assert obj["metadata"]["labels"]["team.example.com/owner"] == "ml"
    assert obj["metadata"]["labels"][api.LABEL_DEVICE_GPU_MODEL] == "NVIDIA-H100-80GB-HBM3"
    service.board.set(service.inventory.gpus[1].uuid, True)
    assert service.report(reporter) is ReportResult.UPDATED
    assert stored(kube)["spec"]["devices"][1]["health"] is True


def test_update_conflict_is_retried(kube, service) -> None:
    kube.node(NODE)
    reporter = DeviceReporter(NODE, custom_api=kube.agent_custom)
    service.report(reporter)
    service.board.set(service.inventory.gpus[0].uuid, False, "Xid48")
    kube.server.fail_next("PUT", rf"/devices/{NODE}$", status=409)
    assert service.report(reporter) is ReportResult.UPDATED
    assert stored(kube)["spec"]["devices"][0]["health"] is False


def test_schema_rejects_what_koordinator_would_reject(kube, service) -> None:
    """Sanity of the check above: the server does validate Device objects."""
    bad = service.device_object(NODE)
    bad["spec"]["devices"][0]["conditions"][0]["reason"] = "not a reason"
    with pytest.raises(ApiException) as info:
        kube.custom.create_cluster_custom_object(api.DEVICE_GROUP, api.DEVICE_VERSION, api.DEVICE_PLURAL, bad)
    assert info.value.status == 422


def test_node_gets_seed_004_gpu_labels_once(kube, service) -> None:
    kube.node(NODE)
    labels = api.node_gpu_labels(service.inventory.model, service.inventory.driver_version)
    assert sync_node_labels(kube.agent_core, NODE, labels) is True
    assert kube.core.read_node(NODE).metadata.labels["kubernetes.io/gpu-model"] == "NVIDIA-H100-80GB-HBM3"
    assert kube.core.read_node(NODE).metadata.labels["kubernetes.io/gpu-driver"] == "580.159.04"
    assert sync_node_labels(kube.agent_core, NODE, labels) is False


def test_service_is_off_on_a_node_without_nvml(tmp_path) -> None:
    assert GPUService.start(FakeNvml(library=False), sys_dir=str(tmp_path / "sys")) is None


def test_service_health_thread_applies_xid_events(service) -> None:
    uuid = service.inventory.gpus[0].uuid
    generation = service.board.generation
    service.session.nvml.inject_xid(0, 79)
    service.board.wait_for_change(generation, timeout_s=5)
    assert service.board.get(uuid).reason == "Xid79"
