"""BECPUEvict on the real kernel (cgroup v1 on this host, v2 in the VM stage): the collector reads the besteffort
dir's CPU use, cpuset and quota (v1 ``cpuacct.usage``, ``cpuset.cpus``, ``cpu.cfs_quota_us``; v2 ``cpu.stat``
``usage_usec``, ``cpuset.cpus.effective``, ``cpu.max``), and the strategy evicts the BE pod whose batch-cpu request
that quota starves.

A BE pod asks for 2 batch cores and burns; the besteffort dir holds half a core of quota (what a cfsQuota suppression
leaves, written here as another agent would have). Satisfaction is 0.5 / 2 = 25 %, under the NodeSLO's 30 % lower
bound, so BECPUEvict asks the API server to evict the BE pod, never the LS one (docs/koordinator.md §4.4). A limit
under one core needs no usage threshold, so nothing here depends on how much CPU the machine gives the burner.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from koordlet.api.pod import ContainerMeta
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.eviction import Evictor
from koordlet.metricsadvisor.pods import BE_CPU_REAL_LIMIT, BE_CPU_REQUEST, BE_CPU_USAGE
from koordlet.qosmanager import QoSManagerConfig
from koordlet.system.cgroup import CgroupVersion
from tests.koordlet.qosmanager.factory import spec
from tests.koordlet.qosmanager.realnode import BOTH_VERSIONS, BURN, RealNode
from tests.support.apiserver import ApiServer, kube_api_client
from tests.support.waiting import wait_for

PODS = (("ls", QoSClass.LS, KubeQoS.BURSTABLE), ("be", QoSClass.BE, KubeQoS.BESTEFFORT))
BATCH_CPU_MILLI = 2000
BE_QUOTA_US = 50_000  # half a core per 100 ms period
GATES = {"BECPUEvict": True, "BECPUSuppress": False, "CPUBurst": False, "RdtResctrl": False}


@pytest.fixture(params=BOTH_VERSIONS)
def node(request: pytest.FixtureRequest) -> Iterator[RealNode]:
    yield from RealNode.of_version_closed_after(request.param, "cpu-evict", PODS)


def _starve_besteffort(node: RealNode) -> None:
    """Half a core for every BE pod: the besteffort dir's quota, as a suppression left it."""
    name, value = (("cpu.max", f"{BE_QUOTA_US} 100000") if node.fs.version is CgroupVersion.V2
                   else ("cpu.cfs_quota_us", str(BE_QUOTA_US)))
    node.groups.write("cpu", node._rel(node.be_dir), name, value)


def test_a_be_pod_starved_below_the_satisfaction_bound_is_evicted_from_what_the_kernel_counts(node: RealNode) -> None:
    container_dir = node.add_container("be", ContainerMeta("job", container_id="0123456789ab",
                                                           requests={"kubernetes.io/batch-cpu": BATCH_CPU_MILLI}))
    _starve_besteffort(node)
    node.groups.spawn(node._rel(container_dir), BURN)
    with ApiServer() as server, kube_api_client(server) as api_client:
        node.put_pod_in_api("be", api_client)
        node.put_pod_in_api("ls", api_client)
        node.start(spec(cpuEvictBESatisfactionLowerPercent=30, cpuEvictBESatisfactionUpperPercent=50),
                   evictor=Evictor("node-1", api_client=api_client),
                   config=QoSManagerConfig(node_name="node-1", feature_gates=GATES))
        assert wait_for(lambda: bool(server.requests("POST", r"/pods/be/eviction$")), 20.0)
        assert not server.requests("POST", r"/pods/ls/eviction$")
        assert wait_for(lambda: bool(server.list_objects("events", "default")), 5.0)
        (event,) = server.list_objects("events", "default")
        assert event["reason"] == "BECPUEvict", event
    # What the strategy decided from: the besteffort dir as the collector read it. The real limit is min(cpuset
    # cores, quota) in milli-cores; the use, a one-second rate of the dir's counter, at most the quota (and a
    # period's slack), and some: the burner ran under it.
    assert node.cache.latest(BE_CPU_REQUEST)[1] == BATCH_CPU_MILLI
    assert node.cache.latest(BE_CPU_REAL_LIMIT)[1] == BE_QUOTA_US / 100
    usage_milli = node.cache.latest(BE_CPU_USAGE)[1]
    assert 0 < usage_milli <= BE_QUOTA_US / 100 * 1.2, usage_milli
