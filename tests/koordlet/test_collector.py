"""The collector pass (koordlet/collector.py): the pure decision on hand-made records, and the pass on a fixture
resctrl tree (this kernel has no resctrl) and a fixture cgroup tree with the records in files, as an agent that
starts after a crash finds them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from koordlet import audit
from koordlet.api.keys import ANNOTATION_RESCTRL
from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.api.pod import PodMeta
from koordlet.collector import CollectorConfig, Made, NodeStateCollector, Wants, collect
from koordlet.executor import ResourceExecutor
from koordlet.executor.records import NodeRecords
from koordlet.plan import LineKey, LineRestore, ResctrlRemoveGroup, SystemRestore
from koordlet.statesinformer.api import NodeInfo, StaticStates
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.sysctl import KIDLED_SCAN_PERIOD, MIN_FREE_KBYTES, SCHED_FEATURES
from tests.support.resctrl import group_as_the_kernel_makes_it, resctrl_tree

RDT = {ANNOTATION_RESCTRL: json.dumps({"llc": {"schemata": {"range": [0, 50]}}})}
NOW = 1_000_000.0
ON = CollectorConfig(pod_groups=True, class_groups=True, blkio=True, system_config=True)
RESCTRL_OFF = CollectorConfig(pod_groups=False, class_groups=True, blkio=True, system_config=True)


def _pod(uid: str, annotations=RDT, phase: str = "Running") -> PodMeta:
    return PodMeta(f"pod-{uid}", "default", uid, annotations=annotations, phase=phase)


def _removed(plans) -> list[str]:
    return [action.group for plan in plans for action in plan.resctrl if isinstance(action, ResctrlRemoveGroup)]


def _wants(pods=(), config: CollectorConfig = ON, rdt: bool | None = True, classes: bool = True) -> Wants:
    return Wants(config, tuple(pods), rdt, classes)


def test_a_pod_group_goes_when_its_pod_is_gone_finished_or_no_longer_annotated_and_stays_while_fresh() -> None:
    old = NOW - 3600
    groups = {"koordlet-live": old, "koordlet-gone": old, "koordlet-done": old, "koordlet-plain": old,
              "koordlet-new": NOW - 10}
    pods = (_pod("live"), _pod("done", phase="Succeeded"), _pod("plain", annotations={}))
    plans = collect(Made(groups), _wants(pods), NOW)
    assert _removed(plans) == ["koordlet-done", "koordlet-gone", "koordlet-plain"]
    assert [plan.reason for plan in plans] == ["NodeStateCollect"] * 3
    assert plans[1].why == "resctrl group koordlet-gone: its pod is gone"


def test_nothing_asks_for_any_pod_group_with_the_gate_off_or_without_rdt_and_unknown_names_stay() -> None:
    groups = {"koordlet-live": NOW - 3600, "koordlet-new": NOW, "somebody-elses": NOW - 3600}
    pods = (_pod("live"), _pod("new"))
    assert _removed(collect(Made(groups), _wants(pods), NOW)) == []
    assert _removed(collect(Made(groups), _wants(pods, CollectorConfig(class_groups=True, blkio=True)), NOW)) == [
        "koordlet-live", "koordlet-new"]
    assert _removed(collect(Made(groups), _wants(pods, rdt=False), NOW)) == ["koordlet-live", "koordlet-new"]
    assert _removed(collect(Made(groups), _wants(pods, rdt=None), NOW)) == []  # RDT unreadable: nothing on that ground


def test_class_groups_go_when_the_rdtresctrl_strategy_cannot_ask_for_them() -> None:
    groups = {"LSR": 0.0, "LS": 0.0, "BE": 0.0}
    assert _removed(collect(Made(groups), _wants(), NOW)) == []
    assert _removed(collect(Made(groups), _wants(classes=False), NOW)) == ["BE", "LS", "LSR"]
    assert _removed(collect(Made(groups), _wants(config=CollectorConfig(pod_groups=True, blkio=True)), NOW)) == [
        "BE", "LS", "LSR"]


def test_recorded_blkio_lines_and_sysctls_go_back_only_while_their_strategy_is_off_and_kidled_is_never_its(
        ) -> None:
    lines = (LineKey("blkio.cost.qos", "", "8:0"), LineKey("blkio.throttle.read_bps_device", "kubepods/besteffort",
                                                          "8:0"))
    made = Made({}, lines, (KIDLED_SCAN_PERIOD, MIN_FREE_KBYTES, f"{SCHED_FEATURES}:NEXT_BUDDY"))
    assert collect(made, _wants(), NOW) == []
    lines_plan, sysctls_plan = collect(made, _wants(config=CollectorConfig(pod_groups=True)), NOW)
    assert lines_plan.lines == tuple(LineRestore(k.resource, k.cgroup_dir, k.device, lines_plan.why) for k in lines)
    assert sysctls_plan.system == (SystemRestore(MIN_FREE_KBYTES, sysctls_plan.why),
                                   SystemRestore(f"{SCHED_FEATURES}:NEXT_BUDDY", sysctls_plan.why))
    assert collect(Made({}, (), (KIDLED_SCAN_PERIOD,)), _wants(config=CollectorConfig()), NOW) == []


def test_the_besteffort_io_weight_line_of_psi_throttle_goes_back_only_while_that_strategy_is_off() -> None:
    """BE PSI throttle's io.weight default line shares the blkio record, not the blkio strategy's fate."""
    blkio = LineKey("blkio.cost.weight", "kubepods/besteffort", "8:0")
    psi = LineKey("io.weight.default", "kubepods/besteffort", "default")
    made = Made({}, (blkio, psi))
    assert collect(made, _wants(config=CollectorConfig(blkio=True, psi_throttle=True)), NOW) == []
    (plan,) = collect(made, _wants(config=CollectorConfig(blkio=True)), NOW)
    assert plan.lines == (LineRestore(psi.resource, psi.cgroup_dir, psi.device, plan.why),)
    assert "BEPSIThrottle strategy is off" in plan.why
    (plan,) = collect(made, _wants(config=CollectorConfig(psi_throttle=True)), NOW)
    assert [line.resource for line in plan.lines] == ["blkio.cost.weight"]


# ------------------------------------------------------------------------------------ the pass, on fixture trees


def _agent(tmp_path: Path, resctrl: Path, states: StaticStates, config: CollectorConfig = ON,
           ) -> tuple[NodeStateCollector, ResourceExecutor]:
    """An agent's collector as built at its start: the records read back from their files."""
    executor = ResourceExecutor(CgroupFS(str(tmp_path / "cg"), CgroupVersion.V2), resctrl_root=str(resctrl),
                                records=NodeRecords.beside(str(tmp_path / "run" / "system-config-originals.json")))
    config = CollectorConfig(config.pod_groups, config.class_groups, config.blkio, config.system_config,
                             str(resctrl), str(tmp_path / "vgpu" / "containers"))
    return NodeStateCollector(config, states, executor, wall_clock=lambda: NOW), executor


def _record(tmp_path: Path, groups: dict[str, float]) -> None:
    path = tmp_path / "run" / "resctrl-groups.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"kind": "koordlet-resctrl-groups", "version": 1,
                                "originals": {g: f"{at:.0f}" for g, at in groups.items()}}))


@pytest.fixture
def audited(tmp_path: Path):
    auditor = audit.Auditor(audit.AuditConfig(log_dir=str(tmp_path / "audit")))
    audit.install(auditor)
    try:
        yield lambda: list(reversed(audit.read_events(str(tmp_path / "audit"))))
    finally:
        audit.install(None)
        auditor.close()


def test_after_a_restart_the_groups_of_pods_that_ended_meanwhile_go_and_only_once_the_states_have_synced(
        tmp_path: Path, audited) -> None:
    """koordlet was down while pod "gone" ended: the first pass after the start removes its group (its tasks back to
    the root group first) and keeps the live pod's, a fresh one's and another agent's. Before the states informer
    has synced (no pods known yet) nothing is touched."""
    root = resctrl_tree(tmp_path / "resctrl")
    (root / "tasks").write_text("")
    for uid in ("live", "gone", "new", "foreign"):
        group_as_the_kernel_makes_it(root, f"koordlet-{uid}", tasks="4242\n" if uid == "gone" else "")
    _record(tmp_path, {"koordlet-live": NOW - 3600, "koordlet-gone": NOW - 3600, "koordlet-new": NOW - 5})
    states = StaticStates()  # no node yet: not synced
    collector, executor = _agent(tmp_path, root, states)
    assert collector.collect_once() == 0 and (root / "koordlet-gone").is_dir()
    states.set_node(NodeInfo("n1"))
    states.set_pods([_pod("live")])
    assert collector.collect_once() == 1
    assert sorted(p.name for p in root.glob("koordlet-*")) == ["koordlet-foreign", "koordlet-live", "koordlet-new"]
    assert (root / "tasks").read_text() == "4242"  # moved back to the root group before the rmdir
    assert executor.records.resctrl_groups.keys() == {"koordlet-live", "koordlet-new"}
    assert json.loads((tmp_path / "run" / "resctrl-groups.json").read_text())["originals"].keys() == {
        "koordlet-live", "koordlet-new"}
    events = [(e.reason, e.message) for e in audited()]
    assert ("NodeStateCollect", "removed resctrl group koordlet-gone by collector: "
                                "resctrl group koordlet-gone: its pod is gone") in events


def test_after_the_resctrl_gate_flips_off_every_pod_group_koordlet_made_goes_and_class_groups_with_their_strategy(
        tmp_path: Path, audited) -> None:
    root = resctrl_tree(tmp_path / "resctrl")
    for group in ("koordlet-live", "LS", "BE"):
        group_as_the_kernel_makes_it(root, group)
    _record(tmp_path, {"koordlet-live": NOW - 3600, "LS": NOW - 3600})  # BE was there before koordlet
    states = StaticStates(node=NodeInfo("n1"), pods=[_pod("live")])
    collector, _ = _agent(tmp_path, root, states, RESCTRL_OFF)
    assert collector.collect_once() == 2  # the pod group (gate off), LS (NodeSLO's resctrlQOS off in every class)
    assert sorted(p.name for p in root.iterdir() if p.name != "info" and p.is_dir()) == ["BE"]
    assert {e.message.rpartition(": ")[2] for e in audited()} == {"feature gate Resctrl is off",
                                                                  "NodeSLO resctrlQOS is off in every class"}


def test_class_groups_stay_while_the_nodeslo_asks_for_them(tmp_path: Path) -> None:
    root = resctrl_tree(tmp_path / "resctrl")
    group_as_the_kernel_makes_it(root, "LS")
    _record(tmp_path, {"LS": NOW - 3600})
    spec = parse_node_slo_spec({"resourceQOSStrategy": {"lsClass": {"resctrlQOS": {"enable": True}}}})
    collector, _ = _agent(tmp_path, root, StaticStates(node=NodeInfo("n1"), node_slo=spec))
    assert collector.collect_once() == 0 and (root / "LS").is_dir()


def test_a_host_dir_goes_when_its_pod_is_gone_past_the_grace_or_finished_and_never_outside_its_root(
        tmp_path: Path, audited) -> None:
    """HAMi-core's per-container cache dirs, made through the hooks and recorded with their pod: a live pod's stays
    (a gate switched off does not take it from a running container), a gone one's goes with what is in it."""
    from hooks.protocol import Changes
    from koordlet.hostdirs import make_host_dirs

    root = tmp_path / "vgpu" / "containers"
    root.mkdir(parents=True)
    states = StaticStates(node=NodeInfo("n1"), pods=[_pod("live"), _pod("done", phase="Failed")])
    collector, executor = _agent(tmp_path, resctrl_tree(tmp_path / "resctrl"), states,
                                 RESCTRL_OFF)
    for uid in ("live", "gone", "done", "new"):
        assert make_host_dirs(Changes(host_dirs=(str(root / f"{uid}_main"),)), str(root),
                              executor.records.host_dirs, uid) == {}
        (root / f"{uid}_main" / f"{uid}_main.cache").write_bytes(b"\0" * 64)
    records = executor.records.host_dirs
    for uid in ("gone", "done", "live"):  # made an hour ago
        path = str(root / f"{uid}_main")
        records.forget(path)
        records.record(path, f"{uid} {NOW - 3600:.0f}")
    records.forget(str(root / "new_main"))
    records.record(str(root / "new_main"), f"new {NOW - 5:.0f}")
    records.record(str(tmp_path / "elsewhere"), f"gone {NOW - 3600:.0f}")  # a record edited by hand
    (tmp_path / "elsewhere").mkdir()
    assert collector.collect_once() == 2
    assert sorted(p.name for p in root.iterdir()) == ["live_main", "new_main"]
    assert (tmp_path / "elsewhere").is_dir()  # never outside the root
    messages = [e.message for e in audited()]
    assert f"removed host dir {root / 'gone_main'} by collector: host dir {root / 'gone_main'}: its pod is gone" \
        in messages
