"""The daemon end to end in local mode: real containerd pods, real cgroup v1 files, /metrics, NodeMetric YAML,
SIGTERM."""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from koordlet import features
from koordlet.agent.context import AgentContext
from koordlet.agent.lifecycle import Koordlet
from koordlet.config import parse_config
from koordlet.main import raise_nofile_limit
from koordlet.ticker import PeriodicThread
from tests.support.containerd import CGROUP_ROOT
from tests.support.cri import CriClient, PodFactory
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
NODE = "test-node-main"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, ""
    except OSError:
        return 0, ""


def _needs_cgroup_v1() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    if not os.path.isdir("/sys/fs/cgroup/cpu") or not os.path.isdir("/sys/fs/cgroup/cpuacct"):
        pytest.skip("no cgroup v1 cpu/cpuacct hierarchy")


@pytest.fixture
def pods(containerd_socket: str) -> Iterator[PodFactory]:
    client = CriClient(containerd_socket)
    factory = PodFactory(client)
    try:
        yield factory
    finally:
        factory.cleanup()
        client.close()


@pytest.mark.containerd
@pytest.mark.cgroupv1
def test_local_mode_daemon_serves_metrics_writes_nodemetric_and_stops_on_sigterm(
        containerd_socket: str, pods: PodFactory, tmp_path: Path) -> None:
    _needs_cgroup_v1()
    pods.start_pod("main-be", labels={"koordinator.sh/qosClass": "BE"})
    slo = tmp_path / "nodeslo.yaml"
    slo.write_text("resourceUsedThresholdWithBE: {enable: false}\n")
    reports = tmp_path / "reports"
    port = free_port()
    argv = [
        sys.executable, "-m", "koordlet.main", "-local-mode",
        f"-node-slo-file={slo}", f"-cri-endpoint={containerd_socket}", f"-report-dir={reports}",
        "-cgroup-root-dir=/sys/fs/cgroup/", f"-kubelet-cgroup-root={CGROUP_ROOT}",
        f"-addr=127.0.0.1:{port}", "-report-interval=1s", "-kubelet-sync-interval=1s", "-sys-root-dir=/sys/",
        f"-runtime-hooks-config-path={tmp_path / 'hookserver.d'}", f"-runtime-hooks-addr={tmp_path / 'koordlet.sock'}",
        f"-sys-fs-root-dir={tmp_path / 'sysfs'}",
        "-feature-gates=NodeMetricPromMetrics=true,PSICollector=true",
    ]
    env = {**os.environ, "NODE_NAME": NODE, "PYTHONPATH": str(REPO)}
    log = (tmp_path / "koordlet.log").open("w+")
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        assert wait_for(lambda: get(base + "/healthz")[0] == 200, 20.0, 0.2), _tail(log)
        metrics = wait_for(lambda: (lambda text: text if f'koordlet_node_used_cpu_cores{{node="{NODE}"}}' in text
                                    else "")(get(base + "/metrics")[1]), 20.0, 0.2)
        assert metrics, _tail(log)
        assert f'koordlet_node_used_memory_bytes{{node="{NODE}"}}' in metrics
        assert f'koordlet_start_time{{node="{NODE}"}}' in metrics
        assert "process_resident_memory_bytes" in metrics  # the default registry is served too
        assert 'koordlet_collector_duration_seconds_count{collector="pod_resource"}' in metrics
        report = reports / f"nodemetric-{NODE}.yaml"

        def pod_reported() -> dict | None:
            if not report.exists():
                return None
            obj = yaml.safe_load(report.read_text())
            names = [p["name"] for p in obj["status"].get("podsMetric", [])]
            return obj if "main-be" in names and obj["status"]["nodeMetric"]["nodeUsage"]["resources"] else None

        obj = wait_for(pod_reported, 20.0, 0.2)
        assert obj, _tail(log)
        assert obj["kind"] == "NodeMetric" and obj["metadata"]["name"] == NODE
        entry = next(p for p in obj["status"]["podsMetric"] if p["name"] == "main-be")
        assert entry["qos"] == "BE" and entry["priority"] == "koord-batch"
        assert set(obj["status"]["nodeMetric"]["nodeUsage"]["resources"]) == {"cpu", "memory"}
        gauge = f'koordlet_node_metric_node_usage{{node="{NODE}",resource="cpu",unit="core"}}'
        assert gauge in get(base + "/metrics")[1]  # gate NodeMetricPromMetrics
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0, _tail(log)
        assert time.monotonic() - started < 5.0
        assert "Traceback" not in _tail(log, 100_000)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()


def _tail(log, size: int = 4000) -> str:  # noqa: ANN001
    log.flush()
    log.seek(0)
    return log.read()[-size:]


@pytest.mark.serial  # a koordlet on its default port and hook socket (it exits before binding them)
def test_missing_node_name_exits_2_with_a_clear_message() -> None:
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run([sys.executable, "-m", "koordlet.main", "-local-mode"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "NODE_NAME" in out.stderr


@pytest.mark.serial  # a koordlet on its default port and hook socket (it exits on the flag before binding them)
def test_a_flag_error_prints_gos_message_then_the_usage_on_stderr_and_exits_2() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "NODE_NAME": "n1"}
    out = subprocess.run([sys.executable, "-m", "koordlet.main", "-kube-api-qps=0x1.8"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith('invalid value "0x1.8" for flag -kube-api-qps: parse error\n'  # Go's failf
                                 "Usage of koordlet:\n  -add_dir_header\n")
    help_out = subprocess.run([sys.executable, "-m", "koordlet.main", "-h"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=60)
    assert help_out.returncode == 0 and help_out.stdout == "" and help_out.stderr.startswith("Usage of koordlet:\n")


def test_nofile_soft_limit_raised_to_hard() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        if hard != resource.RLIM_INFINITY and soft == hard and hard > 64:
            resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        raised = raise_nofile_limit()
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == raised
        assert raised == (hard if hard != resource.RLIM_INFINITY else 1 << 20)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class Recorder:
    """A component for the extra-components seam that records the order of starts and stops."""

    def __init__(self, name: str, order: list[str], ctx: AgentContext) -> None:
        self.name, self.order, self.ctx = name, order, ctx

    def start(self) -> None:
        assert self.ctx.states.has_synced()  # started after the states informer synced
        self.order.append(f"start {self.name}")

    def stop(self, timeout_s: float) -> None:
        self.order.append(f"stop {self.name}")


@pytest.mark.containerd
def test_extra_components_start_after_states_and_stop_in_reverse(containerd_socket: str, tmp_path: Path) -> None:
    config = parse_config(
        ["-local-mode", f"-node-slo-file={tmp_path / 'slo.yaml'}", f"-cri-endpoint={containerd_socket}",
         f"-report-dir={tmp_path}", f"-cgroup-root-dir={tmp_path / 'cgroup'}", "-proc-root-dir=/proc/",
         "-addr=127.0.0.1:0", "-report-interval=30s"],
        {"NODE_NAME": NODE})
    order: list[str] = []
    agent = Koordlet(config, extra_components=[
        lambda ctx: Recorder("hooks", order, ctx),
        lambda ctx: None,  # a factory may decline (feature off)
        lambda ctx: Recorder("other", order, ctx),
    ], states_sync_timeout_s=10)
    agent.start()
    try:
        assert agent.started.is_set()
        assert order == ["start hooks", "start other"]
        assert agent.metrics_server is not None
        status, _ = get(f"http://127.0.0.1:{agent.metrics_server.port}/healthz")
        assert status == 200
    finally:
        agent.stop(5.0)
    assert order == ["start hooks", "start other", "stop other", "stop hooks"]
    assert not agent.started.is_set()


class SlowPart:
    """A periodic part whose every run takes far longer than any stop timeout (a report stuck in flight)."""

    def __init__(self, name: str, release: threading.Event) -> None:
        self.running = threading.Event()
        self.stop_timeouts: list[float] = []
        self.stopped: bool | None = None
        self._loop = PeriodicThread(name, 60.0, lambda: (self.running.set(), release.wait(30.0)))

    def start(self) -> None:
        self._loop.start()

    def stop(self, timeout_s: float) -> bool:
        self.stop_timeouts.append(timeout_s)
        self.stopped = self._loop.stop(timeout_s)
        return self.stopped


def test_stop_of_slow_parts_stays_within_the_stop_timeout(tmp_path: Path) -> None:
    """Parts that do not stop in time get their share of ``-stop-timeout`` each, never more: the states
    informer is stuck in a pod poll (a CRI socket that accepts and never answers, 30 s call timeout) and two
    components are stuck in a run."""
    silent = socket.socket(socket.AF_UNIX)
    silent.bind(str(tmp_path / "silent.sock"))
    silent.listen(16)
    config = parse_config(
        ["-local-mode", f"-node-slo-file={tmp_path / 'slo.yaml'}", f"-cri-endpoint={tmp_path / 'silent.sock'}",
         f"-report-dir={tmp_path}", f"-cgroup-root-dir={tmp_path / 'cgroup'}", "-proc-root-dir=/proc/",
         "-addr=127.0.0.1:0", "-report-interval=30s", "-kubelet-sync-timeout=30s", "-stop-timeout=2s",
         "-sys-root-dir=/sys/"],
        {"NODE_NAME": NODE})
    release = threading.Event()
    slow = [SlowPart("slow-a", release), SlowPart("slow-b", release)]
    agent = Koordlet(config, extra_components=[lambda ctx, part=part: part for part in slow],
                     states_sync_timeout_s=0.5)
    try:
        assert agent.start()
        assert all(part.running.wait(5.0) for part in slow)
        started = time.monotonic()
        agent.stop()
        elapsed = time.monotonic() - started
        # Slack: the metrics HTTP server's shutdown waits out its 0.5 s poll, whatever it is given.
        assert elapsed <= config.stop_timeout_s + 0.6, elapsed
        assert [part.stopped for part in slow] == [False, False]
        # Each got a share (newest first), not the whole budget.
        shares = [part.stop_timeouts[0] for part in slow]
        assert all(0 < share < config.stop_timeout_s / 2 for share in shares), shares
    finally:
        release.set()
        silent.close()


def test_api_server_mode_watches_node_and_slo_lists_kubelet_pods_and_reports_status(tmp_path: Path) -> None:
    """The agent in-process against the in-repo API server and an HTTPS kubelet serving /pods."""
    import kubernetes.client

    from tests.koordlet.gpu.fake_nvml import FakeNvml, h100_gpus
    from tests.support.apiserver import ApiServer, kube_api_client
    from tests.support.kubelet import Kubelet, grant_kubelet_access

    # Accelerators starts the GPU device plugin in <-var-lib-kubelet-dir>/device-plugins: a short dir of our own.
    kubelet_dir = tempfile.mkdtemp(prefix="kdm-", dir="/tmp")
    with ApiServer() as server, kube_api_client(server) as api, Kubelet(server, NODE) as kubelet:
        token = tmp_path / "token"
        token.write_text(grant_kubelet_access(server))
        server.seed(kubelet.node_object({"capacity": {"cpu": "4", "memory": "8Gi"},
                                         "allocatable": {"cpu": "4", "memory": "8Gi"}}))
        server.seed({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": NODE},
                     "spec": {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 45}}})
        server.seed({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": {"name": NODE},
                     "spec": {"metricCollectPolicy": {"reportIntervalSeconds": 60}}})
        config = parse_config(
            [f"-cgroup-root-dir={tmp_path / 'cgroup'}", f"-kubelet-token-file={token}", "-addr=127.0.0.1:0",
             "-report-interval=1s", f"-sys-fs-root-dir={tmp_path}", "-sys-root-dir=/sys/",
             "-feature-gates=Accelerators=true", f"-var-lib-kubelet-dir={kubelet_dir}"],
            {"NODE_NAME": NODE})
        agent = Koordlet(config, api_client=api, extra_components=[], states_sync_timeout_s=10,
                         nvml=FakeNvml(h100_gpus(1)))
        try:
            agent.start()
            states = agent.states
            assert states is not None and states.has_synced()
            assert states.node() is not None and states.node().capacity["cpu"] == 4000
            assert states.node_slo().resource_used_threshold_with_be.cpu_suppress_threshold_percent == 45
            assert sorted(p.name for p in states.pods()) == ["spark-1", "web-0"]
            assert kubelet.authorizations[0] == f"Bearer {token.read_text()}"

            def reported() -> dict | None:
                obj = server.get_object("nodemetrics", NODE) or {}
                return obj if (obj.get("status") or {}).get("nodeMetric", {}).get("nodeUsage", {}).get(
                    "resources") else None

            obj = wait_for(reported, 10.0, 0.2)
            assert obj, "no NodeMetric status reported"
            assert obj["status"]["nodeMetric"]["nodeUsage"]["resources"]["cpu"].endswith("m")
            assert agent.reporter is not None and agent.reporter.policy.report_interval_s == 60.0
            custom = kubernetes.client.CustomObjectsApi(api)
            assert custom.get_cluster_custom_object("slo.koordinator.sh", "v1alpha1", "nodemetrics", NODE)["status"]
            # Accelerators: the Device object is reported, owned by the node.
            device = wait_for(lambda: server.get_object("devices", NODE), 10.0, 0.2)
            assert device and len(device["spec"]["devices"]) == 1
            # NodeTopologyReport (on by default): this host's NUMA zones and CPU pools, owned by the node.
            from koordlet.system.sysfs import read_node_topology
            nrt = wait_for(lambda: server.get_object("noderesourcetopologies", NODE), 10.0, 0.2)
            assert nrt and [z["name"] for z in nrt["zones"]] == [
                f"node-{n.node_id}" for n in read_node_topology("/sys").numa_nodes]
            assert nrt["metadata"]["ownerReferences"][0]["name"] == NODE
            assert "node.koordinator.sh/cpu-shared-pools" in nrt["metadata"]["annotations"]
        finally:
            started = time.monotonic()
            agent.stop(5.0)
            assert time.monotonic() - started < 5.0
            shutil.rmtree(kubelet_dir, ignore_errors=True)


def test_sigterm_while_waiting_for_states_sync_exits_quickly(tmp_path: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "koordlet.main", "-local-mode", f"-node-slo-file={tmp_path / 'slo.yaml'}",
            f"-cri-endpoint={tmp_path / 'no-runtime.sock'}", f"-report-dir={tmp_path}",
            f"-cgroup-root-dir={tmp_path / 'cgroup'}", f"-addr=127.0.0.1:{port}", "-sys-root-dir=/sys/",
            f"-runtime-hooks-addr={tmp_path / 'koordlet.sock'}", f"-runtime-hooks-config-path={tmp_path / 'hooks'}",
            "-kubelet-sync-timeout=200ms"]
    env = {**os.environ, "NODE_NAME": NODE, "PYTHONPATH": str(REPO)}
    log = (tmp_path / "koordlet.log").open("w+")
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        assert wait_for(lambda: "started states informer" in _tail(log, 100_000), 20.0, 0.2), _tail(log)
        assert get(f"http://127.0.0.1:{port}/healthz")[0] == 503  # not started yet
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0, _tail(log)
        assert time.monotonic() - started < 5.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()


@pytest.mark.containerd
@pytest.mark.cgroupv1
def test_pleg_finds_a_new_pod_long_before_the_sync_interval(containerd_socket: str, pods: PodFactory,
                                                            tmp_path: Path) -> None:
    _needs_cgroup_v1()
    pods.start_pod("pleg-first")  # makes kubepods/besteffort exist before the agent watches it
    config = parse_config(
        ["-local-mode", f"-node-slo-file={tmp_path / 'slo.yaml'}", f"-cri-endpoint={containerd_socket}",
         f"-report-dir={tmp_path}", "-cgroup-root-dir=/sys/fs/cgroup/", f"-kubelet-cgroup-root={CGROUP_ROOT}",
         "-addr=127.0.0.1:0", "-kubelet-sync-interval=60s", "-enable-node-metric-report=false",
         "-sys-root-dir=/sys/"],
        {"NODE_NAME": NODE})
    agent = Koordlet(config, extra_components=[], states_sync_timeout_s=10)
    agent.start()
    try:
        states = agent.states
        assert states is not None and "pleg-first" in {p.name for p in states.pods()}
        pods.start_pod("pleg-second")
        assert wait_for(lambda: "pleg-second" in {p.name for p in states.pods()}, timeout_s=5.0)
    finally:
        agent.stop(5.0)


def test_start_logs_no_inert_gate_now_that_every_gate_acts_and_exports_every_gate(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = parse_config(
        ["-local-mode", f"-node-slo-file={tmp_path / 'slo.yaml'}", f"-report-dir={tmp_path}",
         f"-cri-endpoint={tmp_path / 'none.sock'}", f"-cgroup-root-dir={tmp_path / 'cgroup'}",
         "-addr=127.0.0.1:0", "-feature-gates=HamiCoreVGPUMonitor=true,CPUEvict=false,CgroupReconcile=true"],
        {"NODE_NAME": NODE})
    agent = Koordlet(config, extra_components=[], states_sync_timeout_s=0.5)
    with caplog.at_level("INFO", logger="koordlet"):
        try:
            assert agent.start()
            assert agent.metrics_server is not None
            status, text = get(f"http://127.0.0.1:{agent.metrics_server.port}/metrics")
        finally:
            agent.stop()
    inert = [r.getMessage() for r in caplog.records if "not implemented by koordlet-py" in r.getMessage()]
    assert inert == []  # every gate acts (docs/feature-gates.md); the line names any that one day does not
    assert status == 200
    lines = [line for line in text.splitlines() if line.startswith("koordlet_feature_gate{")]
    assert len(lines) == len(features.GATES) == 40  # Koordinator's 39 and BEPSIThrottle
    def value(name: str) -> str:
        [line] = [x for x in lines if f'name="{name}"' in x]
        assert f'node="{NODE}"' in line
        return line.rsplit(" ", 1)[1] + " " + re.search(r'implemented="(\w+)"', line).group(1)
    assert value("HamiCoreVGPUMonitor") == "1.0 yes"
    assert value("NodeTopologyReport") == "1.0 yes"
    assert value("CPUEvict") == "0.0 yes"
    assert value("CgroupReconcile") == "1.0 yes"
    assert value("BECPUManager") == "0.0 yes"
