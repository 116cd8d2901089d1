"""cgroup statistics readers on fixture trees (v1 formats copied from this kernel, v2 formats from the
kernel's cgroup-v2 documentation), and on real cgroup dirs: v1 of this machine, v2 in the VM stage."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from koordlet.system import cgroup_stats as cs
from tests.koordlet.metricsadvisor.v1cgroups import V1TestCgroups
from tests.koordlet.qosmanager.realnode import BOTH_VERSIONS, cgroups_of_version

# /sys/fs/cgroup/memory/memory.stat of Linux 6.18 (cgroup v1).
MEMORY_STAT_V1 = b"""cache 9351168
rss 3891200
rss_huge 0
shmem 9166848
mapped_file 7045120
dirty 8192
writeback 0
workingset_refault_anon 0
workingset_refault_file 337
swap 0
swapcached 0
pgpgin 20427
pgpgout 17194
pgfault 17957
pgmajfault 0
inactive_anon 0
active_anon 1531904
inactive_file 0
active_file 184320
unevictable 11526144
hierarchical_memory_limit 9223372036854771712
hierarchical_memsw_limit 9223372036854771712
total_cache 126783488
total_rss 19742720
total_rss_huge 0
total_shmem 9166848
total_mapped_file 41926656
total_dirty 176128
total_writeback 0
total_workingset_refault_anon 0
total_workingset_refault_file 108069
total_swap 0
total_swapcached 0
total_pgpgin 1289890
total_pgpgout 1256852
total_pgfault 1347320
total_pgmajfault 1048
total_inactive_anon 15634432
total_active_anon 1581056
total_inactive_file 94826496
total_active_file 22790144
total_unevictable 11526144
"""

# cgroup v2 memory.stat keys in the order of Documentation/admin-guide/cgroup-v2.rst.
MEMORY_STAT_V2 = b"""anon 52953088
file 148135936
kernel 6516736
kernel_stack 327680
pagetables 1146880
sec_pagetables 0
percpu 480
sock 0
vmalloc 0
shmem 135168
zswap 0
zswapped 0
file_mapped 57331712
file_dirty 0
file_writeback 0
swapcached 0
anon_thp 0
file_thp 0
shmem_thp 0
inactive_anon 50331648
active_anon 2621440
inactive_file 98566144
active_file 49434624
unevictable 4096
slab_reclaimable 4182728
slab_unreclaimable 791936
slab 4974664
workingset_refault_anon 0
workingset_refault_file 0
workingset_activate_anon 0
workingset_activate_file 0
workingset_restore_anon 0
workingset_restore_file 0
workingset_nodereclaim 0
pgscan 0
pgsteal 0
pgfault 93429
pgmajfault 532
pgrefill 0
pgactivate 12011
pgdeactivate 0
pglazyfree 0
pglazyfreed 0
thp_fault_alloc 0
thp_collapse_alloc 0
"""

CPU_STAT_V1 = b"""nr_periods 1200
nr_throttled 30
throttled_time 4500000000
nr_bursts 0
burst_time 0
"""

CPU_STAT_V2 = b"""usage_usec 67285170
user_usec 40963296
system_usec 26321874
core_sched.force_idle_usec 0
nr_periods 1210
nr_throttled 4
throttled_usec 1258064
nr_bursts 0
burst_usec 0
"""


def _tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def test_v1_memory_usage_uses_hierarchical_total_fields(tmp_path: Path) -> None:
    _tree(tmp_path, {"memory.stat": MEMORY_STAT_V1})
    stat = cs.read_memory_stat(str(tmp_path), 1)
    assert stat.usage_bytes == 15634432 + 1581056 + 11526144
    assert stat.usage_with_page_cache_bytes == stat.usage_bytes + 94826496 + 22790144


def test_v2_memory_usage_uses_plain_field_names(tmp_path: Path) -> None:
    _tree(tmp_path, {"memory.stat": MEMORY_STAT_V2})
    stat = cs.read_memory_stat(str(tmp_path), 2)
    assert stat.usage_bytes == 50331648 + 2621440 + 4096
    assert stat.usage_with_page_cache_bytes == stat.usage_bytes + 98566144 + 49434624


def test_memory_stat_of_the_wrong_version_is_rejected() -> None:
    with pytest.raises(cs.CgroupStatError, match="lacks"):
        cs.parse_memory_stat(MEMORY_STAT_V2, 1)


def test_v1_cpu_usage_from_cpuacct_and_throttling_from_cpu_stat(tmp_path: Path) -> None:
    _tree(tmp_path, {"cpuacct/pod/cpuacct.usage": b"123456789012\n", "cpu/pod/cpu.stat": CPU_STAT_V1})
    assert cs.read_cpu_usage_ns(str(tmp_path / "cpuacct/pod"), 1) == 123456789012
    stat = cs.read_cpu_stat(str(tmp_path / "cpu/pod"), 1)
    assert stat == cs.CpuStat(nr_periods=1200, nr_throttled=30, throttled_ns=4500000000, usage_ns=None)


def test_v2_cpu_usage_and_throttling_both_come_from_cpu_stat_in_ns(tmp_path: Path) -> None:
    _tree(tmp_path, {"cpu.stat": CPU_STAT_V2})
    assert cs.read_cpu_usage_ns(str(tmp_path), 2) == 67285170 * 1000
    stat = cs.read_cpu_stat(str(tmp_path), 2)
    assert (stat.nr_periods, stat.nr_throttled, stat.throttled_ns) == (1210, 4, 1258064 * 1000)


def test_v2_cpu_stat_without_cpu_controller_has_zero_periods() -> None:
    stat = cs.parse_cpu_stat(b"usage_usec 10\nuser_usec 6\nsystem_usec 4\n", 2)
    assert (stat.usage_ns, stat.nr_periods, stat.nr_throttled) == (10_000, 0, 0)


@pytest.mark.parametrize(("memory_stat", "cpu_stat", "version"),
                         [(MEMORY_STAT_V1, CPU_STAT_V1, 1), (MEMORY_STAT_V2, CPU_STAT_V2, 2)])
def test_the_collectors_tuple_readers_agree_with_the_full_parsers(
    memory_stat: bytes, cpu_stat: bytes, version: int
) -> None:
    """The 1 s collector reads tuples (no dataclass per cgroup per tick); they must say what the full
    parsers say, and refuse what they refuse."""
    memory = cs.parse_memory_stat(memory_stat, version)
    assert cs.memory_usage(memory_stat, version) == (memory.usage_bytes, memory.usage_with_page_cache_bytes)
    cpu = cs.parse_cpu_stat(cpu_stat, version)
    assert cs.cpu_stat_counters(cpu_stat, version) == (cpu.usage_ns, cpu.nr_periods, cpu.nr_throttled)
    with pytest.raises(cs.CgroupStatError, match="lacks"):
        cs.memory_usage(MEMORY_STAT_V2, 1)  # v1 wants the hierarchical total_* fields
    with pytest.raises(cs.CgroupStatError, match="usage_usec"):
        cs.cpu_stat_counters(b"nr_periods 1\nnr_throttled 0\n", 2)
    with pytest.raises(cs.CgroupStatError, match="bad value for nr_periods"):
        cs.cpu_stat_counters(b"nr_periods x1\n", version)


def test_memory_usage_counter_per_version(tmp_path: Path) -> None:
    _tree(tmp_path, {"v1/memory.usage_in_bytes": b"4096\n", "v2/memory.current": b"8192\n"})
    assert cs.read_memory_usage_bytes(str(tmp_path / "v1"), 1) == 4096
    assert cs.read_memory_usage_bytes(str(tmp_path / "v2"), 2) == 8192


def test_cpuset_v1_reads_cpuset_cpus_and_rejects_junk(tmp_path: Path) -> None:
    _tree(tmp_path, {"good/cpuset.cpus": b"0-3,8,10-11\n", "bad/cpuset.cpus": b"3-1\n"})
    assert cs.read_cpuset_cpus(str(tmp_path / "good"), 1) == (0, 1, 2, 3, 8, 10, 11)
    with pytest.raises(cs.CgroupStatError):
        cs.read_cpuset_cpus(str(tmp_path / "bad"), 1)


def test_cpuset_v2_reads_the_effective_set(tmp_path: Path) -> None:
    _tree(tmp_path, {"cpuset.cpus": b"\n", "cpuset.cpus.effective": b"0-7\n"})
    assert cs.read_cpuset_cpus(str(tmp_path), 2) == tuple(range(8))


def test_cfs_quota_v1_and_v2_limit_in_milli_cores(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "v1/cpu.cfs_quota_us": b"250000\n",
            "v1/cpu.cfs_period_us": b"100000\n",
            "v1u/cpu.cfs_quota_us": b"-1\n",
            "v1u/cpu.cfs_period_us": b"100000\n",
            "v2/cpu.max": b"50000 100000\n",
            "v2u/cpu.max": b"max 100000\n",
        },
    )
    assert cs.read_cfs_quota(str(tmp_path / "v1"), 1).limit_milli_cores == 2500.0
    assert cs.read_cfs_quota(str(tmp_path / "v1u"), 1).limit_milli_cores is None
    assert cs.read_cfs_quota(str(tmp_path / "v2"), 2).limit_milli_cores == 500.0
    assert cs.read_cfs_quota(str(tmp_path / "v2u"), 2) == cs.CfsQuota(quota_us=-1, period_us=100000)


def test_cgroup_psi_is_read_from_resource_pressure_file(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "io.pressure": b"some avg10=1.00 avg60=2.00 avg300=3.00 total=10\n"
            b"full avg10=0.50 avg60=1.00 avg300=1.50 total=5\n"
        },
    )
    psi = cs.read_cgroup_psi(str(tmp_path), "io")
    assert psi.some.avg300 == 3.0 and psi.full is not None and psi.full.total_us == 5


def test_unknown_cgroup_version_is_refused() -> None:
    with pytest.raises(ValueError, match="1 or 2"):
        cs.parse_cpu_stat(CPU_STAT_V1, 3)


def test_missing_cgroup_file_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        cs.read_cpu_usage_ns(str(tmp_path / "gone"), 1)


# ------------------------------------------------------------------------- real cgroups: v1 here, v2 in the VM


@pytest.fixture(params=BOTH_VERSIONS)
def real(request: pytest.FixtureRequest) -> Iterator[V1TestCgroups]:
    yield from cgroups_of_version(request.param, "stats", ("cpu", "cpuacct", "memory", "cpuset"))


def test_real_files_parse_and_follow_a_burning_child(real: V1TestCgroups) -> None:
    """v1: cpuacct.usage, cpu.stat's nr_* and throttled_time, cpu.cfs_quota_us, cpuset.cpus, total_* of
    memory.stat, memory.usage_in_bytes; v2: cpu.stat's usage_usec, nr_* and throttled_usec, cpu.max,
    cpuset.cpus.effective, memory.stat, memory.current."""
    v = real.version
    real.make("pod")
    real.write("cpu", "pod", *(("cpu.max", "10000 100000") if v == 2 else ("cpu.cfs_quota_us", "10000")))
    real.write("cpuset", "pod", "cpuset.cpus", "0")
    real.spawn("pod", "while True: pass")
    # A tenth of a core of quota against a busy loop: the kernel throttles it in most 100 ms periods even when nine
    # other programs want CPU 0 (half a core was more than the loop got beside the v2 VM). Poll, as the shared
    # machine may be busy.
    deadline = time.monotonic() + 5.0
    while True:
        usage_ns = cs.read_cpu_usage_ns(real.path("cpuacct", "pod"), v)
        stat = cs.read_cpu_stat(real.path("cpu", "pod"), v)
        if (usage_ns > 50_000_000 and stat.nr_periods >= 2 and stat.nr_throttled >= 1) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert usage_ns > 50_000_000
    assert stat.nr_periods >= 2 and stat.nr_throttled >= 1 and stat.throttled_ns > 0
    assert cs.read_cfs_quota(real.path("cpu", "pod"), v).limit_milli_cores == 100.0
    assert cs.read_cpuset_cpus(real.path("cpuset", "pod"), v) == (0,)
    memory = cs.read_memory_stat(real.path("memory", "pod"), v)
    assert memory.usage_bytes >= 0
    assert cs.read_memory_usage_bytes(real.path("memory", "pod"), v) >= memory.usage_bytes


def test_real_memory_usage_counts_touched_anonymous_memory(real: V1TestCgroups) -> None:
    real.make("pod")
    child = real.spawn("pod", "b = b'\\x01' * (32 << 20)\nprint('ready', flush=True)\nsys.stdin.readline()")
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    # memcg statistics reach memory.stat through a lazy flush (about every 2 s): poll a little.
    deadline = time.monotonic() + 4.0
    while True:
        usage = cs.read_memory_stat(real.path("memory", "pod"), real.version).usage_bytes
        if abs(usage - (32 << 20)) <= (32 << 20) * 0.1 or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    assert usage == pytest.approx(32 << 20, rel=0.1)
