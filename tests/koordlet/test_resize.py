"""An in-place resize (Kubernetes 1.35 GA) on the host's cgroup v1, end to end: real containerd behind
koord-runtime-proxy, koordlet's hook server and reconciler, the CPU burst strategy, and the states fed from the
pod JSON kubelet's ``/pods`` serves (``pod_meta_from_pod``: the enacted amounts in
``status.containerStatuses[].resources``).

The test plays kubelet: it resizes the LS container with the CRI call kubelet makes (UpdateContainerResources with
the new Linux resources and no cpuset), then reports the new amounts in the pod's status, as kubelet does once they
are enacted. Memory QoS writes memory.min/low/high, which cgroup v1 lacks: its part runs in the v2 guest
(tests/koordlet/test_pod_story_v2.py, the resize test there).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import grpc
import pytest

from koordlet.api.cpuset import format_cpu_list
from koordlet.api.keys import ANNOTATION_NODE_RESERVATION, ANNOTATION_RESOURCE_STATUS, LABEL_QOS_CLASS
from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.executor import ResourceExecutor
from koordlet.metriccache import MetricCache
from koordlet.qosmanager import QoSManagerConfig, new_qos_manager
from koordlet.runtimehooks import RuntimeHooks, RuntimeHooksConfig
from koordlet.statesinformer.api import NodeInfo, StaticStates
from koordlet.statesinformer.cpumanager import CPUManagerState
from koordlet.statesinformer.kubelet import pod_meta_from_pod
from koordlet.system.cgroup import CgroupFS
from koordlet.system.kubepods import KubeCgroupLayout
from koordlet.system.sysfs import read_online_cpus
from tests.koordlet.runtimehooks.test_runtimehooks import _through_proxy
from tests.support.containerd import CGROUP_ROOT
from tests.support.cri import container_config, sandbox_config
from tests.support.waiting import wait_for
from wire import cri_pb2 as cri

pytestmark = pytest.mark.containerd

CGROUP_V1 = Path("/sys/fs/cgroup")
LAYOUT = KubeCgroupLayout(cgroup_root=CGROUP_ROOT)
MiB = 1 << 20
RECONCILE_INTERVAL_S = 0.5
GATES = {"BatchResource": True, "CPUSetAllocator": True}


def kubelet_pod(sandbox: cri.PodSandboxConfig, container_id: str, cpu: str, memory: str) -> dict:
    """The pod as kubelet's ``/pods`` lists it once the amounts are enacted: spec and status.resources agree."""
    resources = {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}}
    meta = sandbox.metadata
    return {
        "metadata": {"name": meta.name, "namespace": meta.namespace, "uid": meta.uid, "labels": dict(sandbox.labels)},
        "spec": {"containers": [{"name": "app", "resources": resources}]},
        "status": {"phase": "Running", "qosClass": "Burstable",
                   "containerStatuses": [{"name": "app", "containerID": f"containerd://{container_id}",
                                          "allocatedResources": resources["requests"], "resources": resources}]},
    }


def test_an_ls_resize_moves_the_burst_keeps_the_share_pool_cpuset_and_never_reverts_kubelets_limits(
        containerd_socket: str, tmp_path: Path) -> None:
    online = sorted(read_online_cpus("/sys"))
    if len(online) < 2:
        pytest.skip("needs 2 CPUs: one reserved, so that the LS share pool is not every CPU")
    pool = format_cpu_list(online[1:])
    node = NodeInfo("n1", capacity={"cpu": len(online) * 1000, "memory": 4096 * MiB},
                    allocatable={"cpu": len(online) * 1000, "memory": 4096 * MiB},
                    annotations={ANNOTATION_NODE_RESERVATION: json.dumps({"reservedCPUs": str(online[0])})})
    states = StaticStates(node=node, node_slo=parse_node_slo_spec(
        {"cpuBurstStrategy": {"policy": "cpuBurstOnly", "cpuBurstPercent": 50}}))
    executor = ResourceExecutor(CgroupFS.detect())
    socket = str(tmp_path / "koordlet.sock")
    config = RuntimeHooksConfig(socket_path=socket, host_endpoint=socket,
                                config_dir=str(tmp_path / "hookserver.d"), reconcile_interval_s=RECONCILE_INTERVAL_S,
                                feature_gates=GATES)
    hooks = RuntimeHooks(config, states, executor, LAYOUT, cpu_manager=lambda: CPUManagerState(policy="none"))
    burst = new_qos_manager(states, MetricCache(), executor, LAYOUT, started_at=time.time() - 60,
                            config=QoSManagerConfig(node_name="n1", feature_gates={
                                "CPUBurst": True, "BECPUSuppress": False, "RdtResctrl": False,
                                "CgroupReconcile": False}))
    with _through_proxy(hooks, containerd_socket, tmp_path) as (client, pods):
        sandbox = sandbox_config("web", kube_qos="burstable", labels={LABEL_QOS_CLASS: "LS"})
        sid = pods.run_pod(sandbox)
        cid = pods.create_container(sid, sandbox, container_config("app", resources=cri.LinuxContainerResources(
            cpu_period=100000, cpu_quota=100000, cpu_shares=1024, memory_limit_in_bytes=256 * MiB)))
        client.runtime.StartContainer(cri.StartContainerRequest(container_id=cid), timeout=60)
        container = f"{sandbox.linux.cgroup_parent}/{cid}".lstrip("/")

        def read(controller: str, name: str) -> str:
            return (CGROUP_V1 / controller / container / name).read_text().strip()

        states.set_pods([pod_meta_from_pod(kubelet_pod(sandbox, cid, "1", "256Mi"), LAYOUT)])
        assert read("cpuset", "cpuset.cpus") == pool  # the cpuset hook at creation: the LS share pool
        burst.run_strategy("cpuburst")
        assert read("cpu", "cpu.cfs_burst_us") == "50000"  # 1 core × 50 %

        # kubelet resizes: the CRI call first (no cpuset in it), the status after
        client.runtime.UpdateContainerResources(cri.UpdateContainerResourcesRequest(
            container_id=cid, linux=cri.LinuxContainerResources(cpu_period=100000, cpu_quota=200000, cpu_shares=2048,
                                                                memory_limit_in_bytes=512 * MiB)), timeout=30)
        assert (read("cpu", "cpu.cfs_quota_us"), read("memory", "memory.limit_in_bytes")) == \
            ("200000", str(512 * MiB))
        assert read("cpuset", "cpuset.cpus") == pool  # the update hook answered the pool: runc kept it
        # the states still report the old amounts (kubelet has not updated the status yet): reconcile passes and a
        # burst tick must not put the old limit back
        passes = hooks.reconciler.passes
        hooks.reconciler.trigger()
        assert wait_for(lambda: hooks.reconciler.passes >= passes + 2, 10.0)
        burst.run_strategy("cpuburst")
        assert (read("cpu", "cpu.cfs_quota_us"), read("memory", "memory.limit_in_bytes")) == \
            ("200000", str(512 * MiB))
        states.set_pods([pod_meta_from_pod(kubelet_pod(sandbox, cid, "2", "512Mi"), LAYOUT)])
        burst.run_strategy("cpuburst")  # one tick of the strategy follows the new limit
        assert read("cpu", "cpu.cfs_burst_us") == "100000"  # 2 cores × 50 %
        passes = hooks.reconciler.passes
        assert wait_for(lambda: hooks.reconciler.passes >= passes + 2, 10.0)
        assert (read("cpu", "cpu.cfs_quota_us"), read("memory", "memory.limit_in_bytes"),
                read("cpuset", "cpuset.cpus")) == ("200000", str(512 * MiB), pool)



def test_a_pod_level_resize_through_the_proxy_gets_the_pod_level_answers_written_again(
        containerd_socket: str, tmp_path: Path) -> None:
    """kubelet resizes a pod's own cgroup, then calls UpdatePodSandboxResources (cri-api: after it wrote the pod
    dir). Its new quota undid the cpuset hook's unbound one for a pod the scheduler bound to CPUs: the hook
    (PreUpdatePodSandboxResources, registered by koordlet) writes it again at once, the reconciler being far off here.
    containerd here answers UNIMPLEMENTED (its cri-api predates the call) and kubelet gets exactly that."""
    online = sorted(read_online_cpus("/sys"))
    states = StaticStates(node=NodeInfo("n1"))
    socket = str(tmp_path / "koordlet.sock")
    config = RuntimeHooksConfig(socket_path=socket, host_endpoint=socket, config_dir=str(tmp_path / "hookserver.d"),
                                reconcile_interval_s=3600, feature_gates=GATES)
    hooks = RuntimeHooks(config, states, ResourceExecutor(CgroupFS.detect()), LAYOUT)
    made: list[Path] = []
    try:
        with _through_proxy(hooks, containerd_socket, tmp_path) as (client, pods):
            assert "PreUpdatePodSandboxResources" in json.loads(
                (tmp_path / "hookserver.d" / "koordlet.json").read_text())["runtime-hooks"]
            sandbox = sandbox_config("bound", kube_qos="burstable", labels={LABEL_QOS_CLASS: "LSR"},
                                     annotations={ANNOTATION_RESOURCE_STATUS: json.dumps(
                                         {"cpuset": format_cpu_list(online[-1:])})})
            pod_dir = CGROUP_V1 / "cpu" / sandbox.linux.cgroup_parent.lstrip("/")
            for directory in reversed((pod_dir, *pod_dir.parents)):  # kubelet makes the pod's cgroup first
                if not directory.exists():
                    directory.mkdir()
                    made.append(directory)
            sid = pods.run_pod(sandbox)
            assert (pod_dir / "cpu.cfs_quota_us").read_text().strip() == "-1"  # PreRunPodSandbox's answer
            (pod_dir / "cpu.cfs_quota_us").write_text("400000")  # kubelet's pod-level resize
            with pytest.raises(grpc.RpcError) as err:
                client.runtime.UpdatePodSandboxResources(cri.UpdatePodSandboxResourcesRequest(
                    pod_sandbox_id=sid, resources=cri.LinuxContainerResources(cpu_period=100000, cpu_quota=400000,
                                                                              cpu_shares=4096)), timeout=30)
            assert err.value.code() is grpc.StatusCode.UNIMPLEMENTED
            assert (pod_dir / "cpu.cfs_quota_us").read_text().strip() == "-1"
    finally:
        for directory in reversed(made):
            with contextlib.suppress(OSError):  # runc may have pruned it already
                directory.rmdir()
