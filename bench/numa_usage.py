"""What the NUMA-level usage (Koordinator #3138) adds to the 1 s collectors, side by side in one run.

Two setups, each timed with the NUMA part off and on in alternating rounds (the median tick of each):

  host      the node collector on this machine's /proc and /sys (its NUMA nodes' meminfo, every CPU's ticks)
  fixture   the node and pod collectors on the two-NUMA fixture machine of the tests (16 CPUs, 2 nodes) with
            ``--pods`` pod dirs of a cgroup v1 tree laid out as the kernel writes it, and the kubepods dir's
            memory.numa_stat (one read a tick, on a node with more than one NUMA node)

A benchmark, not a test. Prints µs per tick off and on, and their ratio.

    .venv/bin/python bench/numa_usage.py [--pods 150] [--ticks 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from koordlet.metriccache import MetricCache
from koordlet.metricsadvisor import NodeResourceCollector, PodCgroup, PodResourceCollector
from koordlet.metricsadvisor.nodeinfo import CPUNodeMap, NodeInfoCollector
from koordlet.system.cgroup import CgroupFS, CgroupVersion
from koordlet.system.sysfs import NUMAMemInfoFiles
from tests.koordlet.metricsadvisor.test_numa import MACHINE, _numa_stat
from tests.koordlet.metricsadvisor.test_per_cpu import _stat
from tests.koordlet.metricsadvisor.test_pods import _write_v1
from tests.koordlet.system.topology_tree import build_tree

GiB = 1 << 30


def _median_us(tick: Callable[[float], object], ticks: int) -> float:
    durations = []
    for i in range(ticks):
        started = time.perf_counter()
        tick(float(i))
        durations.append(time.perf_counter() - started)
    return statistics.median(durations) * 1e6


def _host(numa: bool) -> Callable[[float], object]:
    cache = MetricCache()
    if numa:
        NodeInfoCollector(cache, "/sys").collect(0.0)
    return NodeResourceCollector("/proc", numa_files=NUMAMemInfoFiles("/sys") if numa else None,
                                 cpu_nodes=CPUNodeMap(cache) if numa else None).collect


def _fixture(root: Path, pods: tuple[PodCgroup, ...], numa: bool) -> Callable[[float], object]:
    sys_dir = str(root / "sys")
    cache = MetricCache()
    if numa:
        NodeInfoCollector(cache, sys_dir).collect(0.0)
    node = NodeResourceCollector(str(root), numa_files=NUMAMemInfoFiles(sys_dir) if numa else None,
                                 cpu_nodes=CPUNodeMap(cache) if numa else None)
    pod_collector = PodResourceCollector(lambda: pods, CgroupFS(str(root / "cgroup"), CgroupVersion.V1), node=node,
                                         kubepods_dir="kubepods")

    def tick(now: float) -> object:
        return (node.collect(now), pod_collector.collect(now))

    return tick


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=150)
    parser.add_argument("--ticks", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="numa-bench-") as tmp:
        root = Path(tmp)
        build_tree(root, MACHINE)
        (root / "stat").write_bytes(_stat(dict.fromkeys(range(16), 1000)))
        (root / "meminfo").write_bytes(b"MemTotal: 134217728 kB\nMemFree: 90000000 kB\nMemAvailable: 100000000 kB\n")
        pods = tuple(PodCgroup(f"uid-{i}", f"kubepods/poduid-{i}", (), "LS") for i in range(args.pods))
        for pod in pods:
            _write_v1(root, pod.cgroup_dir, 10**9, 0, 0, GiB)
        (root / "cgroup/memory/kubepods/memory.numa_stat").write_bytes(
            _numa_stat(1, {0: len(pods) * GiB // 2, 1: len(pods) * GiB // 2}))
        results: dict[tuple[str, bool], list[float]] = {}
        for _ in range(args.rounds):
            for numa in (False, True):
                results.setdefault(("host", numa), []).append(_median_us(_host(numa), args.ticks))
                results.setdefault(("fixture", numa), []).append(
                    _median_us(_fixture(root, pods, numa), args.ticks))
    print(f"{'setup':<10} {'off µs':>10} {'on µs':>10} {'on/off':>8}")
    for setup in ("host", "fixture"):
        off, on = (statistics.median(results[(setup, numa)]) for numa in (False, True))
        print(f"{setup:<10} {off:>10.1f} {on:>10.1f} {on / off:>8.2f}")
    print(f"(median of {args.rounds} rounds of the median of {args.ticks} ticks; fixture: {args.pods} pods, "
          f"2 NUMA nodes, 16 CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
