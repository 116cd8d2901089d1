#!/usr/bin/env python3
"""What koord-runtime-proxy costs kubelet, measured side by side in one run.

Against one private containerd with 20 running pods, the same client calls containerd directly
and through the proxy, alternating rounds so both see the same machine noise:
  * p50/p99 of Version, ListContainers, ContainerStatus (cheap calls) and ListContainerStats (heavy);
  * throughput of ListContainers at 1 and 16 calls in flight (grpc.aio, closed loop), direct, through the
    proxy and through a plain byte pipe (the best any interposer can do here: at 16 in flight the client
    and containerd fill this machine's two cores), interleaved rounds;
  * pod start (RunPodSandbox + CreateContainer + StartContainer), direct, through the proxy, and through
    the proxy with one no-op hook server and with one hook server that changes resources;
  * what one hook round trip adds to a hooked call (StartContainer on a running container: a cheap
    runtime answer, so the hook dominates), with and without a registered hook server;
  * the proxy's own CPU time per relayed call, and per passthrough call as a ratio to a plain byte pipe
    on uvloop over the same sockets (bench/bytepipe.py), at 1 and 16 calls in flight, interleaved rounds;
    with containerd's CPU per call behind each (the relay answers PINGs and connection credit itself).
Prints a table; with --json one JSON object (added_p50_ms, added_p99_ms, throughput_ratio_16,
pipe_throughput_ratio_16, heavy_ratio, pod_start_ratio, pod_start_hooked_ratio, cpu_ratio_to_pipe_1,
cpu_ratio_to_pipe_16, runtime_cpu_ratio_to_pipe_1, runtime_cpu_ratio_to_pipe_16, hook_added_p50_ms, ...).
This is a benchmark, not a test: read ratios, not absolutes. Its containerd and sockets are per process, so
two runs never collide.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import grpc
import psutil

from tests.support.containerd import Containerd
from tests.support.cri import CriClient, PodFactory
from tests.support.hookserver import RecordingHookServer, echo, register
from tests.support.proxy import ProxyProcess, wait_for_socket
from wire import cri_pb2 as cri

# Per process: two runs at once never share (or stop) each other's containerd.
BENCH_CONTAINERD = Containerd(f"/run/koordlet-py/bench-{os.getpid()}/containerd",
                              f"/var/lib/koordlet-py/bench-{os.getpid()}/containerd")
BYTEPIPE = Path(__file__).resolve().parent / "bytepipe.py"


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def time_calls(fn, request, count: int) -> list[float]:
    out = []
    for _ in range(count):
        t0 = time.perf_counter()
        fn(request)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def cpu_per_call(socket_path: str, process: psutil.Process, in_flight: int, seconds: float,
                 runtime: psutil.Process | None = None) -> tuple[float, float, float]:
    """(calls per second, CPU µs of ``process`` per call, CPU µs of ``runtime`` per call) of ListContainers
    through ``socket_path``."""
    before = cpu_seconds(process)
    runtime_before = cpu_seconds(runtime) if runtime is not None else 0.0
    rate, calls = asyncio.run(throughput(socket_path, in_flight, seconds, count=True))
    runtime_us = (cpu_seconds(runtime) - runtime_before) / max(1, calls) * 1e6 if runtime is not None else 0.0
    return rate, (cpu_seconds(process) - before) / max(1, calls) * 1e6, runtime_us


async def throughput(socket_path: str, in_flight: int, seconds: float, count: bool = False):
    request = cri.ListContainersRequest().SerializeToString()
    async with grpc.aio.insecure_channel(f"unix://{socket_path}") as channel:
        call = channel.unary_unary("/runtime.v1.RuntimeService/ListContainers")
        for _ in range(20):
            await call(request)
        done = 0
        stop_at = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < stop_at:
                await call(request)
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        rate = done / (time.perf_counter() - started)
        return (rate, done) if count else rate


def pod_start_ms(pods: PodFactory, name: str) -> float:
    t0 = time.perf_counter()
    pods.start_pod(name)
    return (time.perf_counter() - t0) * 1000


def start_container_again_ms(client: CriClient, container_id: str, count: int) -> list[float]:
    """A hooked call with a cheap runtime answer: StartContainer on a running container fails fast."""
    out = []
    request = cri.StartContainerRequest(container_id=container_id)
    for _ in range(count):
        t0 = time.perf_counter()
        try:
            client.runtime.StartContainer(request)
        except grpc.RpcError:
            pass
        out.append((time.perf_counter() - t0) * 1000)
    return out


def resource_changing_hook(hook: str, request):
    answer = echo(request)
    if hook == "PreCreateContainer":
        answer.container_resources.cpu_shares = 256
        answer.container_resources.cpu_quota = 40000
    return answer


@dataclass
class Measured:
    """Everything one run measured, by side ("direct", "proxy", "pipe", or a hook setup)."""

    methods: dict[str, tuple[str, object]]
    samples: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (side, method) -> ms
    proxy_cpu_s: float = 0.0  # the proxy's CPU over the latency rounds (cheap calls only)
    proxy_calls: int = 0
    rates: dict[tuple[str, int], list[float]] = field(default_factory=dict)  # (side, in flight) -> calls/s
    cpu_us: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    runtime_us: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    starts: dict[str, list[float]] = field(default_factory=dict)  # side -> pod start ms
    hooked_calls: dict[str, list[float]] = field(default_factory=dict)  # hook setup -> StartContainer ms


def cri_methods(container_id: str) -> dict[str, tuple[str, object]]:
    return {
        "Version": ("Version", cri.VersionRequest()),
        "ListContainers": ("ListContainers", cri.ListContainersRequest()),
        "ContainerStatus": ("ContainerStatus", cri.ContainerStatusRequest(container_id=container_id)),
        "ListContainerStats": ("ListContainerStats", cri.ListContainerStatsRequest()),
    }


def latency_rounds(out: Measured, direct: CriClient, via: CriClient, ps: psutil.Process, rounds: int,
                   calls: int) -> None:
    for client in (direct, via):  # warm-up
        for name, (rpc, req) in out.methods.items():
            time_calls(getattr(client.runtime, rpc), req, 50 if name != "ListContainerStats" else 5)
    for _ in range(rounds):
        for side, client in (("direct", direct), ("proxy", via)):
            for name, (rpc, req) in out.methods.items():
                count = calls if name != "ListContainerStats" else max(10, calls // 20)
                cpu0 = sum(ps.cpu_times()[:2])
                out.samples.setdefault((side, name), []).extend(time_calls(getattr(client.runtime, rpc), req, count))
                if side == "proxy" and name != "ListContainerStats":
                    out.proxy_cpu_s += sum(ps.cpu_times()[:2]) - cpu0
                    out.proxy_calls += count


def throughput_rounds(out: Measured, sides: tuple[tuple[str, str, psutil.Process], ...],
                      runtime_ps: psutil.Process, rounds: int, seconds: float) -> None:
    """Throughput of direct, byte pipe and relay, and CPU per passthrough call of the relay and the pipe, in
    interleaved rounds (medians): with 16 in flight the client and containerd already fill this machine's
    cores, so the pipe's throughput ratio is the best any interposer can do here. And containerd's CPU per
    call behind each: what the relay's per-hop PINGs and credit save the runtime."""
    for _ in range(rounds):
        for in_flight in (1, 16):
            out.rates.setdefault(("direct", in_flight), []).append(
                asyncio.run(throughput(BENCH_CONTAINERD.socket, in_flight, seconds)))
            for side, sock, process in sides:
                rate, own, behind = cpu_per_call(sock, process, in_flight, seconds, runtime_ps)
                out.rates.setdefault((side, in_flight), []).append(rate)
                out.cpu_us.setdefault((side, in_flight), []).append(own)
                out.runtime_us.setdefault((side, in_flight), []).append(behind)


def hook_rounds(out: Measured, proxy: ProxyProcess, via: CriClient, started: dict[str, PodFactory],
                hook_servers: tuple[tuple[str, RecordingHookServer], ...], pod_starts: int, hook_calls: int) -> None:
    """Pod starts and a hooked call with no hook server, then with each hook server registered while the
    proxy runs (its watch picks them up)."""
    target = started["proxy"].containers[0]
    out.hooked_calls["no hook"] = start_container_again_ms(via, target, hook_calls)
    for label, server in hook_servers:
        register(proxy.hook_dir, "10-bench.json", server.socket_path)
        time.sleep(1.5)
        out.starts[label] = []
        for i in range(pod_starts):
            out.starts["direct"].append(pod_start_ms(started["direct"], f"hooked-direct-{label}-{i}"))
            out.starts[label].append(pod_start_ms(started["proxy"], f"hooked-{label.split()[0]}-{i}"))
        if label == "no-op hook":
            out.hooked_calls[label] = start_container_again_ms(via, target, hook_calls)


def measure_all(args: argparse.Namespace, tmp: str) -> Measured:
    BENCH_CONTAINERD.up()
    proxy = ProxyProcess(f"{tmp}/proxy.sock", BENCH_CONTAINERD.socket, "--log-level", "warning").start()
    pipe_socket = f"{tmp}/pipe.sock"
    pipe = subprocess.Popen([sys.executable, str(BYTEPIPE), pipe_socket, BENCH_CONTAINERD.socket])
    wait_for_socket(pipe_socket, 15, pipe)
    direct, via = CriClient(BENCH_CONTAINERD.socket), CriClient(proxy.listen)
    background = PodFactory(direct)
    started = {"direct": PodFactory(direct), "proxy": PodFactory(via)}
    noop_hook = RecordingHookServer(f"{tmp}/noop-hook.sock").start()
    changing_hook = RecordingHookServer(f"{tmp}/changing-hook.sock", behaviour=resource_changing_hook).start()
    try:
        for i in range(args.pods):
            background.start_pod(f"bench-{i}")
        out = Measured(cri_methods(background.containers[0]))
        ps = psutil.Process(proxy.proc.pid)
        latency_rounds(out, direct, via, ps, args.rounds, args.calls)
        runtime_ps = psutil.Process(int(Path(BENCH_CONTAINERD.run_dir, "containerd.pid").read_text()))
        throughput_rounds(out, (("pipe", pipe_socket, psutil.Process(pipe.pid)), ("proxy", proxy.listen, ps)),
                          runtime_ps, args.rounds, args.seconds)
        out.starts = {"direct": [], "proxy": []}
        for i in range(args.pod_starts):
            for side in ("direct", "proxy"):
                out.starts[side].append(pod_start_ms(started[side], f"start-{side}-{i}"))
        hook_rounds(out, proxy, via, started, (("no-op hook", noop_hook), ("resource hook", changing_hook)),
                    args.pod_starts, args.hook_calls)
        if not changing_hook.requests("PreCreateContainer"):
            raise RuntimeError("the resource-changing hook server was never called")
        return out
    finally:
        for factory in (*started.values(), background):
            factory.cleanup()
        noop_hook.stop()
        changing_hook.stop()
        pipe.terminate()
        pipe.wait(10)
        direct.close()
        via.close()
        proxy.terminate()
        BENCH_CONTAINERD.down()
        BENCH_CONTAINERD.remove_dirs()


def _median_ratio(values: dict, numerator: object, denominator: object) -> float:
    return round(statistics.median(values[numerator]) / statistics.median(values[denominator]), 3)


def summarize(out: Measured, pods: int) -> tuple[dict, list[tuple[str, float, float, float, float]],
                                                  dict[tuple[str, int], float]]:
    """(the JSON result, per-method latency rows, median throughput by (side, in flight))."""
    rows = []
    for name in out.methods:
        d, p = out.samples[("direct", name)], out.samples[("proxy", name)]
        rows.append((name, percentile(d, 50), percentile(p, 50), percentile(d, 99), percentile(p, 99)))
    cheap = [r for r in rows if r[0] != "ListContainerStats"]
    heavy = next(r for r in rows if r[0] == "ListContainerStats")
    tput = {key: statistics.median(v) for key, v in out.rates.items()}
    starts, hooked = out.starts, out.hooked_calls
    result = {
        "added_p50_ms": round(statistics.mean(r[2] - r[1] for r in cheap), 4),
        "added_p99_ms": round(statistics.mean(r[4] - r[3] for r in cheap), 4),
        "throughput_ratio_1": round(tput[("proxy", 1)] / tput[("direct", 1)], 3),
        "throughput_ratio_16": round(tput[("proxy", 16)] / tput[("direct", 16)], 3),
        "pipe_throughput_ratio_1": round(tput[("pipe", 1)] / tput[("direct", 1)], 3),
        "pipe_throughput_ratio_16": round(tput[("pipe", 16)] / tput[("direct", 16)], 3),
        "heavy_ratio": round(heavy[2] / heavy[1], 3),
        "pod_start_ratio": _median_ratio(starts, "proxy", "direct"),
        "pod_start_hooked_ratio": _median_ratio(starts, "no-op hook", "direct"),
        "pod_start_resource_hook_ratio": _median_ratio(starts, "resource hook", "direct"),
        "hook_added_p50_ms": round(percentile(hooked["no-op hook"], 50) - percentile(hooked["no hook"], 50), 4),
        "hook_added_p99_ms": round(percentile(hooked["no-op hook"], 99) - percentile(hooked["no hook"], 99), 4),
        "proxy_cpu_us_per_call": round(out.proxy_cpu_s / max(1, out.proxy_calls) * 1e6, 1),
        "cpu_ratio_to_pipe_1": _median_ratio(out.cpu_us, ("proxy", 1), ("pipe", 1)),
        "cpu_ratio_to_pipe_16": _median_ratio(out.cpu_us, ("proxy", 16), ("pipe", 16)),
        "cpu_us_per_call": {f"{side}_{n}": round(statistics.median(v), 1) for (side, n), v in out.cpu_us.items()},
        "runtime_cpu_ratio_to_pipe_1": _median_ratio(out.runtime_us, ("proxy", 1), ("pipe", 1)),
        "runtime_cpu_ratio_to_pipe_16": _median_ratio(out.runtime_us, ("proxy", 16), ("pipe", 16)),
        "runtime_cpu_us_per_call": {f"{side}_{n}": round(statistics.median(v), 1)
                                    for (side, n), v in out.runtime_us.items()},
        "pods": pods,
        "methods": {r[0]: {"direct_p50_ms": round(r[1], 4), "proxy_p50_ms": round(r[2], 4),
                           "direct_p99_ms": round(r[3], 4), "proxy_p99_ms": round(r[4], 4)} for r in rows},
        "throughput_calls_per_s": {f"{side}_{n}": round(v, 1) for (side, n), v in tput.items()},
        "pod_start_ms": {side: round(statistics.median(v), 1) for side, v in starts.items()},
    }
    return result, rows, tput


def report(result: dict, rows: list[tuple[str, float, float, float, float]], tput: dict[tuple[str, int], float],
           args: argparse.Namespace) -> None:
    print(f"koord-runtime-proxy overhead vs direct containerd ({args.pods} pods, {args.rounds} alternating rounds)")
    print(f"{'call':<20}{'direct p50':>12}{'proxy p50':>12}{'direct p99':>12}{'proxy p99':>12}   (ms)")
    for name, d50, p50, d99, p99 in rows:
        print(f"{name:<20}{d50:>12.3f}{p50:>12.3f}{d99:>12.3f}{p99:>12.3f}")
    for n, pad in ((1, "  "), (16, " ")):
        print(f"throughput ListContainers, {n} in flight:{pad}direct {tput[('direct', n)]:.0f}/s  "
              f"proxy {tput[('proxy', n)]:.0f}/s  ratio {result[f'throughput_ratio_{n}']}  "
              f"(byte pipe {tput[('pipe', n)]:.0f}/s, ratio {result[f'pipe_throughput_ratio_{n}']}; "
              f"medians of {args.rounds} interleaved rounds)")
    print(f"pod start (run+create+start) median: direct {result['pod_start_ms']['direct']} ms  "
          f"proxy {result['pod_start_ms']['proxy']} ms  ratio {result['pod_start_ratio']}")
    print(f"pod start with one no-op hook server: {result['pod_start_ms']['no-op hook']} ms, ratio "
          f"{result['pod_start_hooked_ratio']}; with a resource-changing hook server: ratio "
          f"{result['pod_start_resource_hook_ratio']}")
    print(f"one hook round trip adds p50 {result['hook_added_p50_ms']} ms, p99 {result['hook_added_p99_ms']} ms "
          "(hooked StartContainer with vs without a registered hook server)")
    print(f"CPU per passthrough call (ListContainers), medians of {args.rounds} interleaved rounds: "
          f"1 in flight relay {result['cpu_us_per_call']['proxy_1']} µs vs byte pipe "
          f"{result['cpu_us_per_call']['pipe_1']} µs, ratio {result['cpu_ratio_to_pipe_1']}; 16 in flight relay "
          f"{result['cpu_us_per_call']['proxy_16']} µs vs pipe {result['cpu_us_per_call']['pipe_16']} µs, "
          f"ratio {result['cpu_ratio_to_pipe_16']}")
    print(f"containerd's CPU per such call behind the relay vs behind the pipe: 1 in flight "
          f"{result['runtime_cpu_us_per_call']['proxy_1']} vs {result['runtime_cpu_us_per_call']['pipe_1']} µs, "
          f"ratio {result['runtime_cpu_ratio_to_pipe_1']}; 16 in flight "
          f"{result['runtime_cpu_us_per_call']['proxy_16']} vs {result['runtime_cpu_us_per_call']['pipe_16']} µs, "
          f"ratio {result['runtime_cpu_ratio_to_pipe_16']}")
    print(f"added p50 (cheap) {result['added_p50_ms']} ms, added p99 {result['added_p99_ms']} ms, "
          f"heavy ratio {result['heavy_ratio']}, proxy CPU {result['proxy_cpu_us_per_call']} µs/call")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=600, help="timed calls per method and side, per round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating direct/proxy rounds")
    ap.add_argument("--pods", type=int, default=20, help="running pods during the measurement")
    ap.add_argument("--pod-starts", type=int, default=6, help="pod starts per side")
    ap.add_argument("--seconds", type=float, default=3.0, help="duration of each throughput run")
    ap.add_argument("--hook-calls", type=int, default=300, help="hooked calls timed per hook setup")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kpy-bench-") as tmp:
        measured = measure_all(args, tmp)
    result, rows, tput = summarize(measured, args.pods)
    if args.json:
        print(json.dumps(result))
    else:
        report(result, rows, tput, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
