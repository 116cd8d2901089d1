"""How often the pod collector reads each pod: the pods a QoS strategy demands every tick, every other pod once every
fan-out interval in its own turn; Σ pods for system usage from the kubepods dir. Fixture v1 and v2 trees with a fake
clock, and real cgroup v1 dirs (the v2 twin: tests/koordlet/test_pod_story_v2.py, in the guest)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from koordlet.metriccache import MetricCache, MetricKind, Sample, SeriesKey
from koordlet.metricsadvisor import CollectorRunner, ContainerCgroup, NodeResourceCollector, PodCgroup
from koordlet.metricsadvisor.node import NodeUsage
from koordlet.metricsadvisor.pods import (
    KUBEPODS_CPU,
    SYS_CPU,
    SYS_MEMORY,
    DemandBoard,
    HostAppCgroup,
    PodResourceCollector,
    UsageDemand,
    fanout_turn,
)
from koordlet.system.procfs import clock_ticks_per_second, read_pid_cpu_ticks
from tests.koordlet.metricsadvisor.test_pods import FakeMonotonic, _by_key, _fs, _write_v1, _write_v2
from tests.koordlet.metricsadvisor.v1cgroups import V1TestCgroups, v1_cgroups

PODS = tuple(PodCgroup(f"uid-{n}", f"kubepods/burstable/pod{n}",
                       (ContainerCgroup(f"ctr-{n}", f"kubepods/burstable/pod{n}/c"),), "LS") for n in range(6))
KUBEPODS = "kubepods"
KUBEPODS_MEMORY = SeriesKey.of(MetricKind.KUBEPODS_MEMORY_USAGE)


def _pod_cpu(uid: str) -> SeriesKey:
    return SeriesKey.of(MetricKind.POD_CPU_USAGE, pod_uid=uid)


def _read_pods(samples: list[Sample], kind: MetricKind) -> set[str]:
    """The pod uids the tick read, by their memory sample (every reading writes one)."""
    return {uid for s in samples if s.key.kind == kind and (uid := s.key.label("pod_uid")) is not None}


@pytest.mark.parametrize("version", [1, 2])
def test_an_undemanded_pod_is_read_once_a_turn_and_a_demanded_one_every_tick(tmp_path: Path, version: int) -> None:
    write = _write_v1 if version == 1 else _write_v2
    clock = FakeMonotonic()
    board = DemandBoard()
    board.set(UsageDemand(pods=frozenset({"uid-1"}), containers=frozenset({"uid-2"})))
    collector = PodResourceCollector(lambda: PODS, _fs(tmp_path, version), monotonic_ns=clock, fanout_interval_s=10.0,
                                     demand=board.get)
    pod_reads: Counter[str] = Counter()
    container_reads: Counter[str] = Counter()
    cpu: dict[str, list[float]] = {}
    for tick in range(32):
        for index, pod in enumerate(PODS):  # pod n burns n/2 cores, its container all of it
            usage_ns = tick * 10**9 * index // 2
            write(tmp_path, pod.cgroup_dir, usage_ns, 0, 0, 1 << 20)
            write(tmp_path, pod.containers[0].cgroup_dir, usage_ns, 0, 0, 1 << 20)
        samples = collector.collect(100.0 + tick)
        if tick == 0 or tick == 1:  # new pods: read at once and again at the next tick, for a CPU rate
            assert _read_pods(samples, MetricKind.POD_MEMORY_USAGE) == {p.pod_uid for p in PODS}
            assert (tick == 1) == all(_pod_cpu(p.pod_uid) in _by_key(samples) for p in PODS)
        elif tick >= 12:  # two whole turns of 10 ticks after the first ones
            pod_reads.update(_read_pods(samples, MetricKind.POD_MEMORY_USAGE))
            container_reads.update(_read_pods(samples, MetricKind.CONTAINER_MEMORY_USAGE))
        for s in samples:
            if s.key.kind == MetricKind.POD_CPU_USAGE:
                cpu.setdefault(s.key.label("pod_uid") or "", []).append(s.value)
        clock.ns += 10**9
    assert pod_reads == {"uid-0": 2, "uid-1": 20, "uid-2": 20, "uid-3": 2, "uid-4": 2, "uid-5": 2}
    assert container_reads == {"uid-0": 2, "uid-1": 2, "uid-2": 20, "uid-3": 2, "uid-4": 2, "uid-5": 2}
    for index, pod in enumerate(PODS):  # a rate over whatever time passed since its last reading
        assert cpu[pod.pod_uid] == pytest.approx([index / 2] * len(cpu[pod.pod_uid]))


def test_the_turns_of_many_pods_spread_evenly_over_the_round() -> None:
    idents = [f"pod/{n:08x}-uid" for n in range(2000)]
    changed = Counter(sum(fanout_turn(i, t + 1.0, 10.0) != fanout_turn(i, t, 10.0) for i in idents) for t in range(10))
    assert sum(count * ticks for count, ticks in changed.items()) == 2000  # each pod's turn comes once a round
    assert all(140 <= count <= 260 for count in changed.elements())  # about 200 a tick


@pytest.mark.parametrize("version", [1, 2])
def test_system_usage_takes_every_pod_from_the_kubepods_dir_and_host_apps_inside_it_once(tmp_path: Path,
                                                                                        version: int) -> None:
    write = _write_v1 if version == 1 else _write_v2
    outside = HostAppCgroup("nginx", "host/nginx")
    inside = HostAppCgroup("agent", "kubepods/besteffort/agent")
    clock = FakeMonotonic()
    node = NodeResourceCollector(proc_dir=str(tmp_path))
    collector = PodResourceCollector(lambda: PODS, _fs(tmp_path, version), node=node, monotonic_ns=clock,
                                     host_apps=lambda: [outside, inside], kubepods_dir=KUBEPODS, fanout_interval_s=10.0)
    unevictable = 4096 if version == 1 else 0  # the v1 fixture's total_unevictable counts as usage
    for tick, (kubepods_s, outside_s, node_cores) in enumerate(((0, 0, None), (3, 1, 5.0))):
        write(tmp_path, KUBEPODS, kubepods_s * 10**9, 0, 0, 900 << 20)  # holds every pod and the inside app
        write(tmp_path, outside.cgroup_dir, outside_s * 10**9, 0, 0, 50 << 20)
        write(tmp_path, inside.cgroup_dir, 2 * tick * 10**9, 0, 0, 30 << 20)
        for pod in PODS:
            write(tmp_path, pod.cgroup_dir, 0, 0, 0, 1 << 20)
            write(tmp_path, pod.containers[0].cgroup_dir, 0, 0, 0, 1 << 20)
        node.last_usage = NodeUsage(timestamp=1.0 + tick, cpu_cores=node_cores, memory_bytes=2000 << 20)
        samples = _by_key(collector.collect(1.0 + tick))
        clock.ns += 10**9
    assert samples[KUBEPODS_CPU] == pytest.approx(3.0)
    assert samples[KUBEPODS_MEMORY] == (900 << 20) + unevictable
    assert samples[SYS_CPU] == pytest.approx(5.0 - 3.0 - 1.0)  # the inside app's 2 cores are in kubepods' 3
    assert samples[SYS_MEMORY] == (2000 << 20) - (900 << 20) - (50 << 20) - 2 * unevictable


def test_without_the_kubepods_dir_system_usage_needs_every_pod_read_every_tick(tmp_path: Path) -> None:
    for pod in PODS:
        _write_v2(tmp_path, pod.cgroup_dir, 0, 0, 0, 10 << 20)
        _write_v2(tmp_path, pod.containers[0].cgroup_dir, 0, 0, 0, 10 << 20)
    node = NodeResourceCollector(proc_dir=str(tmp_path))
    node.last_usage = NodeUsage(timestamp=1.0, cpu_cores=None, memory_bytes=100 << 20)
    every_tick = PodResourceCollector(lambda: PODS, _fs(tmp_path, 2), node=node, kubepods_dir=KUBEPODS)
    assert _by_key(every_tick.collect(1.0))[SYS_MEMORY] == (100 - 60) << 20  # Σ of the pods read
    in_turns = PodResourceCollector(lambda: PODS, _fs(tmp_path, 2), node=node, kubepods_dir=KUBEPODS,
                                    fanout_interval_s=10.0)
    samples = _by_key(in_turns.collect(1.0))
    assert SYS_MEMORY not in samples and SYS_CPU not in samples  # the pods read are not every pod
    assert in_turns.read_errors == 0  # a missing kubepods dir is said once in the log, not counted as an error


# ------------------------------------------------------------------------------------- real cgroups


def collect_two_turns(runner: CollectorRunner, cpu_seconds: Callable[[], float]) -> tuple[list[float], float]:
    """Run the pod collector (fan-out interval 3 s) on new pods, then for two turns at 1 s ticks; (the wall-clock
    times of the ticks, the first the turns' start, and the cores ``cpu_seconds`` (a CPU time counter) counted over
    the turns)."""
    runner.run_collector("pod_resource")  # new pods: read now and again at the next tick
    time.sleep(1.0)
    ticks = [time.time()]
    runner.run_collector("pod_resource")
    cpu_before, started = cpu_seconds(), time.monotonic()
    for _ in range(6):
        time.sleep(1.0)
        ticks.append(time.time())
        runner.run_collector("pod_resource")
    return ticks, (cpu_seconds() - cpu_before) / (time.monotonic() - started)


def pod_in_turns_against_kubepods(cache: MetricCache, pod: SeriesKey, ticks: list[float]) -> list[tuple[float, float]]:
    """Each sample the pod's turns wrote over the ``ticks`` of :func:`collect_two_turns` (its CPU since its reading
    before), beside the kubepods dir's average over the same ticks (its CPU over the same time): what the pod used,
    when it is the only busy pod there."""
    pairs, last = [], 0  # the pod was read at the first tick (its second reading)
    for index in range(1, len(ticks)):
        read = cache.query(pod, ticks[index], ticks[index] + 0.5)
        if read is not None:
            kubepods = cache.query(KUBEPODS_CPU, ticks[last] + 0.5, ticks[index] + 0.5)
            assert kubepods is not None and kubepods.count == index - last
            pairs.append((read.last, kubepods.avg))
            last = index
    return pairs



@pytest.fixture
def real_v1() -> Iterator[V1TestCgroups]:
    yield from v1_cgroups("fanout")


@pytest.mark.cgroupv1
def test_real_burning_pod_read_in_its_turn_shows_its_cpu_and_so_does_the_kubepods_dir(real_v1: V1TestCgroups) -> None:
    """The kubepods dir is the test's prefix: what it holds (the burner's pod and an idle one) counts in it."""
    real_v1.make("podburn/ctr")
    real_v1.make("podidle/ctr")
    pods = [PodCgroup(name, f"{real_v1.prefix}/pod{name}",
                      (ContainerCgroup(f"ctr-{name}", f"{real_v1.prefix}/pod{name}/ctr"),), "LS")
            for name in ("burn", "idle")]
    child = real_v1.spawn("podburn/ctr", "while True: pass")
    cache = MetricCache()
    collector = PodResourceCollector(lambda: pods, kubepods_dir=real_v1.prefix, fanout_interval_s=3.0)
    runner = CollectorRunner(cache, [collector])
    try:
        ticks, own_cores = collect_two_turns(runner, lambda: read_pid_cpu_ticks(child.pid) / clock_ticks_per_second())
    finally:
        collector.close()
    kubepods = cache.query(KUBEPODS_CPU, ticks[0] + 0.5, ticks[-1] + 0.5)
    assert kubepods is not None and kubepods.count == 6  # every tick
    # The kubepods dir agrees with the burner's own CPU time (/proc/<pid>/stat) within 15 %: on this shared 2-core
    # machine that is its share, not a whole core.
    assert kubepods.avg == pytest.approx(own_cores, rel=0.15, abs=0.05)
    assert 0.25 <= own_cores <= 1.1
    # The pod once a turn, its CPU over the 3 s since its last reading: what the kubepods dir saw over them.
    pairs = pod_in_turns_against_kubepods(cache, SeriesKey.of(MetricKind.POD_CPU_USAGE, pod_uid="burn"), ticks)
    assert len(pairs) in (2, 3)  # a turn every 3 s over 6 ticks of a little over 1 s
    for in_turn, kubepods_avg in pairs:
        assert in_turn == pytest.approx(kubepods_avg, rel=0.1, abs=0.03)
