from datetime import UTC, datetime

import pytest
import yaml

from koordlet.api import device as api
from koordlet.gpu.devicecr import (
    build_device,
    format_bytes_quantity,
    semantically_equal,
)
from koordlet.gpu.health import GPUHealth, HealthBoard
from koordlet.gpu.nvml import discover, open_nvml
from koordlet.gpu.reporter import DeviceReporter, ReportResult
from tests.koordlet.gpu.fake_nvml import H100_DRIVER, FakeNvml, h100_gpus

T0 = datetime(2026, 11, 23, 7, 0, 0, tzinfo=UTC)
T1 = datetime(2026, 11, 23, 8, 0, 0, tzinfo=UTC)


@pytest.fixture
def inventory(tmp_path):
    with open_nvml(FakeNvml(h100_gpus(2))) as session:
        return discover(session, sys_dir=str(tmp_path / "sys"))


def healthy(inventory) -> dict[str, GPUHealth]:
    return {g.uuid: GPUHealth(g.uuid, True) for g in inventory.gpus}


def test_device_object_carries_koordinator_gpu_entries(inventory) -> None:
    obj = build_device("node-a", inventory, healthy(inventory), node_uid="uid-1", now=T0)
    assert obj["apiVersion"] == "scheduling.koordinator.sh/v1alpha1" and obj["kind"] == "Device"
    assert obj["metadata"]["name"] == "node-a"
    owner = obj["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "Node" and owner["uid"] == "uid-1" and owner["controller"] is True
    assert obj["metadata"]["labels"] == {
        "node.koordinator.sh/gpu-vendor": "nvidia",
        "node.koordinator.sh/gpu-model": "NVIDIA-H100-80GB-HBM3",
        "node.koordinator.sh/gpu-driver-version": H100_DRIVER,
    }
    first = obj["spec"]["devices"][0]
    assert first["type"] == "gpu"
    assert first["id"] == inventory.gpus[0].uuid
    assert first["minor"] == 0
    assert first["health"] is True
    assert first["resources"] == {
        "koordinator.sh/gpu-core": "100",
        "koordinator.sh/gpu-memory": "81559Mi",
        "koordinator.sh/gpu-memory-ratio": "100",
    }
    assert first["topology"] == {"socketID": -1, "nodeID": -1, "pcieID": "", "busID": "0000:00:06.0"}
    assert first["conditions"][0]["type"] == "Healthy" and first["conditions"][0]["status"] == "True"
    assert [d["minor"] for d in obj["spec"]["devices"]] == [0, 1]


def test_unhealthy_gpu_has_health_false_and_xid_condition(inventory) -> None:
    uuid = inventory.gpus[1].uuid
    health = healthy(inventory) | {uuid: GPUHealth(uuid, False, "Xid79", "fallen off the bus")}
    obj = build_device("node-a", inventory, health, now=T0)
    entry = obj["spec"]["devices"][1]
    assert entry["health"] is False
    assert entry["conditions"][0]["status"] == "False"
    assert entry["conditions"][0]["reason"] == "Xid79"


def test_transition_time_kept_until_status_flips(inventory) -> None:
    first = build_device("node-a", inventory, healthy(inventory), now=T0)
    again = build_device("node-a", inventory, healthy(inventory), previous=first, now=T1)
    assert again["spec"]["devices"][0]["conditions"][0]["lastTransitionTime"] == "2026-11-23T07:00:00Z"
    assert semantically_equal(first, again)
    uuid = inventory.gpus[0].uuid
    flipped = build_device(
        "node-a", inventory, healthy(inventory) | {uuid: GPUHealth(uuid, False, "Xid79")}, previous=first, now=T1
    )
    assert flipped["spec"]["devices"][0]["conditions"][0]["lastTransitionTime"] == "2026-11-23T08:00:00Z"
    assert not semantically_equal(first, flipped)


def test_quantities_compare_by_value_and_foreign_labels_are_ignored(inventory) -> None:
    desired = build_device("node-a", inventory, healthy(inventory), now=T0)
    stored = yaml.safe_load(yaml.safe_dump(desired))
    stored["spec"]["devices"][0]["resources"]["koordinator.sh/gpu-memory"] = "85520809984"
    stored["metadata"]["labels"]["someone.else/label"] = "x"
    stored["metadata"]["resourceVersion"] = "42"
    assert semantically_equal(stored, desired)


def test_bytes_quantity_uses_the_largest_exact_binary_suffix() -> None:
    assert format_bytes_quantity(85520809984) == "81559Mi"
    assert format_bytes_quantity(16 * 2**30) == "16Gi"
    assert format_bytes_quantity(1000) == "1000"
    assert format_bytes_quantity(0) == "0"


def test_file_reporter_writes_yaml_and_skips_unchanged(inventory, tmp_path) -> None:
    path = tmp_path / "out" / "device.yaml"
    reporter = DeviceReporter("node-a", file_path=path)
    board = HealthBoard(g.uuid for g in inventory.gpus)
    desired = build_device("node-a", inventory, board.snapshot(), previous=reporter.previous(), now=T0)
    assert reporter.report(desired) is ReportResult.WRITTEN
    written = yaml.safe_load(path.read_text())
    assert written["spec"]["devices"][0]["resources"][api.RESOURCE_GPU_CORE] == "100"
    again = build_device("node-a", inventory, board.snapshot(), previous=reporter.previous(), now=T1)
    assert reporter.report(again) is ReportResult.UNCHANGED
    board.set(inventory.gpus[0].uuid, False, "Xid79")
    changed = build_device("node-a", inventory, board.snapshot(), previous=reporter.previous(), now=T1)
    assert reporter.report(changed) is ReportResult.WRITTEN
    assert yaml.safe_load(path.read_text())["spec"]["devices"][0]["health"] is False
    assert [p.name for p in path.parent.iterdir()] == ["device.yaml"], "no temp files left behind"
