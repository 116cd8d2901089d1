"""Memory QoS decide() against hand-computed docs/koordinator.md §4.6 figures."""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import pytest

from koordlet.api.keys import ANNOTATION_MEMORY_QOS
from koordlet.api.kubeletmemqos import KubeletMemoryQoS
from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.api.pod import ContainerMeta
from koordlet.api.qos import KubeQoS
from koordlet.qosmanager import QoSManager, QoSManagerConfig
from koordlet.qosmanager.memoryqos import HIERARCHICAL_RESOURCES, STRATEGY, decide_steps, decide_values
from koordlet.qosmanager.snapshot import SnapshotBuilder
from koordlet.statesinformer.api import StaticStates
from tests.koordlet.qosmanager.factory import LAYOUT, GiB, be_pod, node, pod, snapshot

MiB = 1 << 20
PAGE = 4096
SLO = parse_node_slo_spec({"resourceQOSStrategy": {
    "lsClass": {"memoryQOS": {"enable": True, "minLimitPercent": 50, "lowLimitPercent": 30, "throttlingPercent": 80}},
    "beClass": {"memoryQOS": {"enable": True, "minLimitPercent": 100, "lowLimitPercent": 100}},
}})
LS = pod("ls", "LS", containers=(
    ContainerMeta("app", container_id="aaaaaaaaaaaa", requests={"memory": GiB}, limits={"memory": 2 * GiB}),))
BE = be_pod("be", containers=(
    ContainerMeta("job", container_id="bbbbbbbbbbbb", requests={"kubernetes.io/batch-memory": 512 * MiB}),))


def _values(pods=(LS, BE)):
    snap = snapshot(node=node(8000, 16 * GiB, allocatable_memory=15 * GiB), node_slo=SLO, pods=pods)
    return {v.cgroup_dir: v for v in decide_values(snap, LAYOUT, PAGE)}


def test_pod_and_container_min_low_high() -> None:
    values = _values()
    ls_pod = values["kubepods/burstable/poduid-ls"]
    assert ls_pod.min_bytes == GiB // 2
    assert ls_pod.low_bytes == GiB // 2  # 30 % = 322122547 is below min, raised to min
    ls_container = values["kubepods/burstable/poduid-ls/aaaaaaaaaaaa"]
    # high = floor((1 GiB + 1 GiB × 80 %) / 4096) × 4096 = floor(1932735283 / 4096) × 4096
    assert ls_container.high_bytes == 1932734464
    assert (ls_container.min_bytes, ls_container.low_bytes) == (GiB // 2, GiB // 2)


def test_be_pods_use_batch_memory_and_unthrottled_high_is_max() -> None:
    values = _values()
    assert values["kubepods/besteffort/poduid-be"].min_bytes == 512 * MiB
    assert values["kubepods/besteffort/poduid-be/bbbbbbbbbbbb"].high_bytes == -1  # throttlingPercent 0


def test_kube_qos_dirs_sum_their_pods_and_kubepods_sums_all() -> None:
    values = _values()
    assert values["kubepods/burstable"].min_bytes == GiB // 2
    assert values["kubepods/besteffort"].min_bytes == 512 * MiB
    assert values["kubepods"].min_bytes == GiB // 2 + 512 * MiB
    assert values["kubepods/besteffort"].qos is not None and values["kubepods/besteffort"].qos.wmark_min_adj == 50


def test_throttling_uses_node_allocatable_without_a_limit() -> None:
    slo = parse_node_slo_spec({"resourceQOSStrategy": {"lsClass": {"memoryQOS": {"enable": True,
                                                                                "throttlingPercent": 50}}}})
    no_limit = pod("nl", "LS", containers=(ContainerMeta("app", container_id="cccccccccccc",
                                                          requests={"memory": GiB}),))
    snap = snapshot(node=node(8000, 16 * GiB, allocatable_memory=15 * GiB), node_slo=slo, pods=(no_limit,))
    values = {v.cgroup_dir: v for v in decide_values(snap, LAYOUT, PAGE)}
    assert values["kubepods/burstable/poduid-nl/cccccccccccc"].high_bytes == 8 * GiB  # 1 + (15 − 1) × 50 %


def test_annotation_none_turns_a_pod_off() -> None:
    off = pod("off", "LS", annotations={ANNOTATION_MEMORY_QOS: json.dumps({"policy": "none"})},
              containers=LS.containers)
    values = _values(pods=(off,))
    assert values["kubepods/burstable/poduid-off"].min_bytes == 0
    assert values["kubepods/burstable/poduid-off/aaaaaaaaaaaa"].high_bytes == -1


def test_writes_are_leveled_and_limited_to_supported_files() -> None:
    snap = snapshot(node=node(), node_slo=SLO, pods=(LS,))
    steps = decide_steps(snap, LAYOUT, PAGE, frozenset(HIERARCHICAL_RESOURCES))
    assert len(steps) == 1 and steps[0].leveled
    assert {w.resource for w in steps[0].writes} == set(HIERARCHICAL_RESOURCES)
    full = decide_steps(snap, LAYOUT, PAGE)
    assert {w.resource for w in full[1].writes} >= {"memory.wmark_ratio", "memory.priority", "memory.oom.group"}


def test_kernel_without_memory_qos_files_is_a_noop_with_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    from koordlet.executor import ResourceExecutor
    from koordlet.metriccache import MetricCache
    from koordlet.system.cgroup import CgroupFS

    states = StaticStates(node=node(), node_slo=SLO, pods=(LS,))
    executor = ResourceExecutor(CgroupFS(mount_dir="/nonexistent-root/sys/fs/cgroup"))
    builder = SnapshotBuilder(states, MetricCache(), reader=executor, layout=LAYOUT)  # no file: the probe fails
    manager = QoSManager(states, [STRATEGY], QoSManagerConfig(feature_gates={"CgroupReconcile": True}),
                         builder=builder)
    with caplog.at_level(logging.INFO, logger="koordlet.qosmanager.memoryqos"):
        manager.run_strategy("memoryqos")
        manager.run_strategy("memoryqos")
    plan = manager.last_plan("memoryqos")
    assert plan is not None and plan.steps == ()
    assert [r.message for r in caplog.records].count(
        "memory QoS is a no-op: this kernel has none of " + ", ".join(
            ("memory.min", "memory.low", "memory.high", "memory.wmark_ratio", "memory.wmark_scale_factor",
             "memory.wmark_min_adj", "memory.priority", "memory.use_priority_oom", "memory.oom.group"))) == 1


def _unknown(p):
    from dataclasses import replace
    return replace(p, requests_known=False)


def test_pods_with_unknown_requests_and_their_qos_dirs_are_left_alone() -> None:
    """The CRI pod source (local mode) knows no memory requests: such a pod gets no write, and neither do
    min/low of its QoS dir nor of kubepods (their sums would drop its request); other QoS dirs go on."""
    values = _values(pods=(_unknown(LS), BE))
    assert "kubepods/burstable/poduid-ls" not in values and "kubepods/burstable/poduid-ls/aaaaaaaaaaaa" not in values
    assert (values["kubepods/burstable"].min_bytes, values["kubepods/burstable"].low_bytes) == (None, None)
    assert (values["kubepods"].min_bytes, values["kubepods"].low_bytes) == (None, None)
    assert values["kubepods/besteffort"].min_bytes == 512 * MiB
    assert values["kubepods/besteffort/poduid-be"].min_bytes == 512 * MiB
    snap = snapshot(node=node(), node_slo=SLO, pods=(_unknown(LS), BE))
    written = {(w.resource, w.cgroup_dir) for step in decide_steps(snap, LAYOUT, PAGE) for w in step.writes}
    assert not any(d.startswith("kubepods/burstable/poduid-ls") for _, d in written)
    assert not {("memory.min", "kubepods"), ("memory.low", "kubepods"), ("memory.min", "kubepods/burstable"),
                ("memory.low", "kubepods/burstable")} & written
    assert ("memory.wmark_ratio", "kubepods/burstable") in written  # class values, not sums: still written
    assert ("memory.min", "kubepods/besteffort") in written


def test_local_mode_pods_leave_the_memory_files_as_they_are_on_a_fixture_tree(tmp_path) -> None:  # noqa: ANN001
    from koordlet.actuator import PlanRunner
    from koordlet.executor import ResourceExecutor
    from koordlet.metriccache import MetricCache
    from koordlet.system.cgroup import CgroupFS

    mount = tmp_path / "sys/fs/cgroup"
    dirs = ("kubepods", "kubepods/burstable", "kubepods/besteffort", "kubepods/burstable/poduid-ls",
            "kubepods/burstable/poduid-ls/aaaaaaaaaaaa", "kubepods/besteffort/poduid-be",
            "kubepods/besteffort/poduid-be/bbbbbbbbbbbb")
    for d in dirs:
        (mount / "memory" / d).mkdir(parents=True, exist_ok=True)
        for name in HIERARCHICAL_RESOURCES:
            (mount / "memory" / d / name).write_text("7\n")  # the kernel's (or someone's) value

    def read(d: str, name: str) -> str:
        return (mount / "memory" / d / name).read_text().strip()

    states = StaticStates(node=node(8000, 16 * GiB, allocatable_memory=15 * GiB), node_slo=SLO,
                          pods=(_unknown(LS), _unknown(BE)))
    executor = ResourceExecutor(CgroupFS(mount_dir=str(mount)))
    manager = QoSManager(states, [STRATEGY], QoSManagerConfig(feature_gates={"CgroupReconcile": True}),
                         builder=SnapshotBuilder(states, MetricCache(), reader=executor, layout=LAYOUT),
                         runner=PlanRunner(executor))
    assert manager.run_strategy("memoryqos")
    assert {(d, n): read(d, n) for d in dirs for n in HIERARCHICAL_RESOURCES} == {
        (d, n): "7" for d in dirs for n in HIERARCHICAL_RESOURCES}
    states.set_pods((LS, BE))  # with the pod specs (API server mode): every value right
    assert manager.run_strategy("memoryqos")
    assert read("kubepods/burstable/poduid-ls", "memory.min") == str(GiB // 2)
    assert read("kubepods/burstable", "memory.min") == str(GiB // 2)
    assert read("kubepods", "memory.min") == str(GiB // 2 + 512 * MiB)
    assert read("kubepods/besteffort/poduid-be/bbbbbbbbbbbb", "memory.low") == str(512 * MiB)


def test_a_pod_level_pod_counts_its_pod_request_and_its_containers_get_the_pod_limit() -> None:
    """KEP-2837: the pod-level memory request is the pod's (it wins over the containers' sum), and a container
    that sets no limit gets the pod's, as kubelet gives its cgroup; the QoS dir sums it like any other pod."""
    pod_level = replace(pod("pl", "LS", containers=(
        ContainerMeta("app", container_id="dddddddddddd"), ContainerMeta("log", container_id="eeeeeeeeeeee",
                                                                         requests={"memory": 128 * MiB}))),
        pod_requests={"memory": GiB}, pod_limits={"memory": 2 * GiB})
    values = _values((pod_level,))
    assert values["kubepods/burstable/poduid-pl"].min_bytes == GiB // 2  # 50 % of the pod-level 1 GiB
    assert values["kubepods/burstable"].min_bytes == GiB // 2
    app = values["kubepods/burstable/poduid-pl/dddddddddddd"]
    assert (app.min_bytes, app.high_bytes) == (0, 2 * GiB * 80 // 100 // PAGE * PAGE)  # the pod's 2 GiB limit
    log_container = values["kubepods/burstable/poduid-pl/eeeeeeeeeeee"]
    # 128 MiB + (2 GiB − 128 MiB) × 80 %, page-aligned
    assert log_container.high_bytes == (128 * MiB + (2 * GiB - 128 * MiB) * 80 // 100) // PAGE * PAGE


def test_after_a_resize_the_values_follow_the_amounts_the_container_has() -> None:
    resized = replace(LS, containers=(replace(LS.containers[0], requests={"memory": 2 * GiB},
                                              limits={"memory": 4 * GiB}),))
    before, after = _values((LS,)), _values((resized,))
    key = "kubepods/burstable/poduid-ls/aaaaaaaaaaaa"
    assert (before[key].min_bytes, after[key].min_bytes) == (GiB // 2, GiB)
    assert after[key].high_bytes == (2 * GiB + 2 * GiB * 80 // 100) // PAGE * PAGE


# ---- kubelet's own memory QoS (KEP-2570): the files it writes are kubelet's (koordlet/api/kubeletmemqos.py)

LSR = pod("lsr", "LSR", KubeQoS.GUARANTEED, containers=(
    ContainerMeta("db", container_id="cccccccccccc", requests={"memory": 2 * GiB}, limits={"memory": 2 * GiB}),))
SLO_ALL = parse_node_slo_spec({"resourceQOSStrategy": {
    "lsrClass": {"memoryQOS": {"enable": True, "minLimitPercent": 50, "lowLimitPercent": 80, "throttlingPercent": 80}},
    "lsClass": {"memoryQOS": {"enable": True, "minLimitPercent": 50, "lowLimitPercent": 30, "throttlingPercent": 80}},
    "beClass": {"memoryQOS": {"enable": True, "minLimitPercent": 100, "lowLimitPercent": 100}},
}})


def _kubelet_values(kubelet: KubeletMemoryQoS) -> dict[str, tuple[int | None, int | None, int | None]]:
    snap = snapshot(node=node(8000, 16 * GiB, allocatable_memory=15 * GiB), node_slo=SLO_ALL, pods=(LSR, LS, BE),
                    kubelet_memory_qos=kubelet)
    return {v.cgroup_dir: (v.min_bytes, v.low_bytes, v.high_bytes) for v in decide_values(snap, LAYOUT, PAGE)}


def test_with_kubelets_tiered_reservation_and_throttling_koordlet_writes_only_the_files_kubelet_does_not() -> None:
    ours = _kubelet_values(KubeletMemoryQoS())
    shared = _kubelet_values(KubeletMemoryQoS(True, 0.9, "TieredReservation"))
    lsr_pod, lsr_c = "kubepods/poduid-lsr", "kubepods/poduid-lsr/cccccccccccc"
    ls_pod, ls_c = "kubepods/burstable/poduid-ls", "kubepods/burstable/poduid-ls/aaaaaaaaaaaa"
    be_pod_dir, be_c = "kubepods/besteffort/poduid-be", "kubepods/besteffort/poduid-be/bbbbbbbbbbbb"
    # Guaranteed: memory.min is kubelet's (the request); low and high stay koordlet's
    assert shared[lsr_pod] == (None, ours[lsr_pod][1], None) and shared[lsr_c] == (None, *ours[lsr_c][1:])
    # Burstable: memory.low is kubelet's, and the container's memory.high; memory.min stays koordlet's
    assert shared[ls_pod] == (ours[ls_pod][0], None, None) and shared[ls_c] == (ours[ls_c][0], None, None)
    # BestEffort (Koordinator's BE): min and low koordlet's; the container's memory.high kubelet's
    assert shared[be_pod_dir] == ours[be_pod_dir] and shared[be_c] == (*ours[be_c][:2], None)
    # QoS dirs: kubepods' memory.min and burstable's memory.low are kubelet's; the sums koordlet still writes count
    # kubelet's values (the requests) where kubelet protects the pods
    assert shared["kubepods/burstable"] == (ours["kubepods/burstable"][0], None, None)
    assert shared["kubepods/besteffort"] == ours["kubepods/besteffort"]
    be_low = ours["kubepods/besteffort"][1]
    assert shared["kubepods"] == (None, ours[lsr_pod][1] + GiB + be_low, None)  # LSR low + kubelet's LS low + BE


def test_with_kubelet_before_1_36_memory_min_of_both_classes_is_kubelets_and_counts_as_the_request() -> None:
    shared = _kubelet_values(KubeletMemoryQoS(True, None, "Legacy"))
    assert shared["kubepods/burstable/poduid-ls"][0] is None and shared["kubepods/poduid-lsr"][0] is None
    assert shared["kubepods/burstable"][0] is None and shared["kubepods"][0] is None
    assert shared["kubepods/burstable/poduid-ls/aaaaaaaaaaaa"][2] is not None  # no factor: high stays koordlet's
    assert shared["kubepods/besteffort"][0] == 512 * MiB


def test_the_strategy_says_once_what_kubelet_writes_and_again_when_it_changes(caplog: pytest.LogCaptureFixture) -> None:
    kubelet = KubeletMemoryQoS(True, 0.9, "TieredReservation", "file /etc/kubernetes/kubelet.yaml")
    snap = snapshot(node=node(), node_slo=SLO_ALL, pods=(LS,), kubelet_memory_qos=kubelet,
                    kernel_files=frozenset(HIERARCHICAL_RESOURCES))
    caplog.set_level(logging.INFO)
    first = STRATEGY.decide(snap, STRATEGY.config())
    STRATEGY.decide(replace(snap, memo=first.memo), STRATEGY.config())
    STRATEGY.decide(replace(snap, memo=first.memo, kubelet_memory_qos=KubeletMemoryQoS()), STRATEGY.config())
    said = [r.getMessage() for r in caplog.records if "kubelet's memory QoS" in r.getMessage()]
    assert len(said) == 2 and "memory.high at factor 0.9, reservation TieredReservation" in said[0]
    assert "off" in said[1]
