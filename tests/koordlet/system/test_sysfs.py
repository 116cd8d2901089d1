"""CPU topology and online CPUs from a fixture sysfs tree (2 sockets × 2 cores × 2 threads) and this host."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from koordlet.system.sysfs import (
    CPUInfo,
    SysfsError,
    num_online_cpus,
    pci_device_numa_node,
    pci_device_parent_bridge,
    read_cpu_topology,
    read_online_cpus,
)
from tests.koordlet.system.pci_tree import pci_tree


def _make_cpu_tree(root: Path, layout: dict[int, tuple[int, int, int | None]], online: str) -> None:
    """layout: cpu → (core_id, package_id, NUMA node or None for no nodeN link)."""
    cpu_base = root / "sys" / "devices" / "system" / "cpu"
    cpu_base.mkdir(parents=True)
    (cpu_base / "online").write_text(online + "\n")
    for cpu, (core, package, node) in layout.items():
        topology = cpu_base / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "core_id").write_text(f"{core}\n")
        (topology / "physical_package_id").write_text(f"{package}\n")
        if node is not None:
            node_dir = root / "sys" / "devices" / "system" / "node" / f"node{node}"
            node_dir.mkdir(parents=True, exist_ok=True)
            os.symlink(node_dir, cpu_base / f"cpu{cpu}" / f"node{node}")


def test_topology_of_two_sockets_with_hyperthreads(tmp_path: Path) -> None:
    # Linux numbers the second hyper-thread of each core after all first threads.
    layout = {
        0: (0, 0, 0),
        1: (1, 0, 0),
        2: (0, 1, 1),
        3: (1, 1, 1),
        4: (0, 0, 0),
        5: (1, 0, 0),
        6: (0, 1, 1),
        7: (1, 1, 1),
    }
    _make_cpu_tree(tmp_path, layout, "0-7")
    topology = read_cpu_topology(str(tmp_path / "sys"))
    assert len(topology) == 8 and num_online_cpus(str(tmp_path / "sys")) == 8
    assert topology[6] == CPUInfo(cpu_id=6, core_id=0, socket_id=1, node_id=1)
    siblings = [cpu.cpu_id for cpu in topology if cpu.core_key == (1, 0)]
    assert siblings == [2, 6]


def test_offline_cpus_are_skipped_and_missing_numa_falls_back(tmp_path: Path) -> None:
    _make_cpu_tree(tmp_path, {0: (0, 0, None), 1: (1, 0, None), 3: (3, 0, None)}, "0-1,3")
    node0 = tmp_path / "sys" / "devices" / "system" / "node" / "node0"
    node0.mkdir(parents=True)
    (node0 / "cpulist").write_text("0-1\n")
    topology = read_cpu_topology(str(tmp_path / "sys"))
    assert [cpu.cpu_id for cpu in topology] == [0, 1, 3]
    assert [cpu.node_id for cpu in topology] == [0, 0, 0]  # cpu3 has no NUMA info at all → node 0


def test_missing_or_malformed_sysfs_raises_sysfs_error(tmp_path: Path) -> None:
    with pytest.raises(SysfsError):
        read_online_cpus(str(tmp_path / "sys"))
    _make_cpu_tree(tmp_path, {0: (0, 0, 0)}, "0-1")  # cpu1 online but no topology dir
    with pytest.raises(SysfsError):
        read_cpu_topology(str(tmp_path / "sys"))


def test_this_host_topology_matches_os_cpu_count() -> None:
    if not os.path.exists("/sys/devices/system/cpu/online"):
        pytest.skip("no sysfs on this host")
    topology = read_cpu_topology()
    assert topology and [cpu.cpu_id for cpu in topology] == list(read_online_cpus())
    assert all(cpu.socket_id >= 0 and cpu.node_id >= 0 for cpu in topology)


def test_pci_numa_minus_one_is_unknown(tmp_path: Path) -> None:
    pci_tree(tmp_path, "0000:00:06.0", "-1")
    assert pci_device_numa_node("0000:00:06.0", str(tmp_path / "sys")) is None
    assert pci_device_parent_bridge("0000:00:07.0", str(tmp_path / "sys")) == ""
