#!/usr/bin/env python3
"""What NRI mode costs pod starts, and what koordlet's NRI answer costs, side by side in one run.

On one private containerd 2.1.9 with NRI on, BE pods (batch resources: every default plugin has something
to say) started three ways, in rounds that rotate the order so all three see the same machine noise:

  direct   straight on containerd's CRI, no NRI plugin registered, no proxy;
  proxy    through koord-runtime-proxy to a koordlet hook server (koordlet's NRI off);
  nri      straight on containerd's CRI with a koordlet registered as NRI plugin (started for its phase).

A pod start is RunPodSandbox + CreateContainer + StartContainer. Then koordlet's NRI answer alone: a
stand-in runtime (tests/support/nriruntime.py) sends a koordlet process CreateContainer requests built from
a pod and container as containerd 2.1 described them in a real Synchronize, one after the other, and times
each round trip on the socket (what the runtime waits for), and the koordlet process's CPU per call (its
idle CPU over the same time subtracted). koordlet's own histogram of the NRI events during the real pod
starts is printed beside it.

Goals (issue 26): NRI pod start <= 1.02x direct; koordlet's NRI answer p99 <= 5 ms.

    .venv/bin/python bench/nri.py [--rounds 4] [--pods 6] [--calls 2000] [--json]

A benchmark, not a test: needs root and cgroup v1; its containerd, sockets and processes are its own
(stopped by PID); read the ratios, not the absolutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psutil  # noqa: E402

from tests.support.cri import CriClient, PodFactory  # noqa: E402
from tests.support.nri import NriContainerd, clean_up_dead_instances, koordlet_nri_args  # noqa: E402
from tests.support.nriruntime import FakeRuntime  # noqa: E402
from tests.support.proxy import ProxyProcess  # noqa: E402
from tests.support.stack import BE_ANNOTATIONS, BE_LABELS, KoordletProcess, http_get  # noqa: E402
from tests.support.waiting import wait_until  # noqa: E402
from wire import nri_pb2 as api  # noqa: E402
from wire.nri import Event, PluginConnection, event_mask  # noqa: E402

MODES = ("direct", "proxy", "nri")


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def metrics_of(koordlet: KoordletProcess) -> str:
    return http_get(f"http://127.0.0.1:{koordlet.port}/metrics")


def start_pods(factory: PodFactory, count: int, name: str = "job") -> list[float]:
    """Start ``count`` BE pods one after the other; the milliseconds each took."""
    out = []
    for _ in range(count):
        started = time.perf_counter()
        factory.start_pod(name, labels=BE_LABELS, annotations=BE_ANNOTATIONS)
        out.append((time.perf_counter() - started) * 1000)
    return out


def histogram(text: str, event: str) -> dict[float, float]:
    """Cumulative bucket counts of koordlet_nri_event_duration_milliseconds for ``event``."""
    out: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith("koordlet_nri_event_duration_milliseconds_bucket") and f'event="{event}"' in line:
            le = line.split('le="')[1].split('"')[0]
            out[float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def bucket_quantile(buckets: dict[float, float], q: float) -> float | None:
    """The smallest bucket bound holding ``q`` of the observations (an upper bound of the quantile)."""
    total = buckets.get(float("inf"), 0.0)
    if not total:
        return None
    return next(le for le, count in sorted(buckets.items()) if count >= q * total)


class Capture:
    """A throwaway NRI plugin that keeps what containerd's Synchronize describes (a real pod and container)."""

    events = event_mask([Event.CREATE_CONTAINER])

    def __init__(self) -> None:
        self.pods: list[api.PodSandbox] = []
        self.containers: list[api.Container] = []

    def configure(self, request: api.ConfigureRequest) -> None:
        pass

    def synchronize(self, pods, containers, deadline: float) -> list[api.ContainerUpdate]:
        self.pods, self.containers = list(pods), list(containers)
        return []

    def create_container(self, request):
        return api.CreateContainerResponse()

    def update_container(self, request):
        return api.UpdateContainerResponse()

    def state_change(self, event) -> None:
        pass

    def run(self, socket_path: str) -> None:
        async def main() -> None:
            with ThreadPoolExecutor(1) as executor:
                conn = await PluginConnection.open(socket_path, self, executor, timeout_s=5)
                await conn.register("capture", "99")
                await conn.synchronized(5)
                conn.close()
                await conn.wait_closed()

        asyncio.run(main())


def real_request(runtime: NriContainerd, pods: PodFactory) -> api.CreateContainerRequest:
    """A CreateContainer request shaped exactly as containerd 2.1 describes a BE pod (left running, so its
    cgroup dirs are there) and its container."""
    _, container_id, _ = pods.start_pod("job", labels=BE_LABELS, annotations=BE_ANNOTATIONS)
    capture = Capture()
    capture.run(runtime.nri_socket)
    container = next(c for c in capture.containers if c.id == container_id)
    pod = next(p for p in capture.pods if p.id == container.pod_sandbox_id)
    container.state = api.CONTAINER_CREATED
    container.pid = 0
    return api.CreateContainerRequest(pod=pod, container=container)


def answer_latency(state: Path, cri_socket: str, request: api.CreateContainerRequest, calls: int) -> dict:
    """koordlet's NRI answer as the runtime sees it: round trips of ``calls`` CreateContainer requests from a
    stand-in runtime to a koordlet process, and that process's CPU per call. The pod's RunPodSandbox comes
    first, as from containerd, so koordlet has set the pod's values (its quota bounds the container's)."""
    fake_dir = state / "fake"
    state.mkdir(parents=True, exist_ok=True)
    runtime = FakeRuntime(str(fake_dir / "nri" / "nri.sock"))
    koordlet = KoordletProcess(state, cri_socket, str(state / "fake-hookserver.d"))
    koordlet.args += ["-enable-nri-runtime-hook=true", f"-var-run-root-dir={fake_dir}",
                      "-runtime-hooks-nri-socket-path=nri/nri.sock", "-runtime-hooks-reconcile-interval=1h"]
    koordlet.start()
    try:
        conn = runtime.accept(30)
        conn.handshake()
        conn.call("StateChange", api.StateChangeEvent(event=api.RUN_POD_SANDBOX, pod=request.pod), api.Empty)
        process = psutil.Process(koordlet.proc.pid)
        payload = request.SerializeToString()
        for _ in range(100):  # warm-up
            conn.response(conn.request("CreateContainer", payload))
        time.sleep(1.0)
        idle_from, idle_cpu = time.monotonic(), cpu_seconds(process)
        time.sleep(3.0)
        idle_rate = (cpu_seconds(process) - idle_cpu) / (time.monotonic() - idle_from)
        samples = []
        busy_from, busy_cpu = time.monotonic(), cpu_seconds(process)
        for _ in range(calls):
            started = time.perf_counter()
            response = conn.response(conn.request("CreateContainer", payload))
            samples.append((time.perf_counter() - started) * 1000)
        busy_s = time.monotonic() - busy_from
        cpu = cpu_seconds(process) - busy_cpu - idle_rate * busy_s
        answer = api.CreateContainerResponse.FromString(response.payload)
        if answer.adjust.linux.resources.cpu.shares.value != 512:
            raise RuntimeError(f"koordlet's answer lacks the BE pod's shares: {answer}")
        return {"p50_ms": round(percentile(samples, 50), 3), "p99_ms": round(percentile(samples, 99), 3),
                "max_ms": round(max(samples), 3), "calls": calls,
                "cpu_us_per_call": round(cpu / calls * 1e6, 1), "idle_cpu_pct": round(idle_rate * 100, 2)}
    finally:
        koordlet.stop()
        runtime.close()


def pod_starts(runtime: NriContainerd, state: Path, rounds: int, per_round: int) -> dict:
    """Pod starts in the three modes, rounds rotating their order; CPU of the koordlets (and the proxy)."""
    direct = CriClient(runtime.socket)
    proxy = ProxyProcess(str(state / "proxy.sock"), runtime.socket, "--log-level", "warning", state_dir=str(state))
    (state / "hooks").mkdir()
    hooks = KoordletProcess(state / "hooks", runtime.socket, proxy.hook_dir)
    hooks.args += ["-enable-nri-runtime-hook=false", "-runtime-hooks-reconcile-interval=1h"]
    hooks.start()
    proxy.start()
    via_proxy = CriClient(proxy.listen)
    samples: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpu = {"proxy_koordlet": 0.0, "proxy_process": 0.0, "nri_koordlet": 0.0}
    nri_metrics = ""
    try:
        for round_index in range(rounds):
            order = MODES[round_index % 3:] + MODES[:round_index % 3]
            for mode in order:
                if mode == "direct":
                    factory = PodFactory(direct)
                    samples[mode] += start_pods(factory, per_round)
                    factory.cleanup()
                elif mode == "proxy":
                    factory = PodFactory(via_proxy)
                    hooks_ps, proxy_ps = psutil.Process(hooks.proc.pid), psutil.Process(proxy.proc.pid)
                    before = cpu_seconds(hooks_ps), cpu_seconds(proxy_ps)
                    samples[mode] += start_pods(factory, per_round)
                    cpu["proxy_koordlet"] += cpu_seconds(hooks_ps) - before[0]
                    cpu["proxy_process"] += cpu_seconds(proxy_ps) - before[1]
                    factory.client = direct
                    factory.cleanup()
                else:
                    (state / f"nri-{round_index}").mkdir()
                    nri = KoordletProcess(state / f"nri-{round_index}", runtime.socket, str(state / "unused.d"))
                    nri.args += koordlet_nri_args(runtime, "-runtime-hooks-reconcile-interval=1h")
                    nri.start()
                    try:
                        if not wait_until(lambda n=nri: "koordlet_nri_registered 1.0" in metrics_of(n), 15, 0.1):
                            raise RuntimeError("koordlet did not register with NRI")
                        ps = psutil.Process(nri.proc.pid)
                        before_nri = cpu_seconds(ps)
                        factory = PodFactory(direct)
                        samples[mode] += start_pods(factory, per_round)
                        cpu["nri_koordlet"] += cpu_seconds(ps) - before_nri
                        nri_metrics = metrics_of(nri)
                        factory.cleanup()
                    finally:
                        nri.stop()
    finally:
        via_proxy.close()
        direct.close()
        proxy.terminate()
        hooks.stop()
    pods = rounds * per_round
    median = {mode: statistics.median(v) for mode, v in samples.items()}
    create = histogram(nri_metrics, "CreateContainer")
    run_pod = histogram(nri_metrics, "RunPodSandbox")
    return {
        "pod_start_ms": {mode: round(v, 1) for mode, v in median.items()},
        "pod_start_ratio_nri": round(median["nri"] / median["direct"], 3),
        "pod_start_ratio_proxy": round(median["proxy"] / median["direct"], 3),
        "pod_starts_per_mode": pods,
        "cpu_ms_per_pod": {
            "nri_koordlet": round(cpu["nri_koordlet"] / pods * 1000, 2),
            "proxy_koordlet": round(cpu["proxy_koordlet"] / pods * 1000, 2),
            "proxy_process": round(cpu["proxy_process"] / pods * 1000, 2),
        },
        "containerd_nri_histogram_ms": {  # the last NRI round, koordlet's own histogram (bucket bounds)
            "CreateContainer_p50_le": bucket_quantile(create, 0.5),
            "CreateContainer_p99_le": bucket_quantile(create, 0.99),
            "RunPodSandbox_p50_le": bucket_quantile(run_pod, 0.5),
            "RunPodSandbox_p99_le": bucket_quantile(run_pod, 0.99),
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4, help="rounds, each starting pods in all three modes")
    ap.add_argument("--pods", type=int, default=6, help="pod starts per mode and round")
    ap.add_argument("--calls", type=int, default=2000, help="CreateContainer answers timed from the stand-in")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args()

    clean_up_dead_instances()
    runtime = NriContainerd.for_process("2.1").up()
    state = Path(tempfile.mkdtemp(prefix="kpy-bench-nri-"))
    client = CriClient(runtime.socket)
    kept = PodFactory(client)
    try:
        request = real_request(runtime, kept)
        result = pod_starts(runtime, state, args.rounds, args.pods)
        result["nri_answer"] = answer_latency(state / "answer", runtime.socket, request, args.calls)
    finally:
        kept.cleanup()
        client.close()
        runtime.down()
    result["goals"] = {"nri_pod_start_ratio_le_1.02": result["pod_start_ratio_nri"] <= 1.02,
                       "nri_answer_p99_le_5ms": result["nri_answer"]["p99_ms"] <= 5.0}
    if args.json:
        print(json.dumps(result))
        return 0
    starts, cpu, answer = result["pod_start_ms"], result["cpu_ms_per_pod"], result["nri_answer"]
    print(f"containerd 2.1.9, NRI on; {result['pod_starts_per_mode']} BE pod starts per mode, {args.rounds} rotating "
          "rounds")
    print(f"{'':<28}{'direct':>10}{'proxy':>10}{'nri':>10}")
    print(f"{'pod start median (ms)':<28}{starts['direct']:>10}{starts['proxy']:>10}{starts['nri']:>10}")
    print(f"{'ratio to direct':<28}{1.0:>10.3f}{result['pod_start_ratio_proxy']:>10.3f}"
          f"{result['pod_start_ratio_nri']:>10.3f}")
    print(f"CPU per pod start: koordlet (NRI) {cpu['nri_koordlet']} ms; koordlet (hook server) "
          f"{cpu['proxy_koordlet']} ms + proxy {cpu['proxy_process']} ms")
    print(f"koordlet's NRI answer, {answer['calls']} CreateContainer round trips from a stand-in runtime: "
          f"p50 {answer['p50_ms']} ms, p99 {answer['p99_ms']} ms, max {answer['max_ms']} ms; "
          f"koordlet CPU {answer['cpu_us_per_call']} us per call (idle {answer['idle_cpu_pct']} % subtracted)")
    print(f"koordlet's own histogram under containerd (bucket bounds, ms): {result['containerd_nri_histogram_ms']}")
    print(f"goals: {result['goals']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
