"""One source for the kernel's value ranges and names (wire/kernel_ranges.py): the proxy's merge of hook answers,
the hook value check, koordlet's cgroup and node-file registries, the NodeSLO and the executor's resctrl writes take
and refuse the same values at every boundary. Before they shared one module, the proxy passed a memory limit of one
byte and a quota of 2^44 µs on to runc, and the registry took a memory limit of 0, all of which the hook check
refused; the hook check took a resctrl group named "_x" that the executor refused, and the executor one of 65
characters that the hook check refused."""

from __future__ import annotations

import pytest

from hooks import validate
from hooks.protocol import Changes, NodeContext
from koordlet.system.resources import InvalidCgroupValueError, get_resource
from runtimeproxy.interceptor import merge_resources
from wire import hookapi_pb2 as hookapi
from wire import kernel_ranges

# (CRI field of the proxy's merge, Changes field of the hook check or None, cgroup v1 file, value, taken?)
CASES = [
    ("cpu_shares", "cpu_shares", "cpu.shares", 1, False),
    ("cpu_shares", "cpu_shares", "cpu.shares", 2, True),
    ("cpu_shares", "cpu_shares", "cpu.shares", 262144, True),
    ("cpu_shares", "cpu_shares", "cpu.shares", 262145, False),
    ("cpu_quota", "cfs_quota_us", "cpu.cfs_quota_us", -1, True),
    ("cpu_quota", "cfs_quota_us", "cpu.cfs_quota_us", 999, False),
    ("cpu_quota", "cfs_quota_us", "cpu.cfs_quota_us", 1000, True),
    ("cpu_quota", "cfs_quota_us", "cpu.cfs_quota_us", (1 << 44) - 1, True),
    ("cpu_quota", "cfs_quota_us", "cpu.cfs_quota_us", 1 << 44, False),
    ("cpu_period", None, "cpu.cfs_period_us", 999, False),
    ("cpu_period", None, "cpu.cfs_period_us", 1000, True),
    ("cpu_period", None, "cpu.cfs_period_us", 1_000_000, True),
    ("cpu_period", None, "cpu.cfs_period_us", 1_000_001, False),
    ("memory_limit_in_bytes", "memory_limit_bytes", "memory.limit_in_bytes", 1, False),
    ("memory_limit_in_bytes", "memory_limit_bytes", "memory.limit_in_bytes", 4095, False),
    ("memory_limit_in_bytes", "memory_limit_bytes", "memory.limit_in_bytes", 4096, True),
    ("memory_limit_in_bytes", "memory_limit_bytes", "memory.limit_in_bytes", 64 << 30, True),
    ("cpuset_cpus", "cpuset_cpus", "cpuset.cpus", "", True),
    ("cpuset_cpus", "cpuset_cpus", "cpuset.cpus", "0-3,8", True),
    ("cpuset_cpus", "cpuset_cpus", "cpuset.cpus", "0-65535", True),
    ("cpuset_cpus", "cpuset_cpus", "cpuset.cpus", "65536", False),
    ("cpuset_cpus", "cpuset_cpus", "cpuset.cpus", "3-1", False),
    ("cpuset_cpus", "cpuset_cpus", "cpuset.cpus", "banana", False),
]


def _proxy_takes(field: str, value: int | str) -> bool:
    cached = hookapi.LinuxContainerResources()
    rejected: list[str] = []
    merge_resources(cached, hookapi.LinuxContainerResources(**{field: value}), lambda name, _: rejected.append(name))
    assert (getattr(cached, field) == value) != bool(rejected)
    return not rejected


def _hooks_take(field: str | None, value: int | str) -> bool | None:
    if field is None:
        return None  # hooks do not set it
    kept, rejected = validate.check(Changes(**{field: value}), NodeContext())
    assert (getattr(kept, field) == value) != bool(rejected)
    return not rejected


def _registry_takes(resource: str, value: int | str) -> bool:
    try:
        get_resource(resource).validate(value)
    except InvalidCgroupValueError:
        return False
    return True


@pytest.mark.parametrize("cri_field,changes_field,resource,value,taken", CASES,
                         ids=[f"{case[2]}={case[3]}" for case in CASES])
def test_the_proxy_the_hook_check_and_the_registry_take_the_same_values(
        cri_field: str, changes_field: str | None, resource: str, value: int | str, taken: bool) -> None:
    assert _proxy_takes(cri_field, value) is taken
    assert _hooks_take(changes_field, value) in (taken, None)
    assert _registry_takes(resource, value) is taken


def test_every_problem_names_the_range() -> None:
    assert kernel_ranges.shares_problem(1) == "outside 2..262144"
    assert "1000" in str(kernel_ranges.quota_problem(5)) and "-1" in str(kernel_ranges.quota_problem(5))
    assert "one page" in str(kernel_ranges.memory_limit_problem(1))
    assert kernel_ranges.memory_limit_problem(-1) is None and kernel_ranges.quota_problem(-1) is None
    assert "not a CPU list" in str(kernel_ranges.cpu_list_problem("0-"))


# Ranges and names only koordlet's side sets (no CRI field carries bvt, cpu.idle or a resctrl group; the proxy
# checks oom_score_adj): the hook check, the cgroup registry, the node-file registry and the NodeSLO agree.
SMALL_RANGES = [
    ("bvt_warp_ns", "cpu.bvt_warp_ns", -2, False), ("bvt_warp_ns", "cpu.bvt_warp_ns", -1, True),
    ("bvt_warp_ns", "cpu.bvt_warp_ns", 2, True), ("bvt_warp_ns", "cpu.bvt_warp_ns", 3, False),
    ("cpu_idle", "cpu.idle", -1, False), ("cpu_idle", "cpu.idle", 0, True), ("cpu_idle", "cpu.idle", 1, True),
    ("cpu_idle", "cpu.idle", 2, False),
]


@pytest.mark.parametrize("changes_field,resource,value,taken", SMALL_RANGES,
                         ids=[f"{case[1]}={case[2]}" for case in SMALL_RANGES])
def test_the_hook_check_and_the_registry_take_the_same_bvt_and_idle_values(
        changes_field: str, resource: str, value: int, taken: bool) -> None:
    assert _hooks_take(changes_field, value) is taken
    assert _registry_takes(resource, value) is taken


@pytest.mark.parametrize("value,taken", [(-1001, False), (-1000, True), (0, True), (1000, True), (1001, False)])
def test_oom_score_adj_is_one_range_for_the_proxy_the_hook_check_and_the_node_file_registry(
        value: int, taken: bool) -> None:
    from koordlet.system.sysctl import OOM_SCORE_ADJ, InvalidSystemValueError, get_system_resource

    assert _proxy_takes("oom_score_adj", value) is taken
    assert _hooks_take("oom_score_adj", value) is taken
    try:
        get_system_resource(OOM_SCORE_ADJ).validate(value)
        registry_takes = True
    except InvalidSystemValueError:
        registry_takes = False
    assert registry_takes is taken


def test_the_nodeslo_group_identity_and_sched_idle_take_the_kernels_values() -> None:
    from koordlet.api.nodeslo import parse_node_slo_spec

    def cpu_qos(**fields: int) -> object:
        spec = {"resourceQOSStrategy": {"beClass": {"cpuQOS": {"enable": True, **fields}}}}
        return parse_node_slo_spec(spec).resource_qos_strategy.be_class.cpu_qos

    taken = cpu_qos(groupIdentity=kernel_ranges.BVT_WARP_NS_MIN, schedIdle=kernel_ranges.CPU_IDLE_MAX)
    assert (taken.group_identity, taken.sched_idle) == (kernel_ranges.BVT_WARP_NS_MIN, kernel_ranges.CPU_IDLE_MAX)
    for bad in ({"groupIdentity": kernel_ranges.BVT_WARP_NS_MAX + 1}, {"schedIdle": kernel_ranges.CPU_IDLE_MAX + 1}):
        with pytest.raises(ValueError):
            cpu_qos(**bad)


UUID = "4f6c1d2e-0b7a-4c3e-9f00-1a2b3c4d5e6f"
# Koordinator's names (LSR, LS, BE, koordlet-<pod uid>) and what the kernel's mkdir would take; then what it
# would refuse (NAME_MAX, "/", NUL, newline, ".", "..", the root's own entries) and what the rule keeps out on
# purpose (hidden or option-like names, spaces, non-ASCII).
GOOD_GROUPS = ["LSR", "LS", "BE", f"koordlet-{UUID}", "_x", "a.b-c_d", "a" * 255]
BAD_GROUPS = ["", ".", "..", "../x", "a/b", "a\x00b", "a\nb", "a" * 256, "info", "mon_groups", "mon_data", "tasks",
              "schemata", ".hidden", "-x", "a b", "é"]


@pytest.mark.parametrize("name", GOOD_GROUPS + BAD_GROUPS, ids=[repr(n)[:24] for n in GOOD_GROUPS + BAD_GROUPS])
def test_a_resctrl_group_name_is_taken_or_refused_alike_by_the_hook_check_and_the_executor(
        name: str, tmp_path) -> None:
    from koordlet.executor import ResourceExecutor, UnsafePathError
    from koordlet.system.cgroup import CgroupFS

    good = name in GOOD_GROUPS
    assert (kernel_ranges.resctrl_group_problem(name) is None) is good
    if name:  # "" is "no group" to the hook check, the root group to the executor's file writes
        assert _hooks_take("resctrl_group", name) is good
    root = tmp_path / "resctrl"
    root.mkdir()
    executor = ResourceExecutor(CgroupFS(mount_dir=str(tmp_path / "cgroup")), resctrl_root=str(root))
    if good:
        assert executor.ensure_resctrl_group(name) is True
        (root / name / "tasks").write_text("")
        executor.write_resctrl(name, "tasks", "1")
        assert executor.remove_resctrl_group(name) is True
    else:
        for action in (lambda: executor.ensure_resctrl_group(name), lambda: executor.remove_resctrl_group(name)):
            with pytest.raises(UnsafePathError):
                action()
        if name:
            with pytest.raises(UnsafePathError):
                executor.write_resctrl(name, "tasks", "1")
    assert list(root.iterdir()) == []


@pytest.mark.parametrize("length", [255, 256])
def test_the_resctrl_name_length_is_the_kernels_name_max(length: int, tmp_path) -> None:
    """mkdir on this kernel's file system takes exactly the lengths the rule takes (NAME_MAX)."""
    import errno
    import os

    name = "g" * length
    try:
        os.mkdir(tmp_path / name)
        kernel_takes = True
    except OSError as err:
        assert err.errno == errno.ENAMETOOLONG
        kernel_takes = False
    assert (kernel_ranges.resctrl_group_problem(name) is None) is kernel_takes
