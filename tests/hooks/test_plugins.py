"""Each hook plugin against hand-computed values (docs/koordinator.md §3.2, §3.3)."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hooks import batchresource, coresched, cpunormalization, cpuset, gpu, groupidentity, registry, resctrl
from hooks.protocol import (
    NO_CHANGES,
    Changes,
    ContainerContext,
    ContainerResources,
    NodeContext,
    PodContext,
    ResctrlNode,
    memory_limit,
    quota_from_milli,
    shares_from_milli,
)
from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.api.qos import KubeQoS

BE = {"koordinator.sh/qosClass": "BE"}
LS = {"koordinator.sh/qosClass": "LS"}
SPEC = {"containers": {
    "a": {"requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "256Mi"},
          "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "1Gi"}},
    "b": {"requests": {"kubernetes.io/batch-cpu": "250"},
          "limits": {"kubernetes.io/batch-cpu": "2000", "kubernetes.io/batch-memory": "512Mi"}},
}}
NODE = NodeContext()


def be_pod(annotations=None, **kw) -> PodMeta:
    annotations = {"node.koordinator.sh/extended-resource-spec": json.dumps(SPEC)} if annotations is None \
        else annotations
    return PodMeta(name="job", namespace="ns", uid="u1", labels=BE, annotations=annotations,
                   cgroup_parent="/kubepods/besteffort/podu1", **kw)


@pytest.mark.parametrize("milli,shares,quota", [
    (0, 2, -1), (-5, 2, -1), (1, 2, 1000), (5, 5, 1000), (500, 512, 50000), (1000, 1024, 100000),
    (300_000, 262144, 30_000_000),
])
def test_unit_conversions(milli: int, shares: int, quota: int) -> None:
    assert shares_from_milli(milli) == shares
    assert quota_from_milli(milli) == quota
    assert memory_limit(0) == -1 and memory_limit(1 << 20) == 1 << 20


def test_batch_resources_of_a_be_pod_from_the_annotation() -> None:
    rule = batchresource.rule(NODE)
    pod = batchresource.pod(PodContext(be_pod()), rule)
    # shares of 500+250 m; quota of 1000+2000 m; memory 1Gi+512Mi
    assert pod == Changes(cpu_shares=768, cfs_quota_us=300000, memory_limit_bytes=(1 << 30) + (512 << 20))
    a = batchresource.container(ContainerContext(be_pod(), "a"), rule)
    assert a == Changes(cpu_shares=512, cfs_quota_us=100000, memory_limit_bytes=1 << 30)
    b = batchresource.container(ContainerContext(be_pod(), "b"), rule)
    assert b == Changes(cpu_shares=256, cfs_quota_us=200000, memory_limit_bytes=512 << 20)
    unknown = batchresource.container(ContainerContext(be_pod(), "sidecar"), rule)
    assert unknown == Changes(cpu_shares=2, cfs_quota_us=-1, memory_limit_bytes=-1)


def test_batch_resources_from_the_pod_spec_and_missing_limits_mean_unlimited() -> None:
    pod = be_pod(annotations={}, containers=(
        ContainerMeta("a", "c1", requests={"kubernetes.io/batch-cpu": 1000}, limits={"kubernetes.io/batch-cpu": 1500}),
        ContainerMeta("b", "c2", requests={"kubernetes.io/batch-cpu": 1000}),
    ))
    changes = batchresource.pod(PodContext(pod), batchresource.rule(NODE))
    assert changes == Changes(cpu_shares=2048, cfs_quota_us=-1, memory_limit_bytes=-1)


def test_batch_resources_leave_a_pod_whose_requests_are_unknown_alone_unless_annotated() -> None:
    """A pod from the CRI pod source (local mode) knows no batch requests: no shares of 2, no -1 quota on a
    guess. The annotation, which kubelet passes to the sandbox, is still read."""
    containers = (ContainerMeta("a", "c1", requests={"kubernetes.io/batch-cpu": 1000}),)
    local = be_pod(annotations={}, containers=containers, requests_known=False)
    assert batchresource.pod(PodContext(local), batchresource.rule(NODE)) == NO_CHANGES
    assert batchresource.container(ContainerContext(local, "a"), batchresource.rule(NODE)) == NO_CHANGES
    annotated = be_pod(requests_known=False)
    assert batchresource.pod(PodContext(annotated), batchresource.rule(NODE)).cpu_shares == 768


def test_cfs_quota_suppress_and_normalization_change_be_quotas() -> None:
    suppress = NodeContext(node_slo=parse_node_slo_spec(
        {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressPolicy": "cfsQuota"}}))
    assert batchresource.container(ContainerContext(be_pod(), "a"), batchresource.rule(suppress)).cfs_quota_us == -1
    faster = NodeContext(node_annotations={"node.koordinator.sh/cpu-normalization-ratio": "1.5"})
    assert batchresource.container(ContainerContext(be_pod(), "a"),
                                   batchresource.rule(faster)).cfs_quota_us == 66667  # ceil(100000 / 1.5)


def test_batch_resources_ignore_pods_that_are_not_be() -> None:
    pod = PodMeta(name="web", namespace="ns", uid="u2", labels=LS, annotations=be_pod().annotations)
    assert not batchresource.pod(PodContext(pod), batchresource.rule(NODE))


def test_group_identity_values_by_class_and_annotation() -> None:
    enabled = NodeContext(node_slo=parse_node_slo_spec({"resourceQOSStrategy": {
        "lsrClass": {"cpuQOS": {"enable": True}}, "lsClass": {"cpuQOS": {"enable": True}},
        "beClass": {"cpuQOS": {"enable": True}}}}))
    rule = groupidentity.rule(enabled)

    def bvt(labels=None, annotations=None, kube_qos=None):
        pod = PodMeta(name="p", namespace="n", uid="u", labels=labels or {}, annotations=annotations or {},
                      kube_qos=kube_qos)
        return groupidentity.pod(PodContext(pod), rule).bvt_warp_ns

    assert bvt({"koordinator.sh/qosClass": "LSR"}) == 2
    assert bvt(LS) == 2 and bvt(BE) == -1 and bvt({"koordinator.sh/qosClass": "SYSTEM"}) == 0
    assert bvt(kube_qos=KubeQoS.GUARANTEED) == 2 and bvt(kube_qos=KubeQoS.BESTEFFORT) == -1
    assert bvt(LS, {"koordinator.sh/cpuQOS": '{"enable": true, "groupIdentity": 1}'}) == 1
    assert bvt(LS, {"koordinator.sh/cpuQOS": '{"enable": false, "groupIdentity": 1}'}) == 0
    assert bvt(BE, {"koordinator.sh/cpuQOS": '{"enable": true, "groupIdentity": 2}'}) == -1  # LS pods only
    disabled = groupidentity.rule(NODE)  # classes off by default: every value 0
    assert groupidentity.pod(PodContext(PodMeta(name="p", namespace="n", uid="u", labels=BE)),
                             disabled).bvt_warp_ns == 0


def test_core_sched_idle_is_the_class_sched_idle_under_core_sched_else_zero_and_never_for_system_pods() -> None:
    core = NodeContext(node_slo=parse_node_slo_spec({"resourceQOSStrategy": {
        "policies": {"cpuPolicy": "coreSched"}, "lsClass": {"cpuQOS": {"enable": True, "schedIdle": 0}},
        "beClass": {"cpuQOS": {"enable": True, "schedIdle": 1}}}}))

    def answer(node, labels=None, kube_qos=None, annotations=None):
        pod = PodMeta(name="p", namespace="n", uid="u", labels=labels or {}, kube_qos=kube_qos,
                      annotations=annotations or {})
        return coresched.pod(PodContext(pod), coresched.rule(node))

    def idle(node, labels=None, kube_qos=None):
        return answer(node, labels, kube_qos).cpu_idle

    assert idle(core, BE) == 1 and idle(core, LS) == 0 and idle(core, kube_qos=KubeQoS.BESTEFFORT) == 1
    assert idle(core, {"koordinator.sh/qosClass": "SYSTEM"}) is None
    # any other policy (groupIdentity, the default) or the class off: 0, as Koordinator's kubeQoS reconciler writes
    assert idle(NODE, BE) == 0 and idle(NODE, kube_qos=KubeQoS.BESTEFFORT) == 0
    off = NodeContext(node_slo=parse_node_slo_spec({"resourceQOSStrategy": {
        "policies": {"cpuPolicy": "coreSched"}, "beClass": {"cpuQOS": {"enable": False, "schedIdle": 1}}}}))
    assert idle(off, BE) == 0
    # idle back to 0 resets the group's weight to 1024 in the kernel: a BestEffort pod gets kubelet's 2 back, unless
    # batchresource owns its shares
    assert answer(NODE, kube_qos=KubeQoS.BESTEFFORT) == Changes(cpu_idle=0, cpu_shares=2)
    batch = {"node.koordinator.sh/extended-resource-spec": json.dumps(
        {"containers": {"c": {"requests": {"kubernetes.io/batch-cpu": "500"}}}})}
    assert answer(NODE, BE, KubeQoS.BESTEFFORT, batch) == Changes(cpu_idle=0)
    assert answer(core, kube_qos=KubeQoS.BESTEFFORT) == Changes(cpu_idle=1)
    assert answer(NODE, LS, KubeQoS.BURSTABLE) == Changes(cpu_idle=0)
    # the proxy and NRI apply it at the sandbox (pod-level values koordlet writes itself); Koordinator: reconciler only
    assert coresched.PLUGIN.stages == {registry.Stage.PRE_RUN_POD_SANDBOX}
    assert registry.stages({"CoreSched": True}) == [registry.Stage.PRE_RUN_POD_SANDBOX]


def test_cpuset_from_the_scheduler_and_cleared_for_besteffort() -> None:
    bound = PodMeta(name="p", namespace="n", uid="u", labels={"koordinator.sh/qosClass": "LSR"},
                    annotations={"scheduling.koordinator.sh/resource-status": '{"cpuset": "2-3,5"}'})
    assert cpuset.container(ContainerContext(bound, "c"), None) == Changes(cpuset_cpus="2-3,5", cfs_quota_us=-1)
    assert cpuset.pod(PodContext(bound), None) == Changes(cfs_quota_us=-1)
    besteffort = PodMeta(name="p", namespace="n", uid="u", cgroup_parent="/kubepods/besteffort/podu")
    assert cpuset.container(ContainerContext(besteffort, "c"), None) == Changes(cpuset_cpus="")
    burstable = PodMeta(name="p", namespace="n", uid="u", cgroup_parent="/kubepods/burstable/podu")
    assert not cpuset.container(ContainerContext(burstable, "c"), None)


def test_gpu_env_is_the_device_plugins_value() -> None:
    from koordlet.api.device import nvidia_visible_devices, parse_device_allocated

    raw = '{"gpu": [{"minor": 1, "resources": {}}, {"minor": 0, "resources": {}}]}'
    pod = PodMeta(name="p", namespace="n", uid="u", annotations={"scheduling.koordinator.sh/device-allocated": raw})
    changes = gpu.container(ContainerContext(pod, "c"), None)
    assert changes.envs == {"NVIDIA_VISIBLE_DEVICES": nvidia_visible_devices(parse_device_allocated(raw).gpus)}
    assert changes.envs["NVIDIA_VISIBLE_DEVICES"] in ("0,1", "1,0")


def test_resctrl_group_and_schemata() -> None:
    raw = json.dumps({"llc": {"schemata": {"range": [0, 50]}, "schemataPerCache": [{"cacheID": 1, "range": [50, 100]}]},
                      "mb": {"schemata": {"percent": 55}}})
    pod = PodMeta(name="p", namespace="n", uid="u9", annotations={"node.koordinator.sh/resctrl": raw})
    node = NodeContext(resctrl=ResctrlNode(cbm_mask=0xFFF, cache_ids=(0, 1)))
    changes = resctrl.pod(PodContext(pod), resctrl.rule(node))
    assert changes.resctrl_group == "koordlet-u9"
    assert changes.resctrl_schemata == "L3:0=3f;1=fc0\nMB:0=60;1=60\n"  # 12 ways: [0,6) and [6,12); MB up to 10s
    assert not resctrl.pod(PodContext(pod), resctrl.rule(NodeContext()))  # no RDT on the node
    # its containers: the pod's group as their RDT class (what NRI carries to runc); nothing without RDT
    assert resctrl.container(ContainerContext(pod, "c"), resctrl.rule(node)).resctrl_group == "koordlet-u9"
    assert not resctrl.container(ContainerContext(pod, "c"), resctrl.rule(NodeContext()))


def test_cpu_normalization_scales_ls_quotas_only_and_leaves_a_running_one_to_cpu_burst() -> None:
    annotations = {"node.koordinator.sh/cpu-normalization-ratio": "2"}
    ratio = cpunormalization.rule(NodeContext(node_annotations=annotations))
    ls = PodMeta(name="p", namespace="n", uid="u", labels=LS)
    ctx = ContainerContext(ls, "c", resources=ContainerResources(cfs_quota_us=150000))
    assert cpunormalization.container(ctx, ratio) == Changes(cfs_quota_us=75000)
    assert not cpunormalization.container(ContainerContext(be_pod(), "a", resources=ctx.resources), ratio)
    assert cpunormalization.rule(NodeContext(node_annotations={"node.koordinator.sh/cpu-normalization-ratio": "-1"})) \
        .ratio is None
    # CPU burst on: a container kubelet creates or updates still gets the normalized quota (burst's base); a running
    # one is burst's (koordlet/api/cfsquota.py), so the reconciler does not set it back under a burst
    with_burst = cpunormalization.rule(NodeContext(node_annotations=annotations, cpu_burst=True))
    assert cpunormalization.container(ctx, with_burst) == Changes(cfs_quota_us=75000)
    running = ContainerContext(ls, "c", resources=ctx.resources, running=True)
    assert not cpunormalization.container(running, with_burst)
    assert cpunormalization.container(running, ratio) == Changes(cfs_quota_us=75000)  # burst off: the reconciler's


def test_plugins_run_in_name_order_and_later_ones_win() -> None:
    plugins = registry.enabled({"BatchResource": True, "CPUSetAllocator": True, "GroupIdentity": True})
    assert [p.name for p in plugins] == ["batchresource", "cpuset", "groupidentity"]
    pod = be_pod(annotations={**be_pod().annotations, "scheduling.koordinator.sh/resource-status": '{"cpuset":"1"}'})
    changes = registry.run_container(plugins, NODE, ContainerContext(pod, "a"))
    assert changes.cfs_quota_us == -1 and changes.cpu_shares == 512 and changes.cpuset_cpus == "1"


@pytest.mark.parametrize("keep", [False, True], ids=["unset", "disable-unset-cpu-quota"])
def test_every_quota_writer_asks_the_one_owner_so_plugin_order_never_changes_the_quota(keep: bool) -> None:
    """koordlet/api/cfsquota.py: a pod bound to a cpuset is the cpuset hook's (unlimited, or kubelet's with
    ``-disable-unset-cpu-quota``), even a BE pod with a batch-cpu limit; an unbound BE pod is batch resources';
    an LS one on a node with a ratio is normalization's. Each answer is the same in every order the plugins run."""
    plugins = registry.enabled({"BatchResource": True, "CPUSetAllocator": True, "CPUNormalization": True})
    node = NodeContext(keep_cpuset_pod_quota=keep, node_annotations={"node.koordinator.sh/cpu-normalization-ratio":
                                                                     "2"})
    bound = be_pod(annotations={**be_pod().annotations, "scheduling.koordinator.sh/resource-status": '{"cpuset":"1"}'})
    ls = PodMeta(name="web", namespace="ns", uid="u2", labels=LS, cgroup_parent="/kubepods/burstable/podu2")
    kubelets = ContainerResources(cpu_shares=2, cfs_quota_us=150000)
    cases = ((ContainerContext(bound, "a", resources=kubelets), None if keep else -1),
             (ContainerContext(be_pod(), "a", resources=kubelets), 50000),  # 1000 milli ÷ 2
             (ContainerContext(ls, "c", resources=kubelets), 75000))
    for order in itertools.permutations(plugins):
        for ctx, quota in cases:
            assert registry.run_container(list(order), node, ctx).cfs_quota_us == quota, [p.name for p in order]
        assert registry.run_pod(list(order), node, PodContext(bound)).cfs_quota_us == (None if keep else -1)
        assert registry.run_pod(list(order), node, PodContext(be_pod())).cfs_quota_us == 150000  # 3000 milli ÷ 2


_text = st.one_of(st.text(max_size=40), st.builds(json.dumps, st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8)))
_keys = ["node.koordinator.sh/extended-resource-spec", "scheduling.koordinator.sh/resource-status",
         "scheduling.koordinator.sh/device-allocated", "koordinator.sh/cpuQOS", "node.koordinator.sh/resctrl"]


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(_keys), _text, max_size=5), st.sampled_from([BE, LS, {}]))
def test_arbitrary_annotations_are_reported_and_skipped_never_raised(annotations, labels) -> None:
    all_on = {"BatchResource": True, "CPUSetAllocator": True, "GroupIdentity": True, "GPUEnvInject": True,
              "Resctrl": True, "CPUNormalization": True}
    plugins = registry.enabled(all_on)
    node = NodeContext(resctrl=ResctrlNode(0xFF, (0,)), node_slo=parse_node_slo_spec(
        {"resourceQOSStrategy": {"lsClass": {"cpuQOS": {"enable": True}}}}))
    pod = PodMeta(name="p", namespace="n", uid="u", labels=labels, annotations=annotations,
                  cgroup_parent="/kubepods/besteffort/podu")
    errors: list[str] = []
    registry.run_pod(plugins, node, PodContext(pod), lambda plugin, key, err: errors.append(plugin))
    registry.run_container(plugins, node, ContainerContext(pod, "a"), lambda plugin, key, err: errors.append(plugin))
    assert set(errors) <= {p.name for p in plugins}


def test_every_built_in_plugin_is_listed_without_asking_for_the_enabled_ones_first() -> None:
    """``registry.all_plugins`` loads the built-in plugins itself (what /debug/pods lists as not run, with the gate
    that keeps each off): in a fresh interpreter, nothing imported beforehand."""
    import subprocess
    import sys

    code = "from hooks import registry; print(' '.join(p.name for p in registry.all_plugins()))"
    names = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    assert names == ["batchresource", "coresched", "cpunormalization", "cpuset", "gpu", "groupidentity",
                     "hamicore-vgpu-monitor", "oomscoreadj", "rdma", "resctrl"]
