"""Host dirs made for containers' mounts (koordlet/hostdirs.py: HAMi-core's per-container cache dir), through both
front doors (the hook server behind the proxy, the NRI plugin): a dir is recorded with its pod before it is made, so
the collector can take it away; one whose record cannot be written is not made, and its mount is left out of the
answer (runc would fail the container on a missing source), reported as a dropped hook value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from hooks import registry
from hooks.protocol import Changes, NodeContext
from koordlet.api.device import ANNOTATION_DEVICE_ALLOCATED, LABEL_GPU_ISOLATION_PROVIDER
from koordlet.executor import ResourceExecutor
from koordlet.executor.records import NodeRecords
from koordlet.hostdirs import make_host_dirs
from koordlet.runtimehooks.apply import RejectedValues
from koordlet.runtimehooks.nri import NriHandlers
from koordlet.runtimehooks.server import HookService
from koordlet.system.cgroup import CgroupFS
from koordlet.system.kubepods import KubeCgroupLayout
from wire import hookapi_pb2 as hookapi
from wire import nri_pb2 as api

UID = "6f1a9c3e-0b7d-4e5f-8a21-3c4d5e6f7a8b"
GATES = {"GPUEnvInject": True, "HamiCoreVGPUMonitor": True}
ALLOCATED = json.dumps({"gpu": [{"minor": 0, "resources": {"koordinator.sh/gpu-core": "30",
                                                           "koordinator.sh/gpu-memory-ratio": "25",
                                                           "koordinator.sh/gpu-memory": "4Gi"}}]})
LABELS = {LABEL_GPU_ISOLATION_PROVIDER: "HAMi-core"}
REJECTED = ("koordlet_runtime_hook_value_rejected_total", {"key": "host_dirs"})


def _records(tmp_path: Path) -> NodeRecords:
    """Records whose files cannot be written: a file stands where their dir should be (removed, they can)."""
    (tmp_path / "run").write_text("a file where the records' dir should be\n")
    return NodeRecords.beside(str(tmp_path / "run" / "system-config-originals.json"))


def test_a_host_dir_whose_record_cannot_be_written_is_not_made(tmp_path: Path) -> None:
    records = _records(tmp_path)
    root = tmp_path / "vgpu" / "containers"
    root.mkdir(parents=True)
    wanted = Changes(host_dirs=(str(root / f"{UID}_main"),))
    assert list(make_host_dirs(wanted, str(root), records.host_dirs, UID)) == [str(root / f"{UID}_main")]
    assert not (root / f"{UID}_main").exists() and records.host_dirs.keys() == frozenset()
    (tmp_path / "run").unlink()
    assert make_host_dirs(wanted, str(root), records.host_dirs, UID) == {}
    assert (root / f"{UID}_main").is_dir() and records.host_dirs.keys() == {str(root / f"{UID}_main")}


def _through_the_proxy(tmp_path: Path, executor: ResourceExecutor, node: NodeContext,
                       rejects: RejectedValues) -> list[str]:
    service = HookService(lambda: registry.enabled(GATES), lambda: node, lambda uid: None, executor,
                          KubeCgroupLayout(), rejects=rejects)
    request = hookapi.ContainerResourceHookRequest(
        pod_meta=hookapi.PodSandboxMetadata(name="infer", namespace="ml", uid=UID),
        container_meta=hookapi.ContainerMetadata(name="main"), pod_labels=LABELS,
        pod_annotations={ANNOTATION_DEVICE_ALLOCATED: ALLOCATED}, pod_cgroup_parent=f"/kubepods/pod{UID}",
        container_resources=hookapi.LinuxContainerResources(cpu_shares=2, cpu_period=100000))
    answer = service._container(registry.Stage.PRE_CREATE_CONTAINER, request)
    return [mount.host_path for mount in answer.container_mounts]


def _through_nri(tmp_path: Path, executor: ResourceExecutor, node: NodeContext, rejects: RejectedValues) -> list[str]:
    nri = NriHandlers(lambda: registry.enabled(GATES), lambda: node, lambda: (), executor, KubeCgroupLayout(),
                      rejects=rejects)
    try:
        sandbox = api.PodSandbox(id="sb", name="infer", namespace="ml", uid=UID, labels=LABELS,
                                 annotations={ANNOTATION_DEVICE_ALLOCATED: ALLOCATED},
                                 linux=api.LinuxPodSandbox(cgroup_parent=f"/kubepods/pod{UID}"))
        container = api.Container(id="c1", pod_sandbox_id="sb", name="main", state=api.CONTAINER_CREATED)
        answer = nri.create_container(api.CreateContainerRequest(pod=sandbox, container=container))
        return [mount.source for mount in answer.adjust.mounts]
    finally:
        nri.close()


@pytest.mark.parametrize("front_door", [_through_the_proxy, _through_nri], ids=["proxy", "nri"])
def test_a_containers_host_dir_that_cannot_be_recorded_is_not_made_and_its_mount_is_left_out_and_reported(
        tmp_path: Path, front_door) -> None:
    records = _records(tmp_path)
    library = tmp_path / "vgpu" / "libvgpu.so"
    library.parent.mkdir()
    library.write_text("HAMi-core stands in here\n")
    host_dir = library.parent / "containers" / f"{UID}_main"
    executor = ResourceExecutor(CgroupFS(mount_dir=str(tmp_path / "cg")), records=records)
    node = NodeContext(hami_core_library=str(library))
    events: list[tuple[str, str]] = []
    rejects = RejectedValues(lambda pod, reason, message: events.append((reason, message)))
    before = REGISTRY.get_sample_value(*REJECTED) or 0
    sources = front_door(tmp_path, executor, node, rejects)
    assert str(library) in sources and str(host_dir) not in sources  # the container starts, unmonitored
    assert not host_dir.exists() and records.host_dirs.keys() == frozenset()
    assert REGISTRY.get_sample_value(*REJECTED) == before + 1
    assert [reason for reason, _ in events] == ["KoordletHookValueRejected"]
    assert "host_dirs=" in events[0][1] and "cannot be recorded" in events[0][1]
    (tmp_path / "run").unlink()
    assert str(host_dir) in front_door(tmp_path, executor, node, rejects)
    assert host_dir.is_dir() and records.host_dirs.keys() == {str(host_dir)}
