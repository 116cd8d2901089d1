"""CPUEvict, CPUAllocatableEvict, MemoryEvict and MemoryAllocatableEvict decide() against worked figures.

The figures are hand-worked from docs/koordinator.md §4.4–4.5; also the tasks of one plan sharing what they
release, and the rules that keep a pod out."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koordlet.api.eviction import eviction_policy_allows, opt_in_order, opt_in_rule, priority_value
from koordlet.api.keys import (
    ANNOTATION_EVICTION_POLICY,
    ANNOTATION_EVICTION_PRIORITY,
    LABEL_EVICTION_ENABLED,
    LABEL_PRIORITY_CLASS,
    LABEL_SUB_PRIORITY,
)
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.api.qos import KubeQoS
from koordlet.plan import VictimOutcome, walk_evictions
from koordlet.qosmanager import QoSManagerConfig, cpuevict, memoryevict
from koordlet.qosmanager.snapshot import BECPUWindow
from koordlet.qosmanager.victims import allocatable_release, class_request
from tests.koordlet.qosmanager.factory import GiB, node, pod, snapshot, spec

MiB = 1 << 20
OPT_IN = {LABEL_EVICTION_ENABLED: "true"}


def _pod(name: str, qos: str, priority: int, *, opted: bool = True, labels: dict | None = None,
         annotations: dict | None = None, requests: dict | None = None, phase: str = "Running") -> PodMeta:
    base = pod(name, qos, KubeQoS.BESTEFFORT if qos == "BE" else KubeQoS.BURSTABLE, priority=priority,
               annotations=annotations, phase=phase,
               containers=(ContainerMeta("main", container_id=(name.encode().hex() * 12)[:12],
                                         requests=dict(requests or {})),))
    extra = {**(OPT_IN if opted else {}), **(labels or {})}
    return PodMeta(**{**{f: getattr(base, f) for f in base.__slots__}, "labels": {**base.labels, **extra}})


def _flags(*gates: str) -> QoSManagerConfig:
    return QoSManagerConfig(started_at=0.0, feature_gates=dict.fromkeys(gates, True))


# ------------------------------------------------------------------------------------------- CPUEvict

CPU_PODS = (
    _pod("prod-ls", "LS", 9500),  # above the priority threshold
    _pod("mid-a", "LS", 7100),
    _pod("mid-b", "LS", 7100, annotations={ANNOTATION_EVICTION_PRIORITY: "-1"}),
    _pod("batch-c", "BE", 5500, labels={LABEL_SUB_PRIORITY: "10"}),
    _pod("batch-d", "BE", 5500),
    _pod("no-label", "BE", 5000, opted=False),
    _pod("policy-no", "BE", 5000, annotations={ANNOTATION_EVICTION_POLICY: '["BEMemoryEvict"]'}),
    _pod("no-metrics", "BE", 5000),
    _pod("done", "BE", 5000, phase="Succeeded"),
)
CPU_USED = {"uid-prod-ls": 3.0, "uid-mid-a": 0.5, "uid-mid-b": 0.8, "uid-batch-c": 0.3, "uid-batch-d": 0.6,
            "uid-no-label": 2.0, "uid-policy-no": 1.5, "uid-done": 1.0}
CPU_SLO = spec(cpuEvictThresholdPercent=80, evictEnabledPriorityThreshold=7999, cpuEvictTimeWindowSeconds=30)


def _cpu_snapshot(avg_cores: float | None = 7.2, **fields):
    values = {"node": node(8000, 16 * GiB), "pods": CPU_PODS, "node_cpu_avg_cores": avg_cores,
              "pod_cpu_cores": CPU_USED, "node_slo": CPU_SLO}
    values.update(fields)
    return snapshot(**values)


def test_cpu_evict_releases_down_to_threshold_minus_two_from_opted_in_pods_in_order() -> None:
    config = cpuevict.CPUEvictConfig.from_node_slo(CPU_SLO, _flags("CPUEvict"))
    assert config.features == ("CPUEvict",) and config.needs.node_cpu_avg_window_s == 30.0
    plan = cpuevict.decide(_cpu_snapshot(), config)
    decision = plan.report["CPUEvict"]
    # 7.2 cores of 8: usage 90 % >= 80 %; lower 80 − 2 = 78 %: release 8000 × (90 − 78) / 100 = 960m
    assert (decision.usage_percent, decision.release_milli) == (90, 960)
    # eviction priority −1 first; then priority 5500 (label priority 10 before 5500), then 7100
    assert [v.pod.name for v in decision.candidates] == ["mid-b", "batch-c", "batch-d", "mid-a"]
    assert [v.releases for v in decision.candidates] == [800.0, 300.0, 600.0, 500.0]
    assert [v.pod.name for v in decision.victims] == ["mid-b", "batch-c"]  # 800 + 300 >= 960
    (task,) = plan.evictions
    assert task.feature == "CPUEvict" and task.target == 960.0
    assert "90%" in task.reason and "960m" in task.reason and "78%" in task.reason
    assert "this pod uses 800m" in task.candidates[0].message


@pytest.mark.parametrize("avg,lower,expected", [
    (6.3, None, 0),  # 78 % < 80 %
    (6.4, None, 8000 * 2 // 100),  # exactly 80 %
    (7.2, 70, 8000 * 20 // 100),  # cpuEvictLowerPercent
    (None, None, 0),  # no samples in the window
])
def test_cpu_evict_amounts(avg: float | None, lower: int | None, expected: int) -> None:
    slo = spec(cpuEvictThresholdPercent=80, evictEnabledPriorityThreshold=7999,
               **({"cpuEvictLowerPercent": lower} if lower is not None else {}))
    config = cpuevict.CPUEvictConfig.from_node_slo(slo, _flags("CPUEvict"))
    assert cpuevict.usage_release(_cpu_snapshot(avg), config).release_milli == expected


@pytest.mark.parametrize("threshold,reason", [
    ({}, "cpuEvictThresholdPercent is not set"),
    ({"cpuEvictThresholdPercent": 80}, "evictEnabledPriorityThreshold is not set"),
    ({"cpuEvictThresholdPercent": 80, "cpuEvictLowerPercent": 80, "evictEnabledPriorityThreshold": 1},
     "lower percent 80 is not below the threshold 80"),
])
def test_cpu_evict_without_a_valid_config_is_inert(threshold: dict, reason: str) -> None:
    config = cpuevict.CPUEvictConfig.from_node_slo(spec(**threshold), _flags("CPUEvict"))
    plan = cpuevict.decide(_cpu_snapshot(), config)
    assert plan.evictions == () and plan.report["CPUEvict"] == reason


# -------------------------------------------------------------------------------- CPUAllocatableEvict

ALLOC_PODS = (
    _pod("b1", "BE", 5500, requests={"kubernetes.io/batch-cpu": 2000}),
    _pod("b2", "BE", 5500, requests={"kubernetes.io/batch-cpu": 1500}),
    _pod("b3", "BE", 5500, opted=False, requests={"kubernetes.io/batch-cpu": 500}),
    _pod("m1", "LS", 7500, labels={LABEL_PRIORITY_CLASS: "koord-mid"}, requests={"kubernetes.io/mid-cpu": 1000}),
    _pod("prod", "LS", 9500, requests={"cpu": 2000}),
)
ALLOC_SLO = spec(cpuAllocatableEvictThresholdPercent=80, cpuAllocatableEvictLowerPercent=60,
                 allocatableEvictPriorityThreshold=7999)


def _alloc_node():
    info = node(8000, 16 * GiB)
    return type(info)(name=info.name, capacity=info.capacity,
                      allocatable={**info.allocatable, "kubernetes.io/batch-cpu": 4000, "kubernetes.io/mid-cpu": 2000})


def test_cpu_allocatable_evict_releases_the_over_committed_class_only() -> None:
    config = cpuevict.CPUEvictConfig.from_node_slo(ALLOC_SLO, _flags("CPUAllocatableEvict"))
    snap = snapshot(node=_alloc_node(), pods=ALLOC_PODS, node_slo=ALLOC_SLO,
                    pod_cpu_cores={p.uid: 0.1 for p in ALLOC_PODS})
    plan = cpuevict.decide(snap, config)
    decision = plan.report["CPUAllocatableEvict"]
    # batch-cpu: 4000 requested of 4000 = 100 % > 80 %: release 4000 − 60 % × 4000 = 1600; mid-cpu 50 %: no
    assert dict(decision.requested) == {"kubernetes.io/batch-cpu": 4000, "kubernetes.io/mid-cpu": 1000}
    assert dict(decision.release) == {"kubernetes.io/batch-cpu": 1600}
    (task,) = plan.evictions
    assert task.target == 1600.0 and [v.pod.name for v in task.candidates] == ["b1", "b2"]  # request desc
    (done,) = walk_evictions(plan.evictions, lambda _, v: VictimOutcome.EVICTED)
    assert [v.pod.name for v in done.accepted] == ["b1"]  # 2000 >= 1600


def test_allocatable_release_formula() -> None:
    assert allocatable_release(4000, 4000, 80, 60) == 1600
    assert allocatable_release(3000, 4000, 80, 60) == 0  # 75 % is not above 80 %
    assert allocatable_release(3000, 0, 80, 60) == 3000  # the node has none: all of it
    assert allocatable_release(0, 0, 80, 60) == 0


def test_class_request_follows_the_priority_class() -> None:
    assert class_request(ALLOC_PODS[0], "cpu") == ("kubernetes.io/batch-cpu", 2000)
    assert class_request(ALLOC_PODS[3], "cpu") == ("kubernetes.io/mid-cpu", 1000)
    assert class_request(ALLOC_PODS[4], "cpu") == ("cpu", 2000)
    init = _pod("init", "LS", 9500, requests={"cpu": 500})
    init = PodMeta(**{**{f: getattr(init, f) for f in init.__slots__},
                      "containers": (*init.containers, ContainerMeta("setup", requests={"cpu": 900}, is_init=True))})
    assert class_request(init, "cpu") == ("cpu", 900)  # the larger of Σ regular and the largest init container

    # a pod-level request wins over the containers' (KEP-2837), so eviction ranks it by what the pod holds
    pod_level = PodMeta(**{**{f: getattr(init, f) for f in init.__slots__}, "pod_requests": {"cpu": 3000}})
    assert class_request(pod_level, "cpu") == ("cpu", 3000)
    assert class_request(pod_level, "memory") == ("memory", 0)  # no pod-level memory: the containers' sum


def test_allocatable_threshold_above_mid_keeps_the_feature_inert() -> None:
    slo = spec(cpuAllocatableEvictThresholdPercent=80, cpuAllocatableEvictLowerPercent=60,
               allocatableEvictPriorityThreshold=7999)
    config = cpuevict.CPUEvictConfig.from_node_slo(slo, _flags("CPUAllocatableEvict"))
    from dataclasses import replace
    config = replace(config, allocatable_priority_threshold=9000)  # the NodeSLO parser refuses it already
    plan = cpuevict.decide(snapshot(node=_alloc_node(), pods=ALLOC_PODS), config)
    assert plan.evictions == () and "above 7999" in plan.report["CPUAllocatableEvict"]


# ------------------------------------------------------------------------------------------ MemoryEvict

MEM_PODS = (
    _pod("be-1", "BE", 5000, opted=False),
    _pod("be-2", "BE", 5000, opted=False),
    _pod("ls-opt", "LS", 7000),
    _pod("ls-keep", "LS", 7000, opted=False),
)
MEM_USED = {"uid-be-1": 600 * MiB, "uid-be-2": 200 * MiB, "uid-ls-opt": 2 * GiB, "uid-ls-keep": 4 * GiB}
MEM_SLO = spec(evictEnabledPriorityThreshold=7999)


def _memory_snapshot(used: float, **fields):
    values = {"node": node(8000, 16 * GiB), "pods": MEM_PODS, "node_memory_bytes": used,
              "pod_memory_bytes": MEM_USED, "node_slo": MEM_SLO}
    values.update(fields)
    return snapshot(**values)


def test_memory_evict_takes_opted_in_pods_for_what_be_pods_did_not_release() -> None:
    config = memoryevict.MemoryEvictConfig.from_node_slo(MEM_SLO, _flags("BEMemoryEvict", "MemoryEvict"))
    assert config.features == ("BEMemoryEvict", "MemoryEvict")
    plan = memoryevict.decide(_memory_snapshot(12 * GiB), config)
    # 75 % >= 70 %: each task's target is 16 GiB × (75 − 68) / 100 = 1202590842 bytes
    be_task, opt_task = plan.evictions
    assert be_task.target == opt_task.target == 16 * GiB * 7 // 100
    done = walk_evictions(plan.evictions, lambda _, v: VictimOutcome.EVICTED)
    assert [v.pod.name for v in done[0].accepted] == ["be-1", "be-2"]  # 800 MiB of 1.12 GiB
    assert done[1].released >= opt_task.target
    assert [v.pod.name for v in done[1].accepted] == ["ls-opt"]  # the BE pods' 800 MiB counted, 2 GiB more
    assert "ls-keep" not in [v.pod.name for v in opt_task.candidates]


def test_memory_evict_spares_opted_in_pods_when_be_pods_released_enough() -> None:
    used = {**MEM_USED, "uid-be-1": GiB, "uid-be-2": GiB}
    config = memoryevict.MemoryEvictConfig.from_node_slo(MEM_SLO, _flags("BEMemoryEvict", "MemoryEvict"))
    plan = memoryevict.decide(_memory_snapshot(12 * GiB, pod_memory_bytes=used), config)
    done = walk_evictions(plan.evictions, lambda _, v: VictimOutcome.EVICTED)
    assert [v.pod.name for v in done[0].accepted] == ["be-2", "be-1"]  # equal usage: name descending
    assert done[1].accepted == () and done[1].released == 2 * GiB


def test_memory_allocatable_evict_from_batch_memory_requests() -> None:
    pods = (
        _pod("b1", "BE", 5500, requests={"kubernetes.io/batch-memory": 6 * GiB}),
        _pod("b2", "BE", 5500, requests={"kubernetes.io/batch-memory": 3 * GiB},
             annotations={ANNOTATION_EVICTION_PRIORITY: "-5"}),
    )
    slo = spec(memoryAllocatableEvictThresholdPercent=80, memoryAllocatableEvictLowerPercent=50,
               allocatableEvictPriorityThreshold=5999)
    info = node(8000, 16 * GiB)
    info = type(info)(name=info.name, capacity=info.capacity,
                      allocatable={**info.allocatable, "kubernetes.io/batch-memory": 10 * GiB})
    config = memoryevict.MemoryEvictConfig.from_node_slo(slo, _flags("MemoryAllocatableEvict"))
    plan = memoryevict.decide(snapshot(node=info, pods=pods, node_slo=slo,
                                       pod_memory_bytes={p.uid: GiB for p in pods}), config)
    (task,) = plan.evictions
    # 9 GiB of 10 = 90 % > 80 %: release 9 GiB − 50 % × 10 GiB = 4 GiB; b2 first (eviction priority −5)
    assert task.target == 4 * GiB and [v.pod.name for v in task.candidates] == ["b2", "b1"]
    (done,) = walk_evictions(plan.evictions, lambda _, v: VictimOutcome.EVICTED)
    assert [v.pod.name for v in done.accepted] == ["b2", "b1"]


def test_features_whose_gate_is_off_make_no_task() -> None:
    config = memoryevict.MemoryEvictConfig.from_node_slo(MEM_SLO, _flags("MemoryEvict"))
    plan = memoryevict.decide(_memory_snapshot(12 * GiB), config)
    assert [t.feature for t in plan.evictions] == ["MemoryEvict"]
    assert set(plan.report) == {"MemoryEvict"}


def test_the_cool_down_covers_every_feature() -> None:
    from koordlet.actuator import PlanRecord

    config = memoryevict.MemoryEvictConfig.from_node_slo(MEM_SLO, _flags("MemoryEvict"))
    last = PlanRecord("memoryevict", at=1000.0, evicted=("default/ls-opt",))
    plan = memoryevict.decide(_memory_snapshot(12 * GiB, timestamp=1002.0, last=last), config)
    assert plan.evictions == () and plan.memo.resting_until == 1004.0


# ------------------------------------------------------------------------------------------- the rules

def test_eviction_policy_annotation() -> None:
    def with_policy(text: str) -> PodMeta:
        return _pod("x", "BE", 5000, annotations={ANNOTATION_EVICTION_POLICY: text})

    assert eviction_policy_allows(_pod("x", "BE", 5000), "CPUEvict")
    assert eviction_policy_allows(with_policy('["CPUEvict","MemoryEvict"]'), "CPUEvict")
    assert not eviction_policy_allows(with_policy('["MemoryEvict"]'), "CPUEvict")
    assert not eviction_policy_allows(with_policy("CPUEvict"), "CPUEvict")  # not JSON: protects the pod
    assert not eviction_policy_allows(with_policy('{"CPUEvict": true}'), "CPUEvict")


def test_priority_value_defaults_to_the_class_default() -> None:
    assert priority_value(_pod("a", "LS", 0)) == 9500  # LS without priority: koord-prod
    assert priority_value(_pod("b", "BE", 0)) == 5500  # BE: koord-batch
    assert priority_value(_pod("c", "LS", 0, labels={LABEL_PRIORITY_CLASS: "koord-mid"})) == 7500
    assert priority_value(_pod("d", "LS", 7123)) == 7123
    odd = _pod("e", "BE", 5000, annotations={ANNOTATION_EVICTION_PRIORITY: "x"}, labels={LABEL_SUB_PRIORITY: "y"})
    assert opt_in_order(odd) == (0, 5000, 5000)  # unreadable eviction priority → 0, label priority → priority


@settings(max_examples=150, deadline=None)
@given(raw=st.lists(st.tuples(st.sampled_from(["LS", "LSR", "BE", ""]), st.integers(0, 10000), st.booleans(),
                              st.sampled_from([None, '["CPUEvict"]', '["MemoryEvict"]', "bad"]),
                              st.floats(0, 4)), max_size=10),
       threshold=st.integers(0, 9999), usage=st.floats(0, 8))
def test_opt_in_features_never_take_a_pod_the_rule_refuses(raw, threshold: int, usage: float) -> None:
    pods, used = [], {}
    for index, (qos, priority, opted, policy, cores) in enumerate(raw):
        annotations = {ANNOTATION_EVICTION_POLICY: policy} if policy is not None else {}
        pods.append(_pod(f"p{index}", qos, priority, opted=opted, annotations=annotations))
        used[f"uid-p{index}"] = cores
    slo = spec(cpuEvictThresholdPercent=10, evictEnabledPriorityThreshold=threshold)
    config = cpuevict.CPUEvictConfig.from_node_slo(slo, _flags("CPUEvict"))
    plan = cpuevict.decide(_cpu_snapshot(usage, pods=tuple(pods), pod_cpu_cores=used, node_slo=slo), config)
    rule = opt_in_rule("CPUEvict", threshold)
    for task in plan.evictions:
        for victim in task.candidates:
            assert victim.pod.labels.get(LABEL_EVICTION_ENABLED) == "true"
            assert priority_value(victim.pod) <= threshold
            policy = victim.pod.annotations.get(ANNOTATION_EVICTION_POLICY)
            assert policy is None or "CPUEvict" in json.loads(policy)
            assert rule.allows(victim.pod)


def test_cpu_strategy_runs_its_three_features_in_koordinators_order() -> None:
    slo = spec(cpuEvictBESatisfactionUpperPercent=80, cpuEvictBESatisfactionLowerPercent=50,
               cpuAllocatableEvictThresholdPercent=80, cpuAllocatableEvictLowerPercent=60,
               allocatableEvictPriorityThreshold=7999, cpuEvictThresholdPercent=80, evictEnabledPriorityThreshold=7999)
    config = cpuevict.CPUEvictConfig.from_node_slo(slo, _flags("CPUEvict", "BECPUEvict", "CPUAllocatableEvict"))
    assert config.features == ("BECPUEvict", "CPUAllocatableEvict", "CPUEvict")
    snap = snapshot(node=_alloc_node(), pods=ALLOC_PODS, node_slo=slo, node_cpu_avg_cores=7.2,
                    pod_cpu_cores={p.uid: 0.5 for p in ALLOC_PODS},
                    be_cpu=BECPUWindow(30, 30, 1450, 4000, 1500, 1450, 4000, 1500))
    plan = cpuevict.decide(snap, config)
    assert [t.feature for t in plan.evictions] == ["BECPUEvict", "CPUAllocatableEvict", "CPUEvict"]
    done = walk_evictions(plan.evictions, lambda _, v: VictimOutcome.EVICTED)
    # BE: 4000 × (0.8 − 1500/4000) = 1700m of batch-cpu requests, by usage/request: b3 (500m, ratio 1.0),
    # b2 (1500m, 0.33); allocatable (1600m of batch-cpu) counts their 2000m: met; CPUEvict (960m of usage)
    # counts their 2 × 500m: met. Nothing is asked twice, nothing more is asked.
    assert [v.pod.name for v in done[0].accepted] == ["b3", "b2"]
    assert (done[1].accepted, done[1].released) == ((), 2000.0)
    assert (done[2].accepted, done[2].released) == ((), 1000.0)
