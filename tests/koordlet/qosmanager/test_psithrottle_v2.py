"""BE PSI throttle on the real cgroup v2 kernel of the VM stage (koordlet/qosmanager/psithrottle.py): an LS pod whose
probe wakes every millisecond, a BE pod burning every vCPU, kubelet's weights on the QoS and pod dirs, and koordlet's
QoS manager with the gate ``BEPSIThrottle`` (its intervals shortened). The LS pod's real ``cpu.pressure`` passes the
threshold and the besteffort dir's ``cpu.max`` steps down; the burners and the probe stop, the pressure decays and the
limit comes back to ``max``; each step is in the audit log. The measured effect on the LS pod is bench/psi_throttle.py's
(docs/benchmarks.md)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from koordlet import audit
from koordlet.api.nodeslo import parse_node_slo_spec
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.qosmanager import QoSManagerConfig
from koordlet.system.procfs import parse_psi
from tests.koordlet.qosmanager.realnode import BURN, RealNode, skip_unless_v2_writable
from tests.support.waiting import wait_for

pytestmark = pytest.mark.cgroupv2

PODS = (("ls", QoSClass.LS, KubeQoS.BURSTABLE), ("be", QoSClass.BE, KubeQoS.BESTEFFORT))
# The LS probe: sleep 1 ms, wake, 100 µs of work, for at most 5 minutes (killed at the end of the test).
PROBE = """
import time
end = time.monotonic() + 300
while time.monotonic() < end:
    time.sleep(0.001)
    spin = time.monotonic() + 0.0001
    while time.monotonic() < spin:
        pass
"""
THROTTLE = {"enable": True, "cpuPressureThresholdPercent": 5, "stepIntervalSeconds": 2, "releaseIntervalSeconds": 3,
            "cpuStepPercent": 25, "cpuMinPercent": 50}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[RealNode]:
    skip_unless_v2_writable(("cpu", "cpuset", "memory", "io"))
    real = RealNode("psi-throttle", PODS, v2=True, delegate=("cpu", "cpuset", "memory", "io"))
    auditor = audit.Auditor(audit.AuditConfig(log_dir=str(tmp_path / "audit")))
    audit.install(auditor)
    try:
        real.kubelet_weights()
        yield real
    finally:
        audit.install(None)
        auditor.close()
        real.close()


def test_ls_cpu_pressure_steps_the_be_limit_down_and_its_end_brings_it_back(
        node: RealNode, tmp_path: Path, record_property: Callable[[str, object], None]) -> None:
    ls_dir = node.pod_dir(node.pod("ls"))
    probe = node.spawn("ls", PROBE)
    gates = {"BEPSIThrottle": True, "BECPUSuppress": False, "CPUBurst": False, "RdtResctrl": False,
             "CgroupReconcile": False}
    node.start(parse_node_slo_spec({"extensions": {"bePSIThrottleStrategy": THROTTLE}}),
               config=QoSManagerConfig(node_name=node.node.name, feature_gates=gates))
    cpus = node.node.capacity["cpu"] // 1000
    burners: list[subprocess.Popen[bytes]] = [node.spawn("be", BURN) for _ in range(cpus)]

    def be_limit() -> str:
        return node.read("cpu", node.be_dir, "cpu.max")

    def ls_pressure() -> float:
        return parse_psi(node.read("cpu", ls_dir, "cpu.pressure").encode()).some.avg10

    limits = set()
    try:
        assert wait_for(lambda: be_limit() != "max 100000", 90.0, 0.5), (be_limit(), ls_pressure())
        record_property("ls_cpu_pressure_at_first_step", ls_pressure())
        for _ in range(20):  # 10 s more under load: 75 % of the CPUs, or the floor of 50 %, never less
            limits.add(be_limit())
            wait_for(lambda: False, 0.5, 0.5)
        assert limits <= {f"{cpus * 75000} 100000", f"{cpus * 50000} 100000"}, limits
    finally:
        # the probe stops too: under emulation (TCG) it alone keeps its pod's CPU pressure near 4.5 %, above the
        # release mark (half the 5 % threshold), where the strategy holds by design
        for child in (*burners, probe):
            child.kill()
            child.wait(10)
    assert wait_for(lambda: be_limit() == "max 100000", 120.0, 0.5), (be_limit(), ls_pressure())
    record_property("ls_cpu_pressure_at_release", ls_pressure())
    events = [e for e in audit.read_events(str(tmp_path / "audit")) if e.reason == "BEPSIThrottle"]
    messages = " | ".join(e.message for e in reversed(events))
    assert "CPU step 0 -> 1: BE CPU limit" in messages and "CPU step 1 -> 0: BE CPU unlimited" in messages
