"""Fake sysfs CPU/NUMA trees of real machine shapes, built from a compact description.

The files are what the kernel writes: ``cpu/{online,possible,isolated}``, ``cpuN/online`` (absent for cpu0,
which cannot go offline), ``cpuN/topology/{core_id,physical_package_id}`` only for online CPUs (the kernel
removes the topology directory of an offline CPU), the ``cpuN/nodeM`` link, and
``node/nodeM/{cpulist,meminfo,distance}`` plus ``node/online``, and per node the huge page pools of both x86
sizes (``nodeM/hugepages/hugepages-{2048,1048576}kB/{nr,free,surplus}_hugepages``, zero unless reserved).
``nodeM/meminfo`` has every line a 6.x kernel writes there, in its order and spacing (:func:`node_meminfo`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from koordlet.api.cpuset import format_cpu_list

GIB_KB = 1024 * 1024
HUGEPAGE_SIZES_KB = (2048, 1048576)  # x86-64: 2 MiB and 1 GiB


@dataclass(frozen=True)
class Machine:
    """``cpus``: every possible CPU → (core_id, package_id, NUMA node); ``offline`` of those are offline."""

    name: str
    cpus: dict[int, tuple[int, int, int]]
    node_memory_kb: dict[int, int]
    offline: frozenset[int] = frozenset()
    isolated: frozenset[int] = frozenset()
    distances: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # NUMA node → {page size kB: (nr_hugepages, free_hugepages)}; sizes not named hold 0 pages.
    hugepages: dict[int, dict[int, tuple[int, int]]] = field(default_factory=dict)
    # NUMA node → meminfo fields in kB (MemFree, Active(file), Inactive(file), SReclaimable, ...) that differ from
    # node_meminfo's defaults.
    meminfo: dict[int, dict[str, int]] = field(default_factory=dict)

    @property
    def online(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.cpus) - self.offline))


def one_socket_no_smt(cores: int = 4, memory_gib: int = 16) -> Machine:
    """A small VM or desktop part: one package, one NUMA node, one thread per core."""
    return Machine("1-socket-no-smt", {cpu: (cpu, 0, 0) for cpu in range(cores)}, {0: memory_gib * GIB_KB})


def two_sockets_smt(core_ids: tuple[int, ...] = (0, 1, 2, 8), memory_gib: int = 64) -> Machine:
    """A two-socket Intel Xeon with hyper-threading: Linux numbers the first thread of every core (socket 0,
    then socket 1), then the second threads in the same order, so cpuK and cpuK+N/2 are siblings. Core ids
    have holes as on real Xeons (``core_ids`` per socket), and repeat on each socket."""
    per_socket = len(core_ids)
    half = 2 * per_socket
    cpus: dict[int, tuple[int, int, int]] = {}
    for thread in range(2):
        for socket in range(2):
            for index, core in enumerate(core_ids):
                cpus[thread * half + socket * per_socket + index] = (core, socket, socket)
    return Machine("2-sockets-smt", cpus, {0: memory_gib * GIB_KB, 1: memory_gib * GIB_KB},
                   distances={0: (10, 21), 1: (21, 10)})


def four_numa_with_holes() -> Machine:
    """Two sockets split in two NUMA nodes each (sub-NUMA clustering), 2 cores × 2 threads per node (first
    threads cpu0-7, second threads cpu8-15), with CPUs 3, 11 and 14 taken offline (``echo 0 > cpuN/online``):
    the numbering has holes, node 1 lost a whole core and node 3 one thread. CPUs 4 and 12 (one core of
    node 2) are isolated (``isolcpus=4,12``)."""
    cpus: dict[int, tuple[int, int, int]] = {}
    for thread in range(2):
        for node in range(4):
            for index in range(2):
                cpus[thread * 8 + node * 2 + index] = ((node % 2) * 2 + index, node // 2, node)
    near, same_socket, far = 10, 11, 32
    distances = {
        node: tuple(near if other == node else same_socket if other // 2 == node // 2 else far for other in range(4))
        for node in range(4)
    }
    return Machine("4-numa-holes", cpus, dict.fromkeys(range(4), 32 * GIB_KB), offline=frozenset({3, 11, 14}),
                   isolated=frozenset({4, 12}), distances=distances)


MACHINES = (one_socket_no_smt, two_sockets_smt, four_numa_with_holes)

# The lines of /sys/devices/system/node/nodeN/meminfo on Linux 6.x (drivers/base/node.c node_read_meminfo), in order.
_NODE_MEMINFO_KEYS = ("MemTotal", "MemFree", "MemUsed", "SwapCached", "Active", "Inactive", "Active(anon)",
                      "Inactive(anon)", "Active(file)", "Inactive(file)", "Unevictable", "Mlocked", "Dirty",
                      "Writeback", "FilePages", "Mapped", "AnonPages", "Shmem", "KernelStack", "PageTables",
                      "SecPageTables", "NFS_Unstable", "Bounce", "WritebackTmp", "KReclaimable", "Slab", "SReclaimable",
                      "SUnreclaim", "AnonHugePages", "ShmemHugePages", "ShmemPmdMapped", "FileHugePages",
                      "FilePmdMapped")


def node_meminfo(node: int, total_kb: int, fields: dict[str, int] | None = None) -> str:
    """``nodeN/meminfo`` as the kernel writes it: ``Node N Key:`` padded, the value right-aligned in 8, `` kB``, then
    the three HugePages lines without unit. Defaults: half free, 1/16 each of active and inactive file, 1/32
    reclaimable slab; ``fields`` (kB) override them, MemUsed and the sums follow."""
    values = dict.fromkeys(_NODE_MEMINFO_KEYS, 0)
    values.update({"MemTotal": total_kb, "MemFree": total_kb // 2, "Active(file)": total_kb // 16,
                   "Inactive(file)": total_kb // 16, "SReclaimable": total_kb // 32})
    values.update(fields or {})
    values["MemUsed"] = values["MemTotal"] - values["MemFree"]
    values["Active"] = values["Active(anon)"] + values["Active(file)"]
    values["Inactive"] = values["Inactive(anon)"] + values["Inactive(file)"]
    values["KReclaimable"] = values["SReclaimable"]
    values["Slab"] = values["SReclaimable"] + values["SUnreclaim"]
    lines = [f"Node {node} {key + ':':<15} {values[key]:>8} kB" for key in _NODE_MEMINFO_KEYS]
    lines += [f"Node {node} {key + ':':<15} {0:>5}" for key in ("HugePages_Total", "HugePages_Free", "HugePages_Surp")]
    return "\n".join(lines) + "\n"


def build_tree(root: Path, machine: Machine) -> str:
    """Write ``machine`` under ``root/sys``; returns that sys dir."""
    sys_dir = root / "sys"
    cpu_base = sys_dir / "devices" / "system" / "cpu"
    node_base = sys_dir / "devices" / "system" / "node"
    cpu_base.mkdir(parents=True)
    (cpu_base / "possible").write_text(format_cpu_list(machine.cpus) + "\n")
    (cpu_base / "online").write_text(format_cpu_list(machine.online) + "\n")
    (cpu_base / "isolated").write_text(format_cpu_list(machine.isolated) + "\n")
    nodes = sorted(set(machine.node_memory_kb) | {node for _, _, node in machine.cpus.values()})
    for node in nodes:
        node_dir = node_base / f"node{node}"
        node_dir.mkdir(parents=True)
        node_cpus = [cpu for cpu, (_, _, n) in machine.cpus.items() if n == node and cpu not in machine.offline]
        (node_dir / "cpulist").write_text(format_cpu_list(node_cpus) + "\n")
        kb = machine.node_memory_kb.get(node, 0)
        (node_dir / "meminfo").write_text(node_meminfo(node, kb, machine.meminfo.get(node)))
        if node in machine.distances:
            (node_dir / "distance").write_text(" ".join(map(str, machine.distances[node])) + "\n")
        for size_kb in HUGEPAGE_SIZES_KB:
            total, free = machine.hugepages.get(node, {}).get(size_kb, (0, 0))
            pool_dir = node_dir / "hugepages" / f"hugepages-{size_kb}kB"
            pool_dir.mkdir(parents=True)
            for name, value in (("nr_hugepages", total), ("free_hugepages", free), ("surplus_hugepages", 0)):
                (pool_dir / name).write_text(f"{value}\n")
    (node_base / "online").write_text(format_cpu_list(nodes) + "\n")
    for cpu, (core, package, node) in machine.cpus.items():
        cpu_dir = cpu_base / f"cpu{cpu}"
        cpu_dir.mkdir()
        if cpu != 0:
            (cpu_dir / "online").write_text("0\n" if cpu in machine.offline else "1\n")
        os.symlink(node_base / f"node{node}", cpu_dir / f"node{node}")
        if cpu in machine.offline:
            continue
        topology = cpu_dir / "topology"
        topology.mkdir()
        (topology / "core_id").write_text(f"{core}\n")
        (topology / "physical_package_id").write_text(f"{package}\n")
    return str(sys_dir)
