"""A small real node for the QoS tests and bench/qos_reaction.py: private cgroup dirs laid out like
kubelet's (``<prefix>/kubepods/{burstable,besteffort}/pod<uid>``), real processes in them, the real
collectors feeding a real metric cache, the real executor and the QoS manager, wired as koordlet wires them: the
kubepods dir read every collection, each pod every fan-out interval unless a strategy that is on asks for it.

Everything lives under ``/sys/fs/cgroup/<ctrl>/koordlet-py-test-<pid>-<name>/`` on cgroup v1, or
``/sys/fs/cgroup/koordlet-py-test-<pid>-<name>/`` on cgroup v2 (:class:`V2TestCgroups`), which is the
kubelet ``--cgroup-root`` of this node, and is removed by :meth:`RealNode.close`.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace

import kubernetes.client
import pytest

from koordlet.api.keys import LABEL_QOS_CLASS
from koordlet.api.nodeslo import NodeSLOSpec
from koordlet.api.pod import ContainerMeta, PodMeta
from koordlet.api.qos import KubeQoS, QoSClass
from koordlet.eviction import Evictor
from koordlet.executor import ResourceExecutor
from koordlet.metriccache import MetricCache
from koordlet.metricsadvisor import (
    CollectorRunner,
    NodeResourceCollector,
    PodCgroup,
    PodResourceCollector,
)
from koordlet.metricsadvisor.pods import DemandBoard
from koordlet.qosmanager import QoSManager, QoSManagerConfig, new_qos_manager
from koordlet.statesinformer.api import NodeInfo, StaticStates
from koordlet.statesinformer.cgroups import pod_cgroups
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.cgroup_stats import CfsQuota, read_cfs_quota
from koordlet.system.kubepods import KubeCgroupLayout
from koordlet.system.procfs import parse_meminfo
from tests.koordlet.metricsadvisor.v1cgroups import V1TestCgroups, skip_unless_v1_writable
from tests.support.v2guest import V2_CONTROLLERS, V2_ROOT, skip_unless_v2_writable

CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory")
BURN = "while True:\n    pass\n"
FANOUT_S = 10.0  # koordlet's -collect-pod-res-used-interval
# An LS latency probe (bench/cpu_idle.py, bench/psi_throttle.py): {seconds} of sleep 1 ms / wake / 100 µs of work;
# prints its lateness samples (µs, "late_us") and counters as one JSON line.
WAKE_PROBE = """
import json, time
def schedstat():
    with open('/proc/self/schedstat') as f:
        run_ns, wait_ns, slices = f.read().split()
    return int(wait_ns), int(slices)
period, work, end = 0.001, 0.0001, time.monotonic() + {seconds}
late, wakeups = [], 0
wait0, slices0 = schedstat()
started = time.monotonic()
while time.monotonic() < end:
    asked = time.monotonic()
    time.sleep(period)
    woke = time.monotonic()
    late.append((woke - asked - period) * 1e6)
    spin_until = woke + work
    while time.monotonic() < spin_until:
        pass
    wakeups += 1
elapsed = time.monotonic() - started
wait1, slices1 = schedstat()
print(json.dumps({{"late_us": late, "wakeups_per_s": wakeups / elapsed,
                  "run_delay_us_per_wakeup": (wait1 - wait0) / 1e3 / max(wakeups, 1)}}))
"""


def memory_total() -> int:
    """The node's memory (MemTotal): what the QoS tests' nodes have as capacity. Never its use: other programs on
    the machine move that, so no threshold is set from it."""
    with open("/proc/meminfo", "rb") as f:
        return parse_meminfo(f.read()).mem_total_bytes


# Parameters of a fixture that builds its node with RealNode.of_version: each test once per cgroup version.
BOTH_VERSIONS = (pytest.param("v1", marks=pytest.mark.cgroupv1), pytest.param("v2", marks=pytest.mark.cgroupv2))


class V2TestCgroups(V1TestCgroups):
    """Private cgroup v2 dirs with cpu, cpuset and memory delegated to every level. One hierarchy: the
    controller argument of V1TestCgroups is ignored, so ``spawn`` and ``cleanup`` are shared. Processes go
    only into leaves (the v2 no-internal-process rule)."""

    version = 2

    def __init__(self, name: str, delegate: Sequence[str] = V2_CONTROLLERS) -> None:
        """``delegate``: the controllers enabled in every level's ``cgroup.subtree_control``."""
        super().__init__(name, controllers=("unified",))
        self.delegate = tuple(delegate)

    def path(self, controller: str, rel: str = "") -> str:
        return os.path.join(V2_ROOT, self.prefix, rel).rstrip("/")

    def make(self, rel: str = "") -> None:
        parts = [p for p in rel.split("/") if p]
        for depth in range(len(parts) + 1):
            path = self.path("", "/".join(parts[:depth]))
            if not os.path.isdir(path):
                with open(os.path.join(os.path.dirname(path), "cgroup.subtree_control"), "w") as f:
                    f.write(" ".join(f"+{c}" for c in self.delegate))
                os.mkdir(path)
                self._dirs.append(path)


def cgroups_of_version(version: str, name: str,
                       v1_controllers: tuple[str, ...] = ("cpu", "cpuacct", "memory")) -> Iterator[V1TestCgroups]:
    """Generator body of a fixture over :data:`BOTH_VERSIONS`: a test's private cgroup dirs on this host's v1
    (``v1_controllers``) or on the VM stage's v2 (cpu, cpuset and memory); skipped where that hierarchy cannot be
    written, always cleaned up. ``.version`` says which."""
    if version == "v2":
        skip_unless_v2_writable()
        groups: V1TestCgroups = V2TestCgroups(name)
    else:
        skip_unless_v1_writable(v1_controllers)
        groups = V1TestCgroups(name, v1_controllers)
    try:
        yield groups
    finally:
        groups.cleanup()


class RealNode:
    @classmethod
    def of_version(cls, version: str, name: str, pods: Sequence[tuple[str, QoSClass, KubeQoS]]) -> RealNode:
        """A node on this host's cgroup v1 (``"v1"``) or on the VM stage's cgroup v2 (``"v2"``, the
        :data:`BOTH_VERSIONS` parameters); skipped where that hierarchy cannot be written."""
        if version == "v2":
            skip_unless_v2_writable()
        else:
            cls.skip_unless_possible()
        return cls(name, pods, v2=version == "v2")

    @classmethod
    def of_version_closed_after(cls, version: str, name: str,
                                pods: Sequence[tuple[str, QoSClass, KubeQoS]]) -> Iterator[RealNode]:
        """Generator body of a fixture over :data:`BOTH_VERSIONS`: :meth:`of_version`, closed after the test."""
        real = cls.of_version(version, name, pods)
        try:
            yield real
        finally:
            real.close()

    def __init__(self, name: str, pods: Sequence[tuple[str, QoSClass, KubeQoS]], collect_interval_s: float = 1.0,
                 node_name: str = "node-1", v2: bool = False, fanout_s: float = FANOUT_S,
                 delegate: Sequence[str] = V2_CONTROLLERS) -> None:
        """``fanout_s``: how often the collector reads a pod no strategy asks for (at most ``collect_interval_s``:
        every pod every collection); ``delegate``: on cgroup v2, the controllers enabled down to the pods (add ``io``
        for io.weight)."""
        self.groups: V1TestCgroups | V2TestCgroups = (V2TestCgroups(name, delegate) if v2
                                                      else V1TestCgroups(name, CONTROLLERS))
        self.layout = KubeCgroupLayout(cgroup_root="/" + self.groups.prefix)
        self.fs = CgroupFS.detect()
        self.executor = ResourceExecutor(self.fs)
        self.pods: list[PodMeta] = []
        for pod_name, qos, kube_qos in pods:
            uid = f"{pod_name}-0000-4000-8000-{os.getpid():012d}"
            pod_dir = self.layout.pod_dir(uid, kube_qos)
            self.pods.append(PodMeta(name=pod_name, namespace="default", uid=uid, labels={LABEL_QOS_CLASS: qos},
                                     kube_qos=kube_qos, cgroup_parent="/" + pod_dir, phase="Running"))
        try:
            for kube_qos in (KubeQoS.BURSTABLE, KubeQoS.BESTEFFORT):
                self.groups.make(self._rel(self.layout.qos_dir(kube_qos)))
            for pod in self.pods:
                self.groups.make(self._rel(self.pod_dir(pod)))
        except OSError:
            self.groups.cleanup()
            raise
        total = memory_total()
        self.node = NodeInfo(node_name, capacity={"cpu": os.cpu_count() * 1000, "memory": total},
                             allocatable={"cpu": os.cpu_count() * 1000, "memory": total})
        self.states = StaticStates(node=self.node, pods=tuple(self.pods))
        self.cache = MetricCache()
        self.node_collector = NodeResourceCollector(interval_s=collect_interval_s)
        self.demand = DemandBoard()
        self.pod_collector = PodResourceCollector(
            self._pod_cgroups, self.fs, interval_s=collect_interval_s,
            be_cgroup_dir=self.layout.qos_dir(KubeQoS.BESTEFFORT), node=self.node_collector,
            kubepods_dir=self.layout.kubepods_dir(), fanout_interval_s=max(fanout_s, collect_interval_s),
            demand=self.demand.get)
        self.runner = CollectorRunner(self.cache, [self.node_collector, self.pod_collector])
        self.manager: QoSManager | None = None

    @classmethod
    def skip_unless_possible(cls) -> None:
        skip_unless_v1_writable(CONTROLLERS)

    def _rel(self, cgroup_dir: str) -> str:
        return cgroup_dir.removeprefix(self.groups.prefix).strip("/")

    def pod(self, name: str) -> PodMeta:
        return next(p for p in self.pods if p.name == name)

    def pod_dir(self, pod: PodMeta) -> str:
        return pod.cgroup_parent.strip("/")

    def _pod_cgroups(self) -> list[PodCgroup]:
        """The pods' dirs as the agent lists them to its collectors (with the BE pods' batch-cpu requests)."""
        return pod_cgroups(self.states.pods(), self.layout)

    def add_container(self, pod_name: str, container: ContainerMeta) -> str:
        """Give pod ``pod_name`` the container ``container`` (a dir under its pod dir, as cgroupfs lays it out)
        and return the container's dir."""
        pod_dir = self.pod_dir(self.pod(pod_name))
        container_dir = f"{pod_dir}/{container.container_id}"
        self.groups.make(self._rel(container_dir))
        self.states.set_pods([replace(p, containers=(*p.containers, container)) if p.name == pod_name else p
                              for p in self.states.pods()])
        self.pods = list(self.states.pods())
        return container_dir

    def put_pod_in_api(self, pod_name: str, api_client: kubernetes.client.ApiClient) -> None:
        """Create pod ``pod_name`` in the (test) API server and take the uid it gives, so that an eviction
        through the Eviction API can name it."""
        pod = self.pod(pod_name)
        created = kubernetes.client.CoreV1Api(api_client).create_namespaced_pod("default", {
            "metadata": {"name": pod_name, "labels": dict(pod.labels)},
            "spec": {"containers": [{"name": "main", "image": "localhost/busybox"}]}})
        self.states.set_pods([replace(p, uid=created.metadata.uid) if p.name == pod_name else p
                              for p in self.states.pods()])
        self.pods = list(self.states.pods())

    def spawn(self, pod_name: str, code: str = BURN) -> subprocess.Popen[bytes]:
        return self.groups.spawn(self._rel(self.pod_dir(self.pod(pod_name))), code)

    def anon_bytes(self, pod_name: str) -> int:
        """The anonymous memory charged to a pod's own cgroup (v1 ``total_rss``, v2 ``anon`` of memory.stat): the
        node's use as koordlet reads it (MemTotal - MemAvailable) always counts it, whatever else runs."""
        field = "anon" if self.fs.version is CgroupVersion.V2 else "total_rss"
        stat = self.read("memory", self.pod_dir(self.pod(pod_name)), "memory.stat")
        return int(next(line.split()[1] for line in stat.splitlines() if line.split()[0] == field))

    def evict_threshold_held_by(self, pod_name: str) -> int:
        """A memory eviction threshold (percent of the node's capacity) the node is at or above as long as
        ``pod_name`` holds its memory, whatever the rest of the machine does."""
        return self.anon_bytes(pod_name) * 100 // self.node.capacity["memory"]

    def kubelet_weights(self, ls: str = "ls", be: str = "be") -> None:
        """kubelet's CPU weights on the QoS dirs and on pods ``ls`` (1 CPU requested) and ``be`` (BestEffort): the
        besteffort dir and a BestEffort pod 2 shares, the burstable dir and the LS pod 1024 (v2: kubelet's own
        linear mapping to cpu.weight, pkg/kubelet/cm getCPUWeight)."""
        v2 = self.fs.version is CgroupVersion.V2
        burstable = self.layout.qos_dir(KubeQoS.BURSTABLE)
        for cgroup_dir, shares in ((self.be_dir, 2), (self.pod_dir(self.pod(be)), 2), (burstable, 1024),
                                   (self.pod_dir(self.pod(ls)), 1024)):
            value = 1 + ((shares - 2) * 9999) // 262142 if v2 else shares
            with open(os.path.join(self.fs.cgroup_dir("cpu", cgroup_dir), "cpu.weight" if v2 else "cpu.shares"),
                      "w") as f:
                f.write(str(value))

    def read(self, controller: str, cgroup_dir: str, filename: str) -> str:
        with open(os.path.join(self.fs.cgroup_dir(controller, cgroup_dir), filename)) as f:
            return f.read().strip()

    @property
    def be_dir(self) -> str:
        return self.layout.qos_dir(KubeQoS.BESTEFFORT)

    def be_quota(self) -> CfsQuota:
        """The besteffort dir's CFS quota (v1 ``cpu.cfs_quota_us``/``cfs_period_us``, v2 ``cpu.max``)."""
        return read_cfs_quota(self.fs.cgroup_dir("cpu", self.be_dir), self.fs.version)

    def cpu_usage_ns(self, cgroup_dir: str) -> int:
        if self.fs.version is CgroupVersion.V2:
            stat = dict(line.split() for line in self.read("cpu", cgroup_dir, "cpu.stat").splitlines())
            return int(stat["usage_usec"]) * 1000
        return int(self.read("cpuacct", cgroup_dir, "cpuacct.usage"))

    def cpu_cores(self, cgroup_dir: str, seconds: float) -> float:
        """Cores a cgroup used over ``seconds``, measured from cpuacct.usage."""
        start_ns, start = self.cpu_usage_ns(cgroup_dir), time.monotonic()
        time.sleep(seconds)
        return (self.cpu_usage_ns(cgroup_dir) - start_ns) / 1e9 / (time.monotonic() - start)

    def start(self, node_slo: NodeSLOSpec, *, evictor: Evictor | None = None,
              config: QoSManagerConfig | None = None, cpu_manager=None) -> QoSManager:
        """``cpu_manager``: kubelet's CPU manager state provider (statesinformer.cpumanager), for suppress."""
        self.states.set_node_slo(node_slo)
        config = replace(config or QoSManagerConfig(node_name=self.node.name),
                         fanout_interval_s=self.pod_collector.fanout_interval_s)
        self.manager = new_qos_manager(self.states, self.cache, self.executor, self.layout, evictor=evictor,
                                       config=config, started_at=time.time() - 60, cpu_manager=cpu_manager,
                                       publish_demand=self.demand.set)
        self.runner.start()
        self.manager.start()
        return self.manager

    def close(self) -> None:
        if self.manager is not None:
            self.manager.stop()
        self.runner.stop()
        self.pod_collector.close()
        self.node_collector.close()
        self.groups.cleanup()
