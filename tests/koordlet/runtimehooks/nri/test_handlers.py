"""koordlet's NRI answers (runtimehooks/nri/handlers.py, convert.py) from NRI messages as containerd sends them:
the same plugins as behind the proxy, only what differs from the container, the container id on every update,
Synchronize converging what runs, dropped values reported, and one answer when the proxy asked first."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hooks import registry
from hooks.protocol import Changes, NodeContext
from koordlet.api.pod import PodMeta
from koordlet.executor import ResourceExecutor
from koordlet.executor.records import NodeRecords
from koordlet.runtimehooks.apply import RejectedValues
from koordlet.runtimehooks.decisions import Decisions
from koordlet.runtimehooks.nri import NriHandlers, convert
from koordlet.runtimehooks.server import HookService
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.kubepods import KubeCgroupLayout
from wire import hookapi_pb2 as hookapi
from wire import nri_pb2 as api

GATES = {"BatchResource": True, "CPUSetAllocator": True, "GroupIdentity": True, "GPUEnvInject": True,
         "CPUNormalization": True}
SPEC = {"containers": {"job": {"requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "64Mi"},
                               "limits": {"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "96Mi"}}}}
BE_LABELS = {"koordinator.sh/qosClass": "BE"}
BE_ANNOTATIONS = {"node.koordinator.sh/extended-resource-spec": json.dumps(SPEC)}
RATIO = {"node.koordinator.sh/cpu-normalization-ratio": "1.25"}


def sandbox(uid: str = "u1", labels=None, annotations=None, qos: str = "besteffort") -> api.PodSandbox:
    return api.PodSandbox(id=f"sb-{uid}", name="job", namespace="default", uid=uid, labels=labels or {},
                          annotations=annotations or {},
                          linux=api.LinuxPodSandbox(cgroup_parent=f"/kubepods/{qos}/pod{uid}"))


def container(cid: str = "c1", uid: str = "u1", shares: int = 2, quota: int | None = None, env=(),
              state: int = api.CONTAINER_CREATED, name: str = "job") -> api.Container:
    resources = api.LinuxResources()
    resources.cpu.shares.value = shares
    resources.cpu.period.value = 100000
    if quota is not None:
        resources.cpu.quota.value = quota
    return api.Container(id=cid, pod_sandbox_id=f"sb-{uid}", name=name, state=state, env=list(env),
                         linux=api.LinuxContainer(resources=resources))


def handlers(tmp_path: Path, node: NodeContext | None = None, pods=(), decisions=None, rejects=None,
             disabled=frozenset(), version=CgroupVersion.V1) -> NriHandlers:
    executor = ResourceExecutor(CgroupFS(mount_dir=str(tmp_path / "cg"), version=version))
    return NriHandlers(lambda: registry.enabled(GATES), lambda: node or NodeContext(), lambda: pods, executor,
                       KubeCgroupLayout(), disabled, rejects, decisions)


def test_a_be_container_is_created_with_its_batch_values_and_nothing_it_already_has(tmp_path: Path) -> None:
    request = api.CreateContainerRequest(pod=sandbox(labels=BE_LABELS, annotations=BE_ANNOTATIONS),
                                         container=container(env=["PATH=/bin"]))
    adjust = handlers(tmp_path).create_container(request).adjust
    cpu = adjust.linux.resources.cpu
    assert (cpu.shares.value, cpu.quota.value, adjust.linux.resources.memory.limit.value) == (512, 150000, 96 << 20)
    assert not cpu.HasField("period")  # kubelet's period is there already
    assert cpu.cpus == "" and not adjust.env and not adjust.annotations


def test_a_container_that_already_is_as_the_plugins_want_gets_an_empty_answer(tmp_path: Path) -> None:
    request = api.CreateContainerRequest(pod=sandbox(), container=container())  # no qosClass, no annotations
    assert handlers(tmp_path).create_container(request).ByteSize() == 0


def test_gpu_env_and_bound_cpuset_reach_the_adjustment(tmp_path: Path) -> None:
    annotations = {"scheduling.koordinator.sh/device-allocated": json.dumps({"gpu": [{"minor": 1}, {"minor": 0}]}),
                   "scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": "0-1"})}
    request = api.CreateContainerRequest(pod=sandbox(annotations=annotations, qos="burstable"),
                                         container=container(quota=200000, env=["A=1"]))
    adjust = handlers(tmp_path).create_container(request).adjust
    assert [(e.key, e.value) for e in adjust.env] == [("NVIDIA_VISIBLE_DEVICES", "1,0")]
    cpu = adjust.linux.resources.cpu
    assert cpu.cpus == "0-1" and cpu.quota.value == -1  # bound pods are not throttled (Koordinator #489)


def test_an_update_carries_the_container_id_and_what_the_plugins_change_in_the_asked_resources(tmp_path: Path) -> None:
    asked = api.LinuxResources()
    asked.cpu.shares.value = 1024
    asked.cpu.quota.value = 300000
    asked.memory.limit.value = 1 << 30
    request = api.UpdateContainerRequest(pod=sandbox(labels=BE_LABELS, annotations=BE_ANNOTATIONS),
                                         container=container(), linux_resources=asked)
    (update,) = handlers(tmp_path).update_container(request).update
    assert update.container_id == "c1"  # Koordinator leaves it out, so containerd cannot apply it (#3129)
    r = update.linux.resources
    assert (r.cpu.shares.value, r.cpu.quota.value, r.memory.limit.value) == (512, 150000, 96 << 20)
    request.pod.labels.clear()
    assert not handlers(tmp_path).update_container(request).update  # nothing to change: no update at all


def test_synchronize_answers_updates_for_running_containers_that_differ(tmp_path: Path) -> None:
    be = sandbox("u1", BE_LABELS, BE_ANNOTATIONS)
    plain = sandbox("u2")
    skipped = sandbox("u3", {**BE_LABELS, "runtimeproxy.koordinator.sh/skip-hookserver": "true"}, BE_ANNOTATIONS)
    containers = [container("c1", "u1", state=api.CONTAINER_RUNNING), container("c2", "u2"),
                  container("c3", "u3", state=api.CONTAINER_RUNNING),
                  container("c4", "u1", state=api.CONTAINER_STOPPED, name="old")]
    updates = handlers(tmp_path).synchronize([be, plain, skipped], containers, time.monotonic() + 1)
    assert [(u.container_id, u.linux.resources.cpu.shares.value, u.ignore_failure) for u in updates] == \
        [("c1", 512, True)]
    assert handlers(tmp_path).synchronize([be], containers[:1], time.monotonic() - 1) == []  # past its deadline


def test_synchronize_decides_from_the_pod_spec_so_a_relative_rule_is_not_applied_twice(tmp_path: Path) -> None:
    """A container koordlet already normalized (quota 160000 from kubelet's 200000 at ratio 1.25) must not be
    divided again when koordlet restarts and syncs: the spec's limit is the base, as in the reconciler."""
    from koordlet.api.pod import ContainerMeta

    known = PodMeta(name="ls", namespace="default", uid="u1", labels={"koordinator.sh/qosClass": "LS"},
                    containers=(ContainerMeta(name="job", container_id="c1", limits={"cpu": 2000}),))
    node = NodeContext(node_annotations=RATIO)
    running = container("c1", quota=160000, state=api.CONTAINER_RUNNING)
    pod = sandbox("u1", {"koordinator.sh/qosClass": "LS"}, qos="burstable")
    assert handlers(tmp_path, node, pods=(known,)).synchronize([pod], [running], time.monotonic() + 1) == []


def test_dropped_values_are_reported_with_the_pod_and_the_rest_still_applied(tmp_path: Path) -> None:
    warned: list[tuple[str, str]] = []
    rejects = RejectedValues(lambda pod, reason, message: warned.append((pod.key, reason)))
    spec = {"containers": {"job": {"requests": {"kubernetes.io/batch-cpu": "500"},
                                   "limits": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "1"}}}}
    request = api.CreateContainerRequest(
        pod=sandbox(labels=BE_LABELS, annotations={"node.koordinator.sh/extended-resource-spec": json.dumps(spec)}),
        container=container())
    adjust = handlers(tmp_path, rejects=rejects).create_container(request).adjust
    assert adjust.linux.resources.cpu.shares.value == 512 and not adjust.linux.resources.HasField("memory")
    assert warned == [("default/job", "KoordletHookValueRejected")]  # a 1-byte limit: dropped, Event written


def test_disabled_stages_and_skip_label_get_no_answer(tmp_path: Path) -> None:
    request = api.CreateContainerRequest(pod=sandbox(labels=BE_LABELS, annotations=BE_ANNOTATIONS),
                                         container=container())
    assert handlers(tmp_path, disabled=frozenset({"PreCreateContainer"})).create_container(request).ByteSize() == 0
    request.pod.labels["runtimeproxy.koordinator.sh/skip-hookserver"] = "true"
    assert handlers(tmp_path).create_container(request).ByteSize() == 0


def _proxy_request(uid: str = "u1") -> hookapi.ContainerResourceHookRequest:
    return hookapi.ContainerResourceHookRequest(
        pod_meta=hookapi.PodSandboxMetadata(name="job", namespace="default", uid=uid),
        container_meta=hookapi.ContainerMetadata(name="job"), pod_labels={"koordinator.sh/qosClass": "LS"},
        pod_cgroup_parent=f"/kubepods/burstable/pod{uid}",
        container_resources=hookapi.LinuxContainerResources(cpu_shares=2048, cpu_quota=200000, cpu_period=100000))


@pytest.mark.parametrize("shared", [True, False])
def test_with_proxy_and_nri_both_on_a_container_gets_one_answer(tmp_path: Path, shared: bool) -> None:
    """The proxy asks first (kubelet's quota 200000, normalized to 160000 at ratio 1.25); containerd then asks
    NRI about the container as the proxy left it. With the shared decisions NRI changes nothing more; deciding
    again would divide once more (128000): the second answer the shared decisions exist to prevent."""
    node = NodeContext(node_annotations=RATIO)
    executor = ResourceExecutor(CgroupFS(mount_dir=str(tmp_path / "cg")))
    decisions = Decisions() if shared else None
    service = HookService(lambda: registry.enabled(GATES), lambda: node, lambda uid: None, executor,
                          KubeCgroupLayout(), decisions=decisions)
    proxy_answer = service._container(registry.Stage.PRE_CREATE_CONTAINER, _proxy_request())
    assert proxy_answer.container_resources.cpu_quota == 160000
    nri = handlers(tmp_path, node, decisions=decisions)
    as_proxy_left_it = container(shares=2048, quota=160000)
    adjust = nri.create_container(api.CreateContainerRequest(
        pod=sandbox(labels={"koordinator.sh/qosClass": "LS"}, qos="burstable"), container=as_proxy_left_it)).adjust
    if shared:
        assert adjust.ByteSize() == 0 and decisions is not None and decisions.reused == 1
    else:
        assert adjust.linux.resources.cpu.quota.value == 128000


def test_a_cgroup_v2_only_value_travels_in_unified_and_v1_leaves_it_out() -> None:
    current = api.LinuxResources()
    v2 = convert.resources_change(Changes(cpu_idle=1), current, cgroup_v2=True)
    assert dict(v2.unified) == {"cpu.idle": "1"}
    assert convert.resources_change(Changes(cpu_idle=1), current, cgroup_v2=False).ByteSize() == 0


def test_unlimited_is_only_set_over_a_limit_and_a_quota_brings_its_period() -> None:
    unlimited = api.LinuxResources()
    assert convert.resources_change(Changes(cfs_quota_us=-1, memory_limit_bytes=-1), unlimited, False).ByteSize() == 0
    limited = api.LinuxResources()
    limited.cpu.quota.value = 50000
    limited.memory.limit.value = 1 << 20
    out = convert.resources_change(Changes(cfs_quota_us=-1, memory_limit_bytes=-1), limited, False)
    assert (out.cpu.quota.value, out.memory.limit.value) == (-1, -1)
    out = convert.resources_change(Changes(cfs_quota_us=20000, resctrl_group="koordlet-u1"), unlimited, False)
    assert (out.cpu.quota.value, out.cpu.period.value, out.rdt_class.value) == (20000, 100000, "koordlet-u1")


RDT_ANNOTATIONS = {"node.koordinator.sh/resctrl": json.dumps({"llc": {"schemata": {"range": [0, 50]}}})}
RDT_GATES = {**GATES, "Resctrl": True}


def rdt_handlers(tmp_path: Path, resctrl_root: Path | None, gates=RDT_GATES, rejects=None,
                 records: NodeRecords | None = None) -> NriHandlers:
    from koordlet.runtimehooks import read_resctrl_node

    node = NodeContext(resctrl=read_resctrl_node(str(resctrl_root)) if resctrl_root else None)
    executor = ResourceExecutor(CgroupFS(mount_dir=str(tmp_path / "cg")),
                                resctrl_root=str(resctrl_root) if resctrl_root else None, records=records)
    return NriHandlers(lambda: registry.enabled(gates), lambda: node, lambda: (), executor, KubeCgroupLayout(),
                       rejects=rejects)


def rdt_class(nri: NriHandlers, pod: api.PodSandbox) -> str | None:
    resources = nri.create_container(api.CreateContainerRequest(pod=pod, container=container())).adjust.linux.resources
    return resources.rdt_class.value if resources.HasField("rdt_class") else None


def test_a_pod_with_its_own_resctrl_group_gets_it_as_its_containers_rdt_class(tmp_path: Path) -> None:
    from tests.support.resctrl import group_as_the_kernel_makes_it, resctrl_tree

    root = resctrl_tree(tmp_path / "resctrl")
    group_as_the_kernel_makes_it(root, "koordlet-u1")
    nri = rdt_handlers(tmp_path, root)
    assert rdt_class(nri, sandbox(annotations=RDT_ANNOTATIONS)) == "koordlet-u1"
    assert rdt_class(rdt_handlers(tmp_path, None), sandbox(annotations=RDT_ANNOTATIONS)) is None  # no RDT: runc
    # would refuse a closID


def test_the_group_is_made_before_create_container_is_answered_while_the_pod_queue_is_blocked(
        tmp_path: Path) -> None:
    """RunPodSandbox's writes wait behind a busy pod queue: CreateContainer makes the group itself, so runc finds
    the class's directory."""
    import threading

    from tests.support.resctrl import resctrl_tree

    root = resctrl_tree(tmp_path / "resctrl")
    nri = rdt_handlers(tmp_path, root)
    gate = threading.Event()
    nri._pod_work.submit(gate.wait, 5)  # the background thread is busy
    try:
        pod = sandbox(annotations=RDT_ANNOTATIONS)
        nri.state_change(api.StateChangeEvent(event=api.RUN_POD_SANDBOX, pod=pod))
        assert not (root / "koordlet-u1").exists()  # RunPodSandbox's work is queued
        assert rdt_class(nri, pod) == "koordlet-u1"
        assert (root / "koordlet-u1").is_dir()
        assert nri._groups.remove("u1", "test") and not (root / "koordlet-u1").exists()
    finally:
        gate.set()
        nri.close()


def test_a_group_the_kernel_refuses_leaves_the_rdt_class_out_and_is_reported(tmp_path: Path) -> None:
    """ENOSPC, as once the CPU's CLOSIDs are used up: the container is created without the class (runc would fail
    it), and the drop is counted, logged and written as an Event."""
    from prometheus_client import REGISTRY

    from tests.support.resctrl import resctrl_tree_without_closids

    events: list[tuple[str, str]] = []
    with resctrl_tree_without_closids(tmp_path / "resctrl") as root:
        nri = rdt_handlers(tmp_path, root,
                           rejects=RejectedValues(lambda pod, reason, message: events.append((reason, message))))
        before = REGISTRY.get_sample_value("koordlet_runtime_hook_value_rejected_total", {"key": "resctrl_group"}) or 0
        assert rdt_class(nri, sandbox(annotations=RDT_ANNOTATIONS)) is None
        assert not (root / "koordlet-u1").exists()
        assert REGISTRY.get_sample_value("koordlet_runtime_hook_value_rejected_total",
                                         {"key": "resctrl_group"}) == before + 1
        assert [reason for reason, _ in events] == ["KoordletHookValueRejected"]
        assert "No space left on device" in events[0][1] and "without their RDT class" in events[0][1]
        nri.close()


def test_a_group_whose_record_cannot_be_written_is_not_made_and_the_rdt_class_is_left_out_and_reported(
        tmp_path: Path) -> None:
    """Made but not recorded, a group would never be removed and would hold one of the CPU's CLOSIDs (16 on many)
    for good; once they are used up new pods start without their class. So a group whose record cannot be
    written is not made, at RunPodSandbox and at CreateContainer: the container is created without the class,
    and the drop is counted, logged and written as an Event. Once the record can be written, the group is made."""
    from prometheus_client import REGISTRY

    from tests.support.resctrl import resctrl_tree

    root = resctrl_tree(tmp_path / "resctrl")
    (tmp_path / "run").write_text("a file where the records' dir should be\n")
    records = NodeRecords.beside(str(tmp_path / "run" / "system-config-originals.json"))
    events: list[tuple[str, str]] = []
    nri = rdt_handlers(tmp_path, root, records=records,
                       rejects=RejectedValues(lambda pod, reason, message: events.append((reason, message))))
    labels = {"resource": "resctrl.group", "status": "failed"}
    before = REGISTRY.get_sample_value("koordlet_resource_update_total", labels) or 0
    pod = sandbox(annotations=RDT_ANNOTATIONS)
    try:
        nri.run_pod_sandbox(pod)
        assert rdt_class(nri, pod) is None
        assert not (root / "koordlet-u1").exists() and records.resctrl_groups.keys() == frozenset()
        assert REGISTRY.get_sample_value("koordlet_resource_update_total", labels) == before + 2
        assert [reason for reason, _ in events] == ["KoordletHookValueRejected"]
        assert "cannot be recorded" in events[0][1] and "without their RDT class" in events[0][1]
        (tmp_path / "run").unlink()
        assert rdt_class(nri, pod) == "koordlet-u1" and records.resctrl_groups.keys() == {"koordlet-u1"}
        assert json.loads((tmp_path / "run" / "resctrl-groups.json").read_text())["originals"].keys() == {
            "koordlet-u1"}
    finally:
        nri.close()


def test_remove_pod_sandbox_removes_the_group_koordlet_made_whatever_the_gates_say_now(tmp_path: Path) -> None:
    """The record says what koordlet made: a group is removed with its pod even when the gate and the node's RDT
    no longer ask for it, and a group koordlet did not make is never removed, even one named koordlet-*."""
    from tests.support.resctrl import group_as_the_kernel_makes_it, resctrl_tree

    root = resctrl_tree(tmp_path / "resctrl")
    made = rdt_handlers(tmp_path, root)
    made.run_pod_sandbox(sandbox(annotations=RDT_ANNOTATIONS))  # no pod dir: the group is made all the same
    assert (root / "koordlet-u1").is_dir()
    group_as_the_kernel_makes_it(root, "koordlet-u2")  # another agent's
    # the same node and record, the gate off now and no RDT seen
    later = NriHandlers(lambda: registry.enabled(GATES), NodeContext, lambda: (), made._executor, KubeCgroupLayout())
    later.remove_pod_sandbox(sandbox(annotations=RDT_ANNOTATIONS))
    later.remove_pod_sandbox(sandbox(uid="u2", annotations=RDT_ANNOTATIONS))
    assert not (root / "koordlet-u1").exists() and (root / "koordlet-u2").is_dir()
    assert made._executor.records.resctrl_groups.keys() == frozenset()


def test_hostile_input_never_breaks_the_answer_nor_reaches_a_path_outside_the_cgroups(tmp_path: Path) -> None:
    """A cgroup parent that climbs out and annotations that are not JSON: the pod level writes nothing, the
    malformed plugin input is skipped (counted), the rest of the answer still comes."""
    from prometheus_client import REGISTRY

    before = REGISTRY.get_sample_value("koordlet_runtime_hook_plugin_errors_total", {"plugin": "batchresource"}) or 0
    pod = sandbox(labels=BE_LABELS, annotations={"node.koordinator.sh/extended-resource-spec": "{not json",
                                                 "scheduling.koordinator.sh/resource-status": '{"cpuset": "0"}'})
    pod.linux.cgroup_parent = "/kubepods/../../../etc"
    nri = handlers(tmp_path)
    nri.run_pod_sandbox(pod)
    adjust = nri.create_container(api.CreateContainerRequest(pod=pod, container=container(quota=100000))).adjust
    assert adjust.linux.resources.cpu.cpus == "0"  # cpuset still answered
    assert REGISTRY.get_sample_value("koordlet_runtime_hook_plugin_errors_total",
                                     {"plugin": "batchresource"}) == before + 2  # once per event
    assert not any((tmp_path / "cg").rglob("*"))  # nothing written anywhere


def test_pod_events_are_answered_at_once_and_their_writes_follow_in_order(tmp_path: Path) -> None:
    """containerd waits for the answer to RunPodSandbox before it returns to kubelet: koordlet answers first
    and writes the pod's values right after, in the order the pod events came."""
    import threading

    pod_dir = tmp_path / "cg/cpu/kubepods/besteffort/podu1"
    pod_dir.mkdir(parents=True)
    (pod_dir / "cpu.shares").write_text("1024\n")
    (pod_dir / "cpu.cfs_quota_us").write_text("-1\n")
    nri = handlers(tmp_path)
    gate = threading.Event()
    nri._pod_work.submit(gate.wait, 5)  # the background thread is busy
    event = api.StateChangeEvent(event=api.RUN_POD_SANDBOX, pod=sandbox(labels=BE_LABELS, annotations=BE_ANNOTATIONS))
    started = time.monotonic()
    nri.state_change(event)
    assert time.monotonic() - started < 0.1 and (pod_dir / "cpu.shares").read_text().strip() == "1024"
    gate.set()
    nri._pod_work.submit(lambda: None).result(5)  # the pod events received so far are carried out
    assert (pod_dir / "cpu.shares").read_text().strip() == "512"
    assert (pod_dir / "cpu.cfs_quota_us").read_text().strip() == "150000"
    nri.close()
