"""Faults around the node stack, each with a bound so a regression fails CI (issue: bad input never fails a pod).

Covered elsewhere and kept: hook servers that hang, crash or answer garbage and the proxy's kill -9 between
create and start (tests/runtimeproxy/test_hooks.py), hostile clients on the proxy socket
(tests/runtimeproxy/test_hostile_clients.py), hostile NodeSLO files (tests/koordlet/statesinformer/
test_nodeslo_file.py), the runtime going away under the proxy (tests/runtimeproxy/test_process.py). Here, on
the real koordlet and proxy processes in front of real containerd: koordlet kill -9, a containerd restart,
and pod lifecycles with flat fds, RSS and store (``bench/soak.py`` runs 300 and more).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest

from tests.support.containerd import Containerd, generation
from tests.support.cri import PodFactory
from tests.support.stack import Stack, container_value, http_get, rss_mib
from wire import cri_pb2 as cri

pytestmark = [pytest.mark.containerd, pytest.mark.cgroupv1]


@pytest.fixture
def stack(containerd_socket: str, tmp_path: Path):
    running = Stack(tmp_path, containerd_socket).start()
    try:
        yield running
    finally:
        running.stop()


def test_koordlet_kill_9_never_fails_a_pod_and_hooks_come_back_with_it(stack: Stack) -> None:
    assert stack.client is not None
    pods = PodFactory(stack.client)
    try:
        sandbox, _, cid = stack.run_be_pod(pods, "before")
        assert container_value(sandbox, cid, "cpu", "cpu.shares") == "512"  # the hooks' value

        stack.koordlet.kill()  # kill -9: its socket stays behind, nobody answers on it
        started = time.monotonic()
        sandbox, _, cid = stack.run_be_pod(pods, "while-down")
        took = time.monotonic() - started
        assert took < 10, f"a pod took {took:.1f}s to start while koordlet was down"
        assert container_value(sandbox, cid, "cpu", "cpu.shares") == "1024"  # as kubelet asked: no hooks

        stack.koordlet.start()
        sandbox, _, cid = stack.run_be_pod(pods, "after")
        assert container_value(sandbox, cid, "cpu", "cpu.shares") == "512"
    finally:
        pods.cleanup()


def test_containerd_restart_under_the_proxy(tmp_path: Path) -> None:
    """The proxy needs no restart: calls fail fast (UNAVAILABLE) while containerd is down, and work again
    when it is back, pods started before it still there."""
    containerd = Containerd(f"/run/koordlet-py/fault-{os.getpid()}/containerd",
                            f"/var/lib/koordlet-py/fault-{os.getpid()}/containerd", version=generation())
    containerd.up()
    stack = Stack(tmp_path, containerd.socket)
    try:
        stack.start()
        assert stack.client is not None
        pods = PodFactory(stack.client)
        _, sid, _ = stack.run_be_pod(pods, "survivor")

        run = Path(containerd.run_dir)
        pid = int((run / "containerd.pid").read_text())
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.1)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as caught:
            stack.client.runtime.Version(cri.VersionRequest(), timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - started < 5

        with open(run / "containerd.log", "ab") as log:
            proc = subprocess.Popen([containerd.binary, "--config", str(run / "config.toml")], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        (run / "containerd.pid").write_text(str(proc.pid))
        deadline = time.monotonic() + 30
        while True:
            try:
                stack.client.runtime.Version(cri.VersionRequest(), timeout=5)
                break
            except grpc.RpcError:
                assert time.monotonic() < deadline, "the proxy did not serve again after containerd came back"
                time.sleep(0.3)
        listed = stack.client.runtime.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=10).items
        assert sid in {item.id for item in listed}
        stack.run_be_pod(pods, "after-restart")
        pods.cleanup()
    finally:
        stack.stop()
        containerd.down()
        containerd.remove_dirs()


def test_a_hostile_nodeslo_file_leaves_healthz_hooks_and_memory_alone(stack: Stack) -> None:
    """The 402-byte alias bomb (8 levels of 9 aliases) once took the agent's RSS up ~250 MiB, failed /healthz
    and made hook calls wait their whole deadline. Now it is one counted rejection."""
    assert stack.koordlet.proc is not None and stack.client is not None
    pid = stack.koordlet.proc.pid
    before = stack.figures().koordlet_rss_mib
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"] + [
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    (stack.state / "slo.yaml").write_text("\n".join(lines) + "\nresourceQOSStrategy: *a8\n")
    metrics_url = f"http://127.0.0.1:{stack.koordlet.port}/metrics"
    deadline = time.monotonic() + 10
    while 'koordlet_node_slo_file_rejected_total{reason="alias"}' not in http_get(metrics_url):
        assert time.monotonic() < deadline, "the hostile file was not counted"
        time.sleep(0.2)
    started = time.monotonic()
    assert "ok" in http_get(f"http://127.0.0.1:{stack.koordlet.port}/healthz")
    pods = PodFactory(stack.client)
    try:
        sandbox, _, cid = stack.run_be_pod(pods, "after-bomb")
        assert container_value(sandbox, cid, "cpu", "cpu.shares") == "512"  # served by the hooks, in time
    finally:
        pods.cleanup()
    assert time.monotonic() - started < 10
    assert rss_mib(pid) - before < 16, (before, rss_mib(pid))


def test_pod_lifecycles_leave_fds_rss_and_store_flat(stack: Stack) -> None:
    for index in range(5):  # warm up: imports, caches, first connections
        stack.lifecycle(index)
    before = stack.figures()
    for index in range(5, 65):
        stack.lifecycle(index)
    after = stack.figures()
    print(f"\nafter 5 lifecycles: {before.line()}\nafter 65 lifecycles: {after.line()}")
    assert after.proxy_fds <= before.proxy_fds + 3, (before, after)
    assert after.koordlet_fds <= before.koordlet_fds + 3, (before, after)
    assert after.proxy_store <= before.proxy_store, (before, after)
    assert after.proxy_rss_mib <= before.proxy_rss_mib + 8, (before, after)
    assert after.koordlet_rss_mib <= before.koordlet_rss_mib + 12, (before, after)

