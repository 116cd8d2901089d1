"""What the metrics pipeline costs at 10, 50 and 150 containers, collected every second.

For each N this creates N pods in real cgroup v1 dirs (cpu, cpuacct, memory, cpuset) under a private
prefix, one container dir per pod and one sleeping process per container, then runs the node, PSI and
pod/container collectors (with the BE aggregate and system usage) into the metric cache at 1 s in a
fresh Python process for a fixed time, and reports that process's

  rss_mib           resident set at the end (interpreter and imports included)
  cpu_pct           CPU time over wall time while collecting, in % of one core
  us_per_container  time of one pod-collector tick divided by N (each container also has its pod dir)

Anchor: Koordinator's koordlet, 341 MiB and 0.5 core at 150 containers with 1 s collection
(docs/koordinator.md §14). Goal here: <= 100 MiB and <= 5 % of a core. A benchmark, not a test:
needs root and cgroup v1 hierarchies at /sys/fs/cgroup/<controller>. Cleans up after itself.

    .venv/bin/python bench/agent_cost.py [--counts 10,50,150] [--seconds 15] [--json]
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CGROUP_ROOT = "/sys/fs/cgroup"
CONTROLLERS = ("cpu", "cpuacct", "memory", "cpuset")
BE_DIR = "besteffort"


@dataclass(frozen=True, slots=True)
class Result:
    rss_mib: float
    cpu_pct: float
    us_per_container: float
    ticks: int


class BenchCgroups:
    """N pod dirs with one container dir and one sleeping process each, removed by cleanup()."""

    def __init__(self, count: int) -> None:
        self.prefix = f"koordlet-py-bench-{os.getpid()}-{count}"
        self.count = count
        self._dirs: list[str] = []
        self._sleepers: list[subprocess.Popen[bytes]] = []

    def _mkdir(self, rel: str) -> None:
        for ctrl in CONTROLLERS:
            path = os.path.join(CGROUP_ROOT, ctrl, rel)
            os.mkdir(path)
            self._dirs.append(path)
            if ctrl == "cpuset":  # an empty v1 cpuset accepts no tasks
                parent = os.path.dirname(path)
                for name in ("cpuset.cpus", "cpuset.mems"):
                    with open(os.path.join(parent, name)) as src, open(os.path.join(path, name), "w") as dst:
                        dst.write(src.read())

    def pod_rel(self, index: int) -> str:
        return f"{self.prefix}/{BE_DIR}/pod{index}"

    def create(self) -> None:
        self._mkdir(self.prefix)
        self._mkdir(f"{self.prefix}/{BE_DIR}")
        for index in range(self.count):
            self._mkdir(self.pod_rel(index))
            self._mkdir(f"{self.pod_rel(index)}/ctr")
            sleeper = subprocess.Popen(["sleep", "3600"])
            self._sleepers.append(sleeper)
            for ctrl in CONTROLLERS:
                with open(os.path.join(CGROUP_ROOT, ctrl, self.pod_rel(index), "ctr", "cgroup.procs"), "w") as f:
                    f.write(str(sleeper.pid))

    def cleanup(self) -> None:
        for sleeper in self._sleepers:
            sleeper.kill()
            sleeper.wait()
        self._sleepers.clear()
        for path in sorted(self._dirs, key=lambda p: p.count("/"), reverse=True):
            for attempt in range(50):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError as err:
                    if err.errno != errno.EBUSY or attempt == 49:
                        print(f"warning: cannot remove {path}: {err}", file=sys.stderr)
                        break
                    time.sleep(0.02)
        self._dirs.clear()


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def measure(prefix: str, count: int, seconds: float, interval_s: float) -> Result:
    """Runs in the child process: the collectors as the agent would run them."""
    from koordlet.metriccache import MetricCache
    from koordlet.metricsadvisor import (
        CollectorRunner,
        ContainerCgroup,
        NodePsiCollector,
        NodeResourceCollector,
        PodCgroup,
        PodResourceCollector,
    )
    from koordlet.system.cgroup import CgroupFS

    pods = [
        PodCgroup(
            pod_uid=f"uid-{i}",
            cgroup_dir=f"{prefix}/{BE_DIR}/pod{i}",
            containers=(ContainerCgroup(f"ctr-{i}", f"{prefix}/{BE_DIR}/pod{i}/ctr"),),
            qos="BE",
            batch_cpu_request_milli=100,
        )
        for i in range(count)
    ]
    cache = MetricCache()
    node = NodeResourceCollector(interval_s=interval_s)
    pod_collector = PodResourceCollector(
        lambda: pods, CgroupFS.detect(), interval_s=interval_s, be_cgroup_dir=f"{prefix}/{BE_DIR}", node=node
    )
    runner = CollectorRunner(cache, [node, NodePsiCollector(interval_s=10.0), pod_collector])
    usage_before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.monotonic()
    runner.start()
    time.sleep(seconds)
    runner.stop()
    wall = time.monotonic() - started
    usage_after = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (usage_after.ru_utime - usage_before.ru_utime) + (usage_after.ru_stime - usage_before.ru_stime)
    ticks = runner.registry.get_sample_value("koordlet_collector_duration_seconds_count", {"collector": "pod_resource"})
    tick_s = runner.registry.get_sample_value("koordlet_collector_duration_seconds_sum", {"collector": "pod_resource"})
    if not ticks or tick_s is None:
        raise RuntimeError("pod collector never ran")
    return Result(
        rss_mib=round(_rss_mib(), 1),
        cpu_pct=round(cpu_s / wall * 100, 2),
        us_per_container=round(tick_s / ticks / count * 1e6, 1),
        ticks=int(ticks),
    )


def run_one(count: int, seconds: float, interval_s: float) -> Result:
    groups = BenchCgroups(count)
    try:
        groups.create()
        child = subprocess.run(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--child",
                groups.prefix,
                str(count),
                "--seconds",
                str(seconds),
                "--interval",
                str(interval_s),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        return Result(**json.loads(child.stdout))
    finally:
        groups.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="10,50,150", help="container counts, comma separated")
    parser.add_argument("--seconds", type=float, default=15.0, help="collection time per count")
    parser.add_argument("--interval", type=float, default=1.0, help="collector interval in seconds")
    parser.add_argument("--json", action="store_true", help="print one JSON object keyed by count")
    parser.add_argument("--child", nargs=2, metavar=("PREFIX", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = measure(args.child[0], int(args.child[1]), args.seconds, args.interval)
        print(json.dumps(asdict(result)))
        return 0
    if os.geteuid() != 0 or not all(os.path.isdir(os.path.join(CGROUP_ROOT, c)) for c in CONTROLLERS):
        print("needs root and cgroup v1 hierarchies cpu, cpuacct, memory, cpuset", file=sys.stderr)
        return 2
    results = {}
    for count in (int(c) for c in args.counts.split(",")):
        results[count] = run_one(count, args.seconds, args.interval)
    if args.json:
        print(json.dumps({str(n): {k: v for k, v in asdict(r).items() if k != "ticks"} for n, r in results.items()}))
        return 0
    print(f"{'containers':>10} {'rss_mib':>8} {'cpu_pct':>8} {'us/container/tick':>18} {'ticks':>6}")
    for count, r in results.items():
        print(f"{count:>10} {r.rss_mib:>8.1f} {r.cpu_pct:>8.2f} {r.us_per_container:>18.1f} {r.ticks:>6}")
    print("anchor: Koordinator koordlet 341 MiB, 50 % of a core at 150 containers; goal <= 100 MiB, <= 5 %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
