"""GPU collector and Device report loop over the GPU service, with the fake NVML of tests/koordlet/gpu
(no GPU on this machine; `make gpu-check` runs the real one)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import pytest
import yaml

from koordlet.gpu.reporter import DeviceReporter
from koordlet.gpu.service import GPUService
from koordlet.metriccache import Label
from koordlet.reporters.device import DeviceReportLoop, GPUCollector
from tests.koordlet.gpu.fake_nvml import FakeNvml, h100_gpus
from tests.koordlet.statesinformer.waiting import wait_for
from tests.support.apiserver import ApiServer, kube_api_client

NODE = "node-1"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[GPUService]:
    started = GPUService.start(FakeNvml(h100_gpus(2)), sys_dir=str(tmp_path / "sys"), poll_timeout_ms=50)
    assert started is not None
    try:
        yield started
    finally:
        started.stop()


def test_gpu_collector_samples_core_and_memory_per_gpu(service: GPUService) -> None:
    collector = GPUCollector(service)
    assert collector.enabled()
    samples = collector.collect(1000.0)
    kinds = sorted((s.key.kind, s.key.label(Label.GPU_MINOR)) for s in samples)
    assert kinds == [("node_gpu_core_usage", "0"), ("node_gpu_core_usage", "1"),
                     ("node_gpu_memory_usage", "0"), ("node_gpu_memory_usage", "1")]
    assert all(s.timestamp == 1000.0 for s in samples)


def test_device_written_as_yaml_without_api_server(service: GPUService, tmp_path: Path) -> None:
    path = tmp_path / "device-node-1.yaml"
    outcomes: list[str] = []
    loop = DeviceReportLoop(service, DeviceReporter(NODE, file_path=path), observe=outcomes.append)
    assert loop.report_once()
    device = yaml.safe_load(path.read_text())
    assert device["kind"] == "Device" and device["metadata"]["name"] == NODE
    assert len(device["spec"]["devices"]) == 2
    assert device["spec"]["devices"][0]["resources"]["koordinator.sh/gpu-core"] in (100, "100")
    assert outcomes == ["written"]


def test_device_created_in_api_server_and_failures_retried(service: GPUService) -> None:
    with ApiServer() as server, kube_api_client(server) as api:
        reporter = DeviceReporter(NODE, custom_api=kubernetes.client.CustomObjectsApi(api))
        outcomes: list[str] = []
        loop = DeviceReportLoop(service, reporter, interval_s=0.05, observe=outcomes.append)
        server.fail_next("POST", r"/devices$", status=500)
        assert not loop.report_once()
        assert loop.report_once()
        stored = server.get_object("devices", NODE)
        assert stored is not None and len(stored["spec"]["devices"]) == 2
        assert outcomes[:2] == ["failed", "created"]
        loop.start()
        try:
            assert wait_for(lambda: loop.reports >= 3)
        finally:
            loop.stop(2.0)
        assert "unchanged" in outcomes
