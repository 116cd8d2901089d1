"""Property: over random pod mixes and usages, no strategy and not the evictor ever picks a non-BE pod."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from koordlet.api.keys import LABEL_QOS_CLASS
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.eviction import EvictionOutcome, Evictor
from koordlet.plan import Victim, planned_victims
from koordlet.qosmanager import cpuevict, memoryevict
from koordlet.qosmanager.snapshot import BECPUWindow
from tests.koordlet.qosmanager.factory import GiB, node, snapshot

_pods = st.lists(
    st.tuples(
        st.sampled_from([q.value for q in QoSClass]),
        st.sampled_from([*KubeQoS, None]),
        st.one_of(st.none(), st.integers(0, 10000)),
        st.floats(0, 8 * GiB),
        st.floats(0, 4),
        st.integers(0, 4000),
    ),
    max_size=12,
)


def _mix(raw) -> tuple[tuple[PodMeta, ...], dict[str, float], dict[str, float]]:
    pods, memory, cpu = [], {}, {}
    for index, (qos, kube_qos, priority, mem, cores, batch_cpu) in enumerate(raw):
        uid = f"uid-{index}"
        pods.append(PodMeta(
            name=f"p{index}", namespace="default", uid=uid, labels={LABEL_QOS_CLASS: qos} if qos else {},
            kube_qos=kube_qos, priority=priority,
            containers=(ContainerMeta("c", requests={"kubernetes.io/batch-cpu": batch_cpu}),)))
        memory[uid], cpu[uid] = mem, cores
    return tuple(pods), memory, cpu


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=_pods, used_percent=st.integers(0, 100), evicting=st.sets(st.sampled_from([f"uid-{i}" for i in range(12)])))
def test_eviction_strategies_only_pick_be_pods(raw, used_percent: int, evicting: set[str]) -> None:
    pods, memory, cpu = _mix(raw)
    capacity = 16 * GiB
    snap = snapshot(node=node(8000, capacity), pods=pods, node_memory_bytes=capacity * used_percent / 100,
                    pod_memory_bytes=memory, pod_cpu_cores=cpu,
                    be_cpu=BECPUWindow(10, 10, 3900, 4000, 500, 3900, 4000, 500))
    memory_decision = memoryevict.decide_release(snap, memoryevict.MemoryEvictConfig(), evicting)
    cpu_decision = cpuevict.decide_release(snap, cpuevict.CPUEvictConfig(80, 50), evicting)
    picked = [*memory_decision.candidates, *memory_decision.victims, *cpu_decision.candidates, *cpu_decision.victims]
    assert all(v.pod.qos_class is QoSClass.BE for v in picked)
    # Even a hand-built candidate list with non-BE pods in it yields only BE victims.
    planned = planned_victims([Victim(p, 1.0) for p in pods], float(len(pods)), frozenset(evicting))
    assert all(v.pod.qos_class is QoSClass.BE for v in planned)


@settings(max_examples=100, deadline=None)
@given(raw=_pods)
def test_evictor_refuses_every_non_be_pod(raw) -> None:
    pods, _, _ = _mix(raw)
    evictor = Evictor("node-1", cri_endpoint="/nonexistent/runtime.sock")
    for pod in pods:
        if pod.qos_class is not QoSClass.BE:
            assert evictor.evict(pod, "BEMemoryEvict", "property").outcome is EvictionOutcome.NOT_BE
