"""CPU suppress decide() against hand-computed docs/koordinator.md §4.2 figures."""

from __future__ import annotations

import json

import pytest

from koordlet.api.keys import ANNOTATION_NODE_RESERVATION, ANNOTATION_RESOURCE_STATUS
from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.api.pod import ContainerMeta
from koordlet.qosmanager.cpusuppress import (
    CPUBuckets,
    SuppressConfig,
    SuppressCurrent,
    be_cpuset_size,
    candidate_buckets,
    choose_be_cpus,
    decide_cfs_quota,
    decide_suppress,
    select_cpus,
    suppress_budget,
)
from tests.koordlet.qosmanager.factory import LAYOUT, be_pod, cpus, node, pod, snapshot, spec

LS_POD = pod("ls", "LS")
BE_POD = be_pod("be", containers=(ContainerMeta("main", container_id="aaaaaaaaaaaa"),))


def _base(**fields):
    values = {
        "node": node(8000, allocatable_cpu_milli=7000),
        "node_cpu_cores": 5.0,
        "pods": (LS_POD, BE_POD),
        "pod_cpu_cores": {"uid-ls": 2.0, "uid-be": 1.5, "uid-ghost": 0.5},
        "cpus": cpus(1, 4, 2),
    }
    values.update(fields)
    return snapshot(**values)


def test_budget_subtracts_non_be_pods_unknown_pods_and_system_usage() -> None:
    budget = suppress_budget(_base(), SuppressConfig())
    # system = max(5 − 4, 0) = 1, max(1, reserved 8 − 7 = 1) = 1; non-BE = 2 + 0.5 (no meta) = 2.5
    assert budget is not None
    assert budget.system_used_cores == pytest.approx(1.0)
    assert budget.pod_non_be_used_cores == pytest.approx(2.5)
    assert budget.be_used_cores == pytest.approx(1.5)
    assert budget.suppress_cores == pytest.approx(8 * 0.65 - 2.5 - 1.0)  # 1.7


def test_budget_uses_the_larger_reservation_annotation() -> None:
    reserved = node(8000, allocatable_cpu_milli=7000,
                    annotations={ANNOTATION_NODE_RESERVATION: json.dumps({"resources": {"cpu": "2"}})})
    budget = suppress_budget(_base(node=reserved), SuppressConfig())
    assert budget is not None
    assert budget.node_reserved_cores == pytest.approx(2.0)
    assert budget.suppress_cores == pytest.approx(5.2 - 2.5 - 2.0)  # 0.7


def test_budget_min_percent_raises_the_budget() -> None:
    reserved = node(8000, annotations={ANNOTATION_NODE_RESERVATION: json.dumps({"resources": {"cpu": "2"}})})
    budget = suppress_budget(_base(node=reserved), SuppressConfig(min_percent=20))
    assert budget is not None
    assert budget.suppress_cores == pytest.approx(1.6)  # max(0.7, 8 × 20 %)


def test_budget_counts_host_apps_except_be_apps_in_the_besteffort_cgroup() -> None:
    slo = parse_node_slo_spec({
        "resourceUsedThresholdWithBE": {"enable": True},
        "hostApplications": [
            {"name": "agent", "qos": "LS"},
            {"name": "be-app", "qos": "BE", "cgroupPath": {"base": "KubepodsBesteffort"}},
        ],
    })
    budget = suppress_budget(_base(node_slo=slo, host_app_cpu_cores={"agent": 0.4, "be-app": 0.3}),
                             SuppressConfig())
    # system = max(5 − 4 − 0.7, 0) = 0.3 → max(0.3, 1) = 1; host non-BE = 0.4
    assert budget is not None
    assert budget.host_app_non_be_cores == pytest.approx(0.4)
    assert budget.suppress_cores == pytest.approx(5.2 - 2.5 - 0.4 - 1.0)


def test_budget_treats_kube_besteffort_pods_as_be_whatever_their_label() -> None:
    from koordlet.api.qos import KubeQoS

    labelled_ls_but_besteffort = pod("odd", "LS", KubeQoS.BESTEFFORT)
    budget = suppress_budget(_base(pods=(labelled_ls_but_besteffort,), pod_cpu_cores={"uid-odd": 1.0}),
                             SuppressConfig())
    assert budget is not None and budget.pod_non_be_used_cores == 0.0 and budget.be_used_cores == 1.0


def test_no_node_sample_means_no_budget() -> None:
    assert suppress_budget(_base(node_cpu_cores=None), SuppressConfig()) is None


@pytest.mark.parametrize(
    "budget,current,num_cpus,candidates,expected",
    [
        (1.7, 8, 16, 16, 2),  # ceil(1.7) = 2
        (0.3, 8, 16, 16, 2),  # never below 2
        (-3.0, 8, 16, 16, 2),  # a negative budget still leaves 2
        (10.0, 2, 16, 16, 4),  # growth capped at ceil(0.1 × 16) = 2 above the current 2
        (10.0, 0, 16, 16, 10),  # unknown current size: no cap
        (10.0, 2, 16, 3, 3),  # never more than the candidates
        (3.2, 12, 16, 16, 4),  # shrinking happens at once
    ],
)
def test_cpuset_size(budget: float, current: int, num_cpus: int, candidates: int, expected: int) -> None:
    assert be_cpuset_size(budget, current, num_cpus, candidates) == expected


def test_select_takes_both_hyperthreads_of_a_core_then_single_cpus() -> None:
    assert select_cpus(cpus(1, 4, 2), 3) == [0, 1, 4]  # core 0 = {0, 4}, then cpu 1


def test_select_spreads_whole_cores_round_robin_over_sockets() -> None:
    topology = cpus(2, 2, 2)  # socket 0: cores {0,4}, {1,5}; socket 1: {2,6}, {3,7}
    assert select_cpus(topology, 4) == [0, 2, 4, 6]
    assert select_cpus(topology, 5) == [0, 1, 2, 4, 6]


def test_lsr_bucket_gets_its_proportional_share() -> None:
    lsr = pod("lsr", "LSR", annotations={ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": "0,4"})})
    buckets = candidate_buckets(_base(pods=(lsr,)))
    assert [c.cpu_id for c in buckets.lsr] == [0, 4]
    # n = 4: nLSR = floor(4 × 2 / 8) = 1 → cpu 0; LS gets 3: core {1,5} then cpu 2
    assert choose_be_cpus(buckets, 4) == (0, 1, 2, 5)


def test_candidates_exclude_reserved_and_lse_cpus() -> None:
    reserved = node(8000, annotations={ANNOTATION_NODE_RESERVATION: json.dumps({"reservedCPUs": "0-1"})})
    lse = pod("lse", "LSE", annotations={ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": "2"})})
    buckets = candidate_buckets(_base(node=reserved, pods=(lse,)))
    assert buckets.all_ids == (3, 4, 5, 6, 7)
    assert choose_be_cpus(CPUBuckets(), 2) == ()


def test_cpuset_decision_writes_union_then_exact_over_every_besteffort_dir() -> None:
    decision = decide_suppress(_base(), SuppressConfig(), SuppressCurrent(be_cpus=tuple(range(8))), LAYOUT)
    assert decision.be_cpus == (0, 4)  # budget 1.7 → 2 CPUs → one whole core
    (step,) = decision.steps
    assert step.leveled
    assert {(w.cgroup_dir, w.value) for w in step.writes} == {
        ("kubepods/besteffort", "0,4"),
        ("kubepods/besteffort/poduid-be", "0,4"),
        ("kubepods/besteffort/poduid-be/aaaaaaaaaaaa", "0,4"),
    }


@pytest.mark.parametrize(
    "budget,current,expected",
    [
        (1.7, -1, 170000),  # from unlimited: no cap
        (0.01, 5000, 2000),  # the floor is written although the change is below 1 %
        (0.01, 2000, None),  # already at the floor
        (1.75, 170000, None),  # |5000| < 8 cores × 100000 × 1 %
        (6.0, 170000, 250000),  # increase capped at 8 × 100000 × 10 %
        (0.5, 600000, 50000),  # decreases are not capped
    ],
)
def test_cfs_quota_policy(budget: float, current: int, expected: int | None) -> None:
    assert decide_cfs_quota(budget, current, 8.0) == expected


def test_cfs_quota_decision_and_switch_restores_the_cpuset() -> None:
    config = SuppressConfig(policy="cfsQuota")
    decision = decide_suppress(_base(), config, SuppressCurrent(be_cfs_quota_us=-1), LAYOUT, previous_policy="cpuset")
    restore, quota = decision.steps
    assert {w.value for w in restore.writes} == {"0-7"}
    assert quota.writes[0].resource == "cpu.cfs_quota_us" and quota.writes[0].value == 170000
    assert decision.be_cfs_quota_us == 170000


def test_switch_back_to_cpuset_restores_unlimited_quota() -> None:
    decision = decide_suppress(_base(), SuppressConfig(), SuppressCurrent(), LAYOUT, previous_policy="cfsQuota")
    assert decision.steps[0].writes[0].resource == "cpu.cfs_quota_us"
    assert decision.steps[0].writes[0].value == -1


def test_spec_switch_feeds_the_config() -> None:
    config = SuppressConfig.from_node_slo(spec(cpuSuppressThresholdPercent=50, cpuSuppressPolicy="cfsQuota"))
    assert config == SuppressConfig(threshold_percent=50, min_percent=None, policy="cfsQuota")


def _nrt_case(tmp_path):
    """A two-socket node whose reservation is a CPU amount (2 CPUs, taken by topology: core 0 = CPUs 0 and 8),
    with an LSE pod on 1,9, an LSR pod on 2,10 and kubelet's static policy holding 7,15 for a Guaranteed pod."""
    from koordlet.api.qos import KubeQoS
    from koordlet.statesinformer.cpumanager import CPUAssignment, CPUManagerState
    from koordlet.system.sysfs import read_node_topology
    from tests.koordlet.system.topology_tree import build_tree, two_sockets_smt

    topology = read_node_topology(build_tree(tmp_path, two_sockets_smt()))
    annotations = {ANNOTATION_NODE_RESERVATION: json.dumps({"resources": {"cpu": "2"}})}
    kubelet = CPUManagerState(policy="static", assignments=(
        CPUAssignment(cpus=frozenset({7, 15}), pod_uid="uid-guaranteed", container_name="main"),))
    pods = (pod("lse", "LSE", annotations={ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": "1,9"})}),
            pod("lsr", "LSR", annotations={ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": "2,10"})}),
            pod("guaranteed", kube_qos=KubeQoS.GUARANTEED), BE_POD)
    return topology, annotations, kubelet, pods


def test_the_suppressed_cpuset_and_the_nrt_be_pool_agree_with_a_reservation_given_as_a_cpu_amount(tmp_path) -> None:
    from koordlet.api.cpupools import compute_cpu_pools
    from koordlet.api.cpuset import parse_cpu_list
    from koordlet.api.keys import ANNOTATION_NRT_BE_CPU_SHARED_POOLS
    from koordlet.qosmanager.cpusuppress import decide
    from koordlet.reporters.nrt import build_nrt

    topology, annotations, kubelet, pods = _nrt_case(tmp_path)
    nrt = build_nrt("node-1", topology, compute_cpu_pools(topology.cpus, pods, kubelet, annotations), kubelet,
                    annotations)
    be_pool = {cpu for shared in json.loads(nrt["metadata"]["annotations"][ANNOTATION_NRT_BE_CPU_SHARED_POOLS])
               for cpu in parse_cpu_list(shared.get("cpuset", ""))}
    assert be_pool == set(range(16)) - {0, 8} - {1, 9} - {7, 15}
    reserved_node = node(16000, annotations=annotations)
    # idle at a 100 % threshold: suppress gives BE the whole pool; busy: the floor of 2 CPUs, still inside it
    for node_used, config, size in ((0.5, SuppressConfig(threshold_percent=100), len(be_pool)),
                                    (15.0, SuppressConfig(), 2)):
        tick = snapshot(node=reserved_node, cpus=topology.cpus, pods=pods, kubelet_cpu_manager=kubelet,
                        node_cpu_cores=node_used, pod_cpu_cores={})
        decision = decide(tick, config).report
        assert set(decision.be_cpus) <= be_pool and len(decision.be_cpus) == size, decision.be_cpus


def test_the_reservation_annotation_is_parsed_once_per_tick(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from koordlet.api import annotations as annotations_module
    from koordlet.api import cpupools
    from koordlet.qosmanager import cpusuppress

    parsed: list[str] = []
    real = annotations_module.parse_node_reservation

    def counting(raw: str):
        parsed.append(raw)
        return real(raw)

    for module in (annotations_module, cpupools, cpusuppress):
        if hasattr(module, "parse_node_reservation"):
            monkeypatch.setattr(module, "parse_node_reservation", counting)
    topology, annotations, kubelet, pods = _nrt_case(tmp_path)
    tick = snapshot(node=node(16000, annotations=annotations), cpus=topology.cpus, pods=pods,
                    kubelet_cpu_manager=kubelet, node_cpu_cores=4.0, pod_cpu_cores={})
    for config in (SuppressConfig(), SuppressConfig(policy="cfsQuota"), SuppressConfig(enabled=False)):
        parsed.clear()
        cpusuppress.decide(tick, config)
        assert len(parsed) == 1, config
def test_be_cpu_manager_keeps_be_cpusets_on_the_share_pool_and_leaves_allocated_containers_to_the_hook() -> None:
    """BECPUManager (Koordinator recoverCPUSetForBECPUManager): suppress stands down even with the NodeSLO switch
    off; quota unlimited; the whole BE cpuset on the besteffort and BE pod dirs and on the containers of BE pods
    the scheduler did not allocate."""
    from koordlet.qosmanager import QoSManagerConfig
    from koordlet.qosmanager.cpusuppress import decide

    numa = json.dumps({"numaNodeResources": [{"node": 0, "resources": {"kubernetes.io/batch-cpu": "2000"}}]})
    allocated = be_pod("numa", containers=(ContainerMeta("main", container_id="bbbbbbbbbbbb"),))
    allocated = type(allocated)(**{**{f: getattr(allocated, f) for f in allocated.__slots__},
                                   "annotations": {ANNOTATION_RESOURCE_STATUS: numa}})
    lse = pod("lse", "LSE", annotations={ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": "7"})})
    flags = QoSManagerConfig(feature_gates={"BECPUManager": True})
    config = SuppressConfig.from_node_slo(parse_node_slo_spec(None), flags)
    assert config.be_cpu_manager and config.enabled  # resourceUsedThresholdWithBE.enable is false
    plan = decide(_base(pods=(LS_POD, BE_POD, allocated, lse)), config)
    quota, cpusets = plan.steps
    assert [(w.resource, w.cgroup_dir, w.value) for w in quota.writes] == [
        ("cpu.cfs_quota_us", "kubepods/besteffort", -1)]
    assert cpusets.leveled and {(w.cgroup_dir, w.value) for w in cpusets.writes} == {
        ("kubepods/besteffort", "0-6"),  # every CPU but the LSE pod's 7
        ("kubepods/besteffort/poduid-be", "0-6"),
        ("kubepods/besteffort/poduid-be/aaaaaaaaaaaa", "0-6"),
        ("kubepods/besteffort/poduid-numa", "0-6"),  # its container is the cpuset hook's (NUMA node 0's pool)
    }
    assert not SuppressConfig.from_node_slo(parse_node_slo_spec(None), QoSManagerConfig()).enabled
