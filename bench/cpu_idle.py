"""What ``cpu.idle`` on a BE pod buys an LS pod beside it (docs/colocation.md "CPU QoS on stock kernels").

A real node (tests/koordlet/qosmanager/realnode.py: kubelet's cgroup tree under a private prefix, cgroup v1 on
this host, v2 in the VM): the QoS and pod dirs get kubelet's weights (besteffort and the BE pod 2 shares, the
burstable dir and the LS pod 1024), a BE pod burns every CPU, and an LS pod runs a latency probe: it sleeps
1 ms, wakes, does 100 µs of work, again, and records how late each wake-up was (its scheduling delay) and how
many wake-ups a second it got done (its throughput); ``/proc/self/schedstat``'s run delay per wake-up is
reported beside it. Rounds alternate between the BE pod with ``cpu.idle`` 0 and 1, set the way koordlet sets it:
the runtime hooks' reconciler with CoreSched and NodeSLO ``beClass.cpuQOS.schedIdle`` 1 (or not). A round of the LS
probe alone (no BE load) is the floor.

Reported: the LS probe's delay p50 and p99 and its wake-ups per second, per setting (medians over the rounds),
and the ratios idle/plain. Needs root and writable cgroups. ``.venv/bin/python bench/cpu_idle.py [--rounds N]
[--seconds S] [--json]``; ``--v2`` runs the same in the cgroup v2 VM after the host and prints both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402

from hooks import registry  # noqa: E402
from hooks.protocol import NodeContext  # noqa: E402
from koordlet.api.nodeslo import default_node_slo_spec, parse_node_slo_spec  # noqa: E402
from koordlet.api.qos import KubeQoS, QoSClass  # noqa: E402
from koordlet.runtimehooks.reconciler import Reconciler  # noqa: E402
from tests.koordlet.qosmanager.realnode import BURN, WAKE_PROBE, RealNode, skip_unless_v2_writable  # noqa: E402
from tests.support.v2guest import run_bench_in_v2_guest  # noqa: E402

PODS = (("ls", QoSClass.LS, KubeQoS.BURSTABLE), ("be", QoSClass.BE, KubeQoS.BESTEFFORT))
BE_IDLE = parse_node_slo_spec({"resourceQOSStrategy": {
    "policies": {"cpuPolicy": "coreSched"}, "beClass": {"cpuQOS": {"enable": True, "schedIdle": 1}}}})

def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _probe(node: RealNode, seconds: float) -> dict[str, float]:
    child = node.spawn("ls", WAKE_PROBE.format(seconds=seconds))
    out, _ = child.communicate(timeout=seconds + 60)
    result = json.loads(out.decode().strip().splitlines()[-1])
    late = result.pop("late_us")
    return {"p50_delay_us": _percentile(late, 0.5), "p99_delay_us": _percentile(late, 0.99), **result}


def run(rounds: int, seconds: float, v2: bool = False) -> dict[str, object]:
    node = RealNode("bench-cpu-idle", PODS, v2=v2)
    burners: list[subprocess.Popen[bytes]] = []
    try:
        if not os.path.exists(node.fs.cgroup_dir("cpu", os.path.join(node.be_dir, "cpu.idle"))):
            raise SystemExit(f"this kernel ({os.uname().release}) has no cpu.idle")
        node.kubelet_weights()
        plugins = registry.enabled({"CoreSched": True})
        reconciler = Reconciler(node.states.pods, lambda: NodeContext(node_slo=node.states.node_slo()),
                                lambda: plugins, node.executor, node.layout)
        floor = _probe(node, seconds)
        cpus = os.cpu_count() or 1
        burners = [node.spawn("be", BURN) for _ in range(cpus)]
        samples: dict[str, list[dict[str, float]]] = {"plain": [], "idle": []}
        be_idle: dict[str, str] = {}
        for _ in range(rounds):
            for setting, slo in (("plain", default_node_slo_spec()), ("idle", BE_IDLE)):
                node.states.set_node_slo(slo)
                reconciler.reconcile_once()
                be_idle[setting] = node.read("cpu", node.pod_dir(node.pod("be")), "cpu.idle")
                time.sleep(0.5)  # the burners settle under the new setting
                samples[setting].append(_probe(node, seconds))
        medians = {setting: {key: round(statistics.median(s[key] for s in runs), 1) for key in runs[0]}
                   for setting, runs in samples.items()}
        plain, idle = medians["plain"], medians["idle"]
        return {
            "kernel": os.uname().release, "cgroup": "v2" if v2 else "v1", "cpus": cpus, "rounds": rounds,
            "seconds_per_probe": seconds, "be_pod_cpu_idle": be_idle, "ls_alone": {k: round(v, 1) for k, v in
                                                                                  floor.items()},
            "be_plain": plain, "be_idle": idle,
            "ratio_idle_to_plain": {key: round(idle[key] / plain[key], 3) if plain[key] else None for key in plain},
        }
    finally:
        for burner in burners:
            burner.kill()
        node.close()


def _print(result: dict[str, object], label: str) -> None:
    print(f"{label}: kernel {result['kernel']}, cgroup {result['cgroup']}, {result['cpus']} CPUs burnt by the BE pod, "
          f"{result['rounds']} rounds x {result['seconds_per_probe']} s")
    print(f"  {'LS probe':28s} {'p50 delay us':>13s} {'p99 delay us':>13s} {'wake-ups/s':>11s} {'run delay us':>13s}")
    for name in ("ls_alone", "be_plain", "be_idle", "ratio_idle_to_plain"):
        row = result[name]
        assert isinstance(row, dict)
        print(f"  {name:28s} {row['p50_delay_us']!s:>13s} {row['p99_delay_us']!s:>13s} {row['wakeups_per_s']!s:>11s} "
              f"{row['run_delay_us_per_wakeup']!s:>13s}")


def in_the_v2_vm(rounds: int, seconds: float) -> dict[str, object] | None:
    args = ["--rounds", str(rounds), "--seconds", str(seconds)]
    result = run_bench_in_v2_guest("bench/cpu_idle.py", "v2-bench-cpu-idle", args, int(300 + rounds * seconds * 10))
    assert result is None or isinstance(result, dict)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--v2", action="store_true", help="also run it in the cgroup v2 VM, after the host")
    parser.add_argument("--v2-guest", action="store_true", help=argparse.SUPPRESS)  # inside the VM
    args = parser.parse_args(argv)
    try:
        skip_unless_v2_writable() if args.v2_guest else RealNode.skip_unless_possible()
    except pytest.skip.Exception as exc:
        print(f"cannot run: {exc}", file=sys.stderr)
        return 2
    if args.v2_guest:
        result = run(args.rounds, args.seconds, v2=True)
        _print(result, "v2 guest")
        with open(os.path.join(os.environ["KPY_V2_OUT"], "bench.json"), "w") as f:
            json.dump(result, f)
        return 0
    results = {"host_v1": run(args.rounds, args.seconds)}
    if args.v2:
        guest = in_the_v2_vm(args.rounds, args.seconds)
        if guest is None:
            return 1
        results["guest_v2"] = guest
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for label, result in results.items():
            _print(result, label)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
