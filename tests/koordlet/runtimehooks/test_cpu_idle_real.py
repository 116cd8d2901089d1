"""``cpu.idle`` for BE pods on the real kernel (CoreSched, docs/colocation.md "CPU QoS on stock kernels"): cgroup v1
on this host (``cpu.idle`` is a v1 cpu controller file since 5.15) and cgroup v2 in the VM stage.

Koordinator #2732: Koordinator sets ``cpu.idle=1`` on the besteffort QoS dir, where the kernel then refuses
kubelet's ``cpu.shares`` (``cpu.weight``) writes, and kubelet cannot restart. koordlet-py writes it on the pod
dirs; here kubelet's own QoS-dir writes are made while the BE pod is idle, and they succeed.
"""

from __future__ import annotations

import errno
import os

import pytest

from hooks import registry
from hooks.protocol import NodeContext
from koordlet.api.nodeslo import default_node_slo_spec, parse_node_slo_spec
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.runtimehooks.reconciler import Reconciler
from koordlet.system.cgroup import CgroupVersion
from tests.koordlet.qosmanager.realnode import BOTH_VERSIONS, RealNode

PODS = (("ls", QoSClass.LS, KubeQoS.BURSTABLE), ("be", QoSClass.BE, KubeQoS.BESTEFFORT))
CORE_SCHED_BE_IDLE = parse_node_slo_spec({"resourceQOSStrategy": {
    "policies": {"cpuPolicy": "coreSched"}, "beClass": {"cpuQOS": {"enable": True, "schedIdle": 1}}}})


@pytest.fixture(params=BOTH_VERSIONS)
def node(request: pytest.FixtureRequest):
    real = RealNode.of_version(request.param, "cpu-idle", PODS)
    if not os.path.exists(real.fs.cgroup_dir("cpu", os.path.join(real.be_dir, "cpu.idle"))):
        real.close()
        pytest.skip(f"this kernel lacks cpu.idle ({os.uname().release}; it came in Linux 5.15)")
    try:
        yield real
    finally:
        real.close()


def _weight_file(node: RealNode) -> str:
    return "cpu.weight" if node.fs.version is CgroupVersion.V2 else "cpu.shares"


def _kubelet_write(node: RealNode, cgroup_dir: str, shares: int) -> None:
    """What kubelet writes to a QoS dir when it (re)starts: cpu.shares on v1, cpu.weight on v2 (its mapping)."""
    value = 1 + ((shares - 2) * 9999) // 262142 if node.fs.version is CgroupVersion.V2 else shares
    with open(os.path.join(node.fs.cgroup_dir("cpu", cgroup_dir), _weight_file(node)), "w") as f:
        f.write(str(value))


def _reconciler(node: RealNode) -> Reconciler:
    plugins = registry.enabled({"CoreSched": True, "BatchResource": True})
    return Reconciler(node.states.pods, lambda: NodeContext(node_slo=node.states.node_slo()), lambda: plugins,
                      node.executor, node.layout)


def test_cpu_idle_goes_on_be_pod_dirs_kubelets_qos_writes_succeed_and_off_restores_0_and_kubelets_weight(
        node: RealNode) -> None:
    be_pod, ls_pod = node.pod_dir(node.pod("be")), node.pod_dir(node.pod("ls"))
    burstable = node.layout.qos_dir(KubeQoS.BURSTABLE)
    for qos_dir, shares in ((node.be_dir, 2), (burstable, 1024), (be_pod, 2)):  # kubelet's values at creation
        _kubelet_write(node, qos_dir, shares)
    kubelet_be_weight = node.read("cpu", be_pod, _weight_file(node))

    node.states.set_node_slo(CORE_SCHED_BE_IDLE)
    reconciler = _reconciler(node)
    reconciler.reconcile_once()
    assert node.read("cpu", be_pod, "cpu.idle") == "1"
    assert node.read("cpu", ls_pod, "cpu.idle") == "0"
    assert node.read("cpu", node.be_dir, "cpu.idle") == "0"  # never the QoS dirs
    assert node.read("cpu", burstable, "cpu.idle") == "0"
    # Koordinator #2732: kubelet restarts and writes its QoS dirs while BE pods are idle: accepted
    _kubelet_write(node, node.be_dir, 2)
    _kubelet_write(node, burstable, 2048)
    # ...where it would fail had cpu.idle gone on the QoS dir, as in Koordinator (the kernel's rule, shown on a
    # dir of the same tree so this test cannot pass on a kernel without it)
    node.groups.make(node._rel(os.path.join(node.be_dir, "idle-qos-dir")))
    idle_dir = os.path.join(node.be_dir, "idle-qos-dir")
    with open(os.path.join(node.fs.cgroup_dir("cpu", idle_dir), "cpu.idle"), "w") as f:
        f.write("1")
    with pytest.raises(OSError) as refused:
        _kubelet_write(node, idle_dir, 2)
    assert refused.value.errno == errno.EINVAL

    # The option off (or the policy switched): 0 again, and the BE pod's weight back to kubelet's (the kernel reset it
    # to 1024's when idle went off).
    node.states.set_node_slo(default_node_slo_spec())
    reconciler.reconcile_once()
    assert node.read("cpu", be_pod, "cpu.idle") == "0"
    assert node.read("cpu", be_pod, _weight_file(node)) == kubelet_be_weight


def test_a_weight_the_kernel_reset_when_cpu_idle_went_off_is_written_again_within_the_cache_time(
        node: RealNode) -> None:
    """cpu.idle 1 → 0 makes the kernel set the group's weight back to 1024's (cpu.shares 1024, cpu.weight 100: the
    scheduler's sched_group_set_idle), whatever it was. The same weight written again a moment later, well within
    ``-resource-force-update-seconds``, must reach the file rather than be skipped by the executor's write cache."""
    from koordlet.executor import ResourceUpdate

    be_pod = node.pod_dir(node.pod("be"))
    assert node.executor.update(ResourceUpdate.of("cpu.shares", be_pod, 512))
    ours = node.read("cpu", be_pod, _weight_file(node))
    assert node.executor.update(ResourceUpdate.of("cpu.idle", be_pod, 1))
    assert node.executor.update(ResourceUpdate.of("cpu.idle", be_pod, 0))
    reset = "100" if node.fs.version is CgroupVersion.V2 else "1024"
    assert node.read("cpu", be_pod, _weight_file(node)) == reset  # the kernel's doing, not ours
    assert node.executor.update(ResourceUpdate.of("cpu.shares", be_pod, 512)), "skipped by the write cache"
    assert node.read("cpu", be_pod, _weight_file(node)) == ours
    assert not node.executor.update(ResourceUpdate.of("cpu.shares", be_pod, 512))  # cached again from here
