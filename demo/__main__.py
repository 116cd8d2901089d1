"""make demo: the whole story on one machine, in about two minutes.

A private containerd, koordlet (local mode: pods from the CRI, NodeSLO from a file, NodeMetric
written to a file; two fake GPUs through the tests' fake NVML, its device plugin registering with a test
kubelet in the demo's temp dir) and koord-runtime-proxy in front of containerd. An LS and a BE pod start
through the proxy; the demo shows what the hooks set, the reconciler undoing drift, the metrics
page, the NodeMetric, BE CPU suppressed while LS load rises, and a BE pod evicted under memory
pressure. Everything it started is stopped at the end, also on Ctrl-C or an error.
"""

from __future__ import annotations

import json
import math
import os
import queue
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402
import yaml  # noqa: E402

from koordlet.system.procfs import read_meminfo  # noqa: E402
from tests.koordlet.deviceplugin.kubelet import TestKubelet  # noqa: E402
from tests.support.containerd import Containerd, generation  # noqa: E402
from tests.support.cri import CriClient, PodFactory, container_config, sandbox_config  # noqa: E402
from tests.support.proxy import ProxyProcess, wait_for_socket  # noqa: E402
from wire import cri_pb2 as cri  # noqa: E402
from wire import deviceplugin_pb2 as dp  # noqa: E402
from wire import deviceplugin_pb2_grpc as dp_grpc  # noqa: E402

# Its own kubelet --cgroup-root, so a test session running beside it never shares a kubepods tree with it.
CGROUP_ROOT = "/koordlet-py-demo"
# containerd 2.1 (the default generation), or the one KPY_CONTAINERD names (1.6, 1.7: the test command's subsets).
DEMO_CONTAINERD = Containerd("/run/koordlet-py/demo/containerd", "/var/lib/koordlet-py/demo/containerd",
                             cgroup_root=CGROUP_ROOT, version=generation())
CGROUP_V1 = Path("/sys/fs/cgroup")
NODE = "demo-node"
FAKE_GPUS = 2  # fake NVML (tests/koordlet/gpu/fake_nvml.py): H100s as docs/node-interfaces.md §15 describes one
BE_LABELS = {"koordinator.sh/qosClass": "BE"}
LS_LABELS = {"koordinator.sh/qosClass": "LS"}
BE_SPEC = {"containers": {"batch-job": {"requests": {"kubernetes.io/batch-cpu": "500",
                                                      "kubernetes.io/batch-memory": "256Mi"},
                                         "limits": {"kubernetes.io/batch-cpu": "1000",
                                                    "kubernetes.io/batch-memory": "4Gi"}}}}
BURN = ["sh", "-c", "trap 'exit 0' TERM; yes > /dev/null & wait"]
IDLE = ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]


def say(text: str = "") -> None:
    print(text, flush=True)


def step(title: str, why: str = "") -> None:
    say(f"\n== {title}")
    if why:
        say(f"   ({why})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read(controller: str, cgroup: str, name: str) -> str:
    path = CGROUP_V1 / controller / cgroup.lstrip("/") / name
    return path.read_text().strip() if path.exists() else "(absent)"


def show(controller: str, cgroup: str, names: list[str], label: str) -> None:
    values = ", ".join(f"{n}={read(controller, cgroup, n)}" for n in names)
    say(f"   {label:<10} {values}")


def timed_ms(fn, *args, **kwargs):
    t0 = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, (time.perf_counter() - t0) * 1000


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def wait_until(probe, timeout_s: float, step_s: float = 0.25):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(step_s)
    return None


def node_memory_used_percent() -> int:
    """The node's memory use as koordlet computes it (MemTotal − MemAvailable), in percent."""
    info = read_meminfo()
    return int(info.used_bytes * 100 / info.mem_total_bytes)


def anon_bytes(cgroup: str) -> int:
    """The anonymous memory charged to a cgroup (memory.stat total_rss): the node's use as koordlet computes it
    always counts it, whatever other programs do."""
    stat = read("memory", cgroup, "memory.stat")
    return int(next((line.split()[1] for line in stat.splitlines() if line.startswith("total_rss ")), "0"))


# The BE pod's allocation in the memory step: 3 GiB, or a quarter of the node's memory when that is less. The
# threshold comes down to what the BE pod holds once it holds it, so the node is over it whatever other programs
# on the machine do (a test VM booting beside the demo, a build).
ALLOC_MIB = min(3072, read_meminfo().mem_total_bytes // (1 << 20) // 4)


class Koordlet:
    """koordlet in local mode, as a child process stopped by PID."""

    def __init__(self, workdir: Path, cri_socket: str, hook_dir: str) -> None:
        self.workdir = workdir
        self.slo_file = workdir / "nodeslo.yaml"
        self.reports = workdir / "reports"
        self.port = free_port()
        self.log_path = workdir / "koordlet.log"
        self.hook_socket = workdir / "koordlet.sock"
        # kubelet's device plugin dir is <-var-lib-kubelet-dir>/device-plugins: the demo's own, with a test kubelet.
        self.kubelet_dir = workdir / "kubelet"
        self.device_plugin_dir = self.kubelet_dir / "device-plugins"
        self.args = [
            sys.executable, "-m", "demo.fake_gpu_koordlet", "-local-mode",
            f"-node-slo-file={self.slo_file}", f"-cri-endpoint={cri_socket}", f"-report-dir={self.reports}",
            "-cgroup-root-dir=/sys/fs/cgroup/", f"-kubelet-cgroup-root={CGROUP_ROOT}", "-sys-root-dir=/sys/",
            f"-addr=127.0.0.1:{self.port}", "-report-interval=2s", "-kubelet-sync-interval=1s",
            f"-runtime-hooks-config-path={hook_dir}", f"-runtime-hooks-addr={self.hook_socket}",
            f"-runtime-hooks-host-endpoint={self.hook_socket}", "-runtime-hooks-reconcile-interval=2s",
            f"-sys-fs-root-dir={workdir / 'sysfs'}",
            "-feature-gates=BEMemoryEvict=true,NodeMetricPromMetrics=true,PSICollector=true,Accelerators=true",
            f"-var-lib-kubelet-dir={self.kubelet_dir}",
            "-psi-collector-interval=2s",
            f"-prediction-checkpoint-filepath={workdir / 'prediction'}",
            f"-system-config-record-file={workdir / 'system-config-originals.json'}",
        ]
        self.proc: subprocess.Popen | None = None

    def write_slo(self, spec: dict) -> None:
        tmp = self.slo_file.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(spec))
        tmp.replace(self.slo_file)

    def start(self) -> None:
        env = {**os.environ, "NODE_NAME": NODE, "PYTHONPATH": str(REPO), "DEMO_FAKE_GPUS": str(FAKE_GPUS)}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        ok = wait_until(lambda: self._healthy(), 30)
        if not ok:
            raise RuntimeError("koordlet did not become healthy:\n" + self.log_path.read_text()[-3000:])

    def _healthy(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError("koordlet exited:\n" + self.log_path.read_text()[-3000:])
        try:
            return "ok" in http_get(f"http://127.0.0.1:{self.port}/healthz")
        except OSError:
            return False

    def metrics(self) -> str:
        return http_get(f"http://127.0.0.1:{self.port}/metrics")

    def log_lines(self, needle: str) -> list[str]:
        return [line for line in self.log_path.read_text(errors="replace").splitlines() if needle in line]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def burn_in(client: CriClient, container_id: str, seconds: int) -> threading.Thread:
    """Burn one core inside a container for a while (ExecSync in a thread)."""

    def run() -> None:
        try:
            client.runtime.ExecSync(cri.ExecSyncRequest(
                container_id=container_id, cmd=["timeout", "-s", "KILL", str(seconds), "yes"], timeout=seconds + 5),
                timeout=seconds + 10)
        except grpc.RpcError:
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def show_device_plugin(kubelet: TestKubelet) -> TestKubelet:
    """The GPU device plugin koordlet runs (fake NVML): its registration, the devices kubelet is shown, and
    a kubelet restart (kubelet.sock removed and re-created) answered by a new registration. Returns the
    kubelet now running."""
    try:
        request = kubelet.next_registration(timeout_s=10)
    except queue.Empty:
        say("   the device plugin did not register with the test kubelet within 10 s")
        return kubelet
    say(f"   device plugin registered with kubelet as {request.resource_name} (fake NVML: {FAKE_GPUS} GPUs), "
        f"serving on {request.endpoint}")
    with kubelet.plugin_channel(request) as channel:
        listed = next(dp_grpc.DevicePluginStub(channel).ListAndWatch(dp.Empty(), timeout=5))
    say("   kubelet sees: " + ", ".join(f"{d.ID} {d.health}" for d in listed.devices))
    kubelet.stop()
    t0 = time.monotonic()
    kubelet = TestKubelet(kubelet.plugin_dir)
    try:
        again = kubelet.next_registration(timeout_s=10)
        say(f"   kubelet restarted (kubelet.sock re-created): device plugin registered again as "
            f"{again.resource_name} after {(time.monotonic() - t0) * 1000:.0f} ms")
    except queue.Empty:
        say("   kubelet restarted: the device plugin did not register again within 10 s")
    return kubelet


def show_nrt() -> None:
    """This node's NodeResourceTopology as koordlet reports it with an API server (koordlet/reporters/nrt.py)."""
    from koordlet.api.cpupools import compute_cpu_pools
    from koordlet.reporters.nrt import build_nrt
    from koordlet.system.sysfs import read_node_topology

    topology = read_node_topology()
    nrt = build_nrt(NODE, topology, compute_cpu_pools(topology.cpus, []), None, {})
    say("   its NodeResourceTopology (what koord-scheduler reads to bind CPUs; reported with an API server):")
    for zone in nrt["zones"]:
        amounts = {r["name"]: r["capacity"] for r in zone["resources"]}
        say(f"     zone {zone['name']} ({zone['type']}): cpu {amounts['cpu']}, memory {amounts['memory']}")
    annotations = nrt["metadata"]["annotations"]
    for key in ("node.koordinator.sh/cpu-topology", "node.koordinator.sh/cpu-shared-pools",
                "node.koordinator.sh/be-cpu-shared-pools", "kubelet.koordinator.sh/cpu-manager-policy"):
        say(f"     {key}: {annotations[key]}")
    if topology.isolated_cpus:
        say(f"     isolated CPUs: {topology.isolated_cpus}")


@dataclass
class Demo:
    """What the demo's steps start and pass on to the steps after them (and what the clean-up stops)."""

    workdir: Path
    socket_path: str = ""
    koordlet: Koordlet | None = None
    kubelet: TestKubelet | None = None
    proxy: ProxyProcess | None = None
    client: CriClient | None = None  # through the proxy
    direct: CriClient | None = None  # to containerd
    pods: PodFactory | None = None
    ls_cid: str = ""
    be_cid: str = ""
    be_cgroup: str = ""


def start_containerd(demo: Demo) -> None:
    step(f"1. A private containerd {DEMO_CONTAINERD.version} + runc",
         "cgroupfs driver, a local busybox image, no network")
    demo.socket_path = DEMO_CONTAINERD.up()
    say(f"   up at {demo.socket_path}")


def start_koordlet(demo: Demo) -> None:
    step("2. koordlet, the node agent, in local mode",
         "pods from the CRI, NodeSLO from a file, NodeMetric to a file; it serves runtime hooks too, "
         f"and a GPU device plugin for {FAKE_GPUS} fake GPUs (fake NVML) to a test kubelet")
    hook_dir = str(demo.workdir / "hookserver.d")
    koordlet = demo.koordlet = Koordlet(demo.workdir, demo.socket_path, hook_dir)
    koordlet.write_slo({"resourceUsedThresholdWithBE": {"enable": False}})
    # No real kubelet here: a test kubelet serves kubelet.sock in the demo's own device plugin dir.
    koordlet.device_plugin_dir.mkdir(parents=True)
    demo.kubelet = TestKubelet(str(koordlet.device_plugin_dir))
    koordlet.start()
    say(f"   koordlet pid {koordlet.proc.pid}, metrics on 127.0.0.1:{koordlet.port}")
    registration = Path(hook_dir) / "koordlet.json"
    if wait_until(registration.exists, 10):
        say(f"   it registered its hook server: {json.loads(registration.read_text())}")
    demo.kubelet = show_device_plugin(demo.kubelet)
    show_nrt()


def start_proxy(demo: Demo) -> None:
    step("3. koord-runtime-proxy in front of containerd",
         "kubelet would be pointed at it with --container-runtime-endpoint")
    proxy = demo.proxy = ProxyProcess(str(demo.workdir / "runtimeproxy.sock"), demo.socket_path,
                                      state_dir=str(demo.workdir), log_path=str(demo.workdir / "proxy.log")).start()
    wait_for_socket(proxy.listen, 10)
    demo.client, demo.direct = CriClient(proxy.listen), CriClient(demo.socket_path)
    version = demo.client.runtime.Version(cri.VersionRequest(version="v1"))
    say(f"   proxy pid {proxy.proc.pid}: {version.runtime_name} {version.runtime_version} through it")


def start_pods(demo: Demo) -> None:
    step("4. An LS pod and a BE pod start through the proxy",
         "the BE pod asks for kubernetes.io/batch-cpu/-memory, as Koordinator's batch jobs do")
    client = demo.client
    pods = demo.pods = PodFactory(client, cgroup_root=CGROUP_ROOT)
    _, demo.ls_cid, ls_sandbox = pods.start_pod(
        "web", kube_qos="burstable", labels=LS_LABELS, command=IDLE,
        resources=cri.LinuxContainerResources(cpu_period=100000, cpu_quota=100000, cpu_shares=1024,
                                              memory_limit_in_bytes=256 << 20))
    be_sandbox = sandbox_config("batch-job", kube_qos="besteffort", labels=BE_LABELS, cgroup_root=CGROUP_ROOT,
                                annotations={"node.koordinator.sh/extended-resource-spec": json.dumps(BE_SPEC)})
    be_sid, run_ms = timed_ms(pods.run_pod, be_sandbox)
    demo.be_cid, create_ms = timed_ms(pods.create_container, be_sid, be_sandbox,
                                      container_config("batch-job", command=BURN))
    _, start_ms = timed_ms(client.runtime.StartContainer, cri.StartContainerRequest(container_id=demo.be_cid))
    say(f"   BE pod: RunPodSandbox {run_ms:.0f} ms, CreateContainer {create_ms:.0f} ms, "
        f"StartContainer {start_ms:.0f} ms (hooks included)")
    be_cgroup = demo.be_cgroup = f"{be_sandbox.linux.cgroup_parent}/{demo.be_cid}"
    ls_cgroup = f"{ls_sandbox.linux.cgroup_parent}/{demo.ls_cid}"
    say("   cgroup files of the containers (BE values come from the batch resources, via the hooks):")
    show("cpu", ls_cgroup, ["cpu.shares", "cpu.cfs_quota_us"], "LS web")
    show("cpu", be_cgroup, ["cpu.shares", "cpu.cfs_quota_us"], "BE batch")
    show("memory", be_cgroup, ["memory.limit_in_bytes"], "BE batch")

    step("5. Drift: someone rewrites the BE container's cpu.shares by hand",
         "the reconciler re-applies what the hooks decided, without the proxy")
    (CGROUP_V1 / "cpu" / be_cgroup.lstrip("/") / "cpu.shares").write_text("4096")
    show("cpu", be_cgroup, ["cpu.shares"], "changed")
    restored = wait_until(lambda: read("cpu", be_cgroup, "cpu.shares") != "4096", 8)
    show("cpu", be_cgroup, ["cpu.shares"], "restored" if restored else "not yet")


def show_metrics(demo: Demo) -> None:
    step("6. The metrics page (koordlet /metrics, Koordinator's names)")
    koordlet = demo.koordlet
    # The PSI collector runs every 2 s here: give it a tick or two to find the new pods' cgroups.
    metrics = wait_until(lambda: (lambda t: t if "koordlet_node_used_cpu_cores" in t and "koordlet_pod_psi{" in t
                                  else "")(koordlet.metrics()), 10) or koordlet.metrics()
    for line in metrics.splitlines():
        if line.startswith(("koordlet_node_used_cpu_cores", "koordlet_node_used_memory_bytes",
                            "koordlet_collector_duration_seconds_sum", "process_resident_memory_bytes")):
            say(f"   {line}")
    # Per-pod PSI: on this cgroup v1 host it comes from the hybrid cgroup2 mount runc also joins.
    psi_lines = [line for line in metrics.splitlines() if line.startswith("koordlet_pod_psi{")
                 and 'psi_resource_type="cpu"' in line and 'psi_precision="avg10"' in line
                 and 'psi_degree="some"' in line]
    for line in psi_lines:
        say(f"   {line}")
    if not psi_lines:
        say("   (no per-pod PSI on this kernel: no *.pressure files in the pod cgroups)")


def show_nodemetric(demo: Demo) -> None:
    step("7. The NodeMetric koordlet reports (written as a file without an API server)")
    report = demo.koordlet.reports / f"nodemetric-{NODE}.yaml"

    def reported():
        if not report.exists():
            return None
        status = yaml.safe_load(report.read_text()).get("status", {})
        return status if len(status.get("podsMetric", [])) >= 2 else None

    status = wait_until(reported, 15) or {}
    usage = status.get("nodeMetric", {}).get("nodeUsage", {}).get("resources", {})
    say(f"   nodeUsage: {usage}")
    for pod in status.get("podsMetric", []):
        say(f"   pod {pod['namespace']}/{pod['name']}: qos {pod.get('qos')}, priority {pod.get('priority')}, "
            f"usage {pod.get('podUsage', {}).get('resources')}")


def other_cpu_cores(koordlet: Koordlet, seconds: float = 2.0) -> float:
    """CPU the node spends outside the demo's pods, as koordlet counts it (its node usage, less what the demo's
    own kubepods cgroup used meanwhile): what Koordinator's suppress formula calls system usage."""
    kubepods = f"{CGROUP_ROOT}/kubepods"
    started, used = time.monotonic(), int(read("cpuacct", kubepods, "cpuacct.usage"))
    time.sleep(seconds)
    pods = (int(read("cpuacct", kubepods, "cpuacct.usage")) - used) / 1e9 / (time.monotonic() - started)
    node = next(float(line.rsplit(" ", 1)[1]) for line in koordlet.metrics().splitlines()
                if line.startswith("koordlet_node_used_cpu_cores{"))
    return max(node - pods, 0.0)


def show_suppress(demo: Demo) -> None:
    # The threshold sits a core above what the rest of the machine uses now (as koordlet reads it), so BE has
    # about a core while LS idles and loses it when LS burns one, whatever else runs beside the demo.
    cores = len(os.sched_getaffinity(0))
    other = other_cpu_cores(demo.koordlet)
    threshold = min(100, math.ceil((other + 1.0) * 100 / cores))
    step(f"8. CPU suppression: BE gets what LS leaves, under a {threshold} % threshold",
         f"the rest of the node uses {other:.2f} of {cores} cores; NodeSLO resourceUsedThresholdWithBE.enable=true, "
         "cfsQuota policy; watch besteffort cpu.cfs_quota_us")
    besteffort = f"{CGROUP_ROOT}/kubepods/besteffort"
    demo.koordlet.write_slo({"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": threshold,
                                                             "cpuSuppressPolicy": "cfsQuota"}})
    time.sleep(3)
    say(f"   LS idle:      besteffort quota {read('cpu', besteffort, 'cpu.cfs_quota_us')} us per 100 ms")
    burner = burn_in(demo.client, demo.ls_cid, 9)
    for second in range(8):
        time.sleep(1)
        say(f"   LS busy  {second + 1} s: besteffort quota {int(read('cpu', besteffort, 'cpu.cfs_quota_us'))}")
    burner.join(15)
    for second in range(5):
        time.sleep(1)
        say(f"   LS idle  {second + 1} s: besteffort quota {read('cpu', besteffort, 'cpu.cfs_quota_us')}")


def show_explain(demo: Demo) -> None:
    step("9. Why does the BE pod have these values? koordlet explain default/batch-job",
         "what each hook plugin answered at creation, the cgroup files now, the last QoS actions with their figures")
    done = subprocess.run([sys.executable, "-m", "koordlet.main", "explain", "default/batch-job",
                           "--server", f"http://127.0.0.1:{demo.koordlet.port}"],
                          cwd=REPO, capture_output=True, text=True, timeout=30)
    for line in (done.stdout or done.stderr).splitlines():
        say(f"   {line}")
    demo.koordlet.write_slo({"resourceUsedThresholdWithBE": {"enable": False}})


def show_eviction(demo: Demo) -> None:
    step("10. Memory pressure: the BE pod is evicted",
         f"the BE pod takes {ALLOC_MIB / 1024:.1f} GiB; then the threshold comes down to what it holds; local mode "
         "kills through the CRI (with an API server: the Eviction API, so PDBs hold)")
    koordlet, client, direct = demo.koordlet, demo.client, demo.direct
    # CPU suppression stands aside (threshold 100 %): at its floor quota the BE pod would take minutes to allocate
    slo = {"enable": True, "memoryEvictThresholdPercent": 99, "cpuSuppressThresholdPercent": 100,
           "cpuSuppressPolicy": "cfsQuota"}
    koordlet.write_slo({"resourceUsedThresholdWithBE": slo})
    say(f"   node memory used {node_memory_used_percent()} %, eviction threshold 99 %")
    allocate = ["sh", "-c", f"(head -c {ALLOC_MIB}m /dev/zero; sleep 60) | tail -c {ALLOC_MIB}m > /dev/null"]

    def allocate_in_be() -> None:
        try:
            client.runtime.ExecSync(cri.ExecSyncRequest(container_id=demo.be_cid, cmd=allocate, timeout=60),
                                    timeout=65)
        except grpc.RpcError:
            pass

    threading.Thread(target=allocate_in_be, daemon=True).start()
    held = wait_until(lambda: anon_bytes(demo.be_cgroup) >= (ALLOC_MIB << 20) * 2 // 3, 60)
    threshold = anon_bytes(demo.be_cgroup) * 100 // read_meminfo().mem_total_bytes
    say(f"   the BE pod holds {anon_bytes(demo.be_cgroup) >> 20} MiB{'' if held else ' (not all of it yet)'}; "
        f"node memory used {node_memory_used_percent()} %; eviction threshold now {threshold} %")
    koordlet.write_slo({"resourceUsedThresholdWithBE": {**slo, "memoryEvictThresholdPercent": threshold}})

    def be_stopped():
        state = direct.runtime.ContainerStatus(cri.ContainerStatusRequest(container_id=demo.be_cid)).status.state
        return state == cri.CONTAINER_EXITED

    t0 = time.monotonic()
    if wait_until(be_stopped, 30):
        say(f"   BE container stopped {time.monotonic() - t0:.1f} s after the threshold came down; koordlet says:")
        for line in (koordlet.log_lines("evict") or ["(no eviction line logged)"])[-3:]:
            say(f"   | {line.split(' ', 2)[-1][:200]}")
        ls_state = direct.runtime.ContainerStatus(cri.ContainerStatusRequest(container_id=demo.ls_cid)).status.state
        say(f"   the LS pod is untouched: {cri.ContainerState.Name(ls_state)}")
    else:
        say("   the BE container was not evicted within 30 s; koordlet log tail:")
        for line in koordlet.log_path.read_text().splitlines()[-10:]:
            say(f"   | {line}")


def show_proxy_cost(demo: Demo) -> None:
    step("11. What the proxy costs kubelet: the same call, direct vs through the proxy (p50 of 300)")
    for name, request in (("Version", cri.VersionRequest()), ("ListContainers", cri.ListContainersRequest())):
        rows = []
        for c in (demo.direct, demo.client):
            rows.append(statistics.median(timed_ms(getattr(c.runtime, name), request)[1] for _ in range(300)))
        say(f"   {name:<16} direct {rows[0]:.3f} ms   proxy {rows[1]:.3f} ms   added {rows[1] - rows[0]:+.3f} ms")


STEPS = (start_containerd, start_koordlet, start_proxy, start_pods, show_metrics, show_nodemetric, show_suppress,
         show_explain, show_eviction, show_proxy_cost)


def clean_up(demo: Demo) -> None:
    """Stop everything the demo started, whatever step it reached."""
    if demo.pods is not None:
        demo.pods.client = demo.direct or demo.pods.client
        demo.pods.cleanup()
    for c in (demo.client, demo.direct):
        if c is not None:
            c.close()
    if demo.proxy is not None and demo.proxy.proc is not None:
        demo.proxy.terminate()
    if demo.koordlet is not None:
        demo.koordlet.stop()
    if demo.kubelet is not None:
        demo.kubelet.stop()
    DEMO_CONTAINERD.down()


def main() -> int:
    if os.geteuid() != 0:
        say("make demo needs root (it runs containerd and writes cgroups)")
        return 1
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    tmp = tempfile.TemporaryDirectory(prefix="kpy-demo-")
    demo = Demo(Path(tmp.name))
    started = time.monotonic()
    try:
        for run_step in STEPS:
            run_step(demo)
        say(f"\nDone in {time.monotonic() - started:.0f} s: stopping everything the demo started.")
        return 0
    except KeyboardInterrupt:
        say("\ninterrupted: cleaning up")
        return 130
    finally:
        clean_up(demo)
        tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
