"""cgroup version detection from mountinfo and kubelet driver detection, on fixture trees and this host."""

from __future__ import annotations

import os
from pathlib import Path

from koordlet.system.cgroup import (
    CgroupDriver,
    CgroupFS,
    CgroupVersion,
    detect_cgroup_driver,
    detect_cgroup_version,
    parse_mountinfo,
)

# Lines as this Debian 12 host prints them (hybrid v1) and as a unified v2 host does.
MOUNTINFO_V1 = """\
23 1 0:21 / / rw,relatime - overlay overlay rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
MOUNTINFO_V2 = """\
23 1 0:21 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
40 23 0:30 / /mnt/with\\040space rw - tmpfs tmpfs rw
"""


def _proc_with_mountinfo(tmp_path: Path, text: str) -> str:
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "mountinfo").write_text(text)
    return str(tmp_path / "proc")


def test_parse_mountinfo_reads_type_and_unescapes_mount_points() -> None:
    mounts = parse_mountinfo(MOUNTINFO_V2 + "garbage line\n")
    assert [m.mount_point for m in mounts] == ["/", "/sys/fs/cgroup", "/mnt/with space"]
    assert mounts[1].fs_type == "cgroup2"
    assert mounts[1].super_options == "rw,nsdelegate,memory_recursiveprot"


def test_hybrid_v1_host_is_v1_even_with_a_unified_mount(tmp_path: Path) -> None:
    assert detect_cgroup_version(proc_dir=_proc_with_mountinfo(tmp_path, MOUNTINFO_V1)) is CgroupVersion.V1


def test_cgroup2_at_sys_fs_cgroup_is_v2(tmp_path: Path) -> None:
    assert detect_cgroup_version(proc_dir=_proc_with_mountinfo(tmp_path, MOUNTINFO_V2)) is CgroupVersion.V2


def test_missing_mountinfo_means_v1(tmp_path: Path) -> None:
    assert detect_cgroup_version(proc_dir=str(tmp_path / "proc")) is CgroupVersion.V1


def test_this_host_agrees_with_the_kernel() -> None:
    with open("/proc/self/mountinfo") as f:
        types = [m.fs_type for m in parse_mountinfo(f.read()) if m.mount_point == "/sys/fs/cgroup"]
    expected = CgroupVersion.V2 if types and types[-1] == "cgroup2" else CgroupVersion.V1
    assert detect_cgroup_version() is expected


def test_hierarchy_dirs_per_version(tmp_path: Path) -> None:
    v1 = CgroupFS(mount_dir=str(tmp_path / "sys/fs/cgroup"), version=CgroupVersion.V1)
    v2 = CgroupFS(mount_dir=str(tmp_path / "sys/fs/cgroup"), version=CgroupVersion.V2)
    assert v1.cgroup_dir("cpu", "/kubepods/besteffort") == f"{tmp_path}/sys/fs/cgroup/cpu/kubepods/besteffort"
    assert v2.cgroup_dir("cpu", "kubepods/besteffort") == f"{tmp_path}/sys/fs/cgroup/kubepods/besteffort"
    assert v2.hierarchy_dir("memory") == v2.hierarchy_dir("cpu") == f"{tmp_path}/sys/fs/cgroup"


def test_driver_detected_from_kubepods_dir_name(tmp_path: Path) -> None:
    fs = CgroupFS(mount_dir=str(tmp_path / "sys/fs/cgroup"))
    cpu = tmp_path / "sys" / "fs" / "cgroup" / "cpu"
    cpu.mkdir(parents=True)
    assert detect_cgroup_driver(fs) is CgroupDriver.CGROUPFS  # nothing yet: default
    (cpu / "kubepods.slice").mkdir()
    assert detect_cgroup_driver(fs) is CgroupDriver.SYSTEMD
    os.rmdir(cpu / "kubepods.slice")
    (cpu / "koordlet-py" / "kubepods").mkdir(parents=True)
    assert detect_cgroup_driver(fs, cgroup_root="/koordlet-py") is CgroupDriver.CGROUPFS


def test_driver_detection_on_v2_looks_at_the_unified_root(tmp_path: Path) -> None:
    fs = CgroupFS(mount_dir=str(tmp_path / "sys/fs/cgroup"), version=CgroupVersion.V2)
    (tmp_path / "sys" / "fs" / "cgroup" / "kubepods.slice").mkdir(parents=True)
    assert detect_cgroup_driver(fs) is CgroupDriver.SYSTEMD
