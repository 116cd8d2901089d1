"""Koordinator's koordlet feature gates (docs/koordinator.md §9.2), and koordlet-py's own (``koordinator=False``): the
one table of every gate koordlet accepts, its default, and whether (and where) koordlet-py acts on it.

Every gate Koordinator's koordlet knows is accepted on ``-feature-gates`` so that a DaemonSet written for it
runs unchanged; a gate koordlet-py does not implement is accepted and does nothing. Such gates are not
silent: the ones that are on (by default or by the command line) are named in one log line at start-up
(:func:`inert_enabled`), every gate is exported as ``koordlet_feature_gate{name,stage,implemented}``
(value 1 when on; :func:`gate_metrics`), and docs/feature-gates.md lists the table (a test holds it to this one).

``implemented``: ``"yes"`` — read by the modules in ``where``; ``"partial"`` — read there, but only part of
Koordinator's feature is done (``note`` says which); ``"no"`` — read by nothing. ``verified``: where the gate's
tests ran (a real kernel: the v1 host, the v2 guest; or files laid out as a named kernel or driver writes
them); docs/gates.md says what each gate does and how it was verified.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from prometheus_client import CollectorRegistry, Gauge

logger = logging.getLogger(__name__)

BETA, ALPHA = "Beta", "Alpha"
YES, PARTIAL, NO = "yes", "partial", "no"


@dataclass(frozen=True, slots=True)
class Gate:
    name: str
    stage: str  # Beta gates default on, Alpha gates off (docs/koordinator.md §9.2)
    implemented: str = NO
    where: tuple[str, ...] = ()  # the modules (repo-relative paths) that read the gate
    note: str = ""
    verified: str = ""  # where its tests ran: real kernel (v1 host, v2 guest) or fixture laid out as …
    koordinator: bool = True  # False: koordlet-py's own gate, which Koordinator's koordlet does not know

    @property
    def default(self) -> bool:
        return self.stage == BETA

    @property
    def acts(self) -> bool:
        return self.implemented != NO


_QOS = "koordlet/qosmanager/framework.py"
_AGENT = "koordlet/agent/lifecycle.py"
_COLLECTORS = "koordlet/agent/wiring/metricsadvisor.py"
_REPORTERS = "koordlet/agent/wiring/reporters.py"
_NETWORK = "koordlet/agent/wiring/network.py"
_STATES = "koordlet/agent/wiring/states.py"
_VENDOR = "vendor-specific"

GATES: tuple[Gate, ...] = (
    # Beta: on by default
    Gate("BECPUSuppress", BETA, YES, (_QOS,),
         verified="v1 host and v2 guest: real quota and cpuset shrinking under a busy LS pod"),
    Gate("CPUBurst", BETA, YES, (_QOS,),
         verified="v1 host: cfs_burst_us; v2 guest: cpu.max.burst"),
    Gate("RdtResctrl", BETA, YES, (_QOS,),
         verified="fixture: resctrl of an Intel RDT machine (no RDT here)"),
    Gate("NodeTopologyReport", BETA, YES, (_REPORTERS,),
         verified="fixture machines and this host, through the project's API server"),
    Gate("GroupIdentity", BETA, YES, ("hooks/groupidentity.py",),
         verified="fixture: Anolis cpu.bvt_warp_ns files (the reconciler's trees)"),
    Gate("CPUSetAllocator", BETA, YES, ("hooks/cpuset.py",),
         verified="v1 host and v2 guest: real containerd through the proxy"),
    Gate("BatchResource", BETA, YES, ("hooks/batchresource.py",),
         verified="v1 host and v2 guest: real containerd through the proxy and NRI"),
    # Alpha: off by default
    Gate("AuditEvents", ALPHA, YES, (_AGENT,), verified="v1 host: a real suppression and eviction audited"),
    Gate("AuditEventsHTTPHandler", ALPHA, YES, (_AGENT,), verified="v1 host: /events on the agent's port"),
    Gate("BECPUManager", ALPHA, YES, (_QOS, "koordlet/runtimehooks/__init__.py"),
         verified="decisions on snapshots: suppress stands down, BE cpusets back on the share pool"),
    Gate("BECPUEvict", ALPHA, YES, (_QOS,),
         verified="v1 host: real BE cgroups; the Eviction API of the project's API server"),
    Gate("CPUEvict", ALPHA, YES, (_QOS,),
         verified="decisions on snapshots; the Eviction API of the project's API server"),
    Gate("CPUAllocatableEvict", ALPHA, YES, (_QOS,),
         verified="decisions on snapshots; the Eviction API of the project's API server"),
    Gate("BEMemoryEvict", ALPHA, YES, (_QOS,),
         verified="v1 host and v2 guest: real memory pressure"),
    Gate("MemoryEvict", ALPHA, YES, (_QOS,),
         verified="decisions on snapshots; the Eviction API of the project's API server"),
    Gate("MemoryAllocatableEvict", ALPHA, YES, (_QOS,),
         verified="decisions on snapshots; the Eviction API of the project's API server"),
    Gate("SystemConfig", ALPHA, YES, (_QOS,),
         verified="fixture /proc/sys tree; v2 guest: the real /proc/sys/vm files"),
    Gate("ResctrlCollector", ALPHA, YES, (_COLLECTORS,), note="needs -enable-resctrl-collector too, as in Koordinator",
         verified="fixture: resctrl mon_data of an Intel RDT machine"),
    Gate("CgroupReconcile", ALPHA, YES, (_QOS,),
         verified="v1 host and v2 guest: memory.min/low/high on real cgroups"),
    Gate("Accelerators", ALPHA, YES, ("koordlet/agent/wiring/devices.py", _REPORTERS),
         verified="fake NVML built from a real GPU machine's facts (make gpu-check: real NVML); XPU device-info "
                  "files laid out as koord-device-daemon writes them"),
    Gate("RDMADevices", ALPHA, YES, (_REPORTERS,), verified="fixture: sysfs of an mlx5 NIC with SR-IOV"),
    Gate("CPICollector", ALPHA, YES, (_COLLECTORS,), note="off without a hardware PMU (said once)",
         verified="v1 host and v2 guest: software counters on real cgroups; no-PMU path"),
    Gate("Libpfm4", ALPHA, YES, (_COLLECTORS,), verified="v1 host: libpfm4 4.13 encoding, grouped counters"),
    Gate("PSICollector", ALPHA, YES, (_COLLECTORS,),
         verified="v1 host (the hybrid unified mount) and v2 guest: real pressure files"),
    Gate("BlkIOReconcile", ALPHA, YES, (_QOS,),
         verified="v1 host: a loop device, rate measured; v2 guest: an attached disk (io.max, io.cost)"),
    Gate("ColdPageCollector", ALPHA, YES, (_COLLECTORS,), note="kidled or the page-idle bitmap; off without both",
         verified="fixture: Anolis kidled files, page-idle bitmap files; v1 host: neither (off)"),
    Gate("HugePageReport", ALPHA, YES, (_REPORTERS,), verified="fixture machines; v2 guest booted with hugepages"),
    Gate("PodResourcesProxy", ALPHA, YES, (_STATES,), verified="the test kubelet's pod resources API over gRPC"),
    Gate("HamiCoreVGPUMonitor", ALPHA, YES, ("hooks/gpu.py",), note=_VENDOR + " (HAMi-core)",
         verified="real containerd through the proxy; HAMi-core's cache dir layout"),
    Gate("PerCPUMetric", ALPHA, YES, (_COLLECTORS, _REPORTERS), verified="v1 host /proc/stat; fixture of 300 CPUs"),
    Gate("NodeMetricPromMetrics", ALPHA, YES, (_REPORTERS,),
         verified="v1 host: the agent's /metrics; NUMA series: two-NUMA fixture machine, v2 guest with two NUMA "
                  "nodes"),
    Gate("GPUEnvInject", ALPHA, YES, ("hooks/gpu.py",),
         verified="real containerd through the proxy (fake NVML)"),
    Gate("RDMADeviceInject", ALPHA, YES, ("hooks/rdma.py",),
         verified="fixture sysfs; devices into real containerd through the proxy"),
    Gate("CPUNormalization", ALPHA, YES, ("hooks/cpunormalization.py",),
         verified="real containerd through NRI; v1 host and v2 guest: with CPUBurst, neither undoes the other"),
    Gate("CoreSched", ALPHA, PARTIAL, ("hooks/coresched.py",),
         note="cpu.idle per pod only: no core scheduling cookies (prctl PR_SCHED_CORE; no kernel here has "
              "CONFIG_SCHED_CORE)",
         verified="v1 host and v2 guest: cpu.idle on real pod dirs, kubelet's QoS-dir writes accepted; "
                  "real containerd through the proxy and NRI"),
    Gate("TerwayQoS", ALPHA, YES, (_NETWORK,), note=_VENDOR + " (Terway)",
         verified="fixture: Terway's QoS dir (pod.json, global_bps_config)"),
    Gate("TCNetworkQoS", ALPHA, YES, (_NETWORK,),
         verified="v1 host: HTB classes on a veth in a private network namespace, rates measured"),
    Gate("Resctrl", ALPHA, YES, ("hooks/resctrl.py", "koordlet/runtimehooks/__init__.py"),
         verified="fixture: resctrl of an Intel RDT machine (no RDT here)"),
    Gate("OOMScoreAdj", ALPHA, YES, ("hooks/oomscore.py",),
         verified="v1 host: real containerd (raise; lowering needs CAP_SYS_RESOURCE); v2 guest: lowering"),
    # koordlet-py's own: off by default
    Gate("BEPSIThrottle", ALPHA, YES, (_QOS, "koordlet/runtimehooks/__init__.py"),
         note="koordlet-py's own (not Koordinator's): LS pods' CPU and IO pressure step BE's cpu.max and io.weight "
              "(cgroup v2)",
         verified="v2 guest: an LS probe's real CPU pressure beside a BE CPU burner; the io.weight line written and "
                  "put back",
         koordinator=False),
)
BY_NAME: Mapping[str, Gate] = MappingProxyType({gate.name: gate for gate in GATES})
BETA_GATES: tuple[str, ...] = tuple(g.name for g in GATES if g.stage == BETA)
# AllAlpha switches Koordinator's Alpha gates, as in Koordinator: not koordlet-py's own, which are named one by one
ALPHA_GATES: tuple[str, ...] = tuple(g.name for g in GATES if g.stage == ALPHA and g.koordinator)
DEFAULTS: Mapping[str, bool] = MappingProxyType({g.name: g.default for g in GATES})


def inert_enabled(gates: Mapping[str, bool]) -> list[str]:
    """The gates that are on (by default or by the command line) but that koordlet-py does not act on.

    Only gates that are on are named: a gate that is off and does nothing behaves exactly as asked, while
    a gate that is on (by default, or because a DaemonSet turns it on) promises a feature
    that is not there."""
    return [g.name for g in GATES if not g.acts and gates.get(g.name, g.default)]


def inert_message(gates: Mapping[str, bool]) -> str | None:
    """The one start-up log line about gates that are on and do nothing; None when there are none."""
    names = inert_enabled(gates)
    if not names:
        return None
    return f"feature gates on but not implemented by koordlet-py (accepted, no effect): {', '.join(names)}"


def gate_samples(gates: Mapping[str, bool]) -> Iterator[tuple[dict[str, str], float]]:
    """(labels, value) of ``koordlet_feature_gate`` for every known gate: value 1 when on, 0 when off."""
    for g in GATES:
        yield {"name": g.name, "stage": g.stage, "implemented": g.implemented}, float(gates.get(g.name, g.default))


def readme_table() -> str:
    """The gate table of docs/feature-gates.md (``tests/koordlet/test_features.py`` checks it holds exactly this)."""
    rows = ["| gate | default | implemented | note | verified on |", "|---|---|---|---|---|"]
    rows += [f"| `{g.name}` | {'on' if g.default else 'off'} | {g.implemented} | {g.note} | {g.verified} |"
             for g in GATES]
    return "\n".join(rows)


def report(gates: Mapping[str, bool], registry: CollectorRegistry, node: str) -> None:
    """At start-up: log the gates that are on and do nothing (one line), and export every gate as
    ``koordlet_feature_gate{node,name,stage,implemented}`` (1 on, 0 off) on the agent's ``registry``."""
    message = inert_message(gates)
    if message is not None:
        logger.warning("%s", message)
    gauge = Gauge("koordlet_feature_gate", "koordlet feature gates: 1 on, 0 off; implemented yes/partial/no",
                  ["node", "name", "stage", "implemented"], registry=registry)
    for labels, value in gate_samples(gates):
        gauge.labels(node=node, **labels).set(value)
