"""Readers for cgroup statistics files, v1 and v2: CPU usage and throttling, memory, cpuset, CFS quota, PSI.

Each reader takes the cgroup directory to read (already joined with its hierarchy: on v1 the cpuacct,
cpu, memory and cpuset files live in different mounts) and the cgroup version (``1`` or ``2``; an
``IntEnum`` with those values works too). Parsers take raw bytes and are tested on fixture files copied
from a real v1 kernel and from the cgroup v2 kernel documentation.

File names per version (docs/koordinator.md §10, docs/node-interfaces.md §9.1):
  CPU usage        v1 ``cpuacct.usage`` (ns)            v2 ``cpu.stat`` ``usage_usec``
  throttling       v1 ``cpu.stat`` (throttled_time ns)  v2 ``cpu.stat`` (throttled_usec)
  memory stats     ``memory.stat`` (v1 hierarchical ``total_*`` fields; v2 the plain names)
  memory usage     v1 ``memory.usage_in_bytes``         v2 ``memory.current``
  CFS quota        v1 ``cpu.cfs_quota_us`` + ``cpu.cfs_period_us``   v2 ``cpu.max``
  cpuset           ``cpuset.cpus`` (v2 reads ``cpuset.cpus.effective``: an empty ``cpuset.cpus`` inherits)
  processes        ``cgroup.procs`` (both versions; on v1 read it in the cpu hierarchy)
  threads          v1 ``tasks``                         v2 ``cgroup.threads``
  memory per NUMA  ``memory.numa_stat``: v1 ``hierarchical_*`` lines in pages, v2 per-type lines in bytes
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from koordlet.api.cpuset import CPUListError, parse_cpu_list
from koordlet.system.procfs import PSI_RESOURCES, ProcParseError, Psi, read_file_bytes, read_psi

logger = logging.getLogger(__name__)


class CgroupStatError(ProcParseError):
    """A cgroup statistics file did not have the expected format."""


def _is_v2(version: int) -> bool:
    if int(version) == 2:
        return True
    if int(version) == 1:
        return False
    raise ValueError(f"cgroup version must be 1 or 2, got {version!r}")


_Wanted = tuple[tuple[bytes, bytes, str], ...]


def _wanted(keys: dict[bytes, str]) -> _Wanted:
    """(``key `` at the start, ``\\nkey `` anywhere, field name) of each wanted key, built once."""
    return tuple((key + b" ", b"\n" + key + b" ", name) for key, name in keys.items())


def _parse_flat_keyed(data: bytes, wanted: _Wanted) -> dict[str, int]:
    """Values of the wanted keys of a flat-keyed file (``key value`` per line).

    Looks each wanted key up with ``bytes.find`` instead of splitting every line: memory.stat has
    40-70 lines of which we want five, and this runs for every pod and container every second.
    """
    found: dict[str, int] = {}
    find = data.find
    for head, needle, name in wanted:
        if data.startswith(head):
            start = len(head)
        else:
            at = find(needle)
            if at < 0:
                continue
            start = at + len(needle)
        end = find(b"\n", start)
        value = data[start:] if end < 0 else data[start:end]
        try:
            found[name] = int(value)
        except ValueError as err:
            raise CgroupStatError(f"bad value for {head.decode().strip()}: {value[:40]!r}") from err
    return found


def _parse_single_int(data: bytes, path_hint: str) -> int:
    try:
        return int(data.strip())
    except ValueError as err:
        raise CgroupStatError(f"{path_hint}: expected one integer, got {data[:40]!r}") from err


# ------------------------------------------------------------------------------------------- CPU usage


def parse_cpuacct_usage(data: bytes) -> int:
    """v1 ``cpuacct.usage``: total CPU time in nanoseconds."""
    return _parse_single_int(data, "cpuacct.usage")


@dataclass(frozen=True, slots=True)
class CpuStat:
    nr_periods: int
    nr_throttled: int
    throttled_ns: int
    # Only v2 reports usage in cpu.stat; None on v1 (read cpuacct.usage there).
    usage_ns: int | None


_CPU_STAT_V1 = _wanted({b"nr_periods": "nr_periods", b"nr_throttled": "nr_throttled", b"throttled_time": "throttled"})
_CPU_STAT_V2 = _wanted({
    b"usage_usec": "usage",
    b"nr_periods": "nr_periods",
    b"nr_throttled": "nr_throttled",
    b"throttled_usec": "throttled",
})


def _cpu_stat_fields(data: bytes, v2: bool) -> dict[str, int]:
    fields = _parse_flat_keyed(data, _CPU_STAT_V2 if v2 else _CPU_STAT_V1)
    # v2 has usage_usec even without the cpu controller enabled, but no period fields then: count them 0.
    if v2 and "usage" not in fields:
        raise CgroupStatError("cpu.stat (v2) lacks usage_usec")
    return fields


def parse_cpu_stat(data: bytes, version: int) -> CpuStat:
    v2 = _is_v2(version)
    fields = _cpu_stat_fields(data, v2)
    scale = 1000 if v2 else 1
    return CpuStat(
        nr_periods=fields.get("nr_periods", 0),
        nr_throttled=fields.get("nr_throttled", 0),
        throttled_ns=fields.get("throttled", 0) * scale,
        usage_ns=fields["usage"] * 1000 if v2 else None,
    )


def cpu_stat_counters(data: bytes, version: int) -> tuple[int | None, int, int]:
    """(usage ns, None on v1; nr_periods; nr_throttled) of ``cpu.stat``, as :func:`parse_cpu_stat` reads them:
    what the 1 s collector needs of every cgroup, without building a :class:`CpuStat` each time."""
    v2 = _is_v2(version)
    fields = _cpu_stat_fields(data, v2)
    return fields["usage"] * 1000 if v2 else None, fields.get("nr_periods", 0), fields.get("nr_throttled", 0)


def read_cpu_stat(cpu_dir: str, version: int) -> CpuStat:
    """``cpu.stat`` of a cgroup (v1: the dir in the cpu hierarchy)."""
    return parse_cpu_stat(read_file_bytes(os.path.join(cpu_dir, "cpu.stat")), version)


def read_cpu_usage_ns(cpuacct_dir: str, version: int) -> int:
    """Cumulative CPU time of a cgroup in ns (v1: the dir in the cpuacct hierarchy)."""
    if _is_v2(version):
        usage = read_cpu_stat(cpuacct_dir, version).usage_ns
        if usage is None:
            raise CgroupStatError(f"{cpuacct_dir}/cpu.stat has no usage_usec")
        return usage
    return parse_cpuacct_usage(read_file_bytes(os.path.join(cpuacct_dir, "cpuacct.usage")))


# ---------------------------------------------------------------------------------------------- memory


@dataclass(frozen=True, slots=True)
class MemoryStat:
    inactive_anon_bytes: int
    active_anon_bytes: int
    unevictable_bytes: int
    inactive_file_bytes: int
    active_file_bytes: int

    @property
    def usage_bytes(self) -> int:
        """Memory "usage" without page cache: inactive_anon + active_anon + unevictable (docs/koordinator.md §7.1)."""
        return self.inactive_anon_bytes + self.active_anon_bytes + self.unevictable_bytes

    @property
    def usage_with_page_cache_bytes(self) -> int:
        """Usage plus the page cache: adds active_file + inactive_file (docs/koordinator.md §7.1)."""
        return self.usage_bytes + self.active_file_bytes + self.inactive_file_bytes


_MEMORY_FIELDS = ("inactive_anon", "active_anon", "unevictable", "inactive_file", "active_file")
# v1 dirs have children, so the hierarchical total_* fields are the ones that count the whole subtree.
_MEMORY_STAT_V1 = _wanted({b"total_" + name.encode(): name for name in _MEMORY_FIELDS})
_MEMORY_STAT_V2 = _wanted({name.encode(): name for name in _MEMORY_FIELDS})


def _memory_fields(data: bytes, version: int) -> dict[str, int]:
    fields = _parse_flat_keyed(data, _MEMORY_STAT_V2 if _is_v2(version) else _MEMORY_STAT_V1)
    if len(fields) < len(_MEMORY_FIELDS):
        missing = [name for name in _MEMORY_FIELDS if name not in fields]
        raise CgroupStatError(f"memory.stat (v{int(version)}) lacks {', '.join(missing)}")
    return fields


def memory_usage(data: bytes, version: int) -> tuple[int, int]:
    """(usage, usage with page cache) of ``memory.stat``, as :class:`MemoryStat` sums them: what the 1 s
    collector needs of every cgroup, without building a :class:`MemoryStat` each time."""
    fields = _memory_fields(data, version)
    usage = fields["inactive_anon"] + fields["active_anon"] + fields["unevictable"]
    return usage, usage + fields["active_file"] + fields["inactive_file"]


def parse_memory_stat(data: bytes, version: int) -> MemoryStat:
    fields = _memory_fields(data, version)
    return MemoryStat(
        inactive_anon_bytes=fields["inactive_anon"],
        active_anon_bytes=fields["active_anon"],
        unevictable_bytes=fields["unevictable"],
        inactive_file_bytes=fields["inactive_file"],
        active_file_bytes=fields["active_file"],
    )


def read_memory_stat(memory_dir: str, version: int) -> MemoryStat:
    return parse_memory_stat(read_file_bytes(os.path.join(memory_dir, "memory.stat")), version)


def read_memory_usage_bytes(memory_dir: str, version: int) -> int:
    """The kernel's own charge counter (includes page cache): v1 memory.usage_in_bytes, v2 memory.current."""
    name = "memory.current" if _is_v2(version) else "memory.usage_in_bytes"
    return _parse_single_int(read_file_bytes(os.path.join(memory_dir, name)), name)


# ------------------------------------------------------------------------------------------ cpuset, CFS


def read_cpuset_cpus(cpuset_dir: str, version: int) -> tuple[int, ...]:
    """CPUs a cgroup may run on (v1 ``cpuset.cpus``; v2 ``cpuset.cpus.effective``)."""
    name = "cpuset.cpus.effective" if _is_v2(version) else "cpuset.cpus"
    data = read_file_bytes(os.path.join(cpuset_dir, name))
    try:
        return parse_cpu_list(data.decode())
    except (CPUListError, UnicodeDecodeError) as err:
        raise CgroupStatError(f"{cpuset_dir}/{name}: {err}") from err


@dataclass(frozen=True, slots=True)
class CfsQuota:
    quota_us: int  # -1: unlimited
    period_us: int

    @property
    def limit_milli_cores(self) -> float | None:
        """quota × 1000 / period, None when unlimited (Koordinator BE real limit, docs/koordinator.md §7.1)."""
        if self.quota_us < 0 or self.period_us <= 0:
            return None
        return self.quota_us * 1000.0 / self.period_us


def parse_cpu_max(data: bytes) -> CfsQuota:
    """v2 ``cpu.max``: ``$MAX $PERIOD`` where $MAX may be ``max``."""
    parts = data.split()
    if len(parts) != 2:
        raise CgroupStatError(f"cpu.max: expected '$MAX $PERIOD', got {data[:40]!r}")
    try:
        quota = -1 if parts[0] == b"max" else int(parts[0])
        return CfsQuota(quota_us=quota, period_us=int(parts[1]))
    except ValueError as err:
        raise CgroupStatError(f"cpu.max: bad value {data[:40]!r}") from err


def parse_quota_us(text: str) -> int:
    """A CFS quota as read back through the executor: v1 ``cpu.cfs_quota_us`` ("-1", "150000") or v2
    ``cpu.max`` ("max 100000", "150000 100000"); -1 = unlimited. ValueError on anything else."""
    first = text.split()[0] if text.split() else ""
    if first == "max":
        return -1
    value = int(first)
    return -1 if value < 0 else value


def read_cfs_quota(cpu_dir: str, version: int) -> CfsQuota:
    if _is_v2(version):
        return parse_cpu_max(read_file_bytes(os.path.join(cpu_dir, "cpu.max")))
    quota = _parse_single_int(read_file_bytes(os.path.join(cpu_dir, "cpu.cfs_quota_us")), "cpu.cfs_quota_us")
    period = _parse_single_int(read_file_bytes(os.path.join(cpu_dir, "cpu.cfs_period_us")), "cpu.cfs_period_us")
    return CfsQuota(quota_us=quota if quota >= 0 else -1, period_us=period)


# ------------------------------------------------------------------------------------------- processes


def parse_cgroup_procs(data: bytes) -> tuple[int, ...]:
    """The PIDs of a ``cgroup.procs`` file (one per line), sorted and without duplicates."""
    pids: set[int] = set()
    for line in data.split():
        try:
            pids.add(int(line))
        except ValueError:
            raise CgroupStatError(f"cgroup.procs: not a PID: {line[:32]!r}") from None
    return tuple(sorted(pids))


def read_cgroup_procs(cgroup_dir: str) -> tuple[int, ...]:
    """The PIDs in ``cgroup_dir`` itself (not its children); OSError when the cgroup is gone."""
    return parse_cgroup_procs(read_file_bytes(os.path.join(cgroup_dir, "cgroup.procs")))


def threads_file(version: int) -> str:
    """The file listing every thread of a cgroup: v1 ``tasks``, v2 ``cgroup.threads``."""
    return "cgroup.threads" if _is_v2(version) else "tasks"


def read_cgroup_threads(cgroup_dir: str, version: int) -> tuple[int, ...]:
    """The thread ids in ``cgroup_dir`` itself (on v1 read it in the cpu hierarchy); OSError when it is gone."""
    return parse_cgroup_procs(read_file_bytes(os.path.join(cgroup_dir, threads_file(version))))


# ------------------------------------------------------------------------------------------- NUMA memory

# The lines of memory.numa_stat summed into a cgroup's memory use per NUMA node: the same parts as the usage of
# memory.stat (anon LRU + unevictable, no page cache). v1 counts pages and needs the hierarchical lines (a pod
# dir's own "anon=" holds nothing: its pages are charged to its containers' dirs); v2 counts bytes, descendants
# included.
_NUMA_LINES_V1 = (b"hierarchical_anon", b"hierarchical_unevictable")
_NUMA_LINES_V2 = (b"active_anon", b"inactive_anon", b"unevictable")


PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def numa_stat_path(memory_dir: str) -> str:
    """The ``memory.numa_stat`` of a cgroup given its dir in the memory hierarchy."""
    return os.path.join(memory_dir, "memory.numa_stat")


def numa_memory_usage(data: bytes, version: int, page_size: int = PAGE_SIZE) -> dict[int, int]:
    """NUMA node id → bytes of a ``memory.numa_stat``: the anon LRU and unevictable memory on each node. The wanted
    lines are looked up (``bytes.find``), not every line split: this runs for every pod each second."""
    v2 = _is_v2(version)
    wanted, unit = (_NUMA_LINES_V2, 1) if v2 else (_NUMA_LINES_V1, page_size)
    usage: dict[int, int] = {}
    for key in wanted:
        head = key + (b" " if v2 else b"=")
        at = 0 if data.startswith(head) else data.find(b"\n" + head) + 1
        if at == 0 and not data.startswith(head):
            raise CgroupStatError(f"memory.numa_stat lacks {key.decode()}")
        line_end = data.find(b"\n", at)
        for part in data[at:line_end if line_end >= 0 else len(data)].split()[1:]:
            node, sep, value = part.partition(b"=")
            if not sep or not node.startswith(b"N"):
                continue
            try:
                node_id, amount = int(node[1:]), int(value)
            except ValueError as err:
                raise CgroupStatError(f"memory.numa_stat: bad entry {part[:40]!r}") from err
            usage[node_id] = usage.get(node_id, 0) + amount * unit
    return usage


# ------------------------------------------------------------------------------------------------- PSI


def read_cgroup_psi(cgroup_dir: str, resource: str) -> Psi:
    """``<resource>.pressure`` of a cgroup (v2; Alinux/Anolis v1 with PSI enabled)."""
    if resource not in ("cpu", "memory", "io"):
        raise ValueError(f"unknown PSI resource {resource!r}")
    return read_psi(os.path.join(cgroup_dir, f"{resource}.pressure"))


def cgroup_psi_files(cgroup_dir: str) -> tuple[tuple[str, str], ...] | None:
    """``(resource, path)`` of each ``<resource>.pressure`` of a cgroup, for reading through kept
    descriptors; None when the cgroup has no ``cpu.pressure`` (no PSI there)."""
    if not os.path.exists(os.path.join(cgroup_dir, "cpu.pressure")):
        return None
    return tuple((resource, os.path.join(cgroup_dir, f"{resource}.pressure")) for resource in PSI_RESOURCES)


@dataclass(frozen=True, slots=True)
class UsageFiles:
    """The files a per-tick usage reading of one cgroup takes, for reading through kept descriptors."""

    cpu_stat: str
    cpuacct_usage: str | None  # v1 only: v2 has usage_usec in cpu.stat
    memory_stat: str


def usage_files(cpu_dir: str, cpuacct_dir: str, memory_dir: str, version: int) -> UsageFiles:
    """The usage files of a cgroup given its dir in each hierarchy (v2: the same dir three times)."""
    return UsageFiles(
        cpu_stat=os.path.join(cpu_dir, "cpu.stat"),
        cpuacct_usage=None if _is_v2(version) else os.path.join(cpuacct_dir, "cpuacct.usage"),
        memory_stat=os.path.join(memory_dir, "memory.stat"),
    )
