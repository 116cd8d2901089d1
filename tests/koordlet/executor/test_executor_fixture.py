"""The executor on fixture trees: cgroup v2 names and values (this kernel's cgroup2 mount is empty),
symlink escapes (cgroupfs itself has no symlinks), unsupported files and resctrl."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from koordlet.executor import (
    CgroupNotFoundError,
    ExecutorError,
    InvalidUpdateError,
    ResourceExecutor,
    ResourceUpdate,
    UnsafePathError,
    UnsupportedResourceError,
)
from koordlet.executor.metrics import STATUS_UNSAFE_PATH, update_count
from koordlet.system.cgroup import CgroupFS, CgroupVersion

POD = "kubepods/burstable/pod1234"

V2_FILES = {
    "cpu.max": "max 100000",
    "cpu.max.burst": "0",
    "cpu.weight": "100",
    "cpuset.cpus": "",
    "memory.max": "max",
    "memory.min": "0",
    "memory.high": "max",
    "cgroup.threads": "",
    "cgroup.procs": "",
}


def _v2_tree(root: Path, dirs: tuple[str, ...] = ("kubepods", "kubepods/burstable", POD)) -> CgroupFS:
    for rel in dirs:
        path = root / "sys" / "fs" / "cgroup" / rel
        path.mkdir(parents=True, exist_ok=True)
        for name, content in V2_FILES.items():
            (path / name).write_text(content + "\n")
    return CgroupFS(mount_dir=str(root / "sys/fs/cgroup"), version=CgroupVersion.V2)


def _read(root: Path, rel: str, name: str) -> str:
    return (root / "sys" / "fs" / "cgroup" / rel / name).read_text().strip()


def test_v2_quota_translates_to_cpu_max_keeping_the_period(tmp_path: Path) -> None:
    executor = ResourceExecutor(_v2_tree(tmp_path))
    (tmp_path / "sys/fs/cgroup" / POD / "cpu.max").write_text("max 50000\n")
    executor.update(ResourceUpdate.of("cpu.cfs_quota_us", POD, 20000))
    assert _read(tmp_path, POD, "cpu.max") == "20000 50000"
    executor.update(ResourceUpdate.of("cpu.cfs_quota_us", POD, -1))
    assert _read(tmp_path, POD, "cpu.max") == "max 50000"
    executor.update(ResourceUpdate.of("cpu.cfs_period_us", POD, 100000))
    assert _read(tmp_path, POD, "cpu.max") == "max 100000"


def test_v2_weight_memory_max_burst_and_threads(tmp_path: Path) -> None:
    executor = ResourceExecutor(_v2_tree(tmp_path))
    executor.update(ResourceUpdate.of("cpu.shares", POD, 1024))
    executor.update(ResourceUpdate.of("memory.limit_in_bytes", POD, 1 << 30))
    executor.update(ResourceUpdate.of("cpu.cfs_burst_us", POD, 50000))
    executor.update(ResourceUpdate.of("tasks", POD, 4242))
    assert _read(tmp_path, POD, "cpu.weight") == "39"
    assert _read(tmp_path, POD, "memory.max") == str(1 << 30)
    assert _read(tmp_path, POD, "cpu.max.burst") == "50000"
    assert _read(tmp_path, POD, "cgroup.threads") == "4242"
    executor.update(ResourceUpdate.of("memory.limit_in_bytes", POD, -1))
    assert _read(tmp_path, POD, "memory.max") == "max"


def test_v1_only_resource_is_invalid_on_v2(tmp_path: Path) -> None:
    executor = ResourceExecutor(_v2_tree(tmp_path))
    with pytest.raises(InvalidUpdateError, match="no cgroup v2 file"):
        executor.update(ResourceUpdate.of("net_cls.classid", POD, 1))


def test_v2_leveled_update_writes_exact_values_only(tmp_path: Path) -> None:
    executor = ResourceExecutor(_v2_tree(tmp_path))
    result = executor.leveled_update(
        [ResourceUpdate.of("cpuset.cpus", POD, "2-3"), ResourceUpdate.of("cpuset.cpus", "kubepods/burstable", "0-1")]
    )
    assert result.ok and result.written == 2  # no union pre-write on v2
    assert _read(tmp_path, "kubepods/burstable", "cpuset.cpus") == "0-1"
    assert _read(tmp_path, POD, "cpuset.cpus") == "2-3"


def test_symlink_dir_escaping_the_hierarchy_is_refused(tmp_path: Path) -> None:
    executor = ResourceExecutor(_v2_tree(tmp_path / "host"))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "cpu.weight").write_text("100\n")
    os.symlink(outside, tmp_path / "host/sys/fs/cgroup/kubepods/evil")
    before = update_count("cpu.shares", STATUS_UNSAFE_PATH)
    with pytest.raises(UnsafePathError, match="outside"):
        executor.update(ResourceUpdate.of("cpu.shares", "kubepods/evil", 2))
    assert (outside / "cpu.weight").read_text() == "100\n"
    assert update_count("cpu.shares", STATUS_UNSAFE_PATH) - before == 1


def test_symlinked_file_is_refused(tmp_path: Path) -> None:
    executor = ResourceExecutor(_v2_tree(tmp_path / "host"))
    target = tmp_path / "host/sys/fs/cgroup/kubepods/cpu.weight.real"
    target.write_text("100\n")
    weight = tmp_path / "host/sys/fs/cgroup" / POD / "cpu.weight"
    weight.unlink()
    os.symlink(target, weight)  # inside the hierarchy, but the kernel never makes file symlinks
    with pytest.raises(UnsafePathError):
        executor.update(ResourceUpdate.of("cpu.shares", POD, 2))
    assert target.read_text() == "100\n"


def test_absolute_dir_stays_inside_the_hierarchy(tmp_path: Path) -> None:
    executor = ResourceExecutor(_v2_tree(tmp_path / "host"))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "cpu.weight").write_text("100\n")
    # A leading "/" means the hierarchy root (CRI convention), never the host's "/".
    with pytest.raises(CgroupNotFoundError):
        executor.update(ResourceUpdate.of("cpu.shares", str(outside), 2))
    assert (outside / "cpu.weight").read_text() == "100\n"
    executor.update(ResourceUpdate.of("cpu.shares", "/" + POD, 2))
    assert _read(tmp_path / "host", POD, "cpu.weight") == "1"


def test_missing_file_is_unsupported_and_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    executor = ResourceExecutor(_v2_tree(tmp_path))
    with caplog.at_level(logging.DEBUG, logger="koordlet.executor.cgroups"):
        for _ in range(3):
            with pytest.raises(UnsupportedResourceError):
                executor.update(ResourceUpdate.of("cpu.bvt_warp_ns", POD, 2))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "bvt" in r.getMessage()]
    assert len(warnings) == 1
    assert not (tmp_path / "sys/fs/cgroup" / POD / "cpu.bvt_warp_ns").exists()


def test_missing_dir_is_cgroup_not_found(tmp_path: Path) -> None:
    executor = ResourceExecutor(_v2_tree(tmp_path))
    with pytest.raises(CgroupNotFoundError):
        executor.update(ResourceUpdate.of("cpu.shares", "kubepods/burstable/podgone", 2))
    assert not (tmp_path / "sys/fs/cgroup/kubepods/burstable/podgone").exists()


def test_read_goes_through_the_same_path_checks(tmp_path: Path) -> None:
    executor = ResourceExecutor(_v2_tree(tmp_path))
    assert executor.read("cpu.cfs_quota_us", POD) == "max 100000"
    with pytest.raises(UnsafePathError):
        executor.read("cpu.cfs_quota_us", "../..")


def test_resctrl_writes_stay_in_the_resctrl_root(tmp_path: Path) -> None:
    resctrl = tmp_path / "resctrl"
    (resctrl / "koordlet-pod1").mkdir(parents=True)
    (resctrl / "koordlet-pod1" / "schemata").write_text("L3:0=fff\n")
    executor = ResourceExecutor(CgroupFS(mount_dir=str(tmp_path / "sys/fs/cgroup")), resctrl_root=str(resctrl))
    executor.write_resctrl("koordlet-pod1", "schemata", "L3:0=f\n")
    assert (resctrl / "koordlet-pod1" / "schemata").read_text() == "L3:0=f\n"
    with pytest.raises(UnsafePathError):
        executor.write_resctrl("../etc", "schemata", "x")
    with pytest.raises(InvalidUpdateError):
        executor.write_resctrl("koordlet-pod1", "../../passwd", "x")
    with pytest.raises(UnsupportedResourceError):
        ResourceExecutor(CgroupFS(mount_dir=str(tmp_path / "sys/fs/cgroup"))).write_resctrl("LS", "schemata", "x")


_path_parts = st.sampled_from(["..", ".", "", "kubepods", "burstable", "pod1234", "evil", "/", "//", "x\x00"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(_path_parts, max_size=6), leading_slash=st.booleans())
def test_no_cgroup_dir_writes_outside_the_hierarchy(tmp_path: Path, parts: list[str], leading_slash: bool) -> None:
    host = tmp_path / "host"
    outside = tmp_path / "outside"
    if not host.exists():
        _v2_tree(host)
        outside.mkdir()
        (outside / "cpu.weight").write_text("100\n")
        os.symlink(outside, host / "sys/fs/cgroup/kubepods/evil")
    executor = ResourceExecutor(CgroupFS(str(host / "sys/fs/cgroup"), CgroupVersion.V2), force_update_seconds=0)
    cgroup_dir = ("/" if leading_slash else "") + "/".join(parts)
    try:
        executor.update(ResourceUpdate.of("cpu.shares", cgroup_dir, 2))
    except ExecutorError:
        pass
    assert (outside / "cpu.weight").read_text() == "100\n"
    assert not (tmp_path / "cpu.weight").exists() and not (host / "cpu.weight").exists()


def test_resctrl_groups_are_created_by_the_executor_and_names_checked(tmp_path: Path) -> None:
    root = tmp_path / "resctrl"
    root.mkdir()
    executor = ResourceExecutor(CgroupFS(mount_dir=str(tmp_path / "sys/fs/cgroup")), resctrl_root=str(root))
    assert executor.ensure_resctrl_group("BE") is True
    assert executor.ensure_resctrl_group("BE") is False
    assert (root / "BE").is_dir()
    for bad in ("../escape", "", "a/b", "."):
        with pytest.raises(UnsafePathError):
            executor.ensure_resctrl_group(bad)
    assert sorted(p.name for p in root.iterdir()) == ["BE"]


def test_verify_rewrites_a_value_changed_behind_the_caches_back(tmp_path: Path) -> None:
    executor = ResourceExecutor(_v2_tree(tmp_path))
    assert executor.update(ResourceUpdate.of("cpu.cfs_quota_us", POD, 20000)) is True
    (tmp_path / "sys/fs/cgroup" / POD / "cpu.max").write_text("50000 100000\n")  # drift
    assert executor.update(ResourceUpdate.of("cpu.cfs_quota_us", POD, 20000)) is False  # cache: skipped
    assert executor.update(ResourceUpdate.of("cpu.cfs_quota_us", POD, 20000), verify=True) is True
    assert _read(tmp_path, POD, "cpu.max") == "20000 100000"
    assert executor.update(ResourceUpdate.of("cpu.cfs_quota_us", POD, 20000), verify=True) is False  # in place now
