"""/healthz and /readyz (koordlet/health.py): each watched part stalled for real, and the endpoint fails naming it,
with a bound that follows the part's interval; then it passes again once the part moves."""

from __future__ import annotations

import queue
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from hooks import registry
from hooks.protocol import NodeContext
from koordlet.agent.lifecycle import Koordlet
from koordlet.api.nodeslo import NodeSLOSpec
from koordlet.config import parse_config
from koordlet.executor import ResourceExecutor
from koordlet.health import Health
from koordlet.metriccache import MetricCache, Sample
from koordlet.metrics import MetricsServer
from koordlet.metricsadvisor import CollectorRunner
from koordlet.plan import Plan
from koordlet.qosmanager import QoSManager, Strategy
from koordlet.qosmanager.snapshot import Needs, Snapshot
from koordlet.runtimehooks.nri import NriConfig, NriHandlers, NriPlugin
from koordlet.runtimehooks.nri.plugin import socket_identity
from koordlet.statesinformer.api import StaticStates
from koordlet.statesinformer.informer import StatesInformer
from koordlet.statesinformer.kubelet import KubeletPodSource
from koordlet.system.cgroup import CgroupFS
from koordlet.system.kubepods import KubeCgroupLayout
from tests.koordlet.qosmanager.factory import node
from tests.support.nriruntime import FakeRuntime
from tests.support.waiting import wait_for

NODE = "health-node"
GRACE_S = 0.3


def fetch(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def until_failing(port: int, timeout_s: float = 5.0) -> tuple[int, str]:
    """The first failing /healthz answer within ``timeout_s``."""
    answer = wait_for(lambda: (lambda got: got if got[0] == 503 else None)(fetch(port, "/healthz")), timeout_s, 0.05)
    assert answer, "/healthz kept passing"
    return answer


@pytest.fixture
def served() -> Iterator[tuple[Health, int]]:
    """A Health behind a real metrics server, started (as the agent is once its start is complete)."""
    health = Health(lambda: True, grace_s=GRACE_S)
    server = MetricsServer(CollectorRegistry(), "127.0.0.1", 0, include_default=False)
    server.route("/healthz", lambda request: health.healthz(request.query))
    server.route("/readyz", lambda request: health.readyz(request.query))
    server.start()
    try:
        yield health, server.port
    finally:
        server.stop()


@dataclass(frozen=True)
class _On:
    enabled: bool = True
    needs: Needs = Needs()

    @classmethod
    def from_node_slo(cls, node_slo: NodeSLOSpec, flags: object = None) -> _On:
        return cls()


@pytest.mark.alone  # a 0.5 s bound checked from both sides: the fetch just before it must not be late
def test_a_stuck_strategy_fails_healthz_naming_it_and_passes_once_it_returns(served) -> None:
    health, port = served
    release, entered = threading.Event(), threading.Event()
    calls = []

    def decide(snapshot: Snapshot, config: _On) -> Plan:
        calls.append(snapshot.timestamp)
        if len(calls) == 3:
            entered.set()
            release.wait(20)
        return Plan()

    manager = QoSManager(StaticStates(node=node()), [Strategy("stuck", "BECPUSuppress", _On, decide, 0.05)])
    health.watch_loop("qosmanager", manager)
    manager.start()
    try:
        assert wait_for(lambda: len(calls) >= 2, 5.0)
        assert fetch(port, "/healthz") == (200, "ok\n")
        assert entered.wait(5)
        bound = 3 * 0.05 + GRACE_S
        time.sleep(bound - 0.1)
        assert fetch(port, "/healthz")[0] == 200, "failed before the bound"
        status, body = until_failing(port)
        assert "[-]qosmanager failed: no tick finished for" in body
        assert f"(bound {bound:.1f} s)" in body and "in strategy stuck" in body
        assert body.endswith("healthz check failed\n")
        release.set()
        assert wait_for(lambda: fetch(port, "/healthz") == (200, "ok\n"), 5.0)
    finally:
        release.set()
        manager.stop(2.0)


class _StuckCollector:
    name = "stuck"
    interval_s = 0.05

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.runs = 0

    def enabled(self) -> bool:
        return True

    def collect(self, now: float) -> Sequence[Sample]:
        self.runs += 1
        if self.runs == 3:
            self.entered.set()
            self.release.wait(20)
        return ()


def test_a_stuck_collector_fails_healthz_naming_it(served) -> None:
    health, port = served
    collector = _StuckCollector()
    runner = CollectorRunner(MetricCache(), [collector])
    health.watch_loop("collectors", runner)
    runner.start()
    try:
        assert collector.entered.wait(5)
        status, body = until_failing(port)
        assert "[-]collectors failed: no tick finished for" in body and "in collector stuck" in body
        assert fetch(port, "/healthz?verbose")[1].count("\n") == 2  # the one check and the verdict
        collector.release.set()
        assert wait_for(lambda: fetch(port, "/healthz") == (200, "ok\n"), 5.0)
        assert fetch(port, "/healthz?verbose")[1].startswith("[+]collectors ok: last tick ")
    finally:
        collector.release.set()
        runner.stop(2.0)


def test_a_stopped_loop_fails_healthz(served) -> None:
    health, port = served
    runner = CollectorRunner(MetricCache(), [_StuckCollector()])
    health.watch_loop("collectors", runner)
    status, body = fetch(port, "/healthz")
    assert status == 503 and "[-]collectors failed: not running" in body


def test_an_informer_whose_kubelet_stops_answering_goes_stale_past_three_sync_intervals(served, tmp_path: Path) -> None:
    from tests.support.apiserver import ApiServer
    from tests.support.kubelet import Kubelet, grant_kubelet_access

    health, port = served
    with ApiServer() as api, Kubelet(api, "node-1") as kubelet:
        token = tmp_path / "token"
        token.write_text(grant_kubelet_access(api))
        states = StatesInformer(KubeletPodSource(lambda: kubelet.url, KubeCgroupLayout(), timeout_s=1.0,
                                                 token_file=str(token)),
                                sync_interval_s=0.1, needs_node=False, needs_node_slo=False)
        health.watch_states(states)
        try:
            assert fetch(port, "/readyz")[0] == 503
            states.start()
            assert wait_for(lambda: fetch(port, "/readyz") == (200, "ok\n"), 5.0)
            assert fetch(port, "/healthz") == (200, "ok\n")
            kubelet.status = 500
            bound = 3 * 0.1 + GRACE_S
            status, body = until_failing(port)
            assert "[-]states failed: last pod list " in body and f"(bound {bound:.1f} s): " in body
            assert "500" in body  # the last error says what the kubelet answered
            assert fetch(port, "/readyz")[0] == 200  # synced once: still ready, no longer live
            kubelet.status = 200
            assert wait_for(lambda: fetch(port, "/healthz") == (200, "ok\n"), 5.0)
        finally:
            states.stop(2.0)


def test_an_informer_that_never_syncs_fails_healthz_and_readyz(tmp_path: Path) -> None:
    """The agent in-process with a CRI socket that accepts and never answers: it starts after the sync wait,
    and both endpoints say the states are not synced."""
    silent = socket.socket(socket.AF_UNIX)
    silent.bind(str(tmp_path / "silent.sock"))
    silent.listen(16)
    config = parse_config(
        ["-local-mode", f"-node-slo-file={tmp_path / 'slo.yaml'}", f"-cri-endpoint={tmp_path / 'silent.sock'}",
         f"-report-dir={tmp_path}", f"-cgroup-root-dir={tmp_path / 'cgroup'}", "-proc-root-dir=/proc/",
         "-addr=127.0.0.1:0", "-kubelet-sync-timeout=2s", "-sys-root-dir=/sys/"],
        {"NODE_NAME": NODE})
    agent = Koordlet(config, extra_components=[], states_sync_timeout_s=0.5, health_grace_s=GRACE_S)
    try:
        assert agent.start()
        assert agent.metrics_server is not None
        port = agent.metrics_server.port
        status, body = fetch(port, "/healthz")
        assert status == 503 and "[-]states failed: not synced" in body, body
        status, body = fetch(port, "/readyz")
        assert status == 503 and "[+]started ok" in body and "[-]states failed: not synced" in body, body
    finally:
        agent.stop(3.0)
        silent.close()


@pytest.mark.containerd
@pytest.mark.cgroupv1
def test_the_running_agent_watches_its_loops_its_states_and_nri(containerd_socket: str, tmp_path: Path) -> None:
    if not Path("/sys/fs/cgroup/cpu").is_dir():
        pytest.skip("no cgroup v1 cpu hierarchy")
    config = parse_config(
        ["-local-mode", f"-node-slo-file={tmp_path / 'slo.yaml'}", f"-cri-endpoint={containerd_socket}",
         f"-report-dir={tmp_path}", "-cgroup-root-dir=/sys/fs/cgroup/", "-kubelet-cgroup-root=/koordlet-py-health",
         "-addr=127.0.0.1:0", "-sys-root-dir=/sys/", f"-runtime-hooks-config-path={tmp_path / 'hookserver.d'}",
         f"-runtime-hooks-addr={tmp_path / 'koordlet.sock'}", f"-var-run-root-dir={tmp_path}",
         f"-var-lib-kubelet-dir={tmp_path / 'kubelet'}", f"-prediction-checkpoint-filepath={tmp_path / 'pred'}"],
        {"NODE_NAME": NODE})
    agent = Koordlet(config, states_sync_timeout_s=10)
    try:
        assert agent.start()
        assert agent.metrics_server is not None
        port = agent.metrics_server.port
        status, body = fetch(port, "/healthz?verbose")
        assert status == 200, body
        names = [line[3:].split(" ", 1)[0] for line in body.splitlines()[:-1]]
        assert sorted(names) == ["access", "collectors", "nri", "qosmanager", "reconciler", "states"], body
        assert "(bound 33.0 s)" in body  # 3 × the 1 s collect interval + the 30 s grace
        assert fetch(port, "/readyz") == (200, "ok\n")
    finally:
        agent.stop(5.0)


def test_before_the_start_completes_healthz_and_readyz_say_so() -> None:
    health = Health(lambda: False)
    assert health.healthz({}).status == 503 and b"[-]started failed" in health.healthz({}).body
    assert health.readyz({}).status == 503


def _nri_plugin(tmp_path: Path, socket_path: str) -> NriPlugin:
    executor = ResourceExecutor(CgroupFS(mount_dir=str(tmp_path / "cg")))
    handlers = NriHandlers(lambda: registry.enabled({"BatchResource": True}), NodeContext, lambda: (), executor,
                           KubeCgroupLayout())
    return NriPlugin(NriConfig(socket_path=socket_path, connect_timeout_s=0.3, backoff_s=0.05, backoff_cap_s=0.2,
                               socket_poll_s=0.05), handlers)


def test_nri_down_past_its_backoff_cap_fails_healthz_and_recovers_when_the_runtime_is_back(served,
                                                                                           tmp_path: Path) -> None:
    """Registered, then the runtime hangs up and stops answering on its socket (a wedged runtime): past backoff
    cap + connect timeout + grace /healthz fails; when the runtime answers again koordlet registers and it passes."""
    health, port = served
    runtime = FakeRuntime(str(tmp_path / "nri" / "nri.sock"))
    plugin = _nri_plugin(tmp_path, runtime.path)
    health.watch_nri(plugin, lambda path: socket_identity(path) is not None)
    plugin.start()
    try:
        runtime.accept().handshake()
        assert plugin.registered.wait(5)
        assert fetch(port, "/healthz?verbose")[1].startswith("[+]nri ok: registered")
        runtime.connections[0].close()  # the runtime hangs up; its socket stays, nobody answers on it
        assert wait_for(lambda: not plugin.registered.is_set(), 5.0)
        bound = 0.2 + 0.3 + GRACE_S
        status, body = until_failing(port)
        assert f"[-]nri failed: not registered at {runtime.path} for " in body and f"(bound {bound:.1f} s)" in body
        # the runtime answers again: the plugin's next attempt registers
        deadline = time.monotonic() + 10
        while not plugin.registered.is_set() and time.monotonic() < deadline:
            try:
                runtime.accept(timeout_s=1.0).handshake(wait_s=1.0)
            except (OSError, queue.Empty):  # an attempt that timed out on the plugin's side
                continue
        assert plugin.registered.is_set()
        assert wait_for(lambda: fetch(port, "/healthz") == (200, "ok\n"), 5.0)
    finally:
        plugin.stop(2.0)
        runtime.close()


def test_no_nri_socket_is_no_failure(served, tmp_path: Path) -> None:
    health, port = served
    plugin = _nri_plugin(tmp_path, str(tmp_path / "absent" / "nri.sock"))
    health.watch_nri(plugin, lambda path: socket_identity(path) is not None)
    plugin.start()
    try:
        time.sleep(0.2 + 0.3 + GRACE_S + 0.2)
        status, body = fetch(port, "/healthz?verbose")
        assert status == 200 and "[+]nri ok: no NRI socket at " in body
    finally:
        plugin.stop(2.0)
    status, body = fetch(port, "/healthz")
    assert status == 503 and "[-]nri failed: the NRI connection loop ended" in body
