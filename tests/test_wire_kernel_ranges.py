"""One source for the kernel's value ranges (wire/kernel_ranges.py): the proxy's merge of hook answers, the hook
value check and koordlet's cgroup registry take and refuse the same values at every boundary. Before they
shared one module, the proxy passed a memory limit of one byte and a quota of 2^44 µs on to runc, and the
registry took a memory limit of 0, all of which the hook check refused."""

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
