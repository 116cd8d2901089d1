"""Facts from sysfs: online CPUs and topology (``/sys/devices/system/cpu``), NUMA nodes with their CPUs, memory
and distances (``/sys/devices/system/node``), isolated CPUs, PCI devices' NUMA node and upstream bridge
(``/sys/bus/pci/devices``).

Every reader takes the sysfs mount dir ``sys_dir`` (default ``/sys``; :mod:`koordlet.system.roots`).

The CPU-list syntax is shared with the API package (``koordlet.api.cpuset``) and re-exported here.
A machine without NUMA information in sysfs (arm64 minikube, Koordinator #89) is reported as NUMA node 0
rather than failing.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

from koordlet.api.cpuset import CPUListError, format_cpu_list, parse_cpu_list
from koordlet.system.procfs import KeptFile, ProcParseError
from koordlet.system.roots import SYS_DIR

logger = logging.getLogger(__name__)

CPU_SYSFS = "devices/system/cpu"
NODE_SYSFS = "devices/system/node"
PCI_DEVICES_SYSFS = "bus/pci/devices"
_NODE_DIR = re.compile(r"^node(\d+)$")

__all__ = [
    "CPUInfo",
    "CPUListError",
    "HugePages",
    "NUMAMemInfo",
    "NUMAMemInfoFiles",
    "NUMANode",
    "NodeTopology",
    "SysfsError",
    "format_cpu_list",
    "num_online_cpus",
    "parse_cpu_list",
    "pci_device_numa_node",
    "parse_numa_meminfo",
    "pci_device_parent_bridge",
    "read_cpu_topology",
    "read_isolated_cpus",
    "read_node_hugepages",
    "read_node_topology",
    "read_numa_nodes",
    "read_online_cpus",
]


class SysfsError(OSError):
    """A sysfs file is missing or malformed."""


@dataclass(frozen=True, slots=True)
class CPUInfo:
    """One logical CPU. ``core_id`` is unique only within its socket; use :attr:`core_key` to group."""

    cpu_id: int
    core_id: int
    socket_id: int
    node_id: int

    @property
    def core_key(self) -> tuple[int, int]:
        """(socket, core): the hyper-threads of one physical core share it."""
        return (self.socket_id, self.core_id)


def _read_text(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read()


def read_online_cpus(sys_dir: str = SYS_DIR) -> tuple[int, ...]:
    """Ids of the online CPUs (``/sys/devices/system/cpu/online``)."""
    path = os.path.join(sys_dir, CPU_SYSFS, "online")
    try:
        return parse_cpu_list(_read_text(path))
    except (OSError, CPUListError) as exc:
        raise SysfsError(f"cannot read online CPUs from {path}: {exc}") from exc


def num_online_cpus(sys_dir: str = SYS_DIR) -> int:
    return len(read_online_cpus(sys_dir))


def _read_int(path: str) -> int:
    try:
        return int(_read_text(path).strip())
    except (OSError, ValueError) as exc:
        raise SysfsError(f"cannot read an integer from {path}: {exc}") from exc


def _cpu_nodes_from_node_dirs(sys_dir: str) -> dict[int, int]:
    """cpu id → NUMA node from ``/sys/devices/system/node/node*/cpulist`` (fallback when cpuN has no nodeM)."""
    base = os.path.join(sys_dir, NODE_SYSFS)
    nodes: dict[int, int] = {}
    try:
        entries = os.listdir(base)
    except OSError:
        return nodes
    for entry in entries:
        match = _NODE_DIR.match(entry)
        if not match:
            continue
        try:
            cpus = parse_cpu_list(_read_text(os.path.join(base, entry, "cpulist")))
        except (OSError, CPUListError):
            logger.debug("skipping unreadable %s/%s/cpulist", base, entry)
            continue
        for cpu in cpus:
            nodes[cpu] = int(match.group(1))
    return nodes


def read_cpu_topology(sys_dir: str = SYS_DIR) -> tuple[CPUInfo, ...]:
    """Topology of every online CPU, sorted by cpu id.

    core and socket from ``cpuN/topology/{core_id,physical_package_id}``; NUMA node from the ``cpuN/nodeM``
    link, else from ``node/nodeM/cpulist``, else 0.
    """
    base = os.path.join(sys_dir, CPU_SYSFS)
    fallback_nodes: dict[int, int] | None = None
    infos: list[CPUInfo] = []
    for cpu in read_online_cpus(sys_dir):
        cpu_dir = os.path.join(base, f"cpu{cpu}")
        core_id = _read_int(os.path.join(cpu_dir, "topology", "core_id"))
        socket_id = _read_int(os.path.join(cpu_dir, "topology", "physical_package_id"))
        node_id: int | None = None
        try:
            for entry in os.listdir(cpu_dir):
                match = _NODE_DIR.match(entry)
                if match:
                    node_id = int(match.group(1))
                    break
        except OSError as exc:
            raise SysfsError(f"cannot list {cpu_dir}: {exc}") from exc
        if node_id is None:
            if fallback_nodes is None:
                fallback_nodes = _cpu_nodes_from_node_dirs(sys_dir)
            node_id = fallback_nodes.get(cpu, 0)
        infos.append(CPUInfo(cpu_id=cpu, core_id=core_id, socket_id=max(socket_id, 0), node_id=node_id))
    return tuple(infos)


# ------------------------------------------------------------------------------------------------ NUMA

_NODE_MEM_TOTAL = re.compile(r"^Node\s+\d+\s+MemTotal:\s+(\d+)\s*kB\s*$", re.M)


@dataclass(frozen=True, slots=True)
class NUMANode:
    """One NUMA node: its online CPUs, its memory (``nodeN/meminfo`` MemTotal) and its distance to every node.

    A memory-only node (CXL, some AMD/ARM parts) has no CPUs; ``distances`` is ((node id, distance), ...) in
    node order, empty where the kernel does not say.
    """

    node_id: int
    cpus: tuple[int, ...]
    memory_total_bytes: int
    distances: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class NodeTopology:
    """The machine as the NodeResourceTopology reports it: every online CPU, every NUMA node, isolated CPUs."""

    cpus: tuple[CPUInfo, ...]
    numa_nodes: tuple[NUMANode, ...]
    isolated_cpus: tuple[int, ...] = ()

    @property
    def online_cpus(self) -> tuple[int, ...]:
        return tuple(cpu.cpu_id for cpu in self.cpus)

    def numa_node(self, node_id: int) -> NUMANode | None:
        for node in self.numa_nodes:
            if node.node_id == node_id:
                return node
        return None


def read_isolated_cpus(sys_dir: str = SYS_DIR) -> tuple[int, ...]:
    """CPUs taken off the scheduler's balancing by ``isolcpus=`` (``cpu/isolated``); () on kernels without it."""
    path = os.path.join(sys_dir, CPU_SYSFS, "isolated")
    try:
        text = _read_text(path)
    except FileNotFoundError:
        return ()
    except OSError as exc:
        raise SysfsError(f"cannot read isolated CPUs from {path}: {exc}") from exc
    try:
        return parse_cpu_list(text)
    except CPUListError as exc:
        raise SysfsError(f"cannot read isolated CPUs from {path}: {exc}") from exc


def _node_ids(sys_dir: str) -> list[int]:
    base = os.path.join(sys_dir, NODE_SYSFS)
    try:
        entries = os.listdir(base)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise SysfsError(f"cannot list {base}: {exc}") from exc
    return sorted(int(m.group(1)) for m in map(_NODE_DIR.match, entries) if m)


def _node_memory_bytes(path: str) -> int:
    try:
        match = _NODE_MEM_TOTAL.search(_read_text(path))
    except OSError as exc:
        raise SysfsError(f"cannot read {path}: {exc}") from exc
    if match is None:
        raise SysfsError(f"no MemTotal line in {path}")
    return int(match.group(1)) * 1024


def _node_distances(path: str, node_ids: list[int]) -> tuple[tuple[int, int], ...]:
    """``nodeN/distance`` lists one distance per online node, in node order."""
    try:
        values = [int(v) for v in _read_text(path).split()]
    except FileNotFoundError:
        return ()
    except (OSError, ValueError) as exc:
        raise SysfsError(f"cannot read NUMA distances from {path}: {exc}") from exc
    if len(values) != len(node_ids):
        raise SysfsError(f"{path} has {len(values)} distances for {len(node_ids)} NUMA nodes")
    return tuple(zip(node_ids, values, strict=True))


def read_numa_nodes(sys_dir: str = SYS_DIR, online_cpus: tuple[int, ...] | None = None) -> tuple[NUMANode, ...]:
    """Every NUMA node under ``devices/system/node``, sorted by id, with its online CPUs.

    A kernel without NUMA support has no node directory: the machine is then one node 0 holding every online
    CPU, with unknown memory (0).
    """
    online = read_online_cpus(sys_dir) if online_cpus is None else online_cpus
    online_set = set(online)
    node_ids = _node_ids(sys_dir)
    if not node_ids:
        return (NUMANode(node_id=0, cpus=tuple(online), memory_total_bytes=0),)
    base = os.path.join(sys_dir, NODE_SYSFS)
    nodes = []
    for node_id in node_ids:
        node_dir = os.path.join(base, f"node{node_id}")
        cpulist = os.path.join(node_dir, "cpulist")
        try:
            cpus = parse_cpu_list(_read_text(cpulist))
        except (OSError, CPUListError) as exc:
            raise SysfsError(f"cannot read {cpulist}: {exc}") from exc
        nodes.append(NUMANode(
            node_id=node_id,
            cpus=tuple(cpu for cpu in cpus if cpu in online_set),
            memory_total_bytes=_node_memory_bytes(os.path.join(node_dir, "meminfo")),
            distances=_node_distances(os.path.join(node_dir, "distance"), node_ids),
        ))
    return tuple(nodes)


def read_node_topology(sys_dir: str = SYS_DIR) -> NodeTopology:
    """CPUs, NUMA nodes and isolated CPUs in one read; raises SysfsError when sysfs is missing or malformed."""
    cpus = read_cpu_topology(sys_dir)
    return NodeTopology(
        cpus=cpus,
        numa_nodes=read_numa_nodes(sys_dir, tuple(cpu.cpu_id for cpu in cpus)),
        isolated_cpus=read_isolated_cpus(sys_dir),
    )


# ------------------------------------------------------------------------------------------- hugepages

_HUGEPAGES_DIR = re.compile(r"^hugepages-(\d+)kB$")


@dataclass(frozen=True, slots=True)
class HugePages:
    """One huge page size on one NUMA node (``nodeN/hugepages/hugepages-<size>kB/``): the pool the kernel holds
    (``nr_hugepages``) and the pages of it not in use (``free_hugepages``)."""

    page_size_kb: int
    total_pages: int
    free_pages: int

    @property
    def total_bytes(self) -> int:
        return self.total_pages * self.page_size_kb * 1024

    @property
    def free_bytes(self) -> int:
        return self.free_pages * self.page_size_kb * 1024


def read_node_hugepages(sys_dir: str = SYS_DIR) -> dict[int, tuple[HugePages, ...]]:
    """{NUMA node id: its huge page pools, by page size} from ``devices/system/node/node*/hugepages``; a node
    (or a kernel) without huge page support has none. A size whose counters are unreadable is left out."""
    out: dict[int, tuple[HugePages, ...]] = {}
    for node_id in _node_ids(sys_dir):
        base = os.path.join(sys_dir, NODE_SYSFS, f"node{node_id}", "hugepages")
        try:
            names = sorted(os.listdir(base))
        except OSError:
            continue
        pools = []
        for name in names:
            match = _HUGEPAGES_DIR.match(name)
            if match is None:
                continue
            try:
                total = int(_read_text(os.path.join(base, name, "nr_hugepages")))
                free = int(_read_text(os.path.join(base, name, "free_hugepages")))
            except (OSError, ValueError) as exc:
                logger.warning("huge pages of %s unreadable: %s", os.path.join(base, name), exc)
                continue
            pools.append(HugePages(int(match.group(1)), total, free))
        out[node_id] = tuple(sorted(pools, key=lambda pool: pool.page_size_kb))
    return out


# ------------------------------------------------------------------------------------------------- PCI


def _pci_device_dir(bus_id: str, sys_dir: str) -> str:
    return os.path.join(sys_dir, PCI_DEVICES_SYSFS, bus_id)


def pci_device_numa_node(bus_id: str, sys_dir: str = SYS_DIR) -> int | None:
    """NUMA node of a PCI device from sysfs; -1 there means the platform does not say."""
    try:
        with open(os.path.join(_pci_device_dir(bus_id, sys_dir), "numa_node"), encoding="ascii") as f:
            node = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def pci_device_parent_bridge(bus_id: str, sys_dir: str = SYS_DIR) -> str:
    """The bridge above a PCI device in the PCI tree (its parent directory in /sys/devices), "" if unknown.

    Devices behind the same PCIe switch share this id.
    """
    link = _pci_device_dir(bus_id, sys_dir)
    if not os.path.lexists(link):
        return ""
    return os.path.basename(os.path.dirname(os.path.realpath(link)))



# ------------------------------------------------------------------------------------- NUMA memory use

_NUMA_MEMINFO_KEYS = {b"MemTotal": "total", b"MemFree": "free", b"Active(file)": "active_file",
                      b"Inactive(file)": "inactive_file", b"SReclaimable": "sreclaimable"}


@dataclass(frozen=True, slots=True)
class NUMAMemInfo:
    """The fields of ``nodeN/meminfo`` a NUMA node's memory use is worked out from (bytes)."""

    node_id: int
    total_bytes: int
    free_bytes: int
    active_file_bytes: int
    inactive_file_bytes: int
    sreclaimable_bytes: int

    @property
    def used_bytes(self) -> int:
        """MemTotal − (MemFree + Active(file) + Inactive(file) + SReclaimable), at least 0: a node's meminfo has
        no MemAvailable, so its reclaimable part is estimated as Koordinator does (#3138, util/meminfo.go
        NUMAMemUsageBytes; the kernel's si_mem_available without the watermark corrections)."""
        available = self.free_bytes + self.active_file_bytes + self.inactive_file_bytes + self.sreclaimable_bytes
        return max(self.total_bytes - available, 0)


def parse_numa_meminfo(data: bytes, node_id: int) -> NUMAMemInfo:
    """``Node N Key:  value kB`` lines of ``nodeN/meminfo``; a missing MemTotal or MemFree is an error, a
    missing file LRU or SReclaimable line (old kernels) counts 0."""
    values: dict[str, int] = {}
    for line in data.split(b"\n"):
        head, sep, rest = line.partition(b":")
        if not sep:
            continue
        key = head.split()[-1] if head.split() else b""
        name = _NUMA_MEMINFO_KEYS.get(key)
        if name is None:
            continue
        parts = rest.split()
        try:
            value = int(parts[0])
        except (IndexError, ValueError) as err:
            raise ProcParseError(f"bad node{node_id}/meminfo line {line[:80]!r}") from err
        values[name] = value * 1024 if len(parts) > 1 and parts[1] == b"kB" else value
    if "total" not in values or "free" not in values:
        raise ProcParseError(f"node{node_id}/meminfo lacks MemTotal or MemFree")
    return NUMAMemInfo(node_id, values["total"], values["free"], values.get("active_file", 0),
                       values.get("inactive_file", 0), values.get("sreclaimable", 0))


class NUMAMemInfoFiles:
    """Every NUMA node's ``meminfo``, read each tick through kept descriptors (the node collector). The node
    list is read when this is made: a NUMA node added later (memory hotplug) is seen after the agent restarts."""

    __slots__ = ("_files",)

    def __init__(self, sys_dir: str = SYS_DIR) -> None:
        base = os.path.join(sys_dir, NODE_SYSFS)
        self._files = tuple((node_id, KeptFile(os.path.join(base, f"node{node_id}", "meminfo")))
                            for node_id in _node_ids(sys_dir))

    @property
    def node_ids(self) -> tuple[int, ...]:
        return tuple(node_id for node_id, _ in self._files)

    def read(self) -> tuple[NUMAMemInfo, ...]:
        """Each node's meminfo, by node id; raises OSError or ProcParseError (a node gone, a bad file)."""
        return tuple(parse_numa_meminfo(kept.read(), node_id) for node_id, kept in self._files)

    def close(self) -> None:
        for _, kept in self._files:
            kept.close()
