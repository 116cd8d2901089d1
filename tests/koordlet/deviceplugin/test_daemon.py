"""The device plugin as a part of the koordlet daemon: a real Koordlet (fake NVML from docs/node-interfaces.md §15,
the in-repo API server) registers with a test kubelet, re-registers when kubelet restarts, streams the GPU
service's health and serves Allocate with the scheduler's choice (docs/node-lock.md)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from koordlet.agent.lifecycle import Koordlet
from koordlet.agent.parts import agent_parts
from koordlet.api import device as api
from koordlet.config import parse_config
from koordlet.nodelock import NodeLocker
from tests.koordlet.deviceplugin.kube import Kube, gpu_pod, node_annotations, pod_annotations
from tests.koordlet.deviceplugin.kubelet import TestKubelet
from tests.koordlet.gpu.fake_nvml import FakeNvml, h100_gpus
from wire import deviceplugin_pb2 as pb
from wire import deviceplugin_pb2_grpc as pb_grpc

NODE = "node-dp"


@pytest.fixture
def kubelet_dir() -> Iterator[str]:
    # Short: unix socket paths are limited to 107 bytes.
    root = tempfile.mkdtemp(prefix="kdd-", dir="/tmp")
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def agent_config(tmp_path: Path, kubelet_dir: str, *extra: str):  # noqa: ANN201
    return parse_config(
        [f"-cgroup-root-dir={tmp_path / 'cgroup'}", f"-sys-root-dir={tmp_path / 'sys'}",
         f"-sys-fs-root-dir={tmp_path}", f"-var-lib-kubelet-dir={kubelet_dir}", "-addr=127.0.0.1:0",
         "-enable-node-metric-report=false", "-feature-gates=Accelerators=true", *extra],
        {"NODE_NAME": NODE})


def allocated(*minors: int) -> str:
    return json.dumps({"gpu": [{"minor": m, "resources": {api.RESOURCE_GPU_CORE: "100"}} for m in minors]})


def plugin_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "deviceplugin-watch" and t.is_alive()]


def test_the_daemon_part_follows_the_gpu_service() -> None:
    names = [part.name for part in agent_parts([])]
    assert names[names.index("GPU service") + 1] == "device plugin"


def test_daemon_registers_reregisters_after_a_kubelet_restart_and_allocates_the_scheduler_choice(
        kube: Kube, kubelet_dir: str, tmp_path: Path) -> None:
    plugin_dir = os.path.join(kubelet_dir, "device-plugins")
    os.makedirs(plugin_dir)
    kube.node(NODE)
    nvml = FakeNvml(h100_gpus(2))
    gpus = nvml.gpus
    kubelet = TestKubelet(plugin_dir)
    restarted: TestKubelet | None = None
    agent = Koordlet(agent_config(tmp_path, kubelet_dir), api_client=kube.core.api_client, extra_components=[],
                     states_sync_timeout_s=0.5, nvml=nvml)
    try:
        agent.start()
        first = kubelet.next_registration()
        assert first.resource_name == api.RESOURCE_NVIDIA_GPU and first.version == "v1beta1"
        with kubelet.plugin_channel(first) as channel:
            stream = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty(), timeout=20)
            assert [(d.ID, d.health) for d in next(stream).devices] == [(g.uuid, "Healthy") for g in gpus]
            # An Xid seen by the GPU service's health watcher reaches kubelet.
            nvml.inject_xid(0, 79)
            assert [d.health for d in next(stream).devices] == ["Unhealthy", "Healthy"]
            stream.cancel()

        # kubelet restarts: it goes away, its socket is removed, and a new one is served in its place.
        kubelet.stop()
        assert not os.path.exists(kubelet.socket)
        restarted = TestKubelet(plugin_dir)
        again = restarted.next_registration(timeout_s=10)
        assert again.resource_name == first.resource_name and again.endpoint == first.endpoint

        # The scheduler chose minor 1 and locked the node in Bind; kubelet picks minor 0 on its own.
        kube.pod(gpu_pod("train", node=NODE, annotations={api.ANNOTATION_DEVICE_ALLOCATED: allocated(1)}))
        NodeLocker(kube.agent_core).lock(NODE, "ns", "train")
        with restarted.plugin_channel(again) as channel:
            stub = pb_grpc.DevicePluginStub(channel)
            listed = next(stub.ListAndWatch(pb.Empty(), timeout=5))
            assert [d.health for d in listed.devices] == ["Unhealthy", "Healthy"], "health survives the restart"
            response = stub.Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=[gpus[0].uuid])]), timeout=10)
        (container,) = response.container_responses
        assert container.envs["NVIDIA_VISIBLE_DEVICES"] == "1"
        assert ("/dev/nvidia1", "/dev/nvidia1") in [(d.container_path, d.host_path) for d in container.devices]
        assert json.loads(pod_annotations(kube, "train")[api.ANNOTATION_DEVICE_BOUND]) == {"main": [1]}
        assert api.ANNOTATION_NODE_LOCK not in node_annotations(kube, NODE)
    finally:
        t0 = time.monotonic()
        agent.stop(timeout_s=3.0)
        elapsed = time.monotonic() - t0
        kubelet.stop()
        if restarted is not None:
            restarted.stop()
    assert elapsed < 3.5, elapsed
    assert not os.path.exists(os.path.join(plugin_dir, first.endpoint)), "stop removes the plugin socket"
    assert not plugin_threads()


def test_daemon_waits_for_a_kubelet_that_comes_up_later_and_local_mode_allocate_fails_clearly(
        kubelet_dir: str, tmp_path: Path) -> None:
    """Local mode (no API server): kubelet not there yet is no start failure; the plugin registers when
    kubelet's socket appears, lists the GPUs, and Allocate says why it cannot serve."""
    slo = tmp_path / "nodeslo.yaml"
    slo.write_text("resourceUsedThresholdWithBE: {enable: false}\n")
    config = agent_config(tmp_path, kubelet_dir, "-local-mode", f"-node-slo-file={slo}",
                          f"-cri-endpoint={tmp_path / 'no-cri.sock'}", f"-report-dir={tmp_path / 'reports'}")
    plugin_dir = os.path.join(kubelet_dir, "device-plugins")
    agent = Koordlet(config, extra_components=[], states_sync_timeout_s=0.5, nvml=FakeNvml(h100_gpus(2)))
    kubelet: TestKubelet | None = None
    try:
        assert agent.start()
        assert os.path.isdir(plugin_dir), "the plugin serves in <-var-lib-kubelet-dir>/device-plugins"
        kubelet = TestKubelet(plugin_dir)
        request = kubelet.next_registration(timeout_s=10)
        assert request.resource_name == api.RESOURCE_NVIDIA_GPU
        with kubelet.plugin_channel(request) as channel:
            stub = pb_grpc.DevicePluginStub(channel)
            assert len(next(stub.ListAndWatch(pb.Empty(), timeout=5)).devices) == 2
            with pytest.raises(grpc.RpcError) as info:
                stub.Allocate(pb.AllocateRequest(container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=[h100_gpus(1)[0].uuid])]), timeout=10)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "no API server" in info.value.details()
    finally:
        t0 = time.monotonic()
        agent.stop(timeout_s=2.0)
        elapsed = time.monotonic() - t0
        if kubelet is not None:
            kubelet.stop()
    assert elapsed < 2.5, elapsed
    assert not plugin_threads()
