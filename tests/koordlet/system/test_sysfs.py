"""CPU topology, NUMA nodes, online and isolated CPUs from fixture sysfs trees of real machine shapes
(tests/koordlet/system/topology_tree.py) and from this host."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from koordlet.system.sysfs import (
    CPUInfo,
    NUMANode,
    SysfsError,
    num_online_cpus,
    pci_device_numa_node,
    pci_device_parent_bridge,
    read_cpu_topology,
    read_isolated_cpus,
    read_node_topology,
    read_numa_nodes,
    read_online_cpus,
)
from tests.koordlet.system.pci_tree import pci_tree
from tests.koordlet.system.topology_tree import (
    MACHINES,
    build_tree,
    four_numa_with_holes,
    one_socket_no_smt,
    two_sockets_smt,
)


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


# ------------------------------------------------------------------------- NUMA nodes, isolated CPUs, machines


def test_one_socket_without_smt_is_one_node_with_its_memory(tmp_path: Path) -> None:
    topology = read_node_topology(build_tree(tmp_path, one_socket_no_smt(cores=4, memory_gib=16)))
    assert topology.online_cpus == (0, 1, 2, 3) and topology.isolated_cpus == ()
    assert {cpu.core_key for cpu in topology.cpus} == {(0, 0), (0, 1), (0, 2), (0, 3)}  # one thread per core
    assert topology.numa_nodes == (NUMANode(node_id=0, cpus=(0, 1, 2, 3), memory_total_bytes=16 << 30),)


def test_two_sockets_with_smt_pair_cpu_k_with_cpu_k_plus_half(tmp_path: Path) -> None:
    topology = read_node_topology(build_tree(tmp_path, two_sockets_smt(core_ids=(0, 1, 2, 8))))
    assert len(topology.cpus) == 16
    by_core: dict[tuple[int, int], list[int]] = {}
    for cpu in topology.cpus:
        by_core.setdefault(cpu.core_key, []).append(cpu.cpu_id)
    assert sorted(by_core.values()) == [[k, k + 8] for k in range(8)]
    assert by_core[(1, 8)] == [7, 15]  # core ids keep the hardware's holes and repeat per socket
    assert [(n.node_id, n.cpus) for n in topology.numa_nodes] == [(0, (0, 1, 2, 3, 8, 9, 10, 11)),
                                                                  (1, (4, 5, 6, 7, 12, 13, 14, 15))]
    assert topology.numa_node(1) is not None and topology.numa_node(1).distances == ((0, 21), (1, 10))
    assert all(n.memory_total_bytes == 64 << 30 for n in topology.numa_nodes)


def test_four_numa_nodes_with_offline_cpus_and_isolated_ones(tmp_path: Path) -> None:
    topology = read_node_topology(build_tree(tmp_path, four_numa_with_holes()))
    assert topology.online_cpus == (0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 12, 13, 15)
    assert topology.isolated_cpus == (4, 12)
    assert [n.cpus for n in topology.numa_nodes] == [(0, 1, 8, 9), (2, 10), (4, 5, 12, 13), (6, 7, 15)]
    assert [cpu.node_id for cpu in topology.cpus] == [0, 0, 1, 2, 2, 3, 3, 0, 0, 1, 2, 2, 3]
    assert [cpu.socket_id for cpu in topology.cpus if cpu.node_id in (2, 3)] == [1] * 7
    assert topology.numa_node(0).distances == ((0, 10), (1, 11), (2, 32), (3, 32))
    assert topology.numa_node(9) is None


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.__name__)
def test_every_fixture_machine_reads_back_what_it_describes(tmp_path: Path, machine) -> None:
    described = machine()
    topology = read_node_topology(build_tree(tmp_path, described))
    assert topology.online_cpus == described.online
    for cpu in topology.cpus:
        assert (cpu.core_id, cpu.socket_id, cpu.node_id) == described.cpus[cpu.cpu_id]
    assert {n.node_id: n.memory_total_bytes for n in topology.numa_nodes} == {
        node: kb * 1024 for node, kb in described.node_memory_kb.items()}
    assert sorted(c for n in topology.numa_nodes for c in n.cpus) == list(described.online)


def test_no_numa_dir_is_one_node_and_bad_node_files_raise(tmp_path: Path) -> None:
    _make_cpu_tree(tmp_path, {0: (0, 0, None), 1: (1, 0, None)}, "0-1")
    topology = read_node_topology(str(tmp_path / "sys"))
    assert topology.numa_nodes == (NUMANode(node_id=0, cpus=(0, 1), memory_total_bytes=0),)
    assert topology.isolated_cpus == ()  # kernel without cpu/isolated
    node0 = tmp_path / "sys" / "devices" / "system" / "node" / "node0"
    node0.mkdir(parents=True)
    (node0 / "cpulist").write_text("0-1\n")
    (node0 / "meminfo").write_text("Node 0 MemFree: 12 kB\n")
    with pytest.raises(SysfsError, match="MemTotal"):
        read_numa_nodes(str(tmp_path / "sys"))
    (node0 / "meminfo").write_text("Node 0 MemTotal: 12 kB\n")
    (node0 / "distance").write_text("10 20\n")
    with pytest.raises(SysfsError, match="2 distances for 1"):
        read_numa_nodes(str(tmp_path / "sys"))
    (node0 / "distance").write_text("10\n")
    assert read_numa_nodes(str(tmp_path / "sys"))[0].memory_total_bytes == 12 * 1024
    (tmp_path / "sys" / "devices" / "system" / "cpu" / "isolated").write_text("x\n")
    with pytest.raises(SysfsError, match="isolated"):
        read_isolated_cpus(str(tmp_path / "sys"))


def test_this_host_numa_nodes_hold_every_online_cpu_and_its_memory() -> None:
    if not os.path.exists("/sys/devices/system/node/node0/meminfo"):
        pytest.skip("no NUMA sysfs on this host")
    topology = read_node_topology()
    assert sorted(c for n in topology.numa_nodes for c in n.cpus) == list(read_online_cpus())
    # (/proc/meminfo may be virtualised in a sandbox and disagree with sysfs, so it is not compared.)
    assert all(n.memory_total_bytes > 0 for n in topology.numa_nodes if n.cpus)
    assert set(topology.isolated_cpus) <= set(topology.online_cpus) | set(read_isolated_cpus())
