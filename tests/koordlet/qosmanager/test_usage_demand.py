"""Which pods' usage the QoS strategies read every tick (the collector reads the others once a fan-out interval): the
demand the manager publishes, the snapshot that holds only those pods, and the strategies that take "every pod"
from the kubepods and besteffort dirs: CPU suppress's budget and CPU burst's share pool come out as the sum over
every pod does; CPU burst looks after its idle pods once a turn."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from koordlet.api.keys import ANNOTATION_CPU_BURST
from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.api.pod import ContainerMeta
from koordlet.api.qos import KubeQoS
from koordlet.executor import ResourceExecutor
from koordlet.metriccache import Label, MetricCache, MetricKind, SeriesKey
from koordlet.metricsadvisor.pods import KUBEPODS_CPU, UsageDemand
from koordlet.plan import GaugeSet
from koordlet.qosmanager import QoSManagerConfig, cpuburst, cpuevict, cpusuppress, memoryevict
from koordlet.qosmanager.cpuburst import BurstConfig, BurstMemo, SharePoolState, share_pool_state
from koordlet.qosmanager.cpusuppress import SuppressConfig, suppress_budget
from koordlet.qosmanager.framework import QoSManager
from koordlet.qosmanager.snapshot import BE_CPU_USAGE_KEY, CgroupRead, Needs, Scope, SnapshotBuilder, usage_demand
from koordlet.statesinformer.api import StaticStates
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from tests.koordlet.qosmanager.factory import LAYOUT, node, pod, snapshot, spec

LSE = pod("lse", "LSE", KubeQoS.GUARANTEED)
LSR = pod("lsr", "LSR", KubeQoS.GUARANTEED)
BE = pod("be", "BE", KubeQoS.BESTEFFORT)
BE_BURSTABLE = pod("be-burstable", "BE", KubeQoS.BURSTABLE)  # a BE label outside the besteffort dir
PLAIN_BESTEFFORT = pod("plain", "", KubeQoS.BESTEFFORT)  # in the besteffort dir without a label
LS = pod("ls", "LS", KubeQoS.BURSTABLE)
PODS = (LSE, LSR, BE, BE_BURSTABLE, PLAIN_BESTEFFORT, LS)
USED = {"uid-lse": 0.4, "uid-lsr": 1.0, "uid-be": 0.7, "uid-be-burstable": 0.3, "uid-plain": 0.2, "uid-ls": 1.5}
IN_BESTEFFORT = ("uid-be", "uid-plain")


def _pod_cpu(uid: str) -> SeriesKey:
    return SeriesKey.of(MetricKind.POD_CPU_USAGE, **{Label.POD_UID: uid})


def test_the_snapshot_holds_only_the_demanded_pods_and_containers() -> None:
    cache = MetricCache()
    pods = tuple(replace(p, containers=(ContainerMeta("c", container_id=f"ctr-{p.uid}"),)) for p in PODS)
    for p in pods:
        cache.append(_pod_cpu(p.uid), 99.5, USED[p.uid])
        cache.append(SeriesKey.of(MetricKind.CONTAINER_CPU_USAGE, pod_uid=p.uid, container_id=f"ctr-{p.uid}"), 99.5,
                     USED[p.uid])
    builder = SnapshotBuilder(StaticStates(node=node(), pods=pods), cache, collect_interval_s=1.0)
    every = builder.build(now=100.0)
    assert every is not None and every.usage_of_every_pod and dict(every.pod_cpu_cores) == USED

    builder.restrict(UsageDemand(pods=frozenset({"uid-be"}), containers=frozenset({"uid-ls"})))
    some = builder.build(now=100.0)  # the same tick, but the demand changed: the maps are read again
    assert some is not None and not some.usage_of_every_pod
    assert dict(some.pod_cpu_cores) == {"uid-be": 0.7, "uid-ls": 1.5}
    assert dict(some.container_cpu_cores) == {"ctr-uid-ls": 1.5}


def test_the_demand_is_what_the_strategies_that_are_on_read() -> None:
    annotated = pod("annotated", "LS", annotations={ANNOTATION_CPU_BURST: '{"policy": "auto"}'})
    pods = (*PODS, annotated)
    flags = QoSManagerConfig()
    suppress = SuppressConfig.from_node_slo(spec(), flags)
    burst = BurstConfig.from_node_slo(spec(), flags)
    assert usage_demand(pods, [suppress.needs]) == UsageDemand(pods=frozenset({"uid-be-burstable"}))
    # Burst: the pods the besteffort dir sorts wrong for the share pool, and the containers of a pod with quota burst.
    assert usage_demand(pods, [burst.needs]) == UsageDemand(
        pods=frozenset({"uid-lse", "uid-lsr", "uid-be-burstable", "uid-plain"}),
        containers=frozenset({"uid-annotated"}))
    # Evictions sort their victims by usage: BE pods, or every pod with a feature that may take any.
    be_only = memoryevict.MemoryEvictConfig.from_node_slo(spec(), flags)
    assert usage_demand(pods, [be_only.needs]).pods == {"uid-be", "uid-be-burstable", "uid-plain"}
    every_feature = cpuevict.CPUEvictConfig.from_node_slo(spec(), replace(flags, feature_gates={"CPUEvict": True}))
    assert usage_demand(pods, [every_feature.needs]).pods == {p.uid for p in pods}
    # A strategy that does not say (an out-of-tree one) reads every pod and container, as before.
    assert usage_demand(pods, [Needs()]) == UsageDemand(pods=frozenset(p.uid for p in pods),
                                                        containers=frozenset(p.uid for p in pods))
    assert usage_demand(pods, []) == UsageDemand()


def test_the_manager_publishes_the_demand_before_its_ticks_and_again_only_on_a_change() -> None:
    published: list[UsageDemand] = []
    states = StaticStates(node=node(), pods=PODS, node_slo=spec())
    cache = MetricCache()
    builder = SnapshotBuilder(states, cache, collect_interval_s=1.0)
    manager = QoSManager(states, [cpusuppress.STRATEGY], builder=builder, publish_demand=published.append)
    cache.append(SeriesKey.of(MetricKind.NODE_CPU_USAGE), 99.5, 3.0)
    for tick in range(3):
        manager.tick(float(tick))
    assert published == [UsageDemand(pods=frozenset({"uid-be-burstable"}))]
    assert manager.last_plan(cpusuppress.STRATEGY.name) is not None
    states.set_node_slo(parse_node_slo_spec({}))  # suppress off: nothing demanded
    manager.tick(3.0)
    assert published[-1] == UsageDemand()


def _every_pod_snapshot(**fields: object):
    return snapshot(pods=PODS, node=node(8000), node_cpu_cores=6.0, pod_cpu_cores=USED, **fields)


def _aggregate_snapshot(demanded: tuple[str, ...] = (), **fields: object):
    """What the restricted snapshot holds: the dirs' usage, and the demanded pods' own."""
    demanded = {uid: used for uid, used in USED.items() if uid in demanded}
    return snapshot(pods=PODS, node=node(8000), node_cpu_cores=6.0, pod_cpu_cores=demanded,
                    usage_of_every_pod=False, **fields)


def test_suppress_budget_from_the_dirs_is_the_sum_over_every_pod() -> None:
    """With host applications inside the besteffort dir (an LS one and a BE one) and one outside the pods."""
    slo = parse_node_slo_spec({"resourceUsedThresholdWithBE": {"enable": True}, "hostApplications": [
        {"name": "ls-in-be", "qos": "LS", "cgroupPath": {"base": "KubepodsBesteffort", "relativePath": "a"}},
        {"name": "be-in-be", "qos": "BE", "cgroupPath": {"base": "KubepodsBesteffort", "relativePath": "b"}},
        {"name": "host", "qos": "LS", "cgroupPath": {"base": "CgroupRoot", "relativePath": "c"}}]})
    apps = {"ls-in-be": 0.25, "be-in-be": 0.15, "host": 0.1}
    expected = suppress_budget(_every_pod_snapshot(node_slo=slo, host_app_cpu_cores=apps), SuppressConfig())
    inside = apps["ls-in-be"] + apps["be-in-be"]
    from_dirs = suppress_budget(_aggregate_snapshot(
        node_slo=slo, host_app_cpu_cores=apps, demanded=("uid-be-burstable",),
        kubepods_cpu_cores=sum(USED.values()) + inside,
        besteffort_cpu_cores=sum(USED[uid] for uid in IN_BESTEFFORT) + inside), SuppressConfig())
    assert expected is not None and from_dirs is not None
    assert from_dirs.pod_non_be_used_cores == pytest.approx(expected.pod_non_be_used_cores)  # LSE + LSR + LS = 2.9
    assert from_dirs.be_used_cores == pytest.approx(expected.be_used_cores)  # 1.2
    assert from_dirs.system_used_cores == pytest.approx(expected.system_used_cores)
    assert from_dirs.suppress_cores == pytest.approx(expected.suppress_cores)


def test_share_pool_from_the_besteffort_dir_is_the_sum_over_every_pod() -> None:
    besteffort = sum(USED[uid] for uid in IN_BESTEFFORT)
    sorted_apart = ("uid-lse", "uid-lsr", "uid-be-burstable", "uid-plain")
    for node_avg in (3.5, 6.2, 7.0):  # idle, cooling, overload: (node − 2.4) / 8 against 0.45 and 0.5
        expected = share_pool_state(snapshot(pods=PODS, node=node(8000), node_cpu_avg_cores=node_avg,
                                             pod_cpu_avg_cores=USED), 50)
        from_dir = share_pool_state(snapshot(
            pods=PODS, node=node(8000), node_cpu_avg_cores=node_avg, besteffort_cpu_avg_cores=besteffort,
            pod_cpu_avg_cores={uid: USED[uid] for uid in sorted_apart}, usage_of_every_pod=False), 50)
        assert from_dir is expected
    assert {share_pool_state(snapshot(pods=PODS, node=node(8000), node_cpu_avg_cores=avg, pod_cpu_avg_cores=USED),
                             50) for avg in (3.5, 6.2, 7.0)} == {SharePoolState.IDLE, SharePoolState.COOLING,
                                                                 SharePoolState.OVERLOAD}


def test_without_the_dirs_a_restricted_snapshot_gives_no_budget_and_no_share_pool() -> None:
    assert suppress_budget(_aggregate_snapshot(demanded=tuple(USED)), SuppressConfig()) is None
    assert share_pool_state(snapshot(pods=PODS, node=node(8000), node_cpu_avg_cores=4.0, pod_cpu_avg_cores=USED,
                                     usage_of_every_pod=False), 50) is SharePoolState.UNKNOWN


def test_the_builder_takes_the_dirs_usage_from_the_collectors_series() -> None:
    cache = MetricCache()
    cache.append(KUBEPODS_CPU, 99.5, 3.5)
    cache.append(BE_CPU_USAGE_KEY, 97.0, 500.0)  # milli-cores
    cache.append(BE_CPU_USAGE_KEY, 99.5, 900.0)
    snap = SnapshotBuilder(StaticStates(node=node()), cache, collect_interval_s=1.0).build(
        Needs(node_cpu_avg_window_s=5.0), now=100.0)
    assert snap is not None
    assert (snap.kubepods_cpu_cores, snap.besteffort_cpu_cores) == (3.5, 0.9)
    assert snap.besteffort_cpu_avg_cores == pytest.approx(0.7)


def test_a_read_every_few_seconds_takes_each_pod_once_a_turn_and_the_always_ones_every_tick(tmp_path: Path) -> None:
    pods = tuple(pod(f"p{n}", "LS") for n in range(8))
    for p in pods:
        (tmp_path / f"kubepods/burstable/pod{p.uid}").mkdir(parents=True)
        (tmp_path / f"kubepods/burstable/pod{p.uid}/cpu.max").write_text("100000 100000\n")
    executor = ResourceExecutor(CgroupFS(mount_dir=str(tmp_path), version=CgroupVersion.V2))
    builder = SnapshotBuilder(StaticStates(node=node(), pods=pods), MetricCache(), reader=executor, layout=LAYOUT)
    read = CgroupRead("cpu.cfs_quota_us", Scope.PODS, every_s=5.0, always=lambda p: p.name == "p0")
    per_pod = {p.name: 0 for p in pods}
    for tick in range(21):
        first = builder.build(Needs(cgroup_reads=(read,)), now=1000.0 + tick)
        again = builder.build(Needs(cgroup_reads=(read,)), now=1000.0 + tick)  # another strategy of the same tick
        assert first is not None and again is not None
        assert dict(again.cgroup_values) == dict(first.cgroup_values)  # the same pods
        if tick == 0:
            assert len(first.cgroup_values) == 8  # the first build reads them all
            continue
        for p in pods:
            per_pod[p.name] += first.cgroup_value("cpu.cfs_quota_us", f"kubepods/burstable/pod{p.uid}") is not None
    # p0 every tick; the others once a turn of 5 ticks: 4 turns in the 20 ticks after the first.
    assert per_pod == {"p0": 20, **{f"p{n}": 4 for n in range(1, 8)}}


def test_burst_looks_after_an_idle_pod_in_its_turn_and_a_bursting_one_every_tick() -> None:
    cid_idle, cid_burst = "aaaaaaaaaaaa", "bbbbbbbbbbbb"
    idle = pod("idle", "LS", containers=(ContainerMeta("app", container_id=cid_idle, limits={"cpu": 1000}),))
    bursting = pod("bursting", "LS", annotations={ANNOTATION_CPU_BURST: '{"policy": "cpuBurstOnly"}'},
                   containers=(ContainerMeta("app", container_id=cid_burst, limits={"cpu": 1000}),))
    config = BurstConfig.from_node_slo(spec(), QoSManagerConfig(fanout_interval_s=10.0))
    assert config.idle_every_s == 10.0
    quotas = {("cpu.cfs_quota_us", d): "100000" for d in (
        "kubepods/burstable/poduid-idle", f"kubepods/burstable/poduid-idle/{cid_idle}",
        "kubepods/burstable/poduid-bursting", f"kubepods/burstable/poduid-bursting/{cid_burst}")}
    labelled = {cid_idle: (("node", "node-1"),)}
    not_its_turn = {k: v for k, v in quotas.items() if "idle" not in k[1]}
    plan = cpuburst.decide(snapshot(pods=(idle, bursting), node=node(8000), node_cpu_avg_cores=1.0,
                                    cgroup_values=not_its_turn, memo=BurstMemo(labelled=labelled)), config)
    writes = {w.cgroup_dir for step in plan.steps for w in step.writes}
    assert writes == {"kubepods/burstable/poduid-bursting", f"kubepods/burstable/poduid-bursting/{cid_burst}"}
    assert plan.memo.labelled[cid_idle] == labelled[cid_idle]  # its series stay until its turn
    assert not any(g.value is None for g in plan.gauges if isinstance(g, GaugeSet))
    plan = cpuburst.decide(snapshot(pods=(idle, bursting), node=node(8000), node_cpu_avg_cores=1.0,
                                    cgroup_values=quotas), config)
    writes = {w.cgroup_dir for step in plan.steps for w in step.writes}
    assert f"kubepods/burstable/poduid-idle/{cid_idle}" in writes  # its turn: burst 0 kept, quota at its base


def test_the_cache_answers_the_newest_value_of_named_series_and_leaves_out_those_without() -> None:
    cache = MetricCache()
    assert cache.last_values_of({"a": KUBEPODS_CPU}, 0.0, 1.0) == {}
    cache.append(KUBEPODS_CPU, 0.5, 2.0)
    assert cache.last_values_of({"a": KUBEPODS_CPU, "b": BE_CPU_USAGE_KEY}, 0.0, 1.0) == {"a": 2.0}
