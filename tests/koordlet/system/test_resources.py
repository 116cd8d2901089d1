"""The cgroup resource registry: names per version, validators, v1→v2 translation, leveled merges."""

from __future__ import annotations

import pytest

from koordlet.system.cgroup import CgroupVersion
from koordlet.system.resources import (
    CGROUP_RESOURCES,
    InvalidCgroupValueError,
    UnknownCgroupResourceError,
    WeightFormula,
    cpu_shares_to_weight,
    formulas_giving,
    get_resource,
)

V1, V2 = CgroupVersion.V1, CgroupVersion.V2


@pytest.mark.parametrize(
    ("name", "v1", "v2"),
    [
        ("cpu.shares", "cpu.shares", "cpu.weight"),
        ("cpu.cfs_quota_us", "cpu.cfs_quota_us", "cpu.max"),
        ("cpu.cfs_period_us", "cpu.cfs_period_us", "cpu.max"),
        ("cpu.cfs_burst_us", "cpu.cfs_burst_us", "cpu.max.burst"),
        ("memory.limit_in_bytes", "memory.limit_in_bytes", "memory.max"),
        ("tasks", "tasks", "cgroup.threads"),
        ("net_cls.classid", "net_cls.classid", None),
        ("cpuacct.usage", "cpuacct.usage", None),
        ("memory.usage_in_bytes", "memory.usage_in_bytes", "memory.current"),
        ("cpuset.effective_cpus", "cpuset.effective_cpus", "cpuset.cpus.effective"),
        ("memory.events", None, "memory.events"),
    ],
)
def test_file_names_per_version(name: str, v1: str | None, v2: str | None) -> None:
    resource = get_resource(name)
    assert resource.file_name(V1) == v1
    assert resource.file_name(V2) == v2


def test_every_koordinator_writable_resource_is_registered() -> None:
    expected = {
        "cpu.shares",
        "cpu.cfs_quota_us",
        "cpu.cfs_period_us",
        "cpu.cfs_burst_us",
        "cpu.bvt_warp_ns",
        "cpu.idle",
        "cpuset.cpus",
        "cpuset.mems",
        "memory.limit_in_bytes",
        "memory.min",
        "memory.low",
        "memory.high",
        "memory.wmark_ratio",
        "memory.wmark_scale_factor",
        "memory.wmark_min_adj",
        "memory.priority",
        "memory.use_priority_oom",
        "memory.oom.group",
        "cgroup.procs",
        "tasks",
        "net_cls.classid",
    }
    assert expected <= {name for name, resource in CGROUP_RESOURCES.items() if resource.writable}


@pytest.mark.parametrize(
    ("name", "good", "bad"),
    [
        ("cpu.shares", ["2", "262144", 1024], ["1", "262145", "1.5", "", "abc"]),
        ("cpu.cfs_quota_us", ["-1", "1000", "max", 50000], ["999", "0", "-2"]),
        ("cpu.cfs_period_us", ["100000"], ["999", "1000001"]),
        ("cpu.cfs_burst_us", ["0", "100000000"], ["-1", "100000001"]),
        ("cpu.bvt_warp_ns", ["-1", "2"], ["-2", "3"]),
        ("cpu.idle", ["0", "1"], ["2"]),
        ("cpuset.cpus", ["0-3,8", ""], ["0-3,x", "3-1"]),
        ("memory.limit_in_bytes", ["-1", "1073741824"], ["-2", "1G"]),
        ("memory.wmark_ratio", ["0", "100"], ["101"]),
        ("memory.wmark_scale_factor", ["1", "1000"], ["0", "1001"]),
        ("memory.wmark_min_adj", ["-25", "50"], ["-26", "51"]),
        ("memory.priority", ["0", "12"], ["13"]),
        ("memory.use_priority_oom", ["1"], ["2"]),
        ("memory.oom.group", ["0"], ["-1"]),
        ("cgroup.procs", ["1", "4194304"], ["0", "4194305"]),
        ("net_cls.classid", ["0", "4294967295"], ["4294967296"]),
    ],
)
def test_validators_apply_kernel_and_koordinator_ranges(name: str, good: list[str | int], bad: list[str]) -> None:
    resource = get_resource(name)
    for value in good:
        resource.validate(value)
    for value in bad:
        with pytest.raises(InvalidCgroupValueError, match=name.replace(".", r"\.")):
            resource.validate(value)


def test_read_only_resources_cannot_be_validated_for_writing() -> None:
    with pytest.raises(InvalidCgroupValueError, match="read-only"):
        get_resource("memory.stat").validate("1")


def test_values_are_normalised() -> None:
    assert get_resource("cpuset.cpus").validate("3,0-2") == "0-3"
    assert get_resource("cpu.cfs_quota_us").validate("max") == "-1"
    assert get_resource("cpu.shares").validate(" 1024\n") == "1024"


def test_v2_translation_of_cpu_max_keeps_the_other_field() -> None:
    quota = get_resource("cpu.cfs_quota_us")
    assert quota.to_file_value("-1", V2, "50000 100000") == "max 100000"
    assert quota.to_file_value("20000", V2, "max 50000") == "20000 50000"
    assert quota.to_file_value("20000", V2, None) == "20000 100000"
    assert quota.to_file_value("20000", V1) == "20000"
    period = get_resource("cpu.cfs_period_us")
    assert period.to_file_value("50000", V2, "20000 100000") == "20000 50000"


def test_v2_translation_of_unlimited_memory_and_weight() -> None:
    assert get_resource("memory.limit_in_bytes").to_file_value("-1", V2) == "max"
    assert get_resource("memory.high").to_file_value("-1", V2) == "max"
    assert get_resource("cpu.shares").to_file_value("1024", V2) == "39"


@pytest.mark.parametrize(("shares", "weight"), [(2, 1), (1024, 39), (262144, 10000), (1, 1), (10**7, 10000)])
def test_shares_to_weight_linear_kubelet_mapping(shares: int, weight: int) -> None:
    assert cpu_shares_to_weight(shares) == weight == cpu_shares_to_weight(shares, WeightFormula.LINEAR)


# runc's own cases (opencontainers/cgroups TestConvertCPUSharesToCgroupV2Value), runc #4896's 2000 → 170 (77 linear),
# and the BE pods' 512 (500 milli batch-cpu)
@pytest.mark.parametrize(("shares", "weight"), [(1, 1), (2, 1), (3, 2), (512, 59), (1024, 100), (2000, 170),
                                                 (262143, 10000), (262144, 10000), (262145, 10000)])
def test_shares_to_weight_quadratic_is_runcs_newer_mapping(shares: int, weight: int) -> None:
    assert cpu_shares_to_weight(shares, WeightFormula.QUADRATIC) == weight


def test_the_cpu_shares_file_on_v2_takes_the_runtimes_formula() -> None:
    shares = get_resource("cpu.shares")
    assert shares.to_file_value("1024", V2, None, WeightFormula.QUADRATIC) == "100"
    assert shares.to_file_value("1024", V2, None, WeightFormula.LINEAR) == "39"
    assert shares.to_file_value("1024", V1, None, WeightFormula.QUADRATIC) == "1024"


def test_the_formulas_agree_only_at_the_ends_so_one_weight_names_the_runtimes() -> None:
    assert formulas_giving(2, 1) == formulas_giving(262144, 10000) == frozenset(WeightFormula)
    assert formulas_giving(1024, 39) == {WeightFormula.LINEAR}
    assert formulas_giving(1024, 100) == {WeightFormula.QUADRATIC}
    assert formulas_giving(1024, 50) == frozenset()
    assert all(len(formulas_giving(s, cpu_shares_to_weight(s))) == 1 for s in range(3, 262144, 97))


def test_merges_pick_the_looser_value() -> None:
    assert get_resource("cpuset.cpus").merge("0-1", "2-3") == "0-3"
    quota_merge = get_resource("cpu.cfs_quota_us").merge
    assert quota_merge("50000", "80000") == "80000"
    assert quota_merge("80000", "50000") == "80000"
    assert quota_merge("-1", "50000") == "-1"
    assert quota_merge("50000", "-1") == "-1"
    assert get_resource("memory.min").merge("100", "50") == "100"
    assert get_resource("cpu.shares").merge is None


def test_unknown_resource_is_a_key_error() -> None:
    with pytest.raises(UnknownCgroupResourceError):
        get_resource("cpu.turbo")


def test_the_registry_takes_the_kernel_ranges_of_wire():
    """Quota, period, shares and the memory limit's floor come from wire.kernel_ranges (the proxy and the hook
    check read the same module): a memory limit under one page and a quota over the kernel's maximum are
    refused (tests/test_wire_kernel_ranges.py holds all three readers to the same boundaries)."""
    for resource, refused in (("memory.limit_in_bytes", ["0", "4095"]), ("cpu.cfs_quota_us", [str(1 << 44)])):
        for value in refused:
            with pytest.raises(InvalidCgroupValueError):
                get_resource(resource).validate(value)
    assert get_resource("memory.limit_in_bytes").validate("4096") == "4096"
    assert get_resource("cpu.cfs_quota_us").validate(str((1 << 44) - 1)) == str((1 << 44) - 1)
