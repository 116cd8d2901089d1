"""NUMA-level usage (Koordinator #3138): node usage per NUMA node from per-CPU ticks and ``nodeN/meminfo``, system
usage per NUMA node from the pods' ``memory.numa_stat``, into NodeMetric ``status.nodeMetric.numaUsages[]`` (the
CRD's schema is the check) and the ``koordlet_node_metric_numa_*`` gauges. On the two-NUMA fixture machine (v1 and v2
cgroup trees laid out as the kernels write them), on this host's real files, and in the v2 guest booted with two
NUMA nodes (scripts/v2-stage.sh ``V2_NUMA``)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from koordlet.kubeapi import CustomObjects
from koordlet.metriccache import MetricCache, MetricKind, Sample, SeriesKey
from koordlet.metrics import KoordletMetrics
from koordlet.metricsadvisor import CollectorRunner, NodeResourceCollector, PodCgroup, PodResourceCollector
from koordlet.metricsadvisor.node import numa_key
from koordlet.metricsadvisor.nodeinfo import CPUNodeMap, NodeInfoCollector, NodeInfoKV
from koordlet.reporters.nodemetric import CollectPolicy, NodeMetricReporter, ReportOutcome, StatusBuilder
from koordlet.system import cgroup_stats
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.procfs import clock_ticks_per_second
from koordlet.system.sysfs import NUMAMemInfoFiles, SysfsError, parse_numa_meminfo, read_numa_nodes
from tests.koordlet.metricsadvisor.test_per_cpu import _Clock, _stat
from tests.koordlet.metricsadvisor.test_pods import _write_v1, _write_v2
from tests.koordlet.system.topology_tree import GIB_KB, build_tree, one_socket_no_smt, two_sockets_smt
from tests.support.apiserver import ApiServer, kube_api_client
from tests.support.nodeusage import with_node_usage
from tests.support.v2guest import in_v2_guest

GiB = 1 << 30
PAGE = os.sysconf("SC_PAGE_SIZE")
MEMINFO = b"MemTotal: 134217728 kB\nMemFree: 90000000 kB\nMemAvailable: 100000000 kB\n"
NODE = "node-numa"
# two_sockets_smt: node 0 holds CPUs 0-3 and 8-11, node 1 CPUs 4-7 and 12-15; 64 GiB each.
MACHINE = replace(two_sockets_smt(), meminfo={
    0: {"MemFree": 40 * GIB_KB, "Active(file)": 4 * GIB_KB, "Inactive(file)": 4 * GIB_KB, "SReclaimable": GIB_KB},
    1: {"MemFree": 50 * GIB_KB, "Active(file)": 2 * GIB_KB, "Inactive(file)": 2 * GIB_KB, "SReclaimable": GIB_KB},
})
NODE_USED = {0: 15 * GiB, 1: 9 * GiB}  # 64 − (free + active file + inactive file + SReclaimable)
PODS = (PodCgroup("uid-a", "kubepods/poduid-a", (), "LS"), PodCgroup("uid-b", "kubepods/besteffort/poduid-b", (), "BE"))
POD_NUMA = {"uid-a": {0: 3 * GiB, 1: GiB}, "uid-b": {0: GiB, 1: 2 * GiB}}  # anon LRU + unevictable per node


def _numa_stat(version: int, per_node: dict[int, int]) -> bytes:
    """memory.numa_stat as each kernel writes it: v1 ``name=total N0=.. N1=..`` in pages, v2 ``name N0=..`` in
    bytes. The anon part is split 3:1 between the LRU lists (v2) and the unevictable part is 4 KiB-aligned pages."""
    def line(name: str, values: dict[int, int], sep: str = "=") -> str:
        return f"{name}{sep}{sum(values.values())} " * (version == 1) + (f"{name} " * (version == 2)) + \
            " ".join(f"N{node}={value}" for node, value in sorted(values.items()))

    unevictable = dict.fromkeys(per_node, PAGE * 2)
    anon = {node: used - unevictable[node] for node, used in per_node.items()}
    zero = dict.fromkeys(per_node, 0)
    if version == 1:
        def pages(values: dict[int, int]) -> dict[int, int]:
            return {node: value // PAGE for node, value in values.items()}
        lines = [line("total", pages(per_node)), line("file", zero), line("anon", zero), line("unevictable", zero),
                 line("hierarchical_total", pages(per_node)), line("hierarchical_file", zero),
                 line("hierarchical_anon", pages(anon)), line("hierarchical_unevictable", pages(unevictable))]
    else:
        lines = [line("anon", anon), line("file", zero), line("kernel_stack", zero), line("shmem", zero),
                 line("inactive_anon", {n: v // 4 for n, v in anon.items()}),
                 line("active_anon", {n: v - v // 4 for n, v in anon.items()}),
                 line("inactive_file", zero), line("active_file", zero), line("unevictable", unevictable)]
    return ("\n".join(lines) + "\n").encode()


def _write_pods(root: Path, version: int, usage_ns: dict[str, int]) -> None:
    """The pods' dirs, and the kubepods dir's memory.numa_stat holding both pods' memory (the kernel counts a
    dir's descendants there: v1 in its hierarchical_* lines, v2 in every line)."""
    write = _write_v1 if version == 1 else _write_v2
    for pod in PODS:
        write(root, pod.cgroup_dir, usage_ns[pod.pod_uid], 0, 0, sum(POD_NUMA[pod.pod_uid].values()))
    both = {node: POD_NUMA["uid-a"][node] + POD_NUMA["uid-b"][node] for node in (0, 1)}
    kubepods = root / "cgroup" / ("memory" if version == 1 else "") / "kubepods"
    (kubepods / "memory.numa_stat").write_bytes(_numa_stat(version, both))


class _Agent:
    """The three collectors as the agent builds them (koordlet/agent/wiring/metricsadvisor.py), on fixture trees."""

    def __init__(self, root: Path, sys_dir: str, version: int, pods: tuple[PodCgroup, ...] = PODS) -> None:
        self.cache = MetricCache()
        self.clock = _Clock()
        self.infos: list[tuple[str, bool]] = []
        self.info = NodeInfoCollector(self.cache, sys_dir, observe=lambda what, ok: self.infos.append((what, ok)))
        self.node = NodeResourceCollector(str(root), monotonic_ns=self.clock, numa_files=NUMAMemInfoFiles(sys_dir),
                                          cpu_nodes=CPUNodeMap(self.cache))
        fs = CgroupFS(mount_dir=str(root / "cgroup"), version=CgroupVersion(version))
        self.pods = PodResourceCollector(lambda: pods, fs, node=self.node, monotonic_ns=self.clock,
                                         kubepods_dir="kubepods")

    def tick(self, now: float, info: bool = True) -> dict[SeriesKey, float]:
        samples: list[Sample] = [*(self.info.collect(now) if info else ()), *self.node.collect(now),
                                 *self.pods.collect(now)]
        self.cache.append_samples(samples)
        return {s.key: s.value for s in samples}

    def close(self) -> None:
        self.node.close()
        self.pods.close()


@pytest.mark.parametrize("version", [1, 2])
def test_two_numa_node_and_system_usage_per_node(tmp_path: Path, version: int) -> None:
    hz = clock_ticks_per_second()
    sys_dir = build_tree(tmp_path, MACHINE)
    (tmp_path / "meminfo").write_bytes(MEMINFO)
    (tmp_path / "stat").write_bytes(_stat(dict.fromkeys(range(16), 1000)))
    _write_pods(tmp_path, version, {"uid-a": 10**9, "uid-b": 10**9})
    agent = _Agent(tmp_path, sys_dir, version)
    try:
        first = agent.tick(100.0)
        # Memory needs no priming; CPU does. System memory per node = the node's − both pods' memory on it.
        assert {n: first[numa_key(MetricKind.NODE_NUMA_MEMORY_USAGE, n)] for n in (0, 1)} == NODE_USED
        assert first[numa_key(MetricKind.SYS_NUMA_MEMORY_USAGE, 0)] == 15 * GiB - 4 * GiB
        assert first[numa_key(MetricKind.SYS_NUMA_MEMORY_USAGE, 1)] == 9 * GiB - 3 * GiB
        assert numa_key(MetricKind.NODE_NUMA_CPU_USAGE, 0) not in first
        # 2 s later: CPUs 0 and 8 (node 0) fully busy, CPU 12 (node 1) half; the pods used 0.5 core together.
        busy = dict.fromkeys(range(16), 1000) | {0: 1000 + 2 * hz, 8: 1000 + 2 * hz, 12: 1000 + hz}
        (tmp_path / "stat").write_bytes(_stat(busy))
        _write_pods(tmp_path, version, {"uid-a": 10**9 + 6 * 10**8, "uid-b": 10**9 + 4 * 10**8})
        agent.clock.ns += 2 * 10**9
        second = agent.tick(102.0)
    finally:
        agent.close()
    assert second[numa_key(MetricKind.NODE_NUMA_CPU_USAGE, 0)] == pytest.approx(2.0)
    assert second[numa_key(MetricKind.NODE_NUMA_CPU_USAGE, 1)] == pytest.approx(0.5)
    # system CPU = 2.5 − 0.5 = 2.0 cores, shared out 2.0 : 0.5 by the nodes' CPU use (no per-NUMA cgroup CPU)
    assert second[SeriesKey.of(MetricKind.SYS_CPU_USAGE)] == pytest.approx(2.0)
    assert second[numa_key(MetricKind.SYS_NUMA_CPU_USAGE, 0)] == pytest.approx(1.6)
    assert second[numa_key(MetricKind.SYS_NUMA_CPU_USAGE, 1)] == pytest.approx(0.4)
    assert agent.infos == [("cpu_info", True), ("numa_info", True)] * 2
    assert NodeInfoKV.of(agent.cache).numa_node_ids == (0, 1)

    status = StatusBuilder(agent.cache).build((), CollectPolicy(), 102.0)
    numa = status["nodeMetric"]["numaUsages"]
    assert [u["numaNodeID"] for u in numa] == [0, 1]
    assert numa[0]["nodeUsage"] == {"resources": {"cpu": "2000m", "memory": str(15 * GiB)}}
    assert numa[1]["systemUsage"] == {"resources": {"cpu": "400m", "memory": str(6 * GiB)}}


def test_one_numa_node_counts_every_pod_on_it_without_reading_numa_stat(tmp_path: Path) -> None:
    sys_dir = build_tree(tmp_path, one_socket_no_smt(cores=4, memory_gib=16))
    (tmp_path / "meminfo").write_bytes(MEMINFO)
    (tmp_path / "stat").write_bytes(_stat(dict.fromkeys(range(4), 1000)))
    _write_v2(tmp_path, PODS[0].cgroup_dir, 10**9, 0, 0, GiB)  # no memory.numa_stat: it must not be needed
    agent = _Agent(tmp_path, sys_dir, 2, pods=PODS[:1])
    try:
        sample = agent.tick(5.0)
    finally:
        agent.close()
    used = 16 * GiB - (8 * GiB + GiB + GiB + GiB // 2)  # node_meminfo's defaults: half free, 1/16 + 1/16, 1/32
    assert sample[numa_key(MetricKind.NODE_NUMA_MEMORY_USAGE, 0)] == used
    assert sample[numa_key(MetricKind.SYS_NUMA_MEMORY_USAGE, 0)] == used - GiB
    assert agent.pods.read_errors == 0


def test_a_node_meminfo_that_goes_bad_costs_the_numa_part_only(tmp_path: Path) -> None:
    sys_dir = build_tree(tmp_path, MACHINE)
    (tmp_path / "meminfo").write_bytes(MEMINFO)
    (tmp_path / "stat").write_bytes(_stat(dict.fromkeys(range(16), 1000)))
    agent = _Agent(tmp_path, sys_dir, 2, pods=())
    try:
        assert numa_key(MetricKind.NODE_NUMA_MEMORY_USAGE, 1) in agent.tick(1.0)
        Path(sys_dir, "devices/system/node/node1/meminfo").write_text("Node 1 garbage\n")
        with pytest.raises(SysfsError):
            agent.info.collect(2.0)  # the runner counts it; the last good NUMA info stays
        bad = agent.tick(2.0, info=False)
    finally:
        agent.close()
    assert SeriesKey.of(MetricKind.NODE_MEMORY_USAGE) in bad
    assert not any(key.kind == MetricKind.NODE_NUMA_MEMORY_USAGE for key in bad)
    assert agent.infos[-1] == ("numa_info", False) and NodeInfoKV.of(agent.cache).numa_node_ids == (0, 1)


def test_numa_meminfo_and_numa_stat_parsers_take_the_kernels_files() -> None:
    info = parse_numa_meminfo(
        b"Node 1 MemTotal:       65536000 kB\nNode 1 MemFree:        30000000 kB\nNode 1 Active(file):    1000000 kB\n"
        b"Node 1 Inactive(file):  2000000 kB\nNode 1 SReclaimable:     536000 kB\nNode 1 HugePages_Total:     0\n", 1)
    assert info.used_bytes == (65536000 - 30000000 - 1000000 - 2000000 - 536000) * 1024
    assert cgroup_stats.numa_memory_usage(_numa_stat(1, {0: 4 * GiB, 1: GiB}), 1) == {0: 4 * GiB, 1: GiB}
    assert cgroup_stats.numa_memory_usage(_numa_stat(2, {0: 4 * GiB, 1: GiB}), 2) == {0: 4 * GiB, 1: GiB}
    with pytest.raises(cgroup_stats.CgroupStatError):
        cgroup_stats.numa_memory_usage(b"total=1 N0=1\n", 1)  # no hierarchical lines


# ------------------------------------------------------------------------------- NodeMetric and the CRD

def test_numa_usages_pass_the_crd_and_become_the_numa_gauges(server: ApiServer, tmp_path: Path) -> None:
    """``status.nodeMetric.numaUsages[]{numaNodeID, nodeUsage, systemUsage}`` as Koordinator's CRD at #3138
    declares it (numaNodeID int32 required; both usages ResourceMaps): the API server validates the status against
    deploy/chart/koordlet-py/files/crds; the gauges carry Koordinator's labels (metrics/node_metric.go)."""
    cache = MetricCache()
    cache.set_kv("node_numa_info", read_numa_nodes(build_tree(tmp_path, MACHINE)))
    samples = []
    for t in range(1000, 1300):
        for node_id, (cores, used) in {0: (2.0, 15 * GiB), 1: (0.5, 9 * GiB)}.items():
            samples += [Sample(numa_key(MetricKind.NODE_NUMA_CPU_USAGE, node_id), t, cores),
                        Sample(numa_key(MetricKind.NODE_NUMA_MEMORY_USAGE, node_id), t, used)]
        samples += [Sample(numa_key(MetricKind.SYS_NUMA_CPU_USAGE, 0), t, 1.6),
                    Sample(numa_key(MetricKind.SYS_NUMA_MEMORY_USAGE, 0), t, 11 * GiB)]  # node 1: no system series
    cache.append_samples(samples)
    with_node_usage(cache, 1299.0)
    server.seed({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": {"name": NODE},
                 "spec": {}})
    metrics = KoordletMetrics(NODE)
    with kube_api_client(server) as client:
        reporter = NodeMetricReporter(NODE, cache, lambda: (), custom_api=CustomObjects(client),
                                      wall_clock=lambda: 1299.0, on_report=metrics.observe_node_metric_status)
        assert reporter.report_once() is ReportOutcome.UPDATED
    numa = server.get_object("nodemetrics", NODE)["status"]["nodeMetric"]["numaUsages"]
    assert numa == [
        {"numaNodeID": 0, "nodeUsage": {"resources": {"cpu": "2000m", "memory": str(15 * GiB)}},
         "systemUsage": {"resources": {"cpu": "1600m", "memory": str(11 * GiB)}}},
        {"numaNodeID": 1, "nodeUsage": {"resources": {"cpu": "500m", "memory": str(9 * GiB)}}},
    ]
    served = _samples(metrics)
    assert served[("koordlet_node_metric_numa_node_usage", (("node", NODE), ("numa_node_id", "1"),
                                                            ("resource", "cpu"), ("unit", "core")))] == 0.5
    assert served[("koordlet_node_metric_numa_system_usage", (("node", NODE), ("numa_node_id", "0"),
                                                              ("resource", "memory"), ("unit", "byte")))] == 11 * GiB
    # A later report without NUMA usages takes the NUMA series away (every series is set afresh each report).
    metrics.observe_node_metric_status({"nodeMetric": {"nodeUsage": {"resources": {"cpu": "1"}}}})
    assert "numa_node_id=" not in generate_latest(metrics.registry).decode()


def _samples(metrics: KoordletMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """What /metrics shows, parsed back: (sample name, sorted labels) → value."""
    text = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_the_crds_numa_usages_field_is_koordinators() -> None:
    """Facts of Koordinator's NodeMetric CRD after #3138 (config/crd/bases/slo.koordinator.sh_nodemetrics.yaml),
    recorded here: numaUsages is an array under status.nodeMetric whose items require numaNodeID (int32) and
    carry nodeUsage and systemUsage ResourceMaps."""
    import yaml
    repo = Path(__file__).resolve().parents[3]
    crd = yaml.safe_load((repo / "deploy/chart/koordlet-py/files/crds/slo.koordinator.sh_nodemetrics.yaml").read_text())
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    items = status["nodeMetric"]["properties"]["numaUsages"]["items"]
    assert status["nodeMetric"]["properties"]["numaUsages"]["type"] == "array"
    assert items["required"] == ["numaNodeID"]
    assert items["properties"]["numaNodeID"] == {"type": "integer", "format": "int32"}
    for part in ("nodeUsage", "systemUsage"):
        assert set(items["properties"][part]["properties"]) == {"resources", "devices"}


# ------------------------------------------------------------------------------------- real kernels

def test_this_hosts_numa_usage_from_its_own_files(tmp_path: Path) -> None:
    """On this host's /proc and /sys: one entry per NUMA node it has, CPU per node adding up to the node's CPU
    (the same /proc/stat read), memory per node within the node's MemTotal."""
    cache = MetricCache()
    node = NodeResourceCollector("/proc", numa_files=NUMAMemInfoFiles("/sys"), cpu_nodes=CPUNodeMap(cache))
    runner = CollectorRunner(cache, [NodeInfoCollector(cache, "/sys"), node])
    try:
        runner.run_collector("node_info")
        runner.run_collector("node_resource", 1.0)
        started = time.monotonic()
        while time.monotonic() - started < 0.5:  # some CPU between the two readings
            pass
        time.sleep(0.5)
        runner.run_collector("node_resource", 2.0)
        elapsed_s = time.monotonic() - started
    finally:
        node.close()
    nodes = read_numa_nodes("/sys")
    numa = node.last_numa
    assert numa is not None and set(numa.memory_bytes) == {n.node_id for n in nodes}
    for n in nodes:
        assert 0 < numa.memory_bytes[n.node_id] <= n.memory_total_bytes or n.memory_total_bytes == 0
    usage = node.last_usage
    assert usage is not None and usage.cpu_cores is not None
    # The kernel turns each CPU's time into ticks on its own (truncating) and the total once: up to one tick per
    # busy field (5) per CPU apart.
    slack = 5 * sum(len(n.cpus) for n in nodes) / (elapsed_s * clock_ticks_per_second())
    assert sum(numa.cpu_cores.values()) == pytest.approx(usage.cpu_cores, abs=slack)


_TOUCHER = """
import os, sys, time
os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(",")})
sys.stdin.readline()  # moved into the pod's cgroup by now
data = bytearray(256 << 20)
for offset in range(0, len(data), 4096):
    data[offset] = 1  # first touch: the page comes from the NUMA node this CPU belongs to
print("touched", flush=True)
while True:
    pass  # keep one CPU of that node busy
"""


@contextlib.contextmanager
def _pinned_pod(root: str, base: str, cpus: tuple[int, ...]) -> Iterator[str]:
    """A pod dir ``<root>/<base>/pod`` (memory controller on) holding one process pinned to ``cpus`` that has touched
    256 MiB and spins; yields the pod dir, then kills the process and removes both dirs."""
    pod_dir = os.path.join(root, base, "pod")
    child: subprocess.Popen[bytes] | None = None
    try:
        with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
            f.write("+memory")
        os.mkdir(os.path.dirname(pod_dir))
        with open(os.path.join(root, base, "cgroup.subtree_control"), "w") as f:
            f.write("+memory")
        os.mkdir(pod_dir)
        child = subprocess.Popen([sys.executable, "-c", _TOUCHER, ",".join(map(str, cpus))],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        with open(os.path.join(pod_dir, "cgroup.procs"), "w") as f:
            f.write(str(child.pid))
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(b"go\n")
        child.stdin.flush()
        assert child.stdout.readline() == b"touched\n"
        yield pod_dir
    finally:
        if child is not None:
            child.kill()
            child.wait(10)
        for path in (pod_dir, os.path.dirname(pod_dir)):
            if os.path.isdir(path):
                os.rmdir(path)


@pytest.mark.cgroupv2
def test_v2_guest_with_two_numa_nodes_sees_a_pods_memory_on_its_node() -> None:
    """In the v2 guest booted with two NUMA nodes (scripts/v2-stage.sh ``V2_NUMA``, default 2): a process in a
    real pod cgroup, pinned to node 1's CPUs, touches 256 MiB (first touch puts the pages on node 1) and spins.
    The pod's memory shows on node 1, node 1's system memory leaves it out, node 1's CPU use carries the spin, and
    the NodeMetric status has every node (booted with ``V2_NUMA=1``: the same on node 0 alone)."""
    nodes = read_numa_nodes("/sys")
    wanted = int(os.environ.get("KPY_V2_NUMA", "2"))
    if in_v2_guest() and len(nodes) != wanted:
        pytest.fail(f"the v2 guest has {len(nodes)} NUMA node(s); scripts/v2-stage.sh booted it with {wanted}")
    root = "/sys/fs/cgroup"
    if not os.path.exists(os.path.join(root, "cgroup.controllers")):
        pytest.skip("/sys/fs/cgroup is not cgroup v2 (the v2 guest's is)")
    base, target = f"koordlet-py-test-{os.getpid()}-numa", nodes[-1]  # node 1 of two (node 0 with V2_NUMA=1)
    with _pinned_pod(root, base, target.cpus) as pod_dir:
        cache = MetricCache()
        node = NodeResourceCollector("/proc", numa_files=NUMAMemInfoFiles("/sys"), cpu_nodes=CPUNodeMap(cache))
        pods = PodResourceCollector(lambda: (PodCgroup("numa", f"{base}/pod", (), "LS"),),
                                    CgroupFS(root, CgroupVersion.V2), node=node, kubepods_dir=base)
        runner = CollectorRunner(cache, [NodeInfoCollector(cache, "/sys"), node, pods])
        try:
            for names in (("node_info", "node_resource", "pod_resource"), ("node_resource", "pod_resource")):
                now = time.time()
                for name in names:
                    runner.run_collector(name, now)
                time.sleep(1.0)
        finally:
            node.close()
            pods.close()
        pod_memory = cgroup_stats.numa_memory_usage(Path(pod_dir, "memory.numa_stat").read_bytes(), 2)
    numa = node.last_numa
    assert numa is not None and pod_memory.get(target.node_id, 0) >= 200 << 20, pod_memory
    assert numa.memory_bytes[target.node_id] >= pod_memory[target.node_id]
    system = cache.latest(numa_key(MetricKind.SYS_NUMA_MEMORY_USAGE, target.node_id))
    assert system is not None and system[1] <= numa.memory_bytes[target.node_id] - (200 << 20)
    assert numa.cpu_cores[target.node_id] >= 0.5, numa.cpu_cores
    status = StatusBuilder(cache).build((), CollectPolicy(), now)
    assert [u["numaNodeID"] for u in status["nodeMetric"]["numaUsages"]] == [n.node_id for n in nodes]
    assert all("systemUsage" in u for u in status["nodeMetric"]["numaUsages"])
