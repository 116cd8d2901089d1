"""XPU devices from the device-info files a device daemon writes (koordlet/gpu/xpu.py, koordlet/api/xpu.py), into
the Device object through the test API server, which validates it against deploy/chart/koordlet-py/files/crds.

The files are laid out as koord-device-daemon v1.8.0 writes them: one JSON array (Go's MarshalIndent, two spaces)
in ``/var/run/koordlet/xpu-device-infos/ic-device``, replaced through a temporary ``.ic-device…`` file in the same
dir; entries with Koordinator's XPUDeviceInfo fields, the values the daemon's NPU (Huawei Ascend) and MLU
(Cambricon) managers fill in."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest
import yaml

from koordlet.agent.lifecycle import Koordlet
from koordlet.api import device as api
from koordlet.api.xpu import XPUSchemaError, parse_xpu_device_infos
from koordlet.config import parse_config
from koordlet.gpu.reporter import DeviceReporter
from koordlet.gpu.xpu import ANNOTATION_GPU_PARTITIONS, LABEL_GPU_PARTITION_POLICY, XPUInventory
from koordlet.reporters.device import DeviceReportLoop
from tests.koordlet.gpu.fake_nvml import FakeNvml
from tests.koordlet.gpu.test_reporter import NODE, stored


def ascend(minor: int, links: str = "") -> dict:
    """An Ascend 910B as the daemon's NPU manager writes it (uuid = the chip's id + "-" + minor)."""
    topology = {"socketID": "-1", "nodeID": str(minor // 4), "pcieID": f"0000:{0x10 + minor:02x}:00.0",
                "busID": f"0000:{0x10 + minor:02x}:00.0"}
    if links:
        topology["p2pLinks"] = [{"peerMinor": links, "type": "HCCS"}]
    return {"vendor": "huawei", "model": "Ascend-910B", "uuid": f"185011D4-21104518-A0C4ED94-14CC040A-{minor}",
            "minor": str(minor),
            "resources": {"koordinator.sh/gpu-memory": "64Gi", "huawei.com/npu-cpu": "7", "huawei.com/npu-core": "20",
                          "huawei.com/npu-dvpp": "100"},
            "topology": topology, "status": {"healthy": True}}


def mlu(minor: int, healthy: bool = True) -> dict:
    """A Cambricon MLU as the daemon's MLU manager writes it."""
    status = {"healthy": healthy} | ({} if healthy else {"errCode": "ECCError", "errMessage": "uncorrectable ECC"})
    return {"vendor": "cambricon", "model": "MLU370-X8", "uuid": f"MLU-{minor:04d}-7f3c", "minor": str(minor),
            "resources": {"gpu-memory": "48Gi", "gpu-core": "100"},
            "topology": {"socketID": "-1", "nodeID": "0", "pcieID": "0000:3a:00.0", "busID": f"0000:3b:0{minor}.0"},
            "status": status}


def write_like_the_daemon(path: Path, devices: list[dict]) -> None:
    """renameio.WriteFile: a temporary file beside the target, then rename over it."""
    temp = path.parent / f".{path.name}{os.getpid()}"
    temp.write_text(json.dumps(devices, indent=2))
    os.rename(temp, path)


@pytest.fixture
def infos(tmp_path: Path) -> Path:
    path = tmp_path / "xpu-device-infos"
    path.mkdir()
    return path


def test_npus_from_the_daemons_file_take_the_gpus_place_in_the_device(kube, infos: Path, service) -> None:
    write_like_the_daemon(infos / "ic-device", [ascend(0, "1,2,3"), ascend(1, "0,2,3"), ascend(2, "0,1,3"),
                                                ascend(3, "0,1,2")])
    (infos / ".ic-device123456").write_text("[{half")  # a daemon's write in progress: not read
    node = kube.node(NODE)
    loop = DeviceReportLoop(service, DeviceReporter(NODE, custom_api=kube.agent_custom),
                            node_uid=lambda: node["metadata"]["uid"], xpu=XPUInventory(str(infos)))
    assert loop.report_once()
    obj = stored(kube)  # the CRD schema accepted it
    entries = obj["spec"]["devices"]
    assert [(e["type"], e["minor"]) for e in entries] == [("gpu", 0), ("gpu", 1), ("gpu", 2), ("gpu", 3)]
    assert {e["id"] for e in entries}.isdisjoint(gpu.uuid for gpu in service.inventory.gpus)  # no NVML GPU
    first = entries[0]
    assert first["resources"] == {"koordinator.sh/gpu-memory-ratio": "100", "koordinator.sh/gpu-memory": "64Gi",
                                  "huawei.com/npu-cpu": "7", "huawei.com/npu-core": "20", "huawei.com/npu-dvpp": "100"}
    assert first["topology"] == {"socketID": -1, "nodeID": 0, "pcieID": "0000:10:00.0", "busID": "0000:10:00.0"}
    assert first["health"] is True and first["conditions"][0]["reason"] == "DeviceHealthy"
    assert obj["metadata"]["labels"] == {api.LABEL_DEVICE_GPU_MODEL: "Ascend-910B",
                                         api.LABEL_DEVICE_GPU_VENDOR: "huawei", LABEL_GPU_PARTITION_POLICY: "Prefer"}
    assert json.loads(obj["metadata"]["annotations"][ANNOTATION_GPU_PARTITIONS]) == {
        "4": [{"minors": [0, 1, 2, 3], "gpuLinkType": "HCCS", "allocationScore": 1}]}
    # The daemon goes (it removes its file when it stops): the NVML GPUs come back, the partitions go.
    (infos / "ic-device").unlink()
    assert loop.report_once()
    obj = stored(kube)
    assert [e["id"] for e in obj["spec"]["devices"]] == [gpu.uuid for gpu in service.inventory.gpus]
    assert ANNOTATION_GPU_PARTITIONS not in (obj["metadata"].get("annotations") or {})
    assert LABEL_GPU_PARTITION_POLICY not in obj["metadata"]["labels"]
    assert obj["metadata"]["labels"][api.LABEL_DEVICE_GPU_VENDOR] == "nvidia"


def test_enforced_device_infos_never_report_nvml_gpus(kube, infos: Path, service) -> None:
    """``-xpu-enforce-collect-from-device-infos``: without files the Device has no accelerator at all."""
    loop = DeviceReportLoop(service, DeviceReporter(NODE, custom_api=kube.agent_custom),
                            xpu=XPUInventory(str(infos)), xpu_only=True)
    assert loop.report_once()
    assert stored(kube)["spec"]["devices"] == []
    write_like_the_daemon(infos / "ic-device", [mlu(0), mlu(1, healthy=False)])
    assert loop.report_once()
    entries = stored(kube)["spec"]["devices"]
    assert [e["minor"] for e in entries] == [0, 1]
    assert entries[0]["resources"]["koordinator.sh/gpu-core"] == "100"  # "gpu-core" gets Koordinator's domain
    assert entries[1]["health"] is False
    assert entries[1]["conditions"][0] | {"lastTransitionTime": ""} == {
        "type": "Healthy", "status": "False", "reason": "ECCError", "message": "uncorrectable ECC",
        "lastTransitionTime": ""}


def test_bad_files_and_entries_cost_only_themselves(infos: Path, caplog: pytest.LogCaptureFixture) -> None:
    problems: list[str] = []
    inventory = XPUInventory(str(infos), on_problem=problems.append)
    write_like_the_daemon(infos / "ic-device", [mlu(0), mlu(1)])
    bad_minor = ascend(4) | {"minor": "four"}
    no_uuid = {k: v for k, v in ascend(5).items() if k != "uuid"}
    bad_quantity = ascend(6)
    bad_quantity["resources"] = {"huawei.com/npu-core": "lots"}
    write_like_the_daemon(infos / "npu", [bad_minor, no_uuid, bad_quantity, ascend(7), mlu(0)])
    (infos / "subdir").mkdir()
    assert [d.minor for d in inventory.devices()] == [0, 1, 6, 7]  # mlu(0) again: its uuid and minor are taken
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="koordlet.gpu.xpu"):
        assert [d.minor for d in inventory.devices()] == [0, 1, 6, 7]  # nothing new said on the second look
    assert caplog.records == []
    assert len(problems) == 3 and "npu[0]: minor must be a decimal int32 string, got 'four'" in problems[0]
    assert "npu[1]: uuid is missing" in problems[1] and "uuid MLU-0000-7f3c" in problems[2]
    # The file becomes garbage: its devices stay as last read; the reason is said once.
    time.sleep(0.01)
    (infos / "ic-device").write_text('[{"vendor": "cambricon", ')
    with caplog.at_level(logging.WARNING, logger="koordlet.gpu.xpu"):
        assert [d.minor for d in inventory.devices()] == [0, 1, 6, 7]
    broken = [r.getMessage() for r in caplog.records if "not JSON" in r.getMessage()]
    assert len(broken) == 1 and "ic-device" in broken[0] and "keeping the 2 device(s)" in broken[0]
    # A file that is not a list, or far too large, is refused the same way.
    (infos / "odd").write_text('{"vendor": "x"}')
    (infos / "huge").write_bytes(b"[" + b" " * (2 << 20) + b"]")
    assert [d.minor for d in inventory.devices()] == [0, 1, 6, 7]
    assert any("expected a JSON array" in p for p in problems) and any("huge" in p for p in problems)
    # The quantity that does not parse is left out of the entry (the rest of it stands), said once.
    from koordlet.gpu.xpu import xpu_entries
    said: list[str] = []
    entry = next(e for e in xpu_entries(inventory.devices(), on_problem=said.append) if e["minor"] == 6)
    assert "huawei.com/npu-core" not in entry["resources"] and "resource huawei.com/npu-core" in said[0]


def test_no_dir_means_no_devices_and_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    inventory = XPUInventory(str(tmp_path / "none"))
    with caplog.at_level(logging.INFO, logger="koordlet.gpu.xpu"):
        assert inventory.devices() == () and inventory.devices() == ()
    assert len(caplog.records) == 1


@pytest.mark.parametrize("text", ["", "null", "[]", "[1]", '[{"uuid": "u", "minor": 3, "vendor": "v"}]',
                                  '[{"uuid": "u", "minor": "3", "topology": {"nodeID": "zero"}}]',
                                  '[{"uuid": "u", "minor": "3", "status": {"healthy": "yes"}}]'])
def test_any_file_parses_to_devices_and_problems_or_one_schema_error(text: str) -> None:
    try:
        devices, problems = parse_xpu_device_infos(text.encode(), "f")
    except XPUSchemaError as exc:
        assert str(exc).startswith("f")
        return
    assert len(devices) + len(problems) == len(json.loads(text) or [])


def test_the_agent_reports_the_daemons_devices_under_accelerators(tmp_path: Path, infos: Path) -> None:
    """koordlet itself (local mode): ``-feature-gates=Accelerators=true`` and ``-xpu-device-infos-dir`` give the
    Device object the daemon's devices; the Device file is what koordlet would write to the API server."""
    write_like_the_daemon(infos / "ic-device", [ascend(0), ascend(1)])
    config = parse_config(["-local-mode", f"-report-dir={tmp_path / 'reports'}",
                           f"-cri-endpoint={tmp_path / 'no.sock'}",
                           f"-node-slo-file={tmp_path / 'slo.yaml'}", f"-cgroup-root-dir={tmp_path / 'cgroup'}",
                           "-addr=127.0.0.1:0", "-sys-root-dir=/sys/", "-feature-gates=Accelerators=true",
                           f"-xpu-device-infos-dir={infos}", "-node-topology-sync-interval=100ms",
                           "-enable-node-metric-report=false", f"-var-lib-kubelet-dir={tmp_path / 'kubelet'}"],
                          {"NODE_NAME": NODE})
    agent = Koordlet(config, extra_components=[], states_sync_timeout_s=0.2, nvml=FakeNvml([]))
    device_file = tmp_path / "reports" / f"device-{NODE}.yaml"
    try:
        agent.start()
        deadline = time.monotonic() + 10
        while not device_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        agent.stop(5.0)
    obj = yaml.safe_load(device_file.read_text())
    assert [e["minor"] for e in obj["spec"]["devices"]] == [0, 1]
    assert obj["metadata"]["labels"][api.LABEL_DEVICE_GPU_VENDOR] == "huawei"
