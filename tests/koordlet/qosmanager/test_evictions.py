"""BEMemoryEvict and BECPUEvict decide() against hand-computed docs/koordinator.md §4.4–4.5 figures."""

from __future__ import annotations

import pytest

from koordlet.api.pod import ContainerMeta
from koordlet.qosmanager import cpuevict, memoryevict
from koordlet.qosmanager.snapshot import BECPUWindow
from tests.koordlet.qosmanager.factory import GiB, be_pod, node, pod, snapshot, spec

MiB = 1 << 20
CAPACITY = 16 * GiB


def _memory_snapshot(used: float, **fields):
    pods = (
        pod("ls", "LS", priority=9500),
        be_pod("a", priority=5000),
        be_pod("b", priority=5000),
        be_pod("c", priority=3000),
        be_pod("d", priority=5000),
        be_pod("e", priority=5000),
    )
    usage = {"uid-ls": 8 * GiB, "uid-a": 800 * MiB, "uid-b": 600 * MiB, "uid-c": 100 * MiB}
    values = {"node": node(8000, CAPACITY), "pods": pods, "node_memory_bytes": used, "pod_memory_bytes": usage}
    values.update(fields)
    return snapshot(**values)


def test_memory_release_down_to_threshold_minus_two() -> None:
    decision = memoryevict.decide_release(_memory_snapshot(12 * GiB), memoryevict.MemoryEvictConfig(70, 68))
    assert decision.usage_percent == 75
    assert decision.release_bytes == CAPACITY * (75 - 68) // 100


def test_memory_victims_lowest_priority_then_largest_usage_then_idle_pods_by_name_desc() -> None:
    decision = memoryevict.decide_release(_memory_snapshot(12 * GiB), memoryevict.MemoryEvictConfig(70, 68))
    assert [v.pod.name for v in decision.candidates] == ["c", "a", "b", "e", "d"]
    # 100 MiB + 800 MiB < 1.2 GB release; + 600 MiB reaches it
    assert [v.pod.name for v in decision.victims] == ["c", "a", "b"]


def test_memory_pods_already_evicting_count_as_released() -> None:
    decision = memoryevict.decide_release(_memory_snapshot(12 * GiB), memoryevict.MemoryEvictConfig(70, 68),
                                  evicting={"uid-a"})
    assert [v.pod.name for v in decision.victims] == ["c", "b"]


@pytest.mark.parametrize(
    "used,lower,expected",
    [
        (11 * GiB, 68, 0),  # 68.75 % → 68 < 70
        (CAPACITY * 70 // 100 + 1, 68, CAPACITY * 2 // 100),  # exactly at the threshold
        (12 * GiB, 60, CAPACITY * 15 // 100),  # memoryEvictLowerPercent
    ],
)
def test_memory_release_amounts(used: int, lower: int, expected: int) -> None:
    assert memoryevict.decide_release(_memory_snapshot(used), memoryevict.MemoryEvictConfig(70, lower)).release_bytes \
        == expected


def test_memory_config_defaults_from_node_slo() -> None:
    assert memoryevict.MemoryEvictConfig.from_node_slo(spec()) == memoryevict.MemoryEvictConfig(70, 68)
    assert memoryevict.MemoryEvictConfig.from_node_slo(spec(memoryEvictThresholdPercent=80)).lower_percent == 78


def test_memory_no_sample_no_eviction() -> None:
    assert not memoryevict.decide_release(_memory_snapshot(None), memoryevict.MemoryEvictConfig()).triggered


# ------------------------------------------------------------------------------------------ BE CPU

CONFIG = cpuevict.CPUEvictConfig(upper_percent=80, lower_percent=50)


def _window(usage=1450.0, request=4000.0, limit=1500.0, last=None, samples=30, window_s=30.0) -> BECPUWindow:
    last_usage, last_request, last_limit = last or (usage, request, limit)
    return BECPUWindow(window_s, samples, usage, request, limit, last_usage, last_request, last_limit)


def _cpu_snapshot(window: BECPUWindow | None, **fields):
    pods = (
        pod("ls", "LS", priority=9500),
        be_pod("p1", priority=5000, batch_cpu_milli=2000),
        be_pod("p2", priority=5000, batch_cpu_milli=1000),
        be_pod("p3", priority=3000, batch_cpu_milli=500),
    )
    values = {"pods": pods, "be_cpu": window, "pod_cpu_cores": {"uid-p1": 1.0, "uid-p2": 1.0, "uid-ls": 4.0}}
    values.update(fields)
    return snapshot(**values)


def test_be_pods_with_unknown_requests_are_never_evicted_for_cpu() -> None:
    """The CRI pod source knows no batch-cpu requests: satisfaction and what a victim releases are unknown."""
    from dataclasses import replace

    pods = _cpu_snapshot(_window()).pods
    snap = _cpu_snapshot(_window(), pods=tuple(replace(p, requests_known=False) if p.name == "p3" else p
                                               for p in pods))
    decision = cpuevict.decide_release(snap, CONFIG)
    assert not decision.triggered and decision.victims == ()
    assert cpuevict.decide_release(_cpu_snapshot(_window()), CONFIG).triggered  # with the specs: it would


def test_satisfaction_release_from_averages() -> None:
    decision = cpuevict.decide_release(_cpu_snapshot(_window()), CONFIG)
    assert decision.satisfaction == pytest.approx(0.375)  # 1500 / 4000
    assert decision.release_milli == pytest.approx(4000 * (0.8 - 0.375))  # 1700


def test_satisfaction_release_takes_the_smaller_of_avg_and_last() -> None:
    decision = cpuevict.decide_release(_cpu_snapshot(_window(last=(1900.0, 4000.0, 2000.0))), CONFIG)
    assert decision.release_milli == pytest.approx(4000 * (0.8 - 0.5))  # last-based 1200 < 1700


@pytest.mark.parametrize(
    "window,expected",
    [
        (_window(usage=1000.0), 0.0),  # 1000 / 1500 = 67 % < 90 % usage threshold
        (_window(usage=100.0, limit=800.0), 4000 * (0.8 - 0.2)),  # limit < 1 core always passes
        (_window(limit=2400.0, usage=2300.0), 0.0),  # satisfaction 0.6 > 0.5
        (_window(samples=5), 0.0),  # 5 s of samples < 30 s / 3
    ],
)
def test_satisfaction_windows(window: BECPUWindow, expected: float) -> None:
    assert cpuevict.decide_release(_cpu_snapshot(window), CONFIG).release_milli == pytest.approx(expected)


def test_evict_by_allocatable_uses_batch_cpu_allocatable() -> None:
    config = cpuevict.CPUEvictConfig(80, 50, policy="evictByAllocatable")
    snap = _cpu_snapshot(_window(), node=node(8000, batch_cpu_milli=1000))
    assert cpuevict.decide_release(snap, config).release_milli == pytest.approx(4000 * (0.8 - 0.25))
    snap = _cpu_snapshot(_window(), node=node(8000, batch_cpu_milli=0))
    assert cpuevict.decide_release(snap, config).release_milli == pytest.approx(4000 * (0.8 - 1 / 4000))


@pytest.mark.parametrize(
    "config",
    [
        cpuevict.CPUEvictConfig(),
        cpuevict.CPUEvictConfig(upper_percent=80),
        cpuevict.CPUEvictConfig(upper_percent=80, lower_percent=70),  # lower above 60
        cpuevict.CPUEvictConfig(upper_percent=40, lower_percent=50),  # upper below lower
        cpuevict.CPUEvictConfig(upper_percent=100, lower_percent=50),
    ],
)
def test_invalid_or_missing_bounds_keep_the_feature_inert(config: cpuevict.CPUEvictConfig) -> None:
    assert not cpuevict.decide_release(_cpu_snapshot(_window()), config).triggered


def test_cpu_victims_lowest_priority_then_highest_usage_per_request() -> None:
    decision = cpuevict.decide_release(_cpu_snapshot(_window()), CONFIG)
    assert [v.pod.name for v in decision.candidates] == ["p3", "p2", "p1"]  # ratios: p2 1.0, p1 0.5
    assert [v.releases for v in decision.candidates] == [500.0, 1000.0, 2000.0]
    assert [v.pod.name for v in decision.victims] == ["p3", "p2", "p1"]  # 500 + 1000 < 1700


def test_batch_cpu_request_includes_sidecar_init_containers() -> None:
    sidecar = be_pod("s", containers=(
        ContainerMeta("main", container_id="a" * 12, requests={"kubernetes.io/batch-cpu": 1000}),
        ContainerMeta("sidecar", container_id="b" * 12, requests={"koordinator.sh/batch-cpu": 250}, is_init=True),
    ))
    (victim,) = cpuevict.cpu_victims(_cpu_snapshot(None, pods=(sidecar,)))
    assert victim.releases == 1250.0


def test_window_is_at_least_the_collect_interval() -> None:
    assert cpuevict.CPUEvictConfig().window_s(1.0) == 1.0
    assert cpuevict.CPUEvictConfig(time_window_s=30).window_s(1.0) == 30.0
