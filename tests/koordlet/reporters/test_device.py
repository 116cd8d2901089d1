"""GPU collector and Device report loop over the GPU service, with the fake NVML of tests/koordlet/gpu
(no GPU on this machine; `make gpu-check` runs the real one)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from koordlet.gpu.reporter import DeviceReporter
from koordlet.gpu.service import GPUService
from koordlet.kubeapi import CustomObjects
from koordlet.metriccache import Label, MetricCache, SeriesKey
from koordlet.metricsadvisor.pods import ContainerCgroup, PodCgroup
from koordlet.reporters.device import DeviceReportLoop, GPUCollector
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.cgroup_stats import read_cgroup_procs
from tests.koordlet.gpu.fake_nvml import FakeNvml, FakeProcess, h100_gpus
from tests.support.apiserver import ApiServer, kube_api_client
from tests.support.waiting import wait_for

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
        reporter = DeviceReporter(NODE, custom_api=CustomObjects(api))
        outcomes: list[str] = []
        clock = [0.0]
        loop = DeviceReportLoop(service, reporter, interval_s=0.05, observe=outcomes.append,
                                monotonic=lambda: clock[0])
        server.fail_next("POST", r"/devices$", status=500)
        assert not loop.report_once()
        server.clear_requests()
        assert not loop.report_once() and server.requests() == []  # backing off: no request
        clock[0] += 31  # the backoff is at most 30 s
        assert loop.report_once()
        stored = server.get_object("devices", NODE)
        assert stored is not None and len(stored["spec"]["devices"]) == 2
        assert outcomes[:2] == ["failed", "created"]
        ticking = DeviceReportLoop(service, reporter, interval_s=0.05, observe=outcomes.append)
        ticking.start()
        try:
            assert wait_for(lambda: ticking.reports >= 3)
        finally:
            ticking.stop(2.0)
        assert "unchanged" in outcomes


# ------------------------------------------------------------------------------- pod and container GPU usage

@pytest.fixture
def sleepers() -> Iterator[list[int]]:
    """Three real processes: their PIDs go into the fixture cgroups and onto the fake GPUs."""
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_container_gpu_usage_is_attributed_from_the_pids_in_its_cgroup(tmp_path: Path, sleepers: list[int]) -> None:
    in_a, in_b, stranger = sleepers
    mount = tmp_path / "cgroup"
    pod_rel = "kubepods/burstable/podu-train"
    for container, pids in (("ctr-a", [in_a]), ("ctr-b", [in_b]), ("ctr-idle", [])):
        cpu_dir = mount / "cpu" / pod_rel / container
        cpu_dir.mkdir(parents=True)
        (cpu_dir / "cgroup.procs").write_text("".join(f"{pid}\n" for pid in pids))
    pods = [PodCgroup("u-train", pod_rel, (ContainerCgroup("ctr-a", f"{pod_rel}/ctr-a"),
                                           ContainerCgroup("ctr-b", f"{pod_rel}/ctr-b"),
                                           ContainerCgroup("ctr-idle", f"{pod_rel}/ctr-idle"),
                                           ContainerCgroup("ctr-gone", f"{pod_rel}/ctr-gone")), "LS")]
    gpus = h100_gpus(2)
    gpus[0].processes = [FakeProcess(in_a, 8 << 30, sm_util=40), FakeProcess(in_b, 1 << 30, sm_util=10),
                         FakeProcess(stranger, 4 << 30, sm_util=50)]  # on the GPU, in no pod
    gpus[1].processes = [FakeProcess(in_b, 2 << 30, sm_util=30)]
    started = GPUService.start(FakeNvml(gpus), sys_dir=str(tmp_path / "sys"), poll_timeout_ms=50)
    assert started is not None
    try:
        collector = GPUCollector(started, pods=lambda: pods,
                                 cgroup_fs=CgroupFS(mount_dir=str(mount), version=CgroupVersion.V1))
        cache = MetricCache()
        cache.append_samples(collector.collect(1000.0))
    finally:
        started.stop()
    gpu0 = {Label.GPU_MINOR: "0", Label.GPU_DEVICE_UUID: gpus[0].uuid}
    gpu1 = {Label.GPU_MINOR: "1", Label.GPU_DEVICE_UUID: gpus[1].uuid}

    def value(kind: str, **labels: str) -> float | None:
        latest = cache.latest(SeriesKey.of(kind, **labels))
        return None if latest is None else latest[1]

    assert value("container_gpu_core_usage", container_id="ctr-a", **gpu0) == 40
    assert value("container_gpu_memory_usage", container_id="ctr-a", **gpu0) == 8 << 30
    assert value("container_gpu_core_usage", container_id="ctr-a", **gpu1) is None
    assert value("container_gpu_core_usage", container_id="ctr-b", **gpu0) == 10
    assert value("container_gpu_memory_usage", container_id="ctr-b", **gpu1) == 2 << 30
    assert value("pod_gpu_core_usage", pod_uid="u-train", **gpu0) == 50  # not the stranger's 50 %
    assert value("pod_gpu_memory_usage", pod_uid="u-train", **gpu0) == 9 << 30
    assert value("pod_gpu_core_usage", pod_uid="u-train", **gpu1) == 30
    # an idle container and one whose cgroup is gone get no series
    assert {k.label(Label.CONTAINER_ID) for k in cache.keys("container_gpu_core_usage")} == {"ctr-a", "ctr-b"}
    # the node series stay the device's own reading
    assert value("node_gpu_memory_usage", **gpu0) == gpus[0].memory_used


def test_cgroup_procs_reader_reads_the_pids_of_one_cgroup(tmp_path: Path) -> None:
    (tmp_path / "cgroup.procs").write_text("42\n7\n42\n")
    assert read_cgroup_procs(str(tmp_path)) == (7, 42)
    with pytest.raises(OSError):
        read_cgroup_procs(str(tmp_path / "gone"))
