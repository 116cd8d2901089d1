#!/usr/bin/env python3
"""What NRI mode costs pod starts, and what koordlet's NRI answer costs, side by side in one run.

On four private containerd 2.1.9 instances with NRI on (same binary, same config, one per mode, so each
holds the same pods), BE pods (batch resources: every default plugin has something to say) started four
ways, one pod of each in turn (the order shuffled each turn, seeded, so that no mode always follows the same
other: a koordlet's background work after a pod start spills into the next start), so all see the same moment
of this shared machine's noise:

  direct    straight on its containerd's CRI: no NRI plugin registered there, no proxy;
  proxy     through koord-runtime-proxy to a koordlet hook server (its NRI off);
  nri       straight on the CRI of a containerd where a koordlet is registered as NRI plugin;
  nri-noop  straight on the CRI of one where a plugin that answers every event with "no change" at once is
            registered (the same events as koordlet's): what NRI costs containerd itself, koordlet aside.

Ratios are medians of the per-turn ratios (each turn starts one pod in every mode, back to back), which
cancels the machine's drift better than a ratio of medians.

A pod start is RunPodSandbox + CreateContainer + StartContainer. Then koordlet's NRI answer alone: a
stand-in runtime (tests/support/nriruntime.py) sends a koordlet process CreateContainer requests built from
a pod and container as containerd 2.1 described them in a real Synchronize, one after the other, and times
each round trip on the socket (what the runtime waits for), and the koordlet process's CPU per call (its
idle CPU over the same time subtracted). koordlet's own histogram of the NRI events during the real pod
starts is printed beside it.

Goals (issue 26): NRI pod start <= 1.02x direct; koordlet's NRI answer p99 <= 5 ms.

With ``--base-tree DIR`` (another checkout, say main's, made with ``git archive``), the same run compares this
tree's koordlet with DIR's: a fifth mode, ``nri-base``, is a koordlet from DIR's source registered with a fifth
containerd, started in the same turns as the others; and the answer latency is measured on DIR's koordlet and
this one's alternately (base, this, this, base).

    .venv/bin/python bench/nri.py [--rounds 4] [--pods 6] [--calls 2000] [--base-tree DIR] [--json]

A benchmark, not a test: needs root and cgroup v1; its containerd, sockets and processes are its own
(stopped by PID); read the ratios, not the absolutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psutil  # noqa: E402

from koordlet.runtimehooks.nri import EVENTS as NRI_EVENTS  # noqa: E402
from tests.support.cri import CriClient, PodFactory  # noqa: E402
from tests.support.nri import (  # noqa: E402
    NriContainerd,
    TinyPlugin,
    clean_up_dead_instances,
    koordlet_nri_args,
    oci_spec,
)
from tests.support.nriruntime import FakeRuntime  # noqa: E402
from tests.support.proxy import ProxyProcess  # noqa: E402
from tests.support.stack import BE_ANNOTATIONS, BE_LABELS, KoordletProcess, http_get  # noqa: E402
from tests.support.waiting import wait_for  # noqa: E402
from wire import nri_pb2 as api  # noqa: E402
from wire.nri import Event, PluginConnection, event_mask  # noqa: E402

MODES = ("direct", "proxy", "nri", "nri-noop")
BASE_MODE = "nri-base"  # with --base-tree: koordlet from another source tree, as NRI plugin
# koordlet.main run from another tree's source: that tree first on the path (this one is the process's cwd)
_FROM_TREE = ("import runpy, sys; sys.path.insert(0, {tree!r}); "
              "runpy.run_module('koordlet.main', run_name='__main__', alter_sys=True)")


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def koordlet_from(process: KoordletProcess, tree: str | None) -> KoordletProcess:
    """``process`` set to run the koordlet of the source tree ``tree`` (None: this tree's)."""
    if tree is not None:
        if process.args[1:3] != ["-m", "koordlet.main"]:
            raise RuntimeError(f"unexpected koordlet command line: {process.args[:3]}")
        process.args[1:3] = ["-c", _FROM_TREE.format(tree=os.path.abspath(tree))]
    return process


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


def answer_latency(state: Path, cri_socket: str, request: api.CreateContainerRequest, calls: int,
                   tree: str | None = None) -> dict:
    """koordlet's NRI answer as the runtime sees it: round trips of ``calls`` CreateContainer requests from a
    stand-in runtime to a koordlet process (from ``tree``'s source, default this one's), and that process's CPU
    per call. The pod's RunPodSandbox comes first, as from containerd, so koordlet has set the pod's values (its
    quota bounds the container's)."""
    fake_dir = state / "fake"
    state.mkdir(parents=True, exist_ok=True)
    runtime = FakeRuntime(str(fake_dir / "nri" / "nri.sock"))
    koordlet = KoordletProcess(state, cri_socket, str(state / "fake-hookserver.d"))
    koordlet.args += ["-enable-nri-runtime-hook=true", f"-var-run-root-dir={fake_dir}",
                      "-runtime-hooks-nri-socket-path=nri/nri.sock", "-runtime-hooks-reconcile-interval=1h"]
    koordlet_from(koordlet, tree).start()
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


def check_hooked(behind_proxy: CriClient, factories: dict[str, PodFactory]) -> None:
    """The last pod of each mode got what its mode gives: BE shares through NRI and the proxy, none direct."""
    shares = {mode: oci_spec(factory.client if mode != "proxy" else behind_proxy, factory.containers[-1])["linux"]
              ["resources"].get("cpu", {}).get("shares") for mode, factory in factories.items()}
    expected = {"direct": None, "proxy": 512, "nri": 512, "nri-noop": None, BASE_MODE: 512}
    if shares != {mode: expected[mode] for mode in factories}:
        raise RuntimeError(f"the modes did not hook as expected: cpu shares {shares}")


def idle_rate(processes: dict[str, psutil.Process], seconds: float = 3.0) -> dict[str, float]:
    """CPU seconds per second each process spends with nothing to answer (its collectors, its ticks)."""
    before = {name: cpu_seconds(p) for name, p in processes.items()}
    time.sleep(seconds)
    return {name: (cpu_seconds(p) - before[name]) / seconds for name, p in processes.items()}


def remove_all(factories: dict[str, PodFactory], behind_proxy: CriClient) -> None:
    """Every pod made, removed straight on the runtimes (not part of what is measured)."""
    for mode, factory in factories.items():
        client = factory.client
        if mode == "proxy":
            factory.client = behind_proxy
        factory.cleanup()
        factory.client = client


class NoopPlugin(TinyPlugin):
    """Subscribed to koordlet's events, answering each with no change."""

    events = event_mask(list(NRI_EVENTS))


def _no_change(request: api.CreateContainerRequest) -> api.ContainerAdjustment:
    return api.ContainerAdjustment()


def _nri_koordlet(state: Path, runtime: NriContainerd, extra: list[str], tree: str | None) -> KoordletProcess:
    """A koordlet (from ``tree``'s source, default this one's) registered as NRI plugin with ``runtime``."""
    state.mkdir()
    koordlet = KoordletProcess(state, runtime.socket, str(state / "hookserver.d"))
    koordlet.args += koordlet_nri_args(runtime, *extra)
    return koordlet_from(koordlet, tree)


def pod_starts(runtimes: dict[str, NriContainerd], state: Path, rounds: int, per_round: int,
               base_tree: str | None = None) -> dict:
    """Pod starts in the four modes (five with ``base_tree``; ``runtimes``: one containerd per mode), one pod of
    each in turn (in a shuffled order). CPU of the koordlets and the proxy over the whole run, their idle
    CPU subtracted, per pod of their mode."""
    modes = MODES + ((BASE_MODE,) if base_tree else ())
    clients = {mode: CriClient(runtimes[mode].socket) for mode in modes}  # straight on each containerd
    noop_plugin = NoopPlugin(runtimes["nri-noop"].nri_socket, _no_change, name="noop", index="00").__enter__()
    proxy = ProxyProcess(str(state / "proxy.sock"), runtimes["proxy"].socket, "--log-level", "warning",
                         state_dir=str(state))
    (state / "hooks").mkdir()
    # The koordlets with their periodic loops slowed down (pods polled, usage collected, reconciled once an
    # hour): on two cores shared with other work their CPU would otherwise land on whichever pod starts
    # next, in any mode. What the whole agent costs is bench/agent_process.py's figure.
    quiet = ["-runtime-hooks-reconcile-interval=1h", "-kubelet-sync-interval=1h", "-collect-res-used-interval=1h"]
    hooks = KoordletProcess(state / "hooks", runtimes["proxy"].socket, proxy.hook_dir)
    hooks.args += ["-enable-nri-runtime-hook=false", *quiet]
    plugins = {"nri": _nri_koordlet(state / "nri", runtimes["nri"], quiet, None)}
    if base_tree:
        plugins[BASE_MODE] = _nri_koordlet(state / BASE_MODE, runtimes[BASE_MODE], quiet, base_tree)
    for koordlet in (hooks, *plugins.values()):
        koordlet.start()
    proxy.start()
    via_proxy = CriClient(proxy.listen)
    behind_proxy = clients["proxy"]
    factories = {mode: PodFactory(via_proxy if mode == "proxy" else clients[mode]) for mode in modes}
    samples: dict[str, list[float]] = {mode: [] for mode in modes}
    try:
        for koordlet in plugins.values():
            if not wait_for(lambda k=koordlet: "koordlet_nri_registered 1.0" in metrics_of(k), 15, 0.1):
                raise RuntimeError("koordlet did not register with NRI")
        processes = {"hooks": psutil.Process(hooks.proc.pid), "proxy": psutil.Process(proxy.proc.pid),
                     **{mode: psutil.Process(k.proc.pid) for mode, k in plugins.items()}}
        for factory in factories.values():  # warm-up: shims, the first hook calls
            start_pods(factory, 1)
        check_hooked(behind_proxy, factories)
        remove_all(factories, behind_proxy)
        idle = idle_rate(processes)
        before = {name: cpu_seconds(p) for name, p in processes.items()}
        began = time.monotonic()
        order = random.Random(7)  # each turn's order: no mode always follows the same other
        for _ in range(rounds):
            for _ in range(per_round):
                for mode in order.sample(modes, len(modes)):
                    samples[mode] += start_pods(factories[mode], 1)
            check_hooked(behind_proxy, factories)
            remove_all(factories, behind_proxy)
        elapsed = time.monotonic() - began
        spent = {name: cpu_seconds(p) - before[name] - idle[name] * elapsed for name, p in processes.items()}
        nri_metrics = {mode: metrics_of(k) for mode, k in plugins.items()}
    finally:
        remove_all(factories, behind_proxy)
        noop_plugin.__exit__()
        via_proxy.close()
        for client in clients.values():
            client.close()
        proxy.terminate()
        for koordlet in (hooks, *plugins.values()):
            koordlet.stop()
    return _pod_start_figures(samples, spent, nri_metrics, rounds * per_round)


def _paired(samples: dict[str, list[float]], mode: str, to: str = "direct") -> float:
    """The median of ``mode``'s pod starts over ``to``'s, turn by turn."""
    return round(statistics.median(m / d for m, d in zip(samples[mode], samples[to], strict=True)), 3)


def _histogram_figures(metrics: str) -> dict:
    """koordlet's own histogram of its NRI answers (bucket bounds, ms)."""
    create, run_pod = histogram(metrics, "CreateContainer"), histogram(metrics, "RunPodSandbox")
    return {"CreateContainer_p50_le": bucket_quantile(create, 0.5),
            "CreateContainer_p99_le": bucket_quantile(create, 0.99),
            "RunPodSandbox_p50_le": bucket_quantile(run_pod, 0.5),
            "RunPodSandbox_p99_le": bucket_quantile(run_pod, 0.99)}


def _pod_start_figures(samples: dict[str, list[float]], spent: dict[str, float], nri_metrics: dict[str, str],
                       pods: int) -> dict:
    """The medians, the ratios to direct paired by pod, CPU per pod and koordlet's NRI histogram; with a base
    tree, its koordlet's figures and the paired ratio of this tree's NRI pod start to the base's."""
    out = {
        "pod_start_ms": {mode: round(statistics.median(v), 1) for mode, v in samples.items()},
        "pod_start_ratio_nri": _paired(samples, "nri"),
        "pod_start_ratio_proxy": _paired(samples, "proxy"),
        "pod_start_ratio_nri_noop": _paired(samples, "nri-noop"),
        "pod_starts_per_mode": pods,
        "cpu_ms_per_pod": {
            "nri_koordlet": round(spent["nri"] / pods * 1000, 2),
            "proxy_koordlet": round(spent["hooks"] / pods * 1000, 2),
            "proxy_process": round(spent["proxy"] / pods * 1000, 2),
        },
        "containerd_nri_histogram_ms": _histogram_figures(nri_metrics["nri"]),  # over the run
    }
    if BASE_MODE in samples:
        out["base"] = {"pod_start_ratio_nri": _paired(samples, BASE_MODE),
                       "pod_start_ratio_nri_to_base": _paired(samples, "nri", BASE_MODE),
                       "cpu_ms_per_pod_nri_koordlet": round(spent[BASE_MODE] / pods * 1000, 2),
                       "containerd_nri_histogram_ms": _histogram_figures(nri_metrics[BASE_MODE])}
    return out


def answer_latencies(state: Path, cri_socket: str, request: api.CreateContainerRequest, calls: int,
                     base_tree: str | None) -> tuple[dict, dict | None]:
    """The answer latency of this tree's koordlet; with ``base_tree``, of both, alternately (base, this, this,
    base): each tree's runs and the medians of their figures."""
    if base_tree is None:
        return answer_latency(state, cri_socket, request, calls), None
    runs: dict[str | None, list[dict]] = {None: [], base_tree: []}
    for index, tree in enumerate((base_tree, None, None, base_tree)):
        runs[tree].append(answer_latency(state / f"run{index}", cri_socket, request, calls, tree))

    def summary(results: list[dict]) -> dict:
        out = {key: statistics.median(r[key] for r in results) for key in ("p50_ms", "p99_ms", "cpu_us_per_call")}
        return {**out, "calls": calls, "max_ms": max(r["max_ms"] for r in results),
                "idle_cpu_pct": max(r["idle_cpu_pct"] for r in results), "runs": results}
    return summary(runs[None]), summary(runs[base_tree])


def _print_table(result: dict) -> None:
    starts, cpu, answer = result["pod_start_ms"], result["cpu_ms_per_pod"], result["nri_answer"]
    modes = list(starts)
    ratios = {"direct": 1.0, "proxy": result["pod_start_ratio_proxy"], "nri": result["pod_start_ratio_nri"],
              "nri-noop": result["pod_start_ratio_nri_noop"]}
    if "base" in result:
        ratios[BASE_MODE] = result["base"]["pod_start_ratio_nri"]
    print(f"containerd 2.1.9, NRI on; {result['pod_starts_per_mode']} BE pod starts per mode, interleaved pod by pod")
    print(f"{'':<28}" + "".join(f"{mode:>10}" for mode in modes))
    print(f"{'pod start median (ms)':<28}" + "".join(f"{starts[mode]:>10}" for mode in modes))
    print(f"{'ratio to direct (paired)':<28}" + "".join(f"{ratios[mode]:>10.3f}" for mode in modes))
    print(f"CPU per pod start: koordlet (NRI) {cpu['nri_koordlet']} ms; koordlet (hook server) "
          f"{cpu['proxy_koordlet']} ms + proxy {cpu['proxy_process']} ms")
    print(f"koordlet's NRI answer, {answer['calls']} CreateContainer round trips from a stand-in runtime: "
          f"p50 {answer['p50_ms']} ms, p99 {answer['p99_ms']} ms, max {answer['max_ms']} ms; "
          f"koordlet CPU {answer['cpu_us_per_call']} us per call (idle {answer['idle_cpu_pct']} % subtracted)")
    print(f"koordlet's own histogram under containerd (bucket bounds, ms): {result['containerd_nri_histogram_ms']}")
    if "base" in result:
        base = result["base"]
        base_answer = base["nri_answer"]
        print(f"base tree: NRI pod start paired to this tree's {base['pod_start_ratio_nri_to_base']} (this / base); "
              f"its koordlet CPU per pod start {base['cpu_ms_per_pod_nri_koordlet']} ms; its answer p50 "
              f"{base_answer['p50_ms']} ms, p99 {base_answer['p99_ms']} ms, CPU {base_answer['cpu_us_per_call']} us "
              f"per call (medians of 2 runs, alternating with this tree's 2); histogram "
              f"{base['containerd_nri_histogram_ms']}")
    print(f"goals: {result['goals']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6, help="rounds (pods are removed after each)")
    ap.add_argument("--pods", type=int, default=8, help="pod starts per mode and round")
    ap.add_argument("--calls", type=int, default=2000, help="CreateContainer answers timed from the stand-in")
    ap.add_argument("--base-tree", help="another source tree whose koordlet is measured beside this one's")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args()
    if args.base_tree and not os.path.isfile(os.path.join(args.base_tree, "koordlet", "main.py")):
        ap.error(f"--base-tree {args.base_tree}: no koordlet/main.py there")

    clean_up_dead_instances()
    modes = MODES + ((BASE_MODE,) if args.base_tree else ())
    runtimes = {mode: NriContainerd.for_process("2.1", instance=mode.replace("-", "") if mode != "direct" else "")
                for mode in modes}
    for runtime in runtimes.values():
        runtime.up()
    plain = runtimes["direct"]
    state = Path(tempfile.mkdtemp(prefix="kpy-bench-nri-"))
    client = CriClient(plain.socket)
    kept = PodFactory(client)
    try:
        request = real_request(plain, kept)
        result = pod_starts(runtimes, state, args.rounds, args.pods, args.base_tree)
        result["nri_answer"], base_answer = answer_latencies(state / "answer", plain.socket, request, args.calls,
                                                             args.base_tree)
        if base_answer is not None:
            result["base"]["nri_answer"] = base_answer
    finally:
        kept.cleanup()
        client.close()
        for runtime in runtimes.values():
            runtime.down()
        shutil.rmtree(state, ignore_errors=True)
    result["goals"] = {"nri_pod_start_ratio_le_1.02": result["pod_start_ratio_nri"] <= 1.02,
                       "nri_answer_p99_le_5ms": result["nri_answer"]["p99_ms"] <= 5.0}
    if args.json:
        print(json.dumps(result))
    else:
        _print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
