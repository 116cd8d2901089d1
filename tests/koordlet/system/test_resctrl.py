"""resctrl reads on a fixture tree (no RDT on this machine): capabilities, and group tasks via the executor."""

from __future__ import annotations

from pathlib import Path

import pytest

from koordlet.executor import ResourceExecutor
from koordlet.system.cgroup import CgroupFS
from koordlet.system.resctrl import ResctrlInfo, ResctrlInfoError, read_resctrl_info


def _resctrl_tree(root: Path, cbm_mask: str = "7ff") -> Path:
    (root / "info" / "L3").mkdir(parents=True)
    (root / "info" / "L3" / "cbm_mask").write_text(cbm_mask + "\n")
    (root / "schemata").write_text("    L3:0=7ff;1=7ff\n    MB:0=100;1=100\n")
    return root


def test_info_from_cbm_mask_and_root_schemata(tmp_path: Path) -> None:
    assert read_resctrl_info(str(_resctrl_tree(tmp_path / "resctrl"))) == ResctrlInfo(0x7FF, (0, 1), True)


def test_no_rdt_is_none_and_a_bad_mask_is_an_error(tmp_path: Path) -> None:
    assert read_resctrl_info(str(tmp_path / "missing")) is None
    with pytest.raises(ResctrlInfoError, match="bad cbm_mask"):
        read_resctrl_info(str(_resctrl_tree(tmp_path / "bad", cbm_mask="zz")))


def test_group_tasks_of_present_and_absent_groups(tmp_path: Path) -> None:
    (tmp_path / "LS").mkdir()
    (tmp_path / "LS" / "tasks").write_text("12\n34\n")
    # A group's files are read through the executor (the plan runner's ResctrlMoveTasks uses it).
    executor = ResourceExecutor(CgroupFS(str(tmp_path / "cgroup")), resctrl_root=str(tmp_path))
    assert executor.read_resctrl("LS", "tasks").split() == ["12", "34"]
    assert executor.read_resctrl("BE", "tasks") == ""
