"""Hook server edges: socket hygiene, bad input counted in Prometheus, and the resctrl hook on a fixture
resctrl tree (this kernel has no resctrl)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY

from koordlet.executor import ResourceExecutor
from koordlet.runtimehooks import RuntimeHooks, RuntimeHooksConfig, metrics, read_resctrl_node
from koordlet.statesinformer.api import NodeInfo, StaticStates
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.kubepods import KubeCgroupLayout
from wire import hookapi_pb2 as hookapi
from wire import hookapi_pb2_grpc as hookapi_grpc
from wire.sockets import SocketPathError

UID, CID = "0a0b0c0d-0000-4000-8000-000000000002", "d" * 64
BE_LABELS = {"koordinator.sh/qosClass": "BE"}


def _hooks(tmp_path: Path, gates: dict[str, bool], resctrl_root: str | None = None) -> RuntimeHooks:
    config = RuntimeHooksConfig(socket_path=str(tmp_path / "koordlet.sock"),
                                host_endpoint=str(tmp_path / "koordlet.sock"),
                                config_dir=str(tmp_path / "hookserver.d"), reconcile_interval_s=60.0,
                                feature_gates=gates, resctrl_dir=resctrl_root)
    executor = ResourceExecutor(CgroupFS(mount_dir=str(tmp_path / "cg" / "sys/fs/cgroup"), version=CgroupVersion.V1),
                                resctrl_root=resctrl_root)
    return RuntimeHooks(config, StaticStates(node=NodeInfo("n1")), executor, KubeCgroupLayout(cgroup_root="/"))


def test_live_socket_is_refused_and_a_stale_one_replaced(tmp_path: Path) -> None:
    path = tmp_path / "koordlet.sock"
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(path))
    live.listen(1)
    try:
        with pytest.raises(SocketPathError, match="another process"):
            _hooks(tmp_path, {"BatchResource": True}).start()
    finally:
        live.close()
    assert path.exists()  # closed but not unlinked: stale
    hooks = _hooks(tmp_path, {"BatchResource": True})
    hooks.start()
    try:
        with grpc.insecure_channel(f"unix://{path}") as channel:
            stub = hookapi_grpc.RuntimeHookServiceStub(channel)
            assert stub.PostStopContainerHook(hookapi.ContainerResourceHookRequest(), timeout=5) is not None
    finally:
        hooks.stop()


def _sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_bad_annotation_is_logged_and_counted_and_the_call_still_succeeds(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    hooks = _hooks(tmp_path, {"BatchResource": True})
    hooks.start()
    errors_before = _sample("koordlet_runtime_hook_plugin_errors_total", {"plugin": "batchresource"})
    calls_labels = {"node": metrics.node(), "hook": "PreCreateContainer", "stage": "pre", "status": "succeeded"}
    calls_before = _sample("koordlet_runtime_hook_invoked_duration_milliseconds_count", calls_labels)
    try:
        with grpc.insecure_channel(f"unix://{hooks.config.socket_path}") as channel:
            stub = hookapi_grpc.RuntimeHookServiceStub(channel)
            response = stub.PreCreateContainerHook(hookapi.ContainerResourceHookRequest(
                pod_meta=hookapi.PodSandboxMetadata(name="broken-pod", namespace="ns", uid=UID),
                container_meta=hookapi.ContainerMetadata(name="job"),
                container_resources=hookapi.LinuxContainerResources(cpu_shares=2),
                pod_annotations={"node.koordinator.sh/extended-resource-spec": "[1, 2"},
                pod_labels=BE_LABELS), timeout=5)
    finally:
        hooks.stop()
    assert response.container_resources.cpu_shares == 2
    assert _sample("koordlet_runtime_hook_plugin_errors_total", {"plugin": "batchresource"}) == errors_before + 1
    assert _sample("koordlet_runtime_hook_invoked_duration_milliseconds_count", calls_labels) == calls_before + 1
    assert any("broken-pod" in r.getMessage() and "batchresource" in r.getMessage() for r in caplog.records)


def _resctrl_tree(root: Path) -> Path:
    (root / "info/L3").mkdir(parents=True)
    (root / "info/L3/cbm_mask").write_text("7ff\n")  # 11 ways
    (root / "schemata").write_text("    L3:0=7ff;1=7ff\n    MB:0=100;1=100\n")
    return root


def test_resctrl_pod_gets_its_group_schemata_and_tasks_on_a_fixture_tree(tmp_path: Path) -> None:
    resctrl_root = _resctrl_tree(tmp_path / "resctrl")
    assert read_resctrl_node(str(resctrl_root)).cache_ids == (0, 1)
    pod_dir = tmp_path / "cg/sys/fs/cgroup/cpu/kubepods/besteffort" / f"pod{UID}"
    (pod_dir / CID).mkdir(parents=True)
    (pod_dir / CID / "cgroup.procs").write_text("4242\n4243\n")
    from koordlet.api.pod import ContainerMeta, PodMeta

    annotation = json.dumps({"llc": {"schemata": {"range": [0, 50]}}, "mb": {"schemata": {"percent": 30}}})
    pod = PodMeta(name="rdt", namespace="ns", uid=UID, labels=BE_LABELS,
                  annotations={"node.koordinator.sh/resctrl": annotation},
                  cgroup_parent=f"/kubepods/besteffort/pod{UID}", containers=(ContainerMeta("job", CID),))
    # the group as the kernel leaves it after koordlet's mkdir (a plain mkdir here creates no files)
    group = resctrl_root / f"koordlet-{UID}"
    group.mkdir()
    (group / "schemata").write_text("L3:0=7ff;1=7ff\nMB:0=100;1=100\n")
    (group / "tasks").write_text("")
    hooks = _hooks(tmp_path, {"Resctrl": True}, resctrl_root=str(resctrl_root))
    hooks.states.set_pods([pod])
    hooks.reconciler.reconcile_once()
    # 11 ways, [ceil(11 * 0 %), ceil(11 * 50 %)) = ways [0, 6) = 0x3f (docs/koordinator.md §3.3);
    # MB 30 % on Intel stays 30
    assert (group / "schemata").read_text() == "L3:0=3f;1=3f\nMB:0=30;1=30\n"
    assert (group / "tasks").read_text() == "4243"  # a regular file here keeps only the last write


_ANNOTATION_KEYS = ["node.koordinator.sh/extended-resource-spec", "scheduling.koordinator.sh/resource-status",
                    "scheduling.koordinator.sh/device-allocated", "koordinator.sh/cpuQOS"]


def test_arbitrary_annotation_text_through_real_grpc_always_gets_an_answer(tmp_path: Path) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    hooks = _hooks(tmp_path, {"BatchResource": True, "CPUSetAllocator": True, "GroupIdentity": True,
                              "GPUEnvInject": True})
    hooks.start()
    channel = grpc.insecure_channel(f"unix://{hooks.config.socket_path}")
    stub = hookapi_grpc.RuntimeHookServiceStub(channel)

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.dictionaries(st.sampled_from(_ANNOTATION_KEYS),
                           st.one_of(st.text(max_size=40), st.sampled_from(['{"containers": 1}', "[]", "null",
                                                                            '{"cpuset": "0-"}', '{"gpu": [{}]}'])),
                           max_size=4))
    def call(annotations: dict[str, str]) -> None:
        response = stub.PreCreateContainerHook(hookapi.ContainerResourceHookRequest(
            pod_meta=hookapi.PodSandboxMetadata(name="fuzz", namespace="ns", uid=UID),
            container_meta=hookapi.ContainerMetadata(name="job"),
            container_resources=hookapi.LinuxContainerResources(cpu_period=100000, oom_score_adj=7),
            pod_annotations=annotations, pod_labels=BE_LABELS), timeout=5)
        assert response.container_resources.oom_score_adj == 7  # never owned, always echoed

    try:
        call()
    finally:
        channel.close()
        hooks.stop()
    failed = REGISTRY.get_sample_value("koordlet_runtime_hook_invoked_duration_milliseconds_count",
                                       {"node": metrics.node(), "hook": "PreCreateContainer", "stage": "pre",
                                        "status": "failed"})
    assert not failed  # every call was answered by the plugins, none by the catch-all echo
