"""BE memory reclaim on real kernels: in the cgroup v2 guest a BE pod's page cache is given back through
``memory.reclaim`` once the node is above the reclaim threshold; on this host's cgroup v1 the strategy says once
that the kernel has no ``memory.reclaim`` and stays off."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.qosmanager import QoSManager, QoSManagerConfig, new_qos_manager
from koordlet.qosmanager.memoryreclaim import ReclaimMemo
from koordlet.system.cgroup_stats import parse_memory_stat
from koordlet.system.procfs import parse_meminfo
from tests.koordlet.qosmanager.realnode import RealNode, skip_unless_v2_writable
from tests.support.v2guest import attached_disk
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
def test_on_cgroup_v1_it_says_once_that_the_kernel_has_no_memory_reclaim_and_stays_off(
        v1_node: RealNode, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="koordlet.qosmanager.memoryreclaim")
    manager = _manager(v1_node, reclaimThresholdPercent=1, reclaimLowerPercent=0)  # the node is above it
    v1_node.runner.run_collector("node_resource")
    for _ in range(3):
        assert manager.run_strategy("memoryreclaim")
        assert manager.last_plan("memoryreclaim").empty
    assert "no memory.reclaim" in manager.last_plan("memoryreclaim").memo.off_because
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
