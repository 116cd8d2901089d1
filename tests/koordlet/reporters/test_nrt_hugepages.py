"""``HugePageReport``: the NodeResourceTopology zones carry each NUMA node's ``hugepages-2Mi`` and
``hugepages-1Gi`` (capacity and allocatable the pool, available what the kernel has free of it) and their
memory leaves the zone's ``memory``; read from fixture machines laid out as the kernel writes
``node*/hugepages``, from this host, and from the v2 guest booted with huge pages reserved on its command
line (scripts/v2-stage.sh). Every object goes through the project's API server and deploy/crds."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

import pytest

from koordlet.api.cpupools import compute_cpu_pools
from koordlet.reporters.nrt import NRTReporter, NRTReportLoop, build_nrt, format_bytes
from koordlet.system.sysfs import HugePages, read_node_hugepages, read_node_topology
from tests.koordlet.reporters.test_nrt import NODE, PLURAL, custom, server  # noqa: F401 - fixtures
from tests.koordlet.system.topology_tree import GIB_KB, build_tree, two_sockets_smt
from tests.support.apiserver import ApiServer
from tests.support.v2guest import KERNEL_LACKS, in_v2_guest


def _resources(zone: dict) -> dict[str, tuple[str, str, str]]:
    return {r["name"]: (r["capacity"], r["allocatable"], r["available"]) for r in zone["resources"]}


def _machine():
    # node 0: 512 pages of 2 MiB reserved (1 GiB), 500 free; node 1: 4 pages of 1 GiB, 2 free
    return replace(two_sockets_smt(), hugepages={0: {2048: (512, 500)}, 1: {1048576: (4, 2)}})


def test_the_fixture_machines_hugepages_are_read_per_node_and_size(tmp_path: Path) -> None:
    sys_dir = build_tree(tmp_path, _machine())
    assert read_node_hugepages(sys_dir) == {
        0: (HugePages(2048, 512, 500), HugePages(1048576, 0, 0)),
        1: (HugePages(2048, 0, 0), HugePages(1048576, 4, 2))}


def test_zones_carry_the_hugepages_through_the_crd(tmp_path: Path, server: ApiServer, custom) -> None:  # noqa: F811
    sys_dir = build_tree(tmp_path, _machine())
    topology = read_node_topology(sys_dir)
    nrt = build_nrt(NODE, topology, compute_cpu_pools(topology.cpus, []), None, {},
                    hugepages=read_node_hugepages(sys_dir))
    assert NRTReporter(NODE, custom).write(nrt)[0] == "created"
    zones = server.get_object(PLURAL, NODE)["zones"]
    assert _resources(zones[0]) == {"cpu": ("8", "8", "8"), "hugepages-1Gi": ("0", "0", "0"),
                                    "hugepages-2Mi": ("1Gi", "1Gi", "1000Mi"), "memory": ("63Gi", "63Gi", "63Gi")}
    assert _resources(zones[1])["hugepages-1Gi"] == ("4Gi", "4Gi", "2Gi")
    assert _resources(zones[1])["memory"] == ("60Gi", "60Gi", "60Gi")
    assert [r["name"] for r in zones[0]["resources"]] == sorted(_resources(zones[0]))
    off = build_nrt(NODE, topology, compute_cpu_pools(topology.cpus, []), None, {})  # the gate off
    assert _resources(off["zones"][0])["hugepages-2Mi"] == ("0", "0", "0")
    assert _resources(off["zones"][0])["memory"][0] == f"{64 * GIB_KB // GIB_KB}Gi"


def test_the_loop_reports_a_change_of_free_pages(tmp_path: Path, server: ApiServer, custom) -> None:  # noqa: F811
    sys_dir = build_tree(tmp_path, _machine())
    topology = read_node_topology(sys_dir)
    loop = NRTReportLoop(NRTReporter(NODE, custom), lambda: topology, list, lambda: None, min_update_interval_s=0,
                         read_hugepages=lambda: read_node_hugepages(sys_dir))
    assert loop.report_once() == "created"
    free = Path(sys_dir) / "devices/system/node/node0/hugepages/hugepages-2048kB/free_hugepages"
    free.write_text("12\n")  # a pod took 488 pages
    assert loop.report_once() == "updated"
    zone = server.get_object(PLURAL, NODE)["zones"][0]
    assert _resources(zone)["hugepages-2Mi"] == ("1Gi", "1Gi", "24Mi")


def test_this_hosts_hugepages_are_reported(server: ApiServer, custom) -> None:  # noqa: F811
    hugepages = read_node_hugepages()
    if not hugepages:
        pytest.skip(f"{KERNEL_LACKS} NUMA huge page pools in sysfs")
    topology = read_node_topology()
    nrt = build_nrt(NODE, topology, compute_cpu_pools(topology.cpus, []), None, {}, hugepages=hugepages)
    assert NRTReporter(NODE, custom).write(nrt)[0] == "created"
    for zone, node in zip(server.get_object(PLURAL, NODE)["zones"], topology.numa_nodes, strict=True):
        pools = {pool.page_size_kb: pool for pool in hugepages.get(node.node_id, ())}
        for size_kb, name in ((2048, "hugepages-2Mi"), (1048576, "hugepages-1Gi")):
            total = pools[size_kb].total_bytes if size_kb in pools else 0
            assert _resources(zone)[name][0] == format_bytes(total)


@pytest.mark.cgroupv2
def test_the_v2_guests_reserved_hugepages_are_in_its_zones(server: ApiServer, custom) -> None:  # noqa: F811
    """The v2 guest boots with ``hugepagesz=2M hugepages=N`` (scripts/v2-stage.sh), the kernel spreading them over
    its NUMA nodes (two with ``V2_NUMA=2``): each zone carries its node's pool, and together they hold all N."""
    with open("/proc/cmdline") as f:
        cmdline = f.read()
    match = re.search(r"(?:^|\s)hugepages=(\d+)", cmdline)
    if match is None:
        if in_v2_guest():
            pytest.fail("the v2 guest was booted without hugepages= on its command line")
        pytest.skip("this kernel was booted without hugepages= (the v2 guest is)")
    reserved = int(match.group(1))
    hugepages = read_node_hugepages()
    pools = {node: {pool.page_size_kb: pool for pool in node_pools} for node, node_pools in hugepages.items()}
    if not any(2048 in node_pools for node_pools in pools.values()):
        pytest.skip(f"{KERNEL_LACKS} 2 MiB huge pages")
    assert sum(node_pools[2048].total_pages for node_pools in pools.values()) == reserved
    topology = read_node_topology()
    nrt = build_nrt(NODE, topology, compute_cpu_pools(topology.cpus, []), None, {}, hugepages=hugepages)
    assert NRTReporter(NODE, custom).write(nrt)[0] == "created"
    zones = server.get_object(PLURAL, NODE)["zones"]
    assert len(zones) == len(topology.numa_nodes)
    for zone, node in zip(zones, topology.numa_nodes, strict=True):
        pool = pools[node.node_id][2048]
        capacity, allocatable, available = _resources(zone)["hugepages-2Mi"]
        assert capacity == allocatable == (f"{pool.total_pages * 2}Mi" if pool.total_pages else "0")
        assert available == f"{pool.free_pages * 2}Mi" or pool.free_pages == 0
    assert os.path.isdir("/sys/devices/system/node/node0/hugepages/hugepages-2048kB")
