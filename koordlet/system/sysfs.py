"""CPU facts from sysfs: online CPUs and topology (``/sys/devices/system/cpu``), every reader under a root.

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

logger = logging.getLogger(__name__)

CPU_SYSFS = "sys/devices/system/cpu"
NODE_SYSFS = "sys/devices/system/node"
_NODE_DIR = re.compile(r"^node(\d+)$")

__all__ = [
    "CPUInfo",
    "CPUListError",
    "SysfsError",
    "format_cpu_list",
    "num_online_cpus",
    "parse_cpu_list",
    "read_cpu_topology",
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


def read_online_cpus(root: str = "/") -> tuple[int, ...]:
    """Ids of the online CPUs (``/sys/devices/system/cpu/online``)."""
    path = os.path.join(root, CPU_SYSFS, "online")
    try:
        return parse_cpu_list(_read_text(path))
    except (OSError, CPUListError) as exc:
        raise SysfsError(f"cannot read online CPUs from {path}: {exc}") from exc


def num_online_cpus(root: str = "/") -> int:
    return len(read_online_cpus(root))


def _read_int(path: str) -> int:
    try:
        return int(_read_text(path).strip())
    except (OSError, ValueError) as exc:
        raise SysfsError(f"cannot read an integer from {path}: {exc}") from exc


def _cpu_nodes_from_node_dirs(root: str) -> dict[int, int]:
    """cpu id → NUMA node from ``/sys/devices/system/node/node*/cpulist`` (fallback when cpuN has no nodeM)."""
    base = os.path.join(root, NODE_SYSFS)
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


def read_cpu_topology(root: str = "/") -> tuple[CPUInfo, ...]:
    """Topology of every online CPU, sorted by cpu id.

    core and socket from ``cpuN/topology/{core_id,physical_package_id}``; NUMA node from the ``cpuN/nodeM``
    link, else from ``node/nodeM/cpulist``, else 0.
    """
    base = os.path.join(root, CPU_SYSFS)
    fallback_nodes: dict[int, int] | None = None
    infos: list[CPUInfo] = []
    for cpu in read_online_cpus(root):
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
                fallback_nodes = _cpu_nodes_from_node_dirs(root)
            node_id = fallback_nodes.get(cpu, 0)
        infos.append(CPUInfo(cpu_id=cpu, core_id=core_id, socket_id=max(socket_id, 0), node_id=node_id))
    return tuple(infos)
