"""BE memory reclaim on real kernels: in the cgroup v2 guest a BE pod's page cache is given back through
``memory.reclaim`` once the node is above the reclaim threshold, and with swap on (a zram device) only the
anonymous memory of a container whose own ``memory.swap.max`` allows it is counted and swapped; on this host's
cgroup v1 the strategy says once that the kernel has no ``memory.reclaim`` and stays off, and eviction works as
before."""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from koordlet.api.nodeslo import NodeSLOSpec, parse_node_slo_spec
from koordlet.api.pod import ContainerMeta
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.eviction import Evictor
from koordlet.qosmanager import QoSManager, QoSManagerConfig, new_qos_manager
from koordlet.qosmanager.memoryreclaim import ReclaimMemo
from koordlet.system.cgroup_stats import parse_memory_stat
from koordlet.system.procfs import parse_meminfo
from tests.koordlet.qosmanager.realnode import RealNode
from tests.support.apiserver import ApiServer, kube_api_client
from tests.support.v2guest import KERNEL_LACKS, attached_disk, skip_unless_v2_writable
from tests.support.waiting import wait_for

PODS = (("ls", QoSClass.LS, KubeQoS.BURSTABLE), ("be", QoSClass.BE, KubeQoS.BESTEFFORT))
GATES = {"CgroupReconcile": True, "BECPUSuppress": False, "CPUBurst": False, "RdtResctrl": False}
MiB = 1 << 20
# The BE pod reads the disk through the page cache (dropping what the kernel cached of it before, so the pages are
# charged to the BE pod), then holds on.
READ_DISK = """
import os, time
fd = os.open({disk!r}, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
while os.read(fd, 1 << 20):
    pass
print('read', flush=True)
time.sleep(120)
"""


def _manager(node: RealNode, **strategy: object) -> QoSManager:
    node.states.set_node_slo(parse_node_slo_spec({
        "resourceUsedThresholdWithBE": {"memoryEvictThresholdPercent": 99},
        "extensions": {"beMemoryReclaimStrategy": {"enable": True, **strategy}}}))
    return new_qos_manager(node.states, node.cache, node.executor, node.layout,
                           config=QoSManagerConfig(feature_gates=GATES))


def _resident_percent() -> int:
    with open("/proc/meminfo", "rb") as f:
        info = parse_meminfo(f.read())
    return info.used_with_page_cache_bytes * 100 // info.mem_total_bytes


@pytest.fixture
def v1_node() -> Iterator[RealNode]:
    RealNode.skip_unless_possible()
    node = RealNode("reclaim-v1", PODS)
    try:
        yield node
    finally:
        node.close()


@pytest.mark.cgroupv1
def test_on_cgroup_v1_it_says_once_that_the_kernel_has_no_memory_reclaim_stays_off_and_eviction_works_as_before(
        v1_node: RealNode, caplog: pytest.LogCaptureFixture) -> None:
    """The whole QoS manager on its own loop, reclaim switched on with the node far above its threshold, and
    BEMemoryEvict: the strategy says once that this kernel has no memory.reclaim and asks nothing at any tick, and a
    BE pod whose own memory is the eviction threshold is evicted as without it."""
    caplog.set_level(logging.WARNING, logger="koordlet.qosmanager.memoryreclaim")
    allocate = v1_node.node.capacity["memory"] * 3 // 100

    def spec(evict_percent: int) -> NodeSLOSpec:
        return parse_node_slo_spec({
            "resourceUsedThresholdWithBE": {"enable": True, "memoryEvictThresholdPercent": evict_percent},
            "extensions": {"beMemoryReclaimStrategy": {"enable": True, "reclaimThresholdPercent": 1,
                                                       "reclaimLowerPercent": 0}}})

    with ApiServer() as server, kube_api_client(server) as api_client:
        v1_node.put_pod_in_api("be", api_client)
        manager = v1_node.start(
            spec(99), evictor=Evictor("node-1", api_client=api_client),
            config=QoSManagerConfig(node_name="node-1", feature_gates={**GATES, "BEMemoryEvict": True}))
        v1_node.spawn("be", f"data = b'x' * {allocate}\nimport time\ntime.sleep(60)\n")
        assert wait_for(lambda: v1_node.anon_bytes("be") >= allocate, 30.0)
        time.sleep(1.5)
        assert not server.requests("POST", r"/eviction$"), "evicted below the threshold"
        # the threshold from what the BE pod alone holds, never from the machine's use (other programs move it)
        v1_node.states.set_node_slo(spec(v1_node.evict_threshold_held_by("be")))
        assert wait_for(lambda: bool(server.requests("POST", r"/pods/be/eviction$")), 10.0)
        plan = manager.last_plan("memoryreclaim")
        assert plan is not None and plan.empty and "no memory.reclaim" in plan.memo.off_because
    assert [r.getMessage() for r in caplog.records if "memory reclaim off" in r.getMessage()] == [
        "BE memory reclaim off: this kernel has no memory.reclaim (cgroup v1, or Linux before 5.19); memory eviction "
        "works as before"]


@pytest.mark.cgroupv2
def test_v2_a_be_pods_page_cache_is_reclaimed_above_the_threshold() -> None:
    disk = attached_disk()
    skip_unless_v2_writable()
    node = RealNode("reclaim-v2", PODS, v2=True)
    try:
        reader = node.spawn("be", READ_DISK.format(disk=disk))
        assert reader.stdout is not None and reader.stdout.readline() == b"read\n"
        be_dir = node.pod_dir(node.pod("be"))
        cached = lambda: parse_memory_stat(node.read("memory", be_dir, "memory.stat").encode(), 2)  # noqa: E731
        before = cached()
        assert before.inactive_file_bytes + before.active_file_bytes >= 48 * MiB  # the 64 MiB disk, in the BE pod
        # above the threshold now, with a lower threshold far enough below that all of it is asked for
        threshold = max(_resident_percent() - 1, 2)
        manager = _manager(node, reclaimThresholdPercent=threshold, reclaimLowerPercent=max(threshold - 20, 0),
                           reclaimStepBytes="256Mi")

        asked: set[str] = set()

        def reclaimed() -> bool:
            node.runner.run_collector("node_resource")
            assert manager.run_strategy("memoryreclaim")
            plan, record = manager.last_plan("memoryreclaim"), manager.last_record("memoryreclaim")
            assert isinstance(plan.memo, ReclaimMemo) and not plan.memo.off_because
            assert record is not None and record.failed == 0
            asked.update(w.cgroup_dir for step in plan.steps for w in step.writes)
            after = cached()
            return after.inactive_file_bytes + after.active_file_bytes < 8 * MiB

        assert wait_for(reclaimed, 20.0), cached()
        assert asked == {be_dir}  # only the BE pod was asked (the reader still runs: its pages were not in use)
    finally:
        node.close()


@contextmanager
def _zram_swap(size_mib: int = 256) -> Iterator[str]:
    """Swap on the guest while the test runs: a zram device of its own (Debian builds zram as a module), swapped
    off and removed after."""
    if subprocess.run(["modprobe", "zram", "num_devices=0"], capture_output=True).returncode != 0 or \
            not Path("/sys/class/zram-control/hot_add").exists():
        pytest.skip(f"{KERNEL_LACKS} zram: no swap device to test with")
    index = Path("/sys/class/zram-control/hot_add").read_text().strip()
    device = f"/dev/zram{index}"
    try:
        Path(f"/sys/block/zram{index}/disksize").write_text(f"{size_mib}M")
        subprocess.run(["mkswap", device], check=True, capture_output=True)
        subprocess.run(["swapon", device], check=True, capture_output=True)
        try:
            yield device
        finally:
            subprocess.run(["swapoff", device], check=True, capture_output=True)
    finally:
        Path("/sys/class/zram-control/hot_remove").write_text(index)


# Fault in {size} bytes of anonymous memory, say so, and hold it.
HOLD_ANON = """
import time
held = bytearray({size})
for i in range(0, len(held), 4096):
    held[i] = 1
print('held', flush=True)
time.sleep(120)
"""


@pytest.mark.cgroupv2
def test_v2_anonymous_memory_is_reclaimable_only_where_the_containers_own_swap_limit_lets_it_go() -> None:
    """kubelet sets swap per container through CRI ``Unified`` (runc writes the container's ``memory.swap.max``)
    and leaves the pod dir's at ``max``. With swap on the node, a BE pod's container under kubelet's NoSwap
    (``memory.swap.max`` 0) holds 96 MiB and one allowed to swap holds 32 MiB: only the second one's anonymous memory
    is counted reclaimable, and the kernel swaps out only that container's pages when asked through the pod dir."""
    skip_unless_v2_writable()
    node = RealNode("reclaim-swap", (("be", QoSClass.BE, KubeQoS.BESTEFFORT),), v2=True)
    try:
        with _zram_swap():
            no_swap = node.add_container("be", ContainerMeta("keep", container_id="a" * 12))
            may_swap = node.add_container("be", ContainerMeta("spill", container_id="b" * 12))
            node.groups.write("memory", node._rel(no_swap), "memory.swap.max", "0")  # kubelet's NoSwap
            for container_dir, size in ((no_swap, 96 * MiB), (may_swap, 32 * MiB)):
                holder = node.groups.spawn(node._rel(container_dir), HOLD_ANON.format(size=size))
                assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
            anon = {d: parse_memory_stat(node.read("memory", d, "memory.stat").encode(), 2) for d in (no_swap,
                                                                                                       may_swap)}
            spill_anon = anon[may_swap].inactive_anon_bytes + anon[may_swap].active_anon_bytes
            threshold = max(_resident_percent() - 1, 2)
            manager = _manager(node, reclaimThresholdPercent=threshold, reclaimLowerPercent=max(threshold - 20, 0),
                               reclaimStepBytes="256Mi")
            node.runner.run_collector("node_resource")  # the node's free swap, from /proc/meminfo
            assert manager.run_strategy("memoryreclaim")
            report = manager.last_plan("memoryreclaim").report
            (asked,) = report.asked
            assert 0 < asked[0].anon_bytes <= spill_anon  # the NoSwap container's 96 MiB are not counted

            def swapped() -> bool:
                node.runner.run_collector("node_resource")
                assert manager.run_strategy("memoryreclaim")
                return int(node.read("memory", may_swap, "memory.swap.current")) > 0

            assert wait_for(swapped, 30.0)
            assert node.read("memory", no_swap, "memory.swap.current") == "0"
    finally:
        node.close()
