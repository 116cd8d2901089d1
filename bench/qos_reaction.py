"""How fast koordlet's QoS loops react on real cgroups (docs/design.md §6: "time from a BE CPU burst to
suppression; time from memory pressure to eviction").

1. CPU: a BE process burns CPU in the besteffort cgroup under the cfsQuota suppress policy (collect and
   suppress intervals 1 s) until the BE quota is steady; then, at a random phase of the 1 s ticks, an LS
   process starts burning. Reported: seconds from the LS spike to the besteffort ``cpu.cfs_quota_us`` on
   disk shrinking below 80 % of its steady value, per round.
2. Memory: BEMemoryEvict with a threshold 2 % above the node's current usage; a BE process allocates 3 % of
   the node's memory. Reported: seconds from /proc/meminfo crossing the threshold (polled every 5 ms) to
   the eviction request reaching the (test) API server, per round.
Goals: ≤ 2 s each at 1 s intervals. Needs root and writable cgroup v1; run as
``.venv/bin/python bench/qos_reaction.py [--rounds N] [--json]``.

``--v2`` (``make bench-v2``): the same rounds on this host (cgroup v1), then in the cgroup v2 VM of the test
command (scripts/v2-stage.sh; ``cpu.max`` instead of ``cpu.cfs_quota_us``), printed side by side with the
ratio v2 / host. The VM emulates its CPUs (no usable KVM here), so the ratio shows emulation's cost as much
as v2's; ``--v2-guest`` is what runs inside the VM.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402

from koordlet.api.nodeslo import parse_node_slo_spec  # noqa: E402
from koordlet.api.qos import KubeQoS, QoSClass  # noqa: E402
from koordlet.eviction import Evictor  # noqa: E402
from koordlet.qosmanager import QoSManagerConfig  # noqa: E402
from koordlet.system.procfs import read_meminfo  # noqa: E402
from tests.koordlet.qosmanager.realnode import RealNode, skip_unless_v2_writable  # noqa: E402
from tests.support.apiserver import ApiServer, kube_api_client  # noqa: E402
from tests.support.v2guest import run_bench_in_v2_guest  # noqa: E402

PODS = (("ls", QoSClass.LS, KubeQoS.BURSTABLE), ("be", QoSClass.BE, KubeQoS.BESTEFFORT))
GOAL_S = 2.0


def _wait(predicate, timeout_s: float, step_s: float = 0.005) -> float | None:
    """Monotonic time at which ``predicate`` first held, or None on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(step_s)
    return None




def cpu_round(index: int, v2: bool = False) -> float | None:
    node = RealNode(f"bench-cpu-{index}", PODS, v2=v2)
    try:
        node.spawn("be")
        node.start(parse_node_slo_spec({"resourceUsedThresholdWithBE": {
            "enable": True, "cpuSuppressThresholdPercent": 65, "cpuSuppressPolicy": "cfsQuota"}}))
        quota = lambda: node.be_quota().quota_us  # noqa: E731
        # Steady: the quota has been set and stayed within 10 % for 2 s (BE alone gets ~65 % of the node).
        steady_deadline = time.monotonic() + 15
        previous, stable_since = quota(), time.monotonic()
        while time.monotonic() < steady_deadline:
            time.sleep(0.1)
            current = quota()
            if current == -1 or previous == -1 or abs(current - previous) > 0.1 * previous:
                previous, stable_since = current, time.monotonic()
            elif time.monotonic() - stable_since >= 2.0:
                break
        # Spike at a random phase of the 1 s collect/suppress ticks, not right after one.
        time.sleep(random.uniform(0.0, 1.0))
        before = quota()
        spike = time.monotonic()
        node.spawn("ls")
        shrunk = _wait(lambda: 0 < quota() < before * 0.8, 10.0)
        return None if shrunk is None else shrunk - spike
    finally:
        node.close()


def memory_total_and_used() -> tuple[int, int]:
    """The machine's memory and its use now (a benchmark of the real crossing; tests never set a threshold so)."""
    info = read_meminfo()
    return info.mem_total_bytes, info.used_bytes


def memory_round(index: int, v2: bool = False) -> float | None:
    with ApiServer() as server, kube_api_client(server) as api_client:
        node = RealNode(f"bench-mem-{index}", PODS, v2=v2)
        try:  # the node (and its evictor) stops before the API server it reports to
            node.put_pod_in_api("be", api_client)
            total, used = memory_total_and_used()
            threshold = int(used * 100 // total) + 2
            config = QoSManagerConfig(node_name="node-1", feature_gates={
                "BEMemoryEvict": True, "BECPUSuppress": False, "CPUBurst": False, "RdtResctrl": False})
            node.start(parse_node_slo_spec({"resourceUsedThresholdWithBE": {
                "enable": True, "memoryEvictThresholdPercent": threshold}}),
                evictor=Evictor("node-1", api_client=api_client), config=config)
            time.sleep(1.5)
            node.spawn("be", f"data = b'x' * {total * 3 // 100}\nimport time\ntime.sleep(60)\n")
            crossed = _wait(lambda: memory_total_and_used()[1] * 100 // total >= threshold, 10.0)
            requested = _wait(lambda: bool(server.requests("POST", r"/pods/be/eviction$")), 10.0, 0.005)
            if crossed is None or requested is None:
                return None
            return max(requested - crossed, 0.0)
        finally:
            node.close()


def _summary(name: str, values: list[float | None]) -> dict[str, object]:
    done = [v for v in values if v is not None]
    return {
        "measure": name,
        "rounds": len(values),
        "timeouts": len(values) - len(done),
        "median_s": round(statistics.median(done), 3) if done else None,
        "max_s": round(max(done), 3) if done else None,
        "values_s": [None if v is None else round(v, 3) for v in values],
        "goal_s": GOAL_S,
        "meets_goal": bool(done) and len(done) == len(values) and max(done) <= GOAL_S,
    }


def run_rounds(rounds: int, v2: bool = False) -> list[dict[str, object]]:
    return [
        _summary("ls_cpu_spike_to_be_quota_shrink", [cpu_round(i, v2) for i in range(rounds)]),
        _summary("memory_threshold_to_eviction_request", [memory_round(i, v2) for i in range(rounds)]),
    ]


def _print(results: list[dict[str, object]], label: str = "") -> None:
    for result in results:
        print(f"{label}{result['measure']:40s} median {result['median_s']} s  max {result['max_s']} s  "
              f"goal <= {GOAL_S} s  {'OK' if result['meets_goal'] else 'MISSED'}  {result['values_s']}")


def in_the_v2_vm(rounds: int) -> list[dict[str, object]] | None:
    """Run ``--v2-guest`` in the cgroup v2 VM and return its results (None when the guest failed)."""
    results = run_bench_in_v2_guest("bench/qos_reaction.py", "v2-bench", ["--rounds", str(rounds)], 300 + rounds * 120)
    assert results is None or isinstance(results, list)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--v2", action="store_true", help="also run the rounds in the cgroup v2 VM, side by side")
    parser.add_argument("--v2-guest", action="store_true", help=argparse.SUPPRESS)  # inside the VM
    args = parser.parse_args(argv)
    try:
        if args.v2_guest:
            skip_unless_v2_writable()
        else:
            RealNode.skip_unless_possible()
    except pytest.skip.Exception as exc:
        print(f"cannot run: {exc}", file=sys.stderr)
        return 2
    if args.v2_guest:
        results = run_rounds(args.rounds, v2=True)
        _print(results, "v2 guest: ")
        with open(os.path.join(os.environ["KPY_V2_OUT"], "bench.json"), "w") as f:
            json.dump(results, f)
        return 0
    results = run_rounds(args.rounds)
    if not args.v2:
        print(json.dumps(results, indent=2)) if args.json else _print(results)
        return 0
    guest = in_the_v2_vm(args.rounds)
    if guest is None:
        return 1
    side_by_side = []
    for host, v2 in zip(results, guest, strict=True):
        ratio = (round(v2["median_s"] / host["median_s"], 2)
                 if host["median_s"] and v2["median_s"] is not None else None)
        side_by_side.append({"measure": host["measure"], "host_v1": host, "guest_v2": v2, "ratio_v2_to_host": ratio})
    if args.json:
        print(json.dumps(side_by_side, indent=2))
        return 0
    print(f"{'measure':40s} {'host v1 median (max) done':>28s} {'v2 VM median (max) done':>28s} {'v2/host':>8s}")
    cell = lambda r: f"{r['median_s']} s ({r['max_s']} s) {r['rounds'] - r['timeouts']}/{r['rounds']}"  # noqa: E731
    for row in side_by_side:
        print(f"{row['measure']:40s} {cell(row['host_v1']):>28s} {cell(row['guest_v2']):>28s} "
              f"{row['ratio_v2_to_host']!s:>8s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
