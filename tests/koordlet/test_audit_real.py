"""``/events`` on the agent's HTTP port after a real CPU suppression and a real memory eviction (cgroup v1 on this
kernel, real processes, real collectors, the real QoS manager, evictions through the project's API server):
each shows up with its figures, and the pod filter finds the eviction."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from koordlet import audit
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.eviction import Evictor
from koordlet.metrics import MetricsServer
from koordlet.qosmanager import QoSManagerConfig
from tests.koordlet.qosmanager.factory import spec
from tests.koordlet.qosmanager.realnode import RealNode
from tests.support.apiserver import ApiServer, kube_api_client
from tests.support.waiting import wait_for

pytestmark = pytest.mark.cgroupv1


@pytest.fixture
def events_port(tmp_path: Path) -> Iterator[int]:
    auditor = audit.Auditor(audit.AuditConfig(log_dir=str(tmp_path / "audit")))
    audit.install(auditor)
    server = MetricsServer(CollectorRegistry(), "127.0.0.1", 0, include_default=False)
    server.handle("/events", audit.events_handler())
    server.start()
    try:
        yield server.port
    finally:
        server.stop()
        audit.install(None)
        auditor.close()


def _events(port: int, query: str = "") -> list[dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/events?{query}",
                                     headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as answer:
        return json.loads(answer.read())["Events"]


def test_a_suppression_and_an_eviction_show_up_in_events_with_their_figures(events_port: int) -> None:
    """The eviction threshold comes from the BE pod's own cgroup, never from the rest of the node: the pod holds
    its memory before the QoS manager starts, and the node's usage as koordlet reads it (MemTotal - MemAvailable)
    always counts that anonymous memory, so the node is at or above the threshold whatever else runs on it. The
    pod allocates before suppression starts: at the floor quota (2 % of a CPU) its allocation would take ~20 s."""
    RealNode.skip_unless_possible()
    node = RealNode("audit", (("ls", QoSClass.LS, KubeQoS.BURSTABLE), ("be", QoSClass.BE, KubeQoS.BESTEFFORT)))
    try:
        audit.current().set_owner_resolver(audit.pod_owner_resolver(node.states.pods))
        allocate = node.node.capacity["memory"] * 3 // 100
        with ApiServer() as server, kube_api_client(server) as api_client:
            node.put_pod_in_api("be", api_client)
            node.spawn("be", f"data = b'x' * {allocate}\nimport time\ntime.sleep(120)\n")
            assert wait_for(lambda: node.anon_bytes("be") >= allocate, 30.0)
            threshold = node.evict_threshold_held_by("be")
            node.spawn("ls")
            config = QoSManagerConfig(node_name="node-1", feature_gates={
                "BEMemoryEvict": True, "BECPUSuppress": True, "CPUBurst": False, "RdtResctrl": False})
            node.start(spec(cpuSuppressThresholdPercent=30, cpuSuppressPolicy="cfsQuota",
                            memoryEvictThresholdPercent=threshold),
                       evictor=Evictor("node-1", api_client=api_client), config=config)
            assert wait_for(lambda: node.read("cpu", node.be_dir, "cpu.cfs_quota_us") != "-1", 10.0)
            assert wait_for(lambda: bool(server.requests("POST", r"/pods/be/eviction$")), 15.0)
            time.sleep(0.2)
        quota = node.read("cpu", node.be_dir, "cpu.cfs_quota_us")
    finally:
        node.close()
    events = _events(events_port)
    suppress = [e for e in events if e["reason"] == "AdjustBEByNodeCPUUsage" and e["type"] == "node"]
    assert suppress, events
    assert any(e["message"].startswith(f"cpu.cfs_quota_us of {node.be_dir} to {quota} by cpusuppress: policy "
                                       "cfsQuota: BE budget ") and "x 30% - LS pods " in e["message"]
               for e in suppress), suppress
    (eviction,) = _events(events_port, "pod=default/be")
    assert eviction["reason"] == "BEMemoryEvict" and eviction["namespace"] == "default"
    assert eviction["message"].startswith("evicted by memoryevict to release ")
    assert f">= threshold {threshold}%" in eviction["message"]
    assert all(e["name"] == "be" for e in _events(events_port, "pod=be"))
