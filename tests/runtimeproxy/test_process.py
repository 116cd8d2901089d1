"""The proxy as a process: socket hygiene, start-up checks, graceful drain, a runtime that goes away."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
import time

import grpc
import pytest

from tests.support.containerd import REPO
from tests.support.fakeruntime import FakeRuntime
from tests.support.proxy import ProxyProcess

VERSION = "/runtime.v1.RuntimeService/Version"


def test_socket_is_created_0660_in_a_new_directory(fake_runtime: FakeRuntime, tmp_path) -> None:
    sock = tmp_path / "new" / "dir" / "proxy.sock"
    with ProxyProcess(str(sock), fake_runtime.socket_path, log_path=str(tmp_path / "proxy.log")):
        mode = os.stat(sock).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o660
        assert stat.S_IMODE(os.stat(sock.parent).st_mode) == 0o755


def test_refuses_to_start_over_a_live_socket(fake_proxy: ProxyProcess, fake_runtime: FakeRuntime) -> None:
    second = ProxyProcess(fake_proxy.listen, fake_runtime.socket_path, log_path=fake_proxy.listen + ".2.log")
    second.start(wait=False)
    assert second.proc.wait(15) == 1
    assert "another process is serving" in second.log()
    with grpc.insecure_channel(f"unix://{fake_proxy.listen}") as ch:  # the first one still serves
        assert ch.unary_unary(VERSION)(b"ok", timeout=10) == b"ok"


def test_removes_a_stale_socket(fake_runtime: FakeRuntime, tmp_path) -> None:
    sock = str(tmp_path / "stale.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(sock)
    s.close()  # bound, never listening: what a killed process leaves behind
    with ProxyProcess(sock, fake_runtime.socket_path) as proxy:
        assert "removing stale socket" in proxy.log()


def test_refuses_a_path_that_is_not_a_socket(fake_runtime: FakeRuntime, tmp_path) -> None:
    path = tmp_path / "file.sock"
    path.write_text("precious")
    proxy = ProxyProcess(str(path), fake_runtime.socket_path).start(wait=False)
    assert proxy.proc.wait(15) == 1
    assert "is not a socket" in proxy.log()
    assert path.read_text() == "precious"


def test_a_registrations_dir_it_cannot_make_is_a_clear_start_error(fake_runtime: FakeRuntime, tmp_path) -> None:
    """Not a traceback: the one line says which dir and why (a read-only /etc without the dir once did this)."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    hook_dir = blocker / "hookserver.d"
    proxy = ProxyProcess(str(tmp_path / "p.sock"), fake_runtime.socket_path, "--runtime-hook-config-dir",
                         str(hook_dir)).start(wait=False)
    assert proxy.proc.wait(15) == 1
    log = proxy.log()
    assert f"koord-runtime-proxy: hook server registrations dir {hook_dir}:" in log and "Traceback" not in log


def test_exits_with_a_clear_message_when_the_runtime_is_absent(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "runtimeproxy.main", "--koord-runtimeproxy-endpoint", str(tmp_path / "p.sock"),
         "--remote-runtime-service-endpoint", str(tmp_path / "absent.sock"), "--backend-probe-timeout", "1",
         "--metrics-bind-address", "", "--runtime-hook-config-dir", str(tmp_path / "hookserver.d")],
        cwd=REPO, capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert f"container runtime at {tmp_path / 'absent.sock'} is not reachable" in out.stderr
    assert not (tmp_path / "p.sock").exists()


def test_sigterm_drains_in_flight_calls_and_removes_the_socket(fake_runtime: FakeRuntime, tmp_path) -> None:
    proxy = ProxyProcess(str(tmp_path / "p.sock"), fake_runtime.socket_path).start()
    results: dict[str, object] = {}

    def slow_call(path: str) -> None:
        with grpc.insecure_channel(f"unix://{proxy.listen}") as ch:
            try:
                results[path] = ch.unary_unary(path)(b"slow", metadata=(("x-sleep", "1.5"),), timeout=20)
            except grpc.RpcError as err:
                results[path] = err.code()

    threads = [threading.Thread(target=slow_call, args=(p,))
               for p in (VERSION, "/runtime.v1.RuntimeService/StopContainer")]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while len([r for r in fake_runtime.received if r.payload == b"slow"]) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    started = time.monotonic()
    assert proxy.terminate(timeout_s=20) == 0
    for t in threads:
        t.join(20)
    assert results == {VERSION: b"slow", "/runtime.v1.RuntimeService/StopContainer": b"slow"}
    assert time.monotonic() - started < 10
    assert not os.path.exists(proxy.listen)


def test_drain_is_bounded(fake_runtime: FakeRuntime, tmp_path) -> None:
    proxy = ProxyProcess(str(tmp_path / "p.sock"), fake_runtime.socket_path, "--drain-timeout", "0.5").start()
    done = threading.Event()

    def stuck_call() -> None:
        with grpc.insecure_channel(f"unix://{proxy.listen}") as ch:
            try:
                ch.unary_unary(VERSION)(b"stuck", metadata=(("x-sleep", "8"),), timeout=30)
            except grpc.RpcError:
                pass
        done.set()

    t = threading.Thread(target=stuck_call)
    t.start()
    time.sleep(0.5)
    started = time.monotonic()
    assert proxy.terminate(timeout_s=10) == 0
    assert time.monotonic() - started < 4
    assert done.wait(10)
    t.join(5)


def test_runtime_going_away_gives_unavailable_not_a_hang(tmp_path) -> None:
    runtime = FakeRuntime(str(tmp_path / "rt.sock")).start()
    with ProxyProcess(str(tmp_path / "p.sock"), runtime.socket_path) as proxy:
        with grpc.insecure_channel(f"unix://{proxy.listen}") as ch:
            assert ch.unary_unary(VERSION)(b"up", timeout=10) == b"up"
        runtime.stop()
        for path in (VERSION, "/runtime.v1.RuntimeService/CreateContainer", "/runtime.v1.ImageService/ListImages"):
            with grpc.insecure_channel(f"unix://{proxy.listen}") as ch:
                started = time.monotonic()
                with pytest.raises(grpc.RpcError) as err:
                    ch.unary_unary(path)(b"", timeout=20)
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE, path
                assert time.monotonic() - started < 5
        # and it serves again once the runtime is back, without a restart
        runtime = FakeRuntime(runtime.socket_path).start()
        try:
            with grpc.insecure_channel(f"unix://{proxy.listen}") as ch:
                assert ch.unary_unary(VERSION)(b"back", timeout=10, wait_for_ready=True) == b"back"
        finally:
            runtime.stop()


def test_in_flight_call_gets_unavailable_when_the_runtime_dies(tmp_path) -> None:
    runtime = FakeRuntime(str(tmp_path / "rt.sock")).start()
    with ProxyProcess(str(tmp_path / "p.sock"), runtime.socket_path) as proxy:
        outcome: list[object] = []

        def call() -> None:
            with grpc.insecure_channel(f"unix://{proxy.listen}") as ch:
                try:
                    outcome.append(ch.unary_unary(VERSION)(b"", metadata=(("x-sleep", "5"),), timeout=30))
                except grpc.RpcError as err:
                    outcome.append(err.code())

        t = threading.Thread(target=call)
        t.start()
        time.sleep(0.5)
        runtime.stop()
        t.join(10)
        assert outcome == [grpc.StatusCode.UNAVAILABLE]


def test_metrics_and_health_endpoints(fake_proxy: ProxyProcess) -> None:
    import urllib.request

    with grpc.insecure_channel(f"unix://{fake_proxy.listen}") as ch:
        ch.unary_unary(VERSION)(b"", timeout=10)
        ch.unary_unary("/runtime.v1.RuntimeService/StartContainer")(b"", timeout=10)
    base = f"http://127.0.0.1:{fake_proxy.metrics_port}"
    assert urllib.request.urlopen(base + "/healthz", timeout=5).read() == b"ok\n"
    assert urllib.request.urlopen(base + "/readyz", timeout=5).read() == b"ok\n"
    text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
    count = "koord_runtimeproxy_call_duration_seconds_count"
    assert count + '{method="RuntimeService/Version",stage="relay"} 1.0' in text
    assert count + '{method="RuntimeService/StartContainer",stage="backend"} 1.0' in text
    assert "process_cpu_seconds_total" in text
