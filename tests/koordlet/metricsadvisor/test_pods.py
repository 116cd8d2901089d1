"""Pod/container collector: fixture v1 and v2 trees with a fake clock, and real cgroup dirs (v1 here, v2 in the VM
stage)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from koordlet.metriccache import Label, MetricCache, MetricKind, Sample, SeriesKey
from koordlet.metricsadvisor import (
    CollectorRunner,
    ContainerCgroup,
    NodeResourceCollector,
    PodCgroup,
    PodResourceCollector,
)
from koordlet.metricsadvisor.node import NodeUsage
from koordlet.metricsadvisor.pods import (
    BE_CPU_REAL_LIMIT,
    BE_CPU_REQUEST,
    BE_CPU_USAGE,
    SYS_CPU,
    SYS_MEMORY,
    HostAppCgroup,
)
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.procfs import clock_ticks_per_second, read_pid_cpu_ticks
from tests.koordlet.metricsadvisor.v1cgroups import V1TestCgroups
from tests.koordlet.qosmanager.realnode import BOTH_VERSIONS, cgroups_of_version

POD = PodCgroup(
    pod_uid="uid-1",
    cgroup_dir="kubepods/besteffort/poduid-1",
    containers=(ContainerCgroup("ctr-a", "kubepods/besteffort/poduid-1/ctr-a"),),
    qos="BE",
    batch_cpu_request_milli=1500,
)
BE_DIR = "kubepods/besteffort"


class FakeMonotonic:
    def __init__(self) -> None:
        self.ns = 5 * 10**12

    def __call__(self) -> int:
        return self.ns


def _memory_stat_v1(anon: int, file_bytes: int) -> bytes:
    return (
        f"cache {file_bytes}\nrss {anon}\ninactive_anon 0\nactive_anon {anon}\ninactive_file 0\n"
        f"active_file {file_bytes}\nunevictable 0\nhierarchical_memory_limit 9223372036854771712\n"
        f"total_cache {file_bytes}\ntotal_rss {anon}\ntotal_inactive_anon {anon // 4}\n"
        f"total_active_anon {anon - anon // 4}\ntotal_inactive_file {file_bytes}\ntotal_active_file 0\n"
        f"total_unevictable 4096\n"
    ).encode()


def _memory_stat_v2(anon: int, file_bytes: int) -> bytes:
    return (
        f"anon {anon}\nfile {file_bytes}\nkernel 8192\ninactive_anon {anon // 2}\nactive_anon {anon - anon // 2}\n"
        f"inactive_file {file_bytes}\nactive_file 0\nunevictable 0\nslab 100\n"
    ).encode()


def _fs(tmp_path: Path, version: int) -> CgroupFS:
    """A fixture tree whose hierarchies are under <tmp>/cgroup (v1: one dir per controller)."""
    return CgroupFS(mount_dir=str(tmp_path / "cgroup"), version=CgroupVersion(version))


def _write_v1(tmp_path: Path, rel: str, usage_ns: int, periods: int, throttled: int, anon: int) -> None:
    root = tmp_path / "cgroup"
    files = {
        f"cpuacct/{rel}/cpuacct.usage": f"{usage_ns}\n".encode(),
        f"cpu/{rel}/cpu.stat": (
            f"nr_periods {periods}\nnr_throttled {throttled}\nthrottled_time {throttled * 1000}\n"
            "nr_bursts 0\nburst_time 0\n"
        ).encode(),
        f"memory/{rel}/memory.stat": _memory_stat_v1(anon, 1 << 20),
    }
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)


def _write_v2(tmp_path: Path, rel: str, usage_ns: int, periods: int, throttled: int, anon: int) -> None:
    root = tmp_path / "cgroup"
    (root / rel).mkdir(parents=True, exist_ok=True)
    (root / rel / "cpu.stat").write_bytes(
        f"usage_usec {usage_ns // 1000}\nuser_usec 0\nsystem_usec 0\nnr_periods {periods}\n"
        f"nr_throttled {throttled}\nthrottled_usec {throttled * 10}\nnr_bursts 0\nburst_usec 0\n".encode()
    )
    (root / rel / "memory.stat").write_bytes(_memory_stat_v2(anon, 1 << 20))


def _be_files(tmp_path: Path, version: int, cpus: str, quota: str) -> None:
    root = tmp_path / "cgroup"
    if version == 1:
        files = {
            f"cpuset/{BE_DIR}/cpuset.cpus": cpus.encode(),
            f"cpu/{BE_DIR}/cpu.cfs_quota_us": quota.encode(),
            f"cpu/{BE_DIR}/cpu.cfs_period_us": b"100000\n",
        }
    else:
        files = {
            f"{BE_DIR}/cpuset.cpus.effective": cpus.encode(),
            f"{BE_DIR}/cpu.max": (quota.replace("-1", "max") + " 100000\n").encode(),
        }
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)


def _by_key(samples: list[Sample]) -> dict[SeriesKey, float]:
    return {s.key: s.value for s in samples}


def _pod_key(kind: MetricKind) -> SeriesKey:
    return SeriesKey.of(kind, pod_uid="uid-1")


def _ctr_key(kind: MetricKind) -> SeriesKey:
    return SeriesKey.of(kind, pod_uid="uid-1", container_id="ctr-a")


@pytest.mark.parametrize("version", [1, 2])
def test_cpu_memory_throttling_and_be_from_one_pass(tmp_path: Path, version: int) -> None:
    write = _write_v1 if version == 1 else _write_v2
    write(tmp_path, POD.cgroup_dir, 10**9, 100, 5, 64 << 20)
    write(tmp_path, POD.containers[0].cgroup_dir, 9 * 10**8, 100, 5, 60 << 20)
    write(tmp_path, BE_DIR, 2 * 10**9, 0, 0, 64 << 20)
    _be_files(tmp_path, version, "0-3\n", "250000\n")
    clock = FakeMonotonic()
    collector = PodResourceCollector(
        lambda: [POD],
        _fs(tmp_path, version),
        be_cgroup_dir=BE_DIR,
        monotonic_ns=clock,
    )
    first = _by_key(collector.collect(100.0))
    assert _pod_key(MetricKind.POD_CPU_USAGE) not in first  # first sighting primes
    assert BE_CPU_USAGE not in first
    # memory needs no priming: anon + unevictable, without page cache
    expected_pod_memory = (64 << 20) + (4096 if version == 1 else 0)
    assert first[_pod_key(MetricKind.POD_MEMORY_USAGE)] == expected_pod_memory
    assert first[BE_CPU_REQUEST] == 1500.0
    assert first[BE_CPU_REAL_LIMIT] == 2500.0  # min(4 CPUs × 1000, 250000 × 1000 / 100000)

    # 2 s later: the pod used 1.5 cores, the container 1.0, 10 more periods of which 4 throttled
    clock.ns += 2 * 10**9
    write(tmp_path, POD.cgroup_dir, 10**9 + 3 * 10**9, 110, 9, 64 << 20)
    write(tmp_path, POD.containers[0].cgroup_dir, 9 * 10**8 + 2 * 10**9, 110, 9, 60 << 20)
    write(tmp_path, BE_DIR, 2 * 10**9 + 3 * 10**9, 0, 0, 64 << 20)
    _be_files(tmp_path, version, "0-3\n", "-1\n")
    second = _by_key(collector.collect(102.0))
    assert second[_pod_key(MetricKind.POD_CPU_USAGE)] == pytest.approx(1.5)
    assert second[_ctr_key(MetricKind.CONTAINER_CPU_USAGE)] == pytest.approx(1.0)
    assert second[_pod_key(MetricKind.POD_CPU_THROTTLED)] == pytest.approx(0.4)
    assert second[_ctr_key(MetricKind.CONTAINER_CPU_THROTTLED)] == pytest.approx(0.4)
    assert second[BE_CPU_USAGE] == pytest.approx(1500.0)  # milli-cores
    assert second[BE_CPU_REAL_LIMIT] == 4000.0  # quota −1: the cpuset alone
    assert _pod_key(MetricKind.POD_MEMORY_USAGE_WITH_PAGE_CACHE) not in second  # off by default


def test_be_usage_survives_a_missing_cpuset_and_requests_count_unreadable_pods(tmp_path: Path) -> None:
    _write_v2(tmp_path, BE_DIR, 10**9, 0, 0, 0)
    (tmp_path / "cgroup" / BE_DIR / "cpu.max").write_bytes(b"max 100000\n")  # no cpuset.cpus.effective
    unreadable = PodCgroup("uid-x", "kubepods/besteffort/podx", (), "BE", batch_cpu_request_milli=700)
    clock = FakeMonotonic()
    collector = PodResourceCollector(lambda: [unreadable], _fs(tmp_path, 2), be_cgroup_dir=BE_DIR, monotonic_ns=clock)
    first = _by_key(collector.collect(1.0))
    assert first[BE_CPU_REQUEST] == 700.0 and BE_CPU_REAL_LIMIT not in first
    _write_v2(tmp_path, BE_DIR, 2 * 10**9, 0, 0, 0)
    clock.ns += 2 * 10**9
    second = _by_key(collector.collect(3.0))
    assert second[BE_CPU_USAGE] == pytest.approx(500.0)
    assert collector.read_errors == 2  # the missing cpuset, once per tick


def test_page_cache_variant_adds_file_lru(tmp_path: Path) -> None:
    _write_v2(tmp_path, POD.cgroup_dir, 0, 0, 0, 8 << 20)
    _write_v2(tmp_path, POD.containers[0].cgroup_dir, 0, 0, 0, 8 << 20)
    collector = PodResourceCollector(lambda: [POD], _fs(tmp_path, 2), collect_page_cache=True)
    samples = _by_key(collector.collect(1.0))
    assert samples[_pod_key(MetricKind.POD_MEMORY_USAGE_WITH_PAGE_CACHE)] == (8 << 20) + (1 << 20)


def test_no_periods_means_zero_throttling_and_a_vanished_pod_is_skipped(tmp_path: Path) -> None:
    _write_v1(tmp_path, POD.cgroup_dir, 10, 0, 0, 1 << 20)
    _write_v1(tmp_path, POD.containers[0].cgroup_dir, 10, 0, 0, 1 << 20)
    gone = PodCgroup("uid-gone", "kubepods/podgone", (), "LS")
    clock = FakeMonotonic()
    collector = PodResourceCollector(lambda: [gone, POD], _fs(tmp_path, 1), monotonic_ns=clock)
    collector.collect(1.0)
    clock.ns += 10**9
    samples = _by_key(collector.collect(2.0))
    assert samples[_pod_key(MetricKind.POD_CPU_THROTTLED)] == 0.0
    assert not any(key.label(Label.POD_UID) == "uid-gone" for key in samples)
    assert collector.read_errors == 0


def test_state_of_pods_no_longer_listed_is_forgotten(tmp_path: Path) -> None:
    _write_v2(tmp_path, POD.cgroup_dir, 10**9, 0, 0, 1 << 20)
    _write_v2(tmp_path, POD.containers[0].cgroup_dir, 10**9, 0, 0, 1 << 20)
    listed = [POD]
    clock = FakeMonotonic()
    collector = PodResourceCollector(lambda: listed, _fs(tmp_path, 2), monotonic_ns=clock)
    collector.collect(1.0)
    listed.clear()
    clock.ns += 10**9
    assert collector.collect(2.0) == []
    listed.append(POD)  # back again: primes afresh instead of using a stale reading
    clock.ns += 10**9
    assert _pod_key(MetricKind.POD_CPU_USAGE) not in _by_key(collector.collect(3.0))


def test_system_usage_is_node_minus_pods_clamped_at_zero(tmp_path: Path) -> None:
    _write_v2(tmp_path, POD.cgroup_dir, 0, 0, 0, 100 << 20)
    _write_v2(tmp_path, POD.containers[0].cgroup_dir, 0, 0, 0, 100 << 20)
    clock = FakeMonotonic()
    node = NodeResourceCollector(proc_dir=str(tmp_path))
    collector = PodResourceCollector(lambda: [POD], _fs(tmp_path, 2), node=node, monotonic_ns=clock)
    node.last_usage = NodeUsage(timestamp=1.0, cpu_cores=None, memory_bytes=300 << 20)
    first = _by_key(collector.collect(1.0))
    assert first[SYS_MEMORY] == 200 << 20 and SYS_CPU not in first
    _write_v2(tmp_path, POD.cgroup_dir, 2 * 10**9, 0, 0, 400 << 20)
    clock.ns += 10**9
    node.last_usage = NodeUsage(timestamp=2.0, cpu_cores=2.5, memory_bytes=300 << 20)
    second = _by_key(collector.collect(2.0))
    assert second[SYS_CPU] == pytest.approx(0.5)
    assert second[SYS_MEMORY] == 0.0  # pods above node: clamped
    node.last_usage = NodeUsage(timestamp=-10.0, cpu_cores=2.5, memory_bytes=300 << 20)
    clock.ns += 10**9
    assert SYS_CPU not in _by_key(collector.collect(3.0))  # stale node reading: no system sample


def _app_key(kind: MetricKind, name: str = "nginx") -> SeriesKey:
    return SeriesKey.of(kind, host_app_name=name)


@pytest.mark.parametrize("version", [1, 2])
def test_host_applications_are_read_and_left_out_of_system_usage(tmp_path: Path, version: int) -> None:
    write = _write_v1 if version == 1 else _write_v2
    app = HostAppCgroup("nginx", "host-latency-sensitive/nginx")
    write(tmp_path, POD.cgroup_dir, 0, 0, 0, 100 << 20)
    write(tmp_path, POD.containers[0].cgroup_dir, 0, 0, 0, 100 << 20)
    write(tmp_path, app.cgroup_dir, 0, 10, 1, 50 << 20)
    clock = FakeMonotonic()
    node = NodeResourceCollector(proc_dir=str(tmp_path))
    collector = PodResourceCollector(lambda: [POD], _fs(tmp_path, version), node=node, monotonic_ns=clock,
                                     host_apps=lambda: [app])
    node.last_usage = NodeUsage(timestamp=1.0, cpu_cores=None, memory_bytes=400 << 20)
    first = _by_key(collector.collect(1.0))
    unevictable = 4096 if version == 1 else 0  # the v1 fixture's total_unevictable counts as usage
    app_memory, pod_memory = (50 << 20) + unevictable, (100 << 20) + unevictable
    assert first[_app_key(MetricKind.HOST_APP_MEMORY_USAGE)] == app_memory
    assert first[SYS_MEMORY] == (400 << 20) - pod_memory - app_memory
    write(tmp_path, POD.cgroup_dir, 10**9, 0, 0, 100 << 20)
    write(tmp_path, app.cgroup_dir, 5 * 10**8, 20, 2, 50 << 20)
    clock.ns += 10**9
    node.last_usage = NodeUsage(timestamp=2.0, cpu_cores=2.0, memory_bytes=400 << 20)
    second = _by_key(collector.collect(2.0))
    assert second[_app_key(MetricKind.HOST_APP_CPU_USAGE)] == pytest.approx(0.5)
    assert second[SYS_CPU] == pytest.approx(2.0 - 1.0 - 0.5)
    assert not any(key.kind.endswith("throttled") and key.label(Label.HOST_APP_NAME) for key in second)


def test_a_host_application_without_its_cgroup_is_said_once_and_counted_as_system(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    app = HostAppCgroup("ghost", "host/ghost")
    node = NodeResourceCollector(proc_dir=str(tmp_path))
    collector = PodResourceCollector(list, _fs(tmp_path, 2), node=node, host_apps=lambda: [app])
    node.last_usage = NodeUsage(timestamp=1.0, cpu_cores=None, memory_bytes=300 << 20)
    with caplog.at_level("WARNING", logger="koordlet.metricsadvisor.pods"):
        assert _by_key(collector.collect(1.0))[SYS_MEMORY] == 300 << 20
        collector.collect(1.5)
    assert [r.getMessage() for r in caplog.records if "ghost" in r.getMessage()] == [
        "host application ghost: cannot read its cgroup host/ghost (NodeSLO hostApplications); "
        "its usage counts as system usage until it can be read"]


# ------------------------------------------------------------------------- real cgroups: v1 here, v2 in the VM


@pytest.fixture(params=BOTH_VERSIONS)
def real(request: pytest.FixtureRequest) -> Iterator[V1TestCgroups]:
    yield from cgroups_of_version(request.param, "collector")


def _real_pod(groups: V1TestCgroups, name: str) -> PodCgroup:
    pod_rel = f"{groups.prefix}/pod{name}"
    return PodCgroup(name, pod_rel, (ContainerCgroup(f"ctr-{name}", f"{pod_rel}/ctr"),), "LS")


@pytest.mark.alone  # the burner must get at least a quarter core: no other test's load beside it (nor, in the v2
# guest, the host stage beside the niced VM)
def test_real_burning_process_shows_about_one_core_within_two_ticks(real: V1TestCgroups) -> None:
    real.make("podburn/ctr")
    pod = _real_pod(real, "burn")
    child = real.spawn("podburn/ctr", "while True: pass")
    cache = MetricCache()
    collector = PodResourceCollector(lambda: [pod])
    runner = CollectorRunner(cache, [collector])
    runner.run_collector("pod_resource")
    ticks_before, started = read_pid_cpu_ticks(child.pid), time.monotonic()
    time.sleep(1.0)
    runner.run_collector("pod_resource")
    ticks_after, ended = read_pid_cpu_ticks(child.pid), time.monotonic()
    own_cores = (ticks_after - ticks_before) / clock_ticks_per_second() / (ended - started)
    container = cache.latest(SeriesKey.of(MetricKind.CONTAINER_CPU_USAGE, pod_uid="burn", container_id="ctr-burn"))
    pod_cores = cache.latest(SeriesKey.of(MetricKind.POD_CPU_USAGE, pod_uid="burn"))
    assert container is not None and pod_cores is not None
    # The collector agrees within 10 % with the process's own CPU time (/proc/<pid>/stat). On an idle
    # machine that is one core; this 2-core machine is shared with other test runs, so the burner's
    # own share is the reference and only has to show it ran.
    assert container[1] == pytest.approx(own_cores, rel=0.1, abs=0.03)
    assert pod_cores[1] == pytest.approx(container[1], rel=0.05)
    assert 0.25 <= container[1] <= 1.1


def test_real_process_touching_64_mib_shows_that_memory(real: V1TestCgroups) -> None:
    real.make("podmem/ctr")
    pod = _real_pod(real, "mem")
    child = real.spawn("podmem/ctr", "b = b'\\x01' * (64 << 20)\nprint('ready', flush=True)\nsys.stdin.readline()")
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    expected = 64 << 20
    container_key = SeriesKey.of(MetricKind.CONTAINER_MEMORY_USAGE, pod_uid="mem", container_id="ctr-mem")
    pod_key = SeriesKey.of(MetricKind.POD_MEMORY_USAGE, pod_uid="mem")
    collector = PodResourceCollector(lambda: [pod])
    # The kernel folds per-CPU memcg counters into memory.stat lazily (a periodic flush about every
    # 2 s), so a fresh allocation can show up a tick late: allow a few ticks.
    deadline = time.monotonic() + 4.0
    try:
        while True:
            samples = _by_key(collector.collect(time.time()))
            container_memory = samples[container_key]
            settled = abs(container_memory - expected) <= expected * 0.1 and samples[pod_key] >= container_memory
            if settled or time.monotonic() > deadline:
                break
            time.sleep(0.25)
    finally:
        collector.close()
    assert container_memory == pytest.approx(expected, rel=0.1)
    assert samples[pod_key] >= container_memory


def test_real_pod_removed_between_ticks_is_skipped_and_its_descriptors_closed(real: V1TestCgroups) -> None:
    real.make("podkeep/ctr")
    real.make("podgone/ctr")
    keep, gone = _real_pod(real, "keep"), _real_pod(real, "gone")
    listed = [keep, gone]
    collector = PodResourceCollector(lambda: listed)
    try:
        collector.collect(1.0)
        for ctrl in real.controllers:  # the pod is deleted; the listing has not caught up yet (v2: one hierarchy)
            os.rmdir(real.path(ctrl, "podgone/ctr"))
            os.rmdir(real.path(ctrl, "podgone"))
        samples = _by_key(collector.collect(2.0))
        assert SeriesKey.of(MetricKind.POD_CPU_USAGE, pod_uid="keep") in samples
        assert not any(key.label(Label.POD_UID) == "gone" for key in samples)
        assert collector.read_errors == 0
        # (pod + container) of the pod that is left × its files: v1 cpu.stat, cpuacct.usage, memory.stat; v2 no cpuacct
        assert collector.open_files == 2 * (3 if real.version == 1 else 2)
    finally:
        collector.close()
    assert collector.open_files == 0


def test_real_host_application_burning_cpu_is_measured_like_a_pod(real: V1TestCgroups) -> None:
    real.make("host/agent")
    app = HostAppCgroup("agent", f"{real.prefix}/host/agent")
    child = real.spawn("host/agent", "while True: pass")
    collector = PodResourceCollector(list, host_apps=lambda: [app])
    try:
        collector.collect(time.time())
        ticks_before, started = read_pid_cpu_ticks(child.pid), time.monotonic()
        time.sleep(1.0)
        samples = _by_key(collector.collect(time.time()))
        ticks_after, ended = read_pid_cpu_ticks(child.pid), time.monotonic()
    finally:
        collector.close()
    own_cores = (ticks_after - ticks_before) / clock_ticks_per_second() / (ended - started)
    assert samples[_app_key(MetricKind.HOST_APP_CPU_USAGE, "agent")] == pytest.approx(own_cores, rel=0.1, abs=0.03)
    # Same reading path as pods; memory accuracy is checked by the 64 MiB pod test above.
    assert _app_key(MetricKind.HOST_APP_MEMORY_USAGE, "agent") in samples
