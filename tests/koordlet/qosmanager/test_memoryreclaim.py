"""BE memory reclaim decide() on hand-made snapshots (koordlet/qosmanager/memoryreclaim.py): when it asks, whom, how
much, and how memory pressure steers the step."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from koordlet.actuator import PlanRecord
from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.executor import PartialWriteError, ResourceUpdate, UpdateFailure
from koordlet.qosmanager.memoryreclaim import ReclaimConfig, ReclaimMemo, decide
from koordlet.qosmanager.snapshot import container_cgroup_dir
from tests.koordlet.qosmanager.factory import LAYOUT, GiB, be_pod, node, pod, snapshot

MiB = 1 << 20
CACHE, ANON = be_pod("cache"), be_pod("anon")
LS = pod("web", "LS")
DIR = {p.name: f"kubepods/{'besteffort' if p is not LS else 'burstable'}/poduid-{p.name}" for p in (CACHE, ANON, LS)}
CONTAINER_DIR = {p.name: container_cgroup_dir(LAYOUT, DIR[p.name], p.containers[0]) for p in (CACHE, ANON)}


def _stat(file_bytes: int, anon_bytes: int) -> str:
    return (f"anon {anon_bytes}\nfile {file_bytes}\ninactive_anon {anon_bytes}\nactive_anon 0\n"
            f"inactive_file {file_bytes // 2}\nactive_file {file_bytes - file_bytes // 2}\nunevictable 0\n")


def _psi(avg10: float) -> str:
    return f"some avg10={avg10:.2f} avg60=0.00 avg300=0.00 total=1\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0"


def _slo(**strategy: object):
    return parse_node_slo_spec({"resourceUsedThresholdWithBE": {"enable": True, "memoryEvictThresholdPercent": 70},
                                "extensions": {"beMemoryReclaimStrategy": {"enable": True, **strategy}}})


def _snap(use_gib: float, *, swap_free: int = 0, ls_psi: float = 0.0, memo=None, last=None,
          cache_file: int = 3 * GiB, anon: int = 2 * GiB, kernel_has_it: bool = True, **strategy: object):
    values = {("memory.stat", DIR["cache"]): _stat(cache_file, 64 * MiB),
              ("memory.stat", DIR["anon"]): _stat(200 * MiB, anon),
              ("memory.stat", CONTAINER_DIR["cache"]): _stat(cache_file, 64 * MiB),
              ("memory.stat", CONTAINER_DIR["anon"]): _stat(200 * MiB, anon),
              **{("memory.swap.max", d): "max" for d in (*CONTAINER_DIR.values(), DIR["cache"], DIR["anon"])},
              ("memory.pressure", DIR["web"]): _psi(ls_psi)}
    slo = _slo(**strategy)
    return snapshot(node=node(8000, 16 * GiB), node_slo=slo, pods=(CACHE, ANON, LS),
                    node_memory_with_page_cache_bytes=use_gib * GiB, node_swap_free_bytes=swap_free,
                    cgroup_values=values, kernel_files=frozenset({"memory.reclaim"} if kernel_has_it else ()),
                    memo=memo, last=last, timestamp=100.0)


def _config(snap) -> ReclaimConfig:
    return ReclaimConfig.from_node_slo(snap.node_slo)


def _asked(plan) -> list[tuple[str, int]]:
    return [(w.cgroup_dir.rsplit("-", 1)[1], w.value) for step in plan.steps for w in step.writes]


def test_defaults_come_from_the_eviction_threshold_and_reclaim_starts_below_it() -> None:
    config = _config(_snap(10))
    assert (config.threshold_percent, config.lower_percent, config.step_bytes, config.max_step_bytes) == (
        60, 55, 64 * MiB, GiB)
    assert config.needs.kernel_files == ("memory.reclaim",)
    assert ReclaimConfig.from_node_slo(parse_node_slo_spec(None)).enabled is False  # off unless the extension says


def test_below_the_threshold_nothing_is_asked() -> None:
    plan = decide(_snap(9.5), _config(_snap(9.5)))  # 59 % of 16 GiB
    assert plan.empty and plan.memo.use_bytes == 9.5 * GiB


def test_above_it_the_largest_reclaimable_be_pod_is_asked_first_bounded_by_the_step() -> None:
    snap = _snap(10.5, reclaimStepBytes="1Gi")  # 65.6 %: 1.7 GiB above 55 %, the step 1 GiB
    plan = decide(snap, _config(snap))
    assert _asked(plan) == [("cache", GiB)]  # page cache 3 GiB; the anon pod's 200 MiB of cache comes after
    assert plan.reason == "BEMemoryReclaim" and "step 1073741824" in plan.why
    assert plan.memo.reclaimed and plan.memo.use_bytes == 10.5 * GiB


def test_each_pod_gives_at_most_its_reclaimable_and_the_next_ones_the_rest_of_the_need() -> None:
    snap = _snap(9.5, cache_file=300 * MiB, reclaimThresholdPercent=58, reclaimStepBytes="1Gi")  # 59.4 %
    need = int(9.5 * GiB - 16 * GiB * 53 / 100)  # down to the lower threshold, 58 − 5
    plan = decide(snap, _config(snap))
    # page cache only (no swap): 300 MiB of the first pod, 200 MiB of the other; the need (0.98 GiB) is not met
    assert need > 500 * MiB and _asked(plan) == [("cache", 300 * MiB), ("anon", 200 * MiB)]
    assert plan.report.need_bytes == need


def test_anonymous_memory_counts_only_with_swap_left_and_swap_allowed() -> None:
    with_swap = _snap(10.5, swap_free=4 * GiB, reclaimStepBytes="1Gi")
    assert _asked(decide(with_swap, _config(with_swap))) == [("cache", GiB)]  # 3 GiB + 64 MiB vs 2 GiB + 200 MiB
    values = dict(with_swap.cgroup_values)
    values[("memory.stat", DIR["anon"])] = values[("memory.stat", CONTAINER_DIR["anon"])] = _stat(200 * MiB, 5 * GiB)
    bigger = replace(with_swap, cgroup_values=values)
    assert _asked(decide(bigger, _config(bigger)))[0][0] == "anon"
    for limited in (CONTAINER_DIR["anon"], DIR["anon"]):  # kubelet's NoSwap on the container; or the pod's own 0
        no_swap_for_it = replace(with_swap, cgroup_values={**values, ("memory.swap.max", limited): "0"})
        assert _asked(decide(no_swap_for_it, _config(no_swap_for_it)))[0][0] == "cache"
    unread = replace(with_swap, cgroup_values={k: v for k, v in values.items() if k[0] != "memory.swap.max"})
    assert _asked(decide(unread, _config(unread)))[0][0] == "cache"  # a limit not read counts no anon


def test_the_step_doubles_while_use_keeps_rising_up_to_its_bound() -> None:
    snap = _snap(11, reclaimStepBytes="64Mi", reclaimMaxStepBytes="256Mi")
    config = _config(snap)
    first = decide(replace(snap, memo=ReclaimMemo(64 * MiB, use_bytes=10.9 * GiB, reclaimed=True)), config)
    assert first.memo.step_bytes == 128 * MiB and sum(v for _, v in _asked(first)) == 128 * MiB
    second = decide(replace(snap, memo=replace(first.memo, use_bytes=10.95 * GiB)), config)
    assert second.memo.step_bytes == 256 * MiB
    third = decide(replace(snap, memo=replace(second.memo, use_bytes=10.99 * GiB)), config)
    assert third.memo.step_bytes == 256 * MiB  # bounded per tick
    held = decide(replace(snap, memo=replace(third.memo, use_bytes=11 * GiB)), config)
    assert held.memo.step_bytes == 256 * MiB and "steady" in held.why


def test_the_step_halves_when_ls_pressure_rose_after_a_reclaim_and_use_did_not() -> None:
    memo = ReclaimMemo(512 * MiB, use_bytes=11 * GiB, ls_pressure=2.0, reclaimed=True)
    snap = _snap(10.8, ls_psi=15.0, memo=memo)
    plan = decide(snap, _config(snap))
    assert plan.memo.step_bytes == 256 * MiB and "backing off" in plan.why and plan.memo.ls_pressure == 15.0
    floor = decide(replace(snap, memo=replace(memo, step_bytes=64 * MiB)), _config(snap))
    assert floor.memo.step_bytes == 64 * MiB  # never below reclaimStepBytes
    calm = decide(_snap(10.8, ls_psi=5.0, memo=memo), _config(snap))  # below lsMemoryPressureThresholdPercent
    assert calm.memo.step_bytes == 512 * MiB
    unasked = replace(memo, reclaimed=False)  # pressure rose, but not after a reclaim of ours
    assert decide(_snap(10.8, ls_psi=15.0, memo=unasked), _config(snap)).memo.step_bytes == 512 * MiB


def test_a_pod_the_kernel_could_not_give_all_it_was_asked_rests_a_tick() -> None:
    failure = UpdateFailure(ResourceUpdate.of("memory.reclaim", DIR["cache"], GiB),
                            PartialWriteError("write to memory.reclaim: Resource temporarily unavailable", 11))
    last = PlanRecord("memoryreclaim", 99.0, failures=(failure,))
    assert last.partial == (DIR["cache"],) and last.failed == 0  # EAGAIN is no failure
    snap = _snap(10.5, last=last, reclaimStepBytes="1Gi")
    assert [name for name, _ in _asked(decide(snap, _config(snap)))] == ["anon"]


def test_without_memory_reclaim_or_with_a_bad_config_it_says_so_once_and_stays_off(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="koordlet.qosmanager.memoryreclaim")
    snap = _snap(15, kernel_has_it=False)
    first = decide(snap, _config(snap))
    second = decide(replace(snap, memo=first.memo), _config(snap))
    assert first.empty and second.empty
    said = [r.getMessage() for r in caplog.records]
    assert said == ["BE memory reclaim off: this kernel has no memory.reclaim (cgroup v1, or Linux before 5.19); "
                    "memory eviction works as before"]
    late = _snap(15, reclaimThresholdPercent=75)  # above the eviction threshold (70)
    off = decide(late, _config(late))
    assert off.empty and "reclaim would start after eviction" in off.memo.off_because
    inverted = _snap(15, reclaimThresholdPercent=60, reclaimLowerPercent=60)
    assert "is not below reclaimThresholdPercent" in decide(inverted, _config(inverted)).memo.off_because


@pytest.mark.parametrize("raw,error", [
    ({"enable": "yes"}, "enable: expected true or false"),
    ({"reclaimThresholdPercent": 0}, "reclaimThresholdPercent: 0 is below the minimum 1"),
    ({"reclaimStepBytes": "lots"}, "reclaimStepBytes"),
    ({"reclaimStepBytes": "1Gi", "reclaimMaxStepBytes": "64Mi"}, "reclaimMaxStepBytes: 67108864 is below"),
])
def test_a_bad_extension_rejects_the_nodeslo_naming_the_field(raw: dict, error: str) -> None:
    from koordlet.api.nodeslo import NodeSLOError

    with pytest.raises(NodeSLOError) as rejected:
        parse_node_slo_spec({"extensions": {"beMemoryReclaimStrategy": raw}})
    assert f"extensions.beMemoryReclaimStrategy.{error}" in str(rejected.value)


def _v2_file(root, rel: str, name: str, text: str) -> None:
    (root / rel).mkdir(parents=True, exist_ok=True)
    (root / rel / name).write_text(text + "\n")


def test_anonymous_memory_counts_by_each_containers_own_swap_limit_where_kubelet_sets_it(tmp_path) -> None:
    """kubelet gives a container its swap through CRI ``Unified`` (``memory.swap.max`` of the container's cgroup:
    0 under NoSwap, a share of the node's swap under LimitedSwap) and leaves the pod dir's at ``max``. On a cgroup v2
    tree laid out so, with swap on the node: the NoSwap container's anonymous memory is not reclaimable, the
    LimitedSwap one's up to what its limit leaves (limit − ``memory.swap.current``), the pod's page cache all."""
    from koordlet.api.pod import ContainerMeta
    from koordlet.executor import ResourceExecutor
    from koordlet.metriccache import MetricCache, MetricKind, SeriesKey
    from koordlet.qosmanager.snapshot import SnapshotBuilder
    from koordlet.statesinformer.api import StaticStates
    from koordlet.system.cgroup import CgroupFS, CgroupVersion
    from tests.koordlet.qosmanager.factory import LAYOUT

    no_swap, limited = "a" * 12, "b" * 12
    be = be_pod("mixed", containers=(ContainerMeta("cache", container_id=no_swap),
                                     ContainerMeta("spill", container_id=limited)))
    root = tmp_path / "sys/fs/cgroup"
    pod_dir = "kubepods/besteffort/poduid-mixed"
    _v2_file(root, "kubepods", "memory.reclaim", "")
    for rel, swap_max, swap_current, stat in (
            (pod_dir, "max", str(100 * MiB), _stat(300 * MiB, 3 * GiB)),
            (f"{pod_dir}/{no_swap}", "0", "0", _stat(100 * MiB, 2 * GiB)),  # NoSwap: 0
            (f"{pod_dir}/{limited}", str(512 * MiB), str(100 * MiB), _stat(200 * MiB, GiB))):  # LimitedSwap
        _v2_file(root, rel, "memory.swap.max", swap_max)
        _v2_file(root, rel, "memory.swap.current", swap_current)
        _v2_file(root, rel, "memory.stat", stat)
    cache = MetricCache()
    cache.append(SeriesKey.of(MetricKind.NODE_MEMORY_USAGE_WITH_PAGE_CACHE), 99.5, 12 * GiB)  # 75 %
    cache.append(SeriesKey.of(MetricKind.NODE_SWAP_FREE), 99.5, 4 * GiB)
    states = StaticStates(node=node(8000, 16 * GiB), pods=(be,),
                          node_slo=_slo(reclaimThresholdPercent=60, reclaimStepBytes="4Gi", reclaimMaxStepBytes="4Gi"))
    executor = ResourceExecutor(CgroupFS(str(root), CgroupVersion.V2))
    config = ReclaimConfig.from_node_slo(states.node_slo())
    snap = SnapshotBuilder(states, cache, reader=executor, layout=LAYOUT).build(config.needs, now=100.0)
    assert snap is not None and snap.kernel_files == frozenset({"memory.reclaim"})
    plan = decide(snap, config)
    (found,) = plan.report.asked
    assert (found[0].file_bytes, found[0].anon_bytes) == (300 * MiB, 412 * MiB)  # 512 MiB − 100 MiB swapped
    assert _asked(plan) == [("mixed", 712 * MiB)]
