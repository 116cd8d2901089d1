"""Resctrl class groups on a fixture resctrl tree (no RDT on this machine): masks, MBA, tasks moved in."""

from __future__ import annotations

from pathlib import Path

import pytest

from koordlet.actuator import PlanRunner
from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.api.pod import ContainerMeta
from koordlet.api.resctrl import ResctrlMathError, l3_mask, mb_value
from koordlet.executor import ResourceExecutor, UnsafePathError
from koordlet.metriccache import MetricCache
from koordlet.qosmanager import QoSManager
from koordlet.qosmanager.resctrl import STRATEGY, schemata_text
from koordlet.qosmanager.snapshot import SnapshotBuilder
from koordlet.statesinformer.api import StaticStates
from koordlet.system.cgroup import CgroupFS
from koordlet.system.resctrl import ResctrlInfo, read_resctrl_info
from tests.koordlet.qosmanager.factory import LAYOUT, be_pod, node, pod

SLO = parse_node_slo_spec({"resourceQOSStrategy": {
    "lsClass": {"resctrlQOS": {"enable": True}},
    "beClass": {"resctrlQOS": {"enable": True, "catRangeEndPercent": 30, "mbaPercent": 55}},
}})


@pytest.mark.parametrize(
    "start,end,expected",
    [(0, 100, 0x7FF), (0, 30, 0xF), (30, 100, 0x7F0), (50, 60, 0x40)],  # 11 ways: ceil(3.3) = 4, ceil(5.5) = 6
)
def test_l3_mask_from_cbm_and_percents(start: int, end: int, expected: int) -> None:
    assert l3_mask(0x7FF, start, end) == expected


def test_non_contiguous_cbm_is_refused() -> None:
    with pytest.raises(ResctrlMathError):
        l3_mask(0x5, 0, 100)


def test_mba_rounding() -> None:
    assert mb_value(55, "intel") == 60
    assert mb_value(100, "intel") == 100
    assert mb_value(50, "amd") == 80  # 25 × 8 × 0.8 × 50 %
    assert mb_value(100, "amd") == 2048


def _resctrl_tree(root: Path) -> Path:
    resctrl = root / "resctrl"
    (resctrl / "info" / "L3").mkdir(parents=True)
    (resctrl / "info" / "L3" / "cbm_mask").write_text("7ff\n")
    (resctrl / "schemata").write_text("    L3:0=7ff;1=7ff\n    MB:0=100;1=100\n")
    for group in ("LSR", "LS", "BE"):  # what the kernel creates on mkdir
        (resctrl / group).mkdir()
        (resctrl / group / "schemata").write_text("")
        (resctrl / group / "tasks").write_text("")
    return resctrl


def test_read_info_and_schemata_text(tmp_path: Path) -> None:
    info = read_resctrl_info(str(_resctrl_tree(tmp_path)))
    assert info == ResctrlInfo(0x7FF, (0, 1), True)
    be = SLO.resource_qos_strategy.be_class.resctrl_qos
    assert schemata_text(info, be) == "L3:0=f;1=f\nMB:0=60;1=60\n"
    assert read_resctrl_info(str(tmp_path / "missing")) is None


def test_groups_get_schemata_and_pod_tasks_are_moved_in(tmp_path: Path) -> None:
    resctrl = _resctrl_tree(tmp_path)
    (resctrl / "LS" / "tasks").write_text("201\n")  # already there: not moved again
    cgroup_root = tmp_path / "host"
    be = be_pod("be", containers=(ContainerMeta("job", container_id="a" * 12),))
    ls = pod("ls", "LS", containers=(ContainerMeta("app", container_id="b" * 12),))
    lsr = pod("lsr", "LSR", containers=(ContainerMeta("app", container_id="c" * 12),))  # LSR resctrl disabled
    for rel, pids in (("kubepods/besteffort/poduid-be/" + "a" * 12, "101\n102\n"),
                      ("kubepods/burstable/poduid-ls/" + "b" * 12, "201\n202\n"),
                      ("kubepods/burstable/poduid-lsr/" + "c" * 12, "301\n")):
        directory = cgroup_root / "sys/fs/cgroup/cpu" / rel
        directory.mkdir(parents=True)
        (directory / "tasks").write_text(pids)
    executor = ResourceExecutor(CgroupFS(mount_dir=str(cgroup_root / "sys/fs/cgroup")), resctrl_root=str(resctrl))
    states = StaticStates(node=node(), node_slo=SLO, pods=(be, ls, lsr))
    manager = QoSManager(states, [STRATEGY], builder=SnapshotBuilder(states, MetricCache(), reader=executor,
                                                                      layout=LAYOUT), runner=PlanRunner(executor))
    assert STRATEGY.configure(SLO, manager.config).enabled
    assert manager.run_strategy("resctrl")
    assert (resctrl / "BE" / "schemata").read_text() == "L3:0=f;1=f\nMB:0=60;1=60\n"
    assert (resctrl / "LS" / "schemata").read_text() == "L3:0=7ff;1=7ff\nMB:0=100;1=100\n"
    record = manager.last_record("resctrl")
    assert record is not None
    assert dict(record.moved_tasks) == {"BE": (101, 102), "LS": (202,)}
    assert (resctrl / "BE" / "tasks").read_text() == "102"  # a plain file keeps the last write


def test_no_rdt_is_a_noop(tmp_path: Path) -> None:
    executor = ResourceExecutor(CgroupFS(str(tmp_path / "sys/fs/cgroup")), resctrl_root=str(tmp_path / "resctrl"))
    states = StaticStates(node=node(), node_slo=SLO)
    manager = QoSManager(states, [STRATEGY], builder=SnapshotBuilder(states, MetricCache(), reader=executor,
                                                                      layout=LAYOUT), runner=PlanRunner(executor))
    assert manager.run_strategy("resctrl")
    plan = manager.last_plan("resctrl")
    assert plan is not None and plan.empty and not (tmp_path / "resctrl").exists()


def _kernel_mkdir(resctrl: Path) -> None:
    """What the kernel puts in a new resctrl group; a fixture's mkdir makes an empty dir."""
    for group in ("LSR", "LS", "BE"):
        for name in ("schemata", "tasks", "cpus", "cpus_list", "mode", "size"):
            if (resctrl / group).is_dir() and not (resctrl / group / name).exists():
                (resctrl / group / name).write_text("")


def test_switched_off_the_groups_it_made_are_removed_and_their_tasks_go_back_to_the_root(tmp_path: Path) -> None:
    resctrl = tmp_path / "resctrl"
    (resctrl / "info" / "L3").mkdir(parents=True)
    (resctrl / "info" / "L3" / "cbm_mask").write_text("7ff\n")
    (resctrl / "schemata").write_text("L3:0=7ff\n")
    (resctrl / "tasks").write_text("1\n")
    (resctrl / "other").mkdir()  # a group someone else made: never touched
    cgroup_root = tmp_path / "host"
    be = be_pod("be", containers=(ContainerMeta("job", container_id="a" * 12),))
    directory = cgroup_root / "sys/fs/cgroup/cpu/kubepods/besteffort/poduid-be" / ("a" * 12)
    directory.mkdir(parents=True)
    (directory / "tasks").write_text("101\n102\n")
    executor = ResourceExecutor(CgroupFS(mount_dir=str(cgroup_root / "sys/fs/cgroup")), resctrl_root=str(resctrl))
    states = StaticStates(node=node(), node_slo=SLO, pods=(be,))
    manager = QoSManager(states, [STRATEGY], builder=SnapshotBuilder(states, MetricCache(), reader=executor,
                                                                      layout=LAYOUT), runner=PlanRunner(executor))
    assert manager.run_strategy("resctrl")
    record = manager.last_record("resctrl")
    assert record is not None and record.created_groups == ("LSR", "LS", "BE")
    _kernel_mkdir(resctrl)
    assert manager.run_strategy("resctrl")
    assert (resctrl / "BE" / "tasks").read_text() == "102"
    (resctrl / "BE" / "tasks").write_text("101\n102\n")  # a fixture file keeps one write; the kernel keeps all

    states.set_node_slo(parse_node_slo_spec({"resourceQOSStrategy": {}}))  # every class's resctrlQOS off
    assert manager.run_strategy("resctrl")
    plan = manager.last_plan("resctrl")
    assert plan is not None
    assert [type(a).__name__ for a in plan.resctrl] == ["ResctrlRemoveGroup"] * 3
    record = manager.last_record("resctrl")
    assert record is not None and record.resctrl_errors == ()
    assert dict(record.moved_tasks) == {"": (101, 102)} and record.removed_groups == ("LSR", "LS", "BE")
    assert (resctrl / "tasks").read_text() == "102"  # moved back (the fixture file keeps the last write)
    assert sorted(p.name for p in resctrl.iterdir()) == ["info", "other", "schemata", "tasks"]


def test_switched_off_only_the_group_it_made_goes_and_groups_that_were_there_stay(tmp_path: Path) -> None:
    resctrl = _resctrl_tree(tmp_path)
    for name in ("schemata", "tasks"):
        (resctrl / "BE" / name).unlink()
    (resctrl / "BE").rmdir()  # LSR and LS were there before the agent; BE it makes
    executor = ResourceExecutor(CgroupFS(str(tmp_path / "sys/fs/cgroup")), resctrl_root=str(resctrl))
    states = StaticStates(node=node(), node_slo=SLO)
    manager = QoSManager(states, [STRATEGY], builder=SnapshotBuilder(states, MetricCache(), reader=executor,
                                                                      layout=LAYOUT), runner=PlanRunner(executor))
    assert manager.run_strategy("resctrl")
    _kernel_mkdir(resctrl)
    assert manager.run_strategy("resctrl")
    states.set_node_slo(parse_node_slo_spec({}))
    assert manager.run_strategy("resctrl")
    plan = manager.last_plan("resctrl")
    assert plan is not None and [(type(a).__name__, a.group) for a in plan.resctrl] == [("ResctrlRemoveGroup", "BE")]
    assert not (resctrl / "BE").exists()
    assert all((resctrl / group / "schemata").is_file() for group in ("LSR", "LS"))


def test_removing_a_group_refuses_anything_but_the_kernels_files(tmp_path: Path) -> None:
    resctrl = tmp_path / "resctrl"
    executor = ResourceExecutor(CgroupFS(str(tmp_path / "cg")), resctrl_root=str(resctrl))
    for group, extra in (("BE", None), ("LS", "notes.txt"), ("LSR", "mon_groups")):
        (resctrl / group).mkdir(parents=True)
        (resctrl / group / "tasks").write_text("")
        (resctrl / group / "schemata").write_text("")
        if extra == "notes.txt":
            (resctrl / group / extra).write_text("mine")
        elif extra:
            (resctrl / group / extra).mkdir()
    assert executor.remove_resctrl_group("BE") and not (resctrl / "BE").exists()
    assert not executor.remove_resctrl_group("BE")  # gone already
    for group in ("LS", "LSR"):
        with pytest.raises(UnsafePathError):
            executor.remove_resctrl_group(group)
        assert (resctrl / group / "tasks").is_file()  # nothing removed
    for bad in ("", "..", "../x", "a/b"):
        with pytest.raises(UnsafePathError):
            executor.remove_resctrl_group(bad)
    (tmp_path / "outside").mkdir()
    (resctrl / "link").symlink_to(tmp_path / "outside")
    with pytest.raises(UnsafePathError):
        executor.remove_resctrl_group("link")
    assert (tmp_path / "outside").is_dir()
