"""koordlet's hook server through real gRPC, and end to end: real proxy, real containerd, real cgroup v1."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from koordlet.api.nodeslo import default_node_slo_spec, parse_node_slo_spec
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.executor import ResourceExecutor
from koordlet.runtimehooks import RuntimeHooks, RuntimeHooksConfig
from koordlet.statesinformer.api import NodeInfo, StaticStates
from koordlet.system.cgroup import CgroupFS
from koordlet.system.kubepods import KubeCgroupLayout
from tests.support.containerd import CGROUP_ROOT
from tests.support.cri import CriClient, PodFactory, container_config, sandbox_config
from tests.support.proxy import ProxyProcess
from wire import cri_pb2 as cri
from wire import hookapi_pb2 as hookapi
from wire import hookapi_pb2_grpc as hookapi_grpc

GATES = {"BatchResource": True, "CPUSetAllocator": True, "GroupIdentity": True, "GPUEnvInject": True}
SPEC = {"containers": {"job": {"requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "64Mi"},
                               "limits": {"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "96Mi"}}}}
BE_ANNOTATIONS = {"node.koordinator.sh/extended-resource-spec": json.dumps(SPEC)}
BE_LABELS = {"koordinator.sh/qosClass": "BE"}
CGROUP_V1 = Path("/sys/fs/cgroup")


def _hooks(tmp_path: Path, states: StaticStates, cgroup_root: str = "/", interval_s: float = 60.0,
           gates: dict[str, bool] = GATES) -> RuntimeHooks:
    config = RuntimeHooksConfig(socket_path=str(tmp_path / "koordlet.sock"),
                                host_endpoint=str(tmp_path / "koordlet.sock"),
                                config_dir=str(tmp_path / "hookserver.d"), reconcile_interval_s=interval_s,
                                feature_gates=gates)
    executor = ResourceExecutor(CgroupFS(mount_dir=os.path.join(cgroup_root, "sys/fs/cgroup")))
    return RuntimeHooks(config, states, executor, KubeCgroupLayout(cgroup_root=CGROUP_ROOT))


@contextlib.contextmanager
def _through_proxy(hooks: RuntimeHooks, containerd_socket: str,
                   tmp_path: Path) -> Iterator[tuple[CriClient, PodFactory]]:
    """``hooks`` started behind a real proxy in front of ``containerd_socket``: a CRI client of the proxy and a pod
    factory on it; everything stopped and cleaned up after (the pods straight on containerd)."""
    hooks.start()
    proxy = ProxyProcess(str(tmp_path / "proxy.sock"), containerd_socket, state_dir=str(tmp_path)).start()
    client = CriClient(proxy.listen)
    pods = PodFactory(client)
    try:
        yield client, pods
    finally:
        pods.client = CriClient(containerd_socket)
        pods.cleanup()
        pods.client.close()
        client.close()
        proxy.terminate()
        hooks.stop()


@pytest.fixture()
def served(tmp_path: Path):
    hooks = _hooks(tmp_path, StaticStates(node=NodeInfo("n1")), cgroup_root=str(tmp_path / "fakecg"))
    hooks.start()
    channel = grpc.insecure_channel(f"unix://{hooks.config.socket_path}")
    try:
        yield hooks, hookapi_grpc.RuntimeHookServiceStub(channel)
    finally:
        channel.close()
        hooks.stop()


def test_server_answers_full_desired_state_with_batch_resources(served) -> None:
    hooks, stub = served
    request = hookapi.ContainerResourceHookRequest(
        pod_meta=hookapi.PodSandboxMetadata(name="job", namespace="ns", uid="u1"),
        container_meta=hookapi.ContainerMetadata(name="job", attempt=0),
        container_annotations={"kept": "yes"},
        container_resources=hookapi.LinuxContainerResources(cpu_period=100000, oom_score_adj=1000,
                                                            unified={"memory.high": "max"}),
        pod_annotations=BE_ANNOTATIONS, pod_labels=BE_LABELS,
        pod_cgroup_parent=f"{CGROUP_ROOT}/kubepods/besteffort/podu1", container_envs={"A": "1"})
    response = stub.PreCreateContainerHook(request, timeout=5)
    r = response.container_resources
    assert (r.cpu_shares, r.cpu_quota, r.memory_limit_in_bytes) == (512, 150000, 96 << 20)
    assert r.cpuset_cpus == ""  # BestEffort: follow the besteffort parent
    # echo: what koordlet does not own comes back unchanged
    assert r.cpu_period == 100000 and r.oom_score_adj == 1000 and dict(r.unified) == {"memory.high": "max"}
    assert response.container_annotations == {"kept": "yes"} and response.container_envs == {"A": "1"}
    assert response.pod_cgroup_parent == request.pod_cgroup_parent


def test_unlimited_batch_memory_is_answered_as_minus_one_and_the_proxy_keeps_kubelets_limit(served) -> None:
    """Koordinator's wire answer for a BE container without a batch-memory limit is -1 (not 0); the proxy's
    merge (docs/koordinator.md §2.7) takes a memory limit only when > 0, so the CRI request keeps kubelet's value."""
    from runtimeproxy.interceptor import merge_resources
    from runtimeproxy.store import to_cri_resources

    _, stub = served
    spec = {"containers": {"job": {"requests": {"kubernetes.io/batch-cpu": "500"},
                                   "limits": {"kubernetes.io/batch-cpu": "1500"}}}}
    kubelet = hookapi.LinuxContainerResources(cpu_period=100000, cpu_shares=2, memory_limit_in_bytes=0)
    request = hookapi.ContainerResourceHookRequest(
        pod_meta=hookapi.PodSandboxMetadata(name="job", namespace="ns", uid="u1"),
        container_meta=hookapi.ContainerMetadata(name="job", attempt=0), container_resources=kubelet,
        pod_annotations={"node.koordinator.sh/extended-resource-spec": json.dumps(spec)}, pod_labels=BE_LABELS,
        pod_cgroup_parent=f"{CGROUP_ROOT}/kubepods/besteffort/podu1")
    answer = stub.PreCreateContainerHook(request, timeout=5).container_resources
    assert answer.memory_limit_in_bytes == -1
    rejected: list[tuple[str, object]] = []
    for cached_limit in (0, 64 << 20):  # kubelet's own limit: none (a BE pod), or one it set
        cached = hookapi.LinuxContainerResources()
        cached.CopyFrom(kubelet)
        cached.memory_limit_in_bytes = cached_limit
        merge_resources(cached, answer, lambda name, value: rejected.append((name, value)))
        crireq = to_cri_resources(cached)
        assert crireq.memory_limit_in_bytes == cached_limit
        assert (crireq.cpu_shares, crireq.cpu_quota) == (512, 150000)
    assert rejected == []


def test_registration_file_names_the_stages_and_goes_on_stop(tmp_path: Path) -> None:
    hooks = _hooks(tmp_path, StaticStates(node=NodeInfo("n1")))
    hooks.start()
    path = tmp_path / "hookserver.d" / "koordlet.json"
    try:
        doc = json.loads(path.read_text())
        assert doc == {"remote-endpoint": str(tmp_path / "koordlet.sock"), "failure-policy": "Ignore",
                       "runtime-hooks": ["PreRunPodSandbox", "PreCreateContainer", "PreUpdateContainerResources",
                                         "PreUpdatePodSandboxResources"]}
        assert "\t" in path.read_text()  # tab-indented like Koordinator's
        assert oct(os.stat(hooks.config.socket_path).st_mode & 0o777) == "0o660"
    finally:
        hooks.stop()
    assert not path.exists() and not os.path.exists(hooks.config.socket_path)


def test_bad_annotations_never_break_the_answer(served) -> None:
    _, stub = served
    request = hookapi.ContainerResourceHookRequest(
        pod_meta=hookapi.PodSandboxMetadata(name="bad", namespace="ns", uid="u2"),
        container_meta=hookapi.ContainerMetadata(name="job"),
        container_resources=hookapi.LinuxContainerResources(cpu_shares=77),
        pod_annotations={"node.koordinator.sh/extended-resource-spec": "{not json",
                         "scheduling.koordinator.sh/device-allocated": '{"gpu": [{"minor": "x"}]}'},
        pod_labels=BE_LABELS, pod_cgroup_parent=f"{CGROUP_ROOT}/kubepods/besteffort/podu2")
    response = stub.PreCreateContainerHook(request, timeout=5)
    assert response.container_resources.cpu_shares == 77  # batchresource skipped, the rest still answered
    pod = stub.PreRunPodSandboxHook(hookapi.PodSandboxHookRequest(
        pod_meta=hookapi.PodSandboxMetadata(name="bad", uid="u2"), labels=BE_LABELS,
        annotations={"koordinator.sh/cpuQOS": "[[["}, cgroup_parent="/nowhere/podu2"), timeout=5)
    assert pod.labels == BE_LABELS


@pytest.mark.containerd
def test_be_pod_through_the_proxy_gets_its_batch_resources_on_disk_and_skip_label_opts_out(
        containerd_socket: str, tmp_path: Path) -> None:
    states = StaticStates(node=NodeInfo("n1"), node_slo=default_node_slo_spec())
    hooks = _hooks(tmp_path, states, interval_s=0.5)
    with _through_proxy(hooks, containerd_socket, tmp_path) as (client, pods):
        sandbox = sandbox_config("job", labels=BE_LABELS, annotations=BE_ANNOTATIONS)
        sid = pods.run_pod(sandbox)
        cid = pods.create_container(sid, sandbox, container_config("job"))
        client.runtime.StartContainer(cri.StartContainerRequest(container_id=cid))
        cgroup = f"{sandbox.linux.cgroup_parent}/{cid}".lstrip("/")
        read = lambda ctrl, name: (CGROUP_V1 / ctrl / cgroup / name).read_text().strip()  # noqa: E731
        assert read("cpu", "cpu.shares") == "512"
        assert read("cpu", "cpu.cfs_quota_us") == "150000"
        assert read("memory", "memory.limit_in_bytes") == str(96 << 20)

        skipped = sandbox_config("skipped", labels={**BE_LABELS, "runtimeproxy.koordinator.sh/skip-hookserver": "true"},
                                 annotations=BE_ANNOTATIONS)
        sid2 = pods.run_pod(skipped)
        cid2 = pods.create_container(sid2, skipped, container_config("job"))
        client.runtime.StartContainer(cri.StartContainerRequest(container_id=cid2))
        cgroup2 = f"{skipped.linux.cgroup_parent}/{cid2}".lstrip("/")
        # no hooks: what the CRI request asked for (nothing), i.e. the kernel's default weight
        assert (CGROUP_V1 / "cpu" / cgroup2 / "cpu.shares").read_text().strip() == "1024"
        assert (CGROUP_V1 / "cpu" / cgroup2 / "cpu.cfs_quota_us").read_text().strip() == "-1"

        # The reconciler: the same values without the proxy, and back after drift. The pod level too.
        pod_meta = lambda name, uid, labels, container_id: PodMeta(  # noqa: E731
            name=name, namespace="default", uid=uid, labels=labels, annotations=BE_ANNOTATIONS,
            cgroup_parent=f"{CGROUP_ROOT}/kubepods/besteffort/pod{uid}",
            containers=(ContainerMeta("job", container_id),))
        states.set_pods([pod_meta("job", sandbox.metadata.uid, BE_LABELS, cid),
                         pod_meta("skipped", skipped.metadata.uid, dict(skipped.labels), cid2)])
        (CGROUP_V1 / "cpu" / cgroup / "cpu.cfs_quota_us").write_text("50000")
        pod_dir = sandbox.linux.cgroup_parent.lstrip("/")
        pod_quota = lambda: (CGROUP_V1 / "cpu" / pod_dir / "cpu.cfs_quota_us").read_text().strip()  # noqa: E731
        # one reconcile pass writes the container and the pod level one after the other (the tighter
        # child first): wait for the pass to finish, i.e. for both values
        deadline = time.monotonic() + 10
        while (read("cpu", "cpu.cfs_quota_us"), pod_quota()) != ("150000", "150000"):
            assert time.monotonic() < deadline, (
                f"the reconciler did not restore the quotas: container {read('cpu', 'cpu.cfs_quota_us')}, "
                f"pod {pod_quota()}")
            time.sleep(0.1)
        assert (CGROUP_V1 / "memory" / pod_dir / "memory.limit_in_bytes").read_text().strip() == str(96 << 20)
        assert (CGROUP_V1 / "cpu" / cgroup2 / "cpu.shares").read_text().strip() == "1024"  # skip label: left alone


@pytest.mark.containerd
def test_be_pod_through_the_proxy_gets_cpu_idle_at_run_pod_sandbox(containerd_socket: str, tmp_path: Path) -> None:
    """CoreSched with ``beClass.cpuQOS.schedIdle: 1`` through koord-runtime-proxy: the hook server writes the BE pod
    dir's ``cpu.idle`` at PreRunPodSandbox (the reconciler does not run here), the LS pod's gets 0."""
    core_sched = parse_node_slo_spec({"resourceQOSStrategy": {
        "policies": {"cpuPolicy": "coreSched"}, "beClass": {"cpuQOS": {"enable": True, "schedIdle": 1}}}})
    states = StaticStates(node=NodeInfo("n1"), node_slo=core_sched)
    hooks = _hooks(tmp_path, states, interval_s=3600, gates={**GATES, "CoreSched": True})
    made: list[Path] = []
    try:
        with _through_proxy(hooks, containerd_socket, tmp_path) as (_, pods):
            be = sandbox_config("job", labels=BE_LABELS, annotations=BE_ANNOTATIONS)
            ls = sandbox_config("web", kube_qos="burstable", labels={"koordinator.sh/qosClass": "LS"})
            for sandbox in (be, ls):
                # kubelet makes the pod's cgroup before it asks for the sandbox
                pod_dir = CGROUP_V1 / "cpu" / sandbox.linux.cgroup_parent.lstrip("/")
                for directory in reversed((pod_dir, *pod_dir.parents)):
                    if not directory.exists():
                        directory.mkdir()
                        made.append(directory)
                pods.run_pod(sandbox)
            idle = lambda sandbox: (CGROUP_V1 / "cpu" / sandbox.linux.cgroup_parent.lstrip("/")  # noqa: E731
                                    / "cpu.idle").read_text().strip()
            assert (idle(be), idle(ls)) == ("1", "0")
    finally:
        for directory in reversed(made):
            with contextlib.suppress(OSError):  # runc may have pruned it already
                directory.rmdir()


@pytest.mark.containerd
def test_a_pods_resctrl_group_goes_after_post_stop_pod_sandbox_through_the_proxy(
        containerd_socket: str, tmp_path: Path) -> None:
    """Real proxy, real containerd, koordlet's hook server with the Resctrl gate on a fixture resctrl tree: the
    group made at PreRunPodSandbox is removed at PostStopPodSandbox, which koordlet registers for."""
    from tests.support.resctrl import resctrl_tree
    from tests.support.waiting import wait_for

    root = resctrl_tree(tmp_path / "resctrl")
    config = RuntimeHooksConfig(socket_path=str(tmp_path / "koordlet.sock"),
                                host_endpoint=str(tmp_path / "koordlet.sock"),
                                config_dir=str(tmp_path / "hookserver.d"), reconcile_interval_s=3600,
                                feature_gates={"Resctrl": True}, resctrl_dir=str(root))
    executor = ResourceExecutor(CgroupFS(), resctrl_root=str(root))
    hooks = RuntimeHooks(config, StaticStates(node=NodeInfo("n1")), executor, KubeCgroupLayout(cgroup_root=CGROUP_ROOT))
    with _through_proxy(hooks, containerd_socket, tmp_path) as (client, pods):
        registered = json.loads((tmp_path / "hookserver.d" / "koordlet.json").read_text())["runtime-hooks"]
        assert registered == ["PreRunPodSandbox", "PreCreateContainer", "PostStopPodSandbox"]
        annotations = {"node.koordinator.sh/resctrl": json.dumps({"llc": {"schemata": {"range": [0, 50]}}})}
        sandbox = sandbox_config("rdt", annotations=annotations)
        sid = pods.run_pod(sandbox)
        group = root / f"koordlet-{sandbox.metadata.uid}"
        assert group.is_dir()  # PreRunPodSandbox made it before the proxy went on to containerd
        assert executor.records.resctrl_groups.get(group.name) is not None
        client.runtime.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=30)
        assert wait_for(lambda: not group.exists(), 5), "PostStopPodSandbox removes the group"
        assert executor.records.resctrl_groups.keys() == frozenset()
