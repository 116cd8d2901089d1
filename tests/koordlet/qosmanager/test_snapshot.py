"""SnapshotBuilder: fresh samples only, a copy taken at the build, window averages, BE window, nothing before the node
is known."""

from __future__ import annotations

import pytest

from koordlet.metriccache import Label, MetricCache, MetricKind, SeriesKey
from koordlet.qosmanager.snapshot import (
    BE_CPU_REAL_LIMIT_KEY,
    BE_CPU_REQUEST_KEY,
    BE_CPU_USAGE_KEY,
    SnapshotBuilder,
    parse_quota_us,
)
from koordlet.statesinformer.api import StaticStates
from tests.koordlet.qosmanager.factory import node


def _pod_cpu(uid: str) -> SeriesKey:
    return SeriesKey.of(MetricKind.POD_CPU_USAGE, **{Label.POD_UID: uid})


def test_latest_values_ignore_samples_older_than_two_intervals() -> None:
    cache = MetricCache()
    cache.append(SeriesKey.of(MetricKind.NODE_CPU_USAGE), 97.0, 3.0)
    cache.append(_pod_cpu("fresh"), 99.5, 1.0)
    cache.append(_pod_cpu("stale"), 90.0, 5.0)  # a pod gone 10 s ago
    snap = SnapshotBuilder(StaticStates(node=node()), cache, collect_interval_s=1.0).build(now=100.0)
    assert snap is not None
    assert snap.node_cpu_cores is None  # 3 s old > 2 × 1 s
    assert dict(snap.pod_cpu_cores) == {"fresh": 1.0}


class _CountingCache(MetricCache):
    """A real MetricCache that counts its per-label scans."""

    def __init__(self) -> None:
        super().__init__()
        self.scans: list[str] = []

    def last_values(self, kind: str, label: str, start: float, end: float) -> dict[str, float]:
        self.scans.append(kind)
        return super().last_values(kind, label, start, end)


def test_a_snapshot_is_a_copy_and_the_strategies_of_one_tick_share_its_usage_scans() -> None:
    cache = _CountingCache()
    cache.append(_pod_cpu("a"), 99.5, 1.5)
    builder = SnapshotBuilder(StaticStates(node=node()), cache, collect_interval_s=1.0)
    first = builder.build(now=100.0)
    assert first is not None and len(cache.scans) == 5  # the five usage maps, read at the build
    cache.append(_pod_cpu("a"), 99.8, 9.0)  # written after the build, inside its window: not in the snapshot
    cache.append(_pod_cpu("b"), 99.9, 2.0)
    assert dict(first.pod_cpu_cores) == {"a": 1.5}
    with pytest.raises(TypeError):
        first.pod_cpu_cores["a"] = 0.0  # type: ignore[index]

    second = builder.build(now=100.0)  # another strategy of the same manager tick
    assert second is not None and second.pod_cpu_cores is first.pod_cpu_cores and len(cache.scans) == 5
    later = builder.build(now=101.0)  # the next tick reads again
    assert later is not None and dict(later.pod_cpu_cores) == {"a": 9.0, "b": 2.0} and len(cache.scans) == 10


def test_window_averages_and_be_window() -> None:
    cache = MetricCache()
    for t, value in ((91.0, 2.0), (95.0, 4.0), (100.0, 6.0)):
        cache.append(SeriesKey.of(MetricKind.NODE_CPU_USAGE), t, value)
        cache.append(_pod_cpu("a"), t, value / 2)
        cache.append(BE_CPU_USAGE_KEY, t, value * 100)
        cache.append(BE_CPU_REQUEST_KEY, t, 4000.0)
        cache.append(BE_CPU_REAL_LIMIT_KEY, t, 1000.0 + t)
    snap = SnapshotBuilder(StaticStates(node=node()), cache).build(
        now=100.0, node_cpu_avg_window_s=6.0, be_window_s=10.0)
    assert snap is not None
    assert snap.node_cpu_avg_cores == pytest.approx(5.0)  # samples at 95 and 100
    assert snap.pod_cpu_avg_cores["a"] == pytest.approx(2.5)
    assert snap.be_cpu is not None and snap.be_cpu.samples == 3
    assert snap.be_cpu.avg_usage_milli == pytest.approx(400.0)
    assert snap.be_cpu.last_real_limit_milli == 1100.0


def test_no_snapshot_before_the_node_is_known() -> None:
    assert SnapshotBuilder(StaticStates(), MetricCache()).build(now=1.0) is None


@pytest.mark.parametrize("text,expected", [("-1", -1), ("50000", 50000), ("max 100000", -1), ("20000 100000", 20000)])
def test_quota_read_back_in_both_versions(text: str, expected: int) -> None:
    assert parse_quota_us(text) == expected


def test_needs_read_the_cgroup_values_of_the_selected_pods_and_probe_kernel_files(tmp_path) -> None:
    from koordlet.api.pod import ContainerMeta
    from koordlet.executor import ResourceExecutor
    from koordlet.qosmanager.snapshot import CgroupRead, Needs, Scope
    from koordlet.system.cgroup import CgroupFS, CgroupVersion
    from tests.koordlet.qosmanager.factory import LAYOUT, be_pod, pod

    ls = pod("ls", "LS", containers=(ContainerMeta("app", container_id="a" * 12),
                                     ContainerMeta("init", container_id="c" * 12, is_init=True)))
    be = be_pod("be", containers=(ContainerMeta("job", container_id="b" * 12),))
    cpu = tmp_path / "sys/fs/cgroup/cpu"
    for rel, quota in (("kubepods", "-1"), ("kubepods/burstable/poduid-ls", "200000"),
                       ("kubepods/burstable/poduid-ls/" + "a" * 12, "150000"),
                       ("kubepods/burstable/poduid-ls/" + "c" * 12, "50000"),
                       ("kubepods/besteffort/poduid-be", "-1"), ("kubepods/besteffort/poduid-be/" + "b" * 12, "-1")):
        (cpu / rel).mkdir(parents=True, exist_ok=True)
        (cpu / rel / "cpu.cfs_quota_us").write_text(quota + "\n")
    (cpu / "kubepods/cpu.shares").write_text("1024\n")
    executor = ResourceExecutor(CgroupFS(str(tmp_path / "sys/fs/cgroup"), CgroupVersion.V1))
    builder = SnapshotBuilder(StaticStates(node=node(), pods=(ls, be)), MetricCache(), reader=executor,
                              layout=LAYOUT)
    not_be = lambda p: p.qos_label is not None and p.qos_label.value == "LS"  # noqa: E731
    needs = Needs(cgroup_reads=(CgroupRead("cpu.cfs_quota_us", Scope.PODS, not_be),
                                CgroupRead("cpu.cfs_quota_us", Scope.APP_CONTAINERS, not_be)),
                  kernel_files=("cpu.shares", "cpu.bvt_warp_ns"))
    snap = builder.build(needs, now=100.0, memo="kept")
    assert snap is not None and snap.memo == "kept" and snap.layout is LAYOUT
    assert dict(snap.cgroup_values) == {
        ("cpu.cfs_quota_us", "kubepods/burstable/poduid-ls"): "200000",
        ("cpu.cfs_quota_us", "kubepods/burstable/poduid-ls/" + "a" * 12): "150000",
    }  # the BE pod and the init container are not read
    assert snap.kernel_files == frozenset({"cpu.shares"})  # this "kernel" has no bvt_warp_ns
