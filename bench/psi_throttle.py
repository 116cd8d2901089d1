"""BE PSI throttle (gate ``BEPSIThrottle``) in the cgroup v2 VM: an LS latency probe beside a BE CPU and IO burner,
with the gate off and on (docs/colocation.md "BE CPU and IO steered by the LS pods' pressure", docs/benchmarks.md).

A real node (tests/koordlet/qosmanager/realnode.py, cgroup v2 with cpu, cpuset, memory and io delegated to the pods;
kubelet's CPU weights on the QoS and pod dirs), koordlet's collectors and QoS manager. blk-iocost is on for the
attached disk (the blkio strategy, NodeSLO ``cgroupRoot.blkioQOS``) in every phase, so that ``io.weight`` means
something; only ``BEPSIThrottle`` differs between the two BE phases.

- The LS pod runs two probes: a CPU one (sleeps 1 ms, wakes, works 100 µs, again: its wake-up delay) and an IO one
  (a 4 KiB ``O_DIRECT`` read at a random place of the attached disk every 10 ms: its latency).
- The BE pod runs a CPU burner on every vCPU and two IO burners (1 MiB ``O_DIRECT`` writes over the disk, end to end).

Phases, each ``--warmup`` seconds for the load (and the throttle's steps) to settle, the LS probes running through
it too (the LS pod's pressure is what the throttle steers by; those samples are not counted), then ``--seconds``
measured:
the LS pod alone; LS beside BE, gate off; LS beside BE, gate on (NodeSLO ``extensions.bePSIThrottleStrategy``, with
the thresholds and floors given on the command line). Reported per phase: the LS probes' p50 and p99, the LS pod's
CPU and IO pressure over the window (its ``cpu.pressure`` and ``io.pressure`` stall time as a share of the window),
and the BE pod's throughput (CPU cores it used, MB/s it wrote, from its ``cpu.stat`` and ``io.stat``); with the gate
on, the steps the strategy took (the besteffort dir's ``cpu.max`` and ``io.weight`` each second). And the goals: the
LS p99 within 1.2x of the LS pod alone, BE keeping at least half its gate-off throughput.

    .venv/bin/python bench/psi_throttle.py [--warmup 40 --seconds 30]     (boots the guest with its own disk and a
                                                                         timeout that fits the phases; V2_CPUS=2:
                                                                         one vCPU per host core)

Not ``V2_MODE=bench make v2-check``: that stage's disk is 64 MiB and its 900 s timeout is shorter than three phases
take under emulation.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


from koordlet.api.nodeslo import parse_node_slo_spec  # noqa: E402
from koordlet.api.qos import KubeQoS, QoSClass  # noqa: E402
from koordlet.qosmanager import QoSManagerConfig  # noqa: E402
from koordlet.system.procfs import parse_psi  # noqa: E402
from tests.koordlet.qosmanager.realnode import BURN, WAKE_PROBE, RealNode  # noqa: E402
from tests.support.v2guest import attached_disk, guest_part, host_part  # noqa: E402

PODS = (("ls", QoSClass.LS, KubeQoS.BURSTABLE), ("be", QoSClass.BE, KubeQoS.BESTEFFORT))
DELEGATE = ("cpu", "cpuset", "memory", "io")
MiB = 1 << 20
# Every other QoS strategy off: only the blkio strategy (blk-iocost on the disk) and, in its phase, PSI throttle run.
OFF = {"BECPUSuppress": False, "CPUBurst": False, "RdtResctrl": False, "CgroupReconcile": False,
       "BlkIOReconcile": True}

IO_PROBE = """
import json, mmap, os, random, time
fd = os.open({disk!r}, os.O_RDONLY | os.O_DIRECT)
buf = mmap.mmap(-1, 4096)
blocks = {span} // 4096
lat, end = [], time.monotonic() + {seconds}
while time.monotonic() < end:
    start = time.monotonic()
    os.preadv(fd, [buf], random.randrange(blocks) * 4096)
    lat.append((time.monotonic() - start) * 1e6)
    time.sleep(0.01)
print(json.dumps(lat))
"""
IO_BURN = """
import mmap, os
fd = os.open({disk!r}, os.O_WRONLY | os.O_DIRECT)
buf = mmap.mmap(-1, 1 << 20)
buf.write(b"x" * (1 << 20))
offset = {start}
while True:
    os.pwrite(fd, buf, offset)
    offset = offset + (1 << 20) if offset + (2 << 20) <= {end} else {start}
"""


def _progress(line: str) -> None:
    """Where the guest part is, on stderr (the console): an emulated guest's phase takes minutes."""
    print(f"psi_throttle: {time.strftime('%H:%M:%S')} {line}", file=sys.stderr, flush=True)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1) if ordered else 0.0


def _stats(node: RealNode, disk_number: str) -> dict[str, float]:
    """The counters a window is measured by: LS stall totals (µs), BE CPU (µs) and bytes written to the disk."""
    ls, be = node.pod_dir(node.pod("ls")), node.pod_dir(node.pod("be"))
    cpu = dict(line.split() for line in node.read("cpu", be, "cpu.stat").splitlines())
    written = 0
    for line in node.read("io", be, "io.stat").splitlines():
        head, *fields = line.split()
        if head == disk_number:
            written = int(dict(f.split("=") for f in fields).get("wbytes", 0))
    return {"ls_cpu_stall_us": parse_psi(node.read("cpu", ls, "cpu.pressure").encode()).some.total_us,
            "ls_io_stall_us": parse_psi(node.read("io", ls, "io.pressure").encode()).some.total_us,
            "be_cpu_us": int(cpu["usage_usec"]), "be_written": written, "at": time.monotonic()}


def _window(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    seconds = after["at"] - before["at"]
    return {"ls_cpu_pressure_percent": round((after["ls_cpu_stall_us"] - before["ls_cpu_stall_us"]) / seconds / 1e4, 2),
            "ls_io_pressure_percent": round((after["ls_io_stall_us"] - before["ls_io_stall_us"]) / seconds / 1e4, 2),
            "be_cpu_cores": round((after["be_cpu_us"] - before["be_cpu_us"]) / seconds / 1e6, 3),
            "be_write_mb_s": round((after["be_written"] - before["be_written"]) / seconds / 1e6, 2)}


def _throttle_state(node: RealNode) -> str:
    io_weight = node.read("io", node.be_dir, "io.weight").splitlines()[0]
    return f"cpu.max {node.read('cpu', node.be_dir, 'cpu.max')}, io.weight {io_weight}"


def _probes(node: RealNode, disk: str, span: int, seconds: float, name: str, steps: list[tuple[float, str]],
            started: float) -> tuple[dict, list[float]]:
    """The LS pod's two probes for ``seconds``, the throttle's state sampled each second meanwhile: their results.

    Each probe prints its whole sample list at the end (the CPU probe's 30 s: about 0.5 MB), more than a pipe holds:
    the output is read while they run, or a probe blocks on its write and never ends."""
    probes = [node.spawn("ls", WAKE_PROBE.format(seconds=seconds)),
              node.spawn("ls", IO_PROBE.format(disk=disk, span=span, seconds=seconds))]
    outputs: dict[int, bytes] = {}
    readers = [threading.Thread(target=lambda i=i, p=p: outputs.__setitem__(i, p.communicate()[0]), daemon=True)
               for i, p in enumerate(probes)]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + seconds * 4 + 120
    while any(reader.is_alive() for reader in readers) and time.monotonic() < deadline:
        steps.append((round(time.monotonic() - started, 1), _throttle_state(node)))
        time.sleep(1.0)
    if any(reader.is_alive() for reader in readers):
        for probe in probes:
            probe.kill()
        raise RuntimeError(f"{name}: the LS probes did not end within {seconds * 4 + 120:g} s")
    wake, io_lat = (json.loads(outputs[i].decode().strip().splitlines()[-1]) for i in range(len(probes)))
    return wake, io_lat


def phase(disk: str, disk_number: str, span: int, name: str, be: bool, args: argparse.Namespace,
          slo: dict) -> dict[str, object]:
    """One phase on a node of its own: the load, the QoS manager (gates by ``name``), ``--warmup`` s, then
    ``--seconds`` measured."""
    gates = {**OFF, "BEPSIThrottle": name == "gate_on"}
    _progress(f"{name}: the node")
    node = RealNode(f"bench-psi-{name}", PODS, v2=True, delegate=DELEGATE)
    burners: list[subprocess.Popen[bytes]] = []
    steps: list[tuple[float, str]] = []
    try:
        node.kubelet_weights()
        node.start(parse_node_slo_spec(slo), config=QoSManagerConfig(node_name=node.node.name, feature_gates=gates))
        _progress(f"{name}: QoS manager started; the load and {args.warmup:g} s of warm-up")
        if be:
            burners = [node.spawn("be", BURN) for _ in range(os.cpu_count() or 1)]
            burners += [node.spawn("be", IO_BURN.format(disk=disk, start=span + i * span // 2,
                                                        end=span + (i + 1) * span // 2)) for i in range(2)]
        started = time.monotonic()
        # The LS pod runs its probes through the warm-up too: its pressure is what the throttle steers by, so the
        # steps settle before the measurement, not during it. Their samples are not counted.
        _probes(node, disk, span, args.warmup, name, steps, started)
        before = _stats(node, disk_number)
        _progress(f"{name}: measuring {args.seconds:g} s")
        wake, io_lat = _probes(node, disk, span, args.seconds, name, steps, started)
        after = _stats(node, disk_number)
        cpu_late = wake["late_us"]
    finally:
        for burner in burners:
            burner.kill()
        node.close()
    result: dict[str, object] = {
        "cpu_wake_delay_p50_us": _percentile(cpu_late, 0.5), "cpu_wake_delay_p99_us": _percentile(cpu_late, 0.99),
        "io_read_latency_p50_us": _percentile(io_lat, 0.5), "io_read_latency_p99_us": _percentile(io_lat, 0.99),
        **_window(before, after)}
    if name == "gate_on":
        changes = [steps[0]] + [s for prev, s in zip(steps, steps[1:], strict=False) if s[1] != prev[1]]
        result["steps"] = changes
        result["measured_from_s"] = args.warmup
    return result


def _sysfs(disk: str, name: str) -> str:
    with open(f"/sys/class/block/{os.path.basename(disk)}/{name}") as f:
        return f.read().strip()


def in_the_guest(args: argparse.Namespace) -> dict[str, object]:
    disk = attached_disk()
    disk_number = _sysfs(disk, "dev")
    # the LS probe reads the first half of the disk, the BE burners write the second
    span = int(_sysfs(disk, "size")) * 512 // 2 // MiB * MiB
    throttle = {"enable": True, "cpuPressureThresholdPercent": args.cpu_threshold,
                "ioPressureThresholdPercent": args.io_threshold, "cpuMinPercent": args.cpu_min,
                "stepIntervalSeconds": args.step_interval, "releaseIntervalSeconds": args.release_interval}
    slo = {"resourceQOSStrategy": {"cgroupRoot": {"blkioQOS": {"enable": True, "blocks": [
        {"name": disk, "type": "device", "ioCfg": {}}]}}},
        "extensions": {"bePSIThrottleStrategy": throttle}}
    results: dict[str, object] = {"ls_alone": phase(disk, disk_number, span, "ls_alone", False, args, slo)}
    for round_ in range(args.rounds):
        for name in ("gate_off", "gate_on"):
            key = name if args.rounds == 1 else f"{name}_{round_ + 1}"
            results[key] = phase(disk, disk_number, span, name, True, args, slo)
    with open("/sys/fs/cgroup/io.cost.qos") as f:
        iocost = next((line for line in f.read().splitlines() if line.startswith(disk_number)), "")
    return {"kernel": os.uname().release, "cpus": os.cpu_count(), "disk": disk, "disk_mib": span * 2 // MiB,
            "io_cost_qos": iocost, "warmup_s": args.warmup, "seconds": args.seconds, "throttle": throttle,
            "phases": results}


def _goals(result: dict[str, object]) -> list[str]:
    phases = result["phases"]
    assert isinstance(phases, dict)
    alone = phases["ls_alone"]
    out = []
    for on_key in (k for k in phases if k.startswith("gate_on")):
        on, off = phases[on_key], phases[on_key.replace("gate_on", "gate_off")]
        for probe in ("cpu_wake_delay_p99_us", "io_read_latency_p99_us"):
            ratio = on[probe] / alone[probe] if alone[probe] else float("inf")
            out.append(f"{on_key}: LS {probe} {on[probe]} = {ratio:.2f}x alone ({alone[probe]}); goal <= 1.2x: "
                       f"{'met' if ratio <= 1.2 else 'NOT met'}")
        for metric in ("be_cpu_cores", "be_write_mb_s"):
            kept = on[metric] / off[metric] if off[metric] else float("inf")
            out.append(f"{on_key}: BE {metric} {on[metric]} = {kept:.2f} of gate off ({off[metric]}); goal >= 0.5: "
                       f"{'met' if kept >= 0.5 else 'NOT met'}")
    return out


def _print(result: dict[str, object]) -> None:
    print(f"kernel {result['kernel']}, {result['cpus']} vCPUs, disk {result['disk']} ({result['disk_mib']} MiB, "
          f"io.cost.qos {result['io_cost_qos'] or 'off'}), warm-up {result['warmup_s']} s, measured "
          f"{result['seconds']} s")
    print(f"throttle: {result['throttle']}")
    phases = result["phases"]
    assert isinstance(phases, dict)
    keys = ("cpu_wake_delay_p50_us", "cpu_wake_delay_p99_us", "io_read_latency_p50_us", "io_read_latency_p99_us",
            "ls_cpu_pressure_percent", "ls_io_pressure_percent", "be_cpu_cores", "be_write_mb_s")
    print(f"  {'':26s}" + "".join(f"{name:>14s}" for name in phases))
    for key in keys:
        print(f"  {key:26s}" + "".join(f"{phases[name][key]!s:>14s}" for name in phases))
    for name, values in phases.items():
        for at, state in values.get("steps", ()):
            print(f"  {name} t={at:>5}s {state}")
    for line in _goals(result):
        print(f"  {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="measured per phase")
    parser.add_argument("--warmup", type=float, default=25.0, help="before the measurement, per phase")
    parser.add_argument("--rounds", type=int, default=1, help="gate off / gate on pairs")
    parser.add_argument("--disk-mib", type=int, default=512, help="the attached disk (V2_DISK_MB): the LS probe "
                                                                  "reads its first half, the BE burners write the rest")
    parser.add_argument("--cpu-threshold", type=int, default=10)
    parser.add_argument("--io-threshold", type=int, default=10)
    parser.add_argument("--cpu-min", type=int, default=50, help="cpuMinPercent: BE never below this share of CPUs")
    parser.add_argument("--step-interval", type=int, default=4)
    parser.add_argument("--release-interval", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--v2-guest", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.v2_guest:
        return guest_part(lambda: in_the_guest(args), _print, DELEGATE)
    timeout = int(600 + (1 + 2 * args.rounds) * (args.warmup + args.seconds) * 3)
    return host_part("bench/psi_throttle.py", "v2-bench-psi-throttle", args, _print, timeout,
                     {"V2_DISK_MB": str(args.disk_mib)}, kept_here=("disk_mib",))


if __name__ == "__main__":
    raise SystemExit(main())
