"""The relay with a grpc-go client (kubelet's gRPC library): containerd's own `ctr` tool speaks
containerd's native API, which the proxy relays like any service it does not hook."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import urllib.request

import pytest

from tests.support.proxy import ProxyProcess
from tests.support.waiting import wait_for

pytestmark = pytest.mark.containerd


_AGE = re.compile(r"^(\d+|About an?) (seconds?|minutes?|hours?)$")


def _normalised(output: str) -> list[str]:
    """ctr's table with what differs between two calls a moment apart taken out: label lists come from a
    Go map (random order), and the AGE column ticks."""
    rows = []
    for line in output.splitlines():
        cells = [cell for cell in re.split(r"\t+", line) if not _AGE.match(cell)]
        rows.append("\t".join(",".join(sorted(c.split(","))) if "=" in c else c for c in cells))
    return rows


def _ctr(socket_path: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ctr", "-a", socket_path, "--timeout", "20s", *args], capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.mark.skipif(shutil.which("ctr") is None, reason="ctr (from the containerd package) not installed")
@pytest.mark.parametrize("args", [
    ("version",),
    ("plugins", "ls"),
    ("namespaces", "ls"),
    ("-n", "k8s.io", "images", "ls"),
    ("-n", "k8s.io", "content", "ls"),
    ("-n", "k8s.io", "snapshots", "ls"),
    ("-n", "k8s.io", "containers", "ls"),
])
def test_ctr_through_the_proxy_sees_what_it_sees_directly(containerd_socket: str, proxy: ProxyProcess,
                                                          args: tuple[str, ...]) -> None:
    direct, via = _ctr(containerd_socket, *args), _ctr(proxy.listen, *args)
    assert direct.returncode == 0, direct.stderr
    assert (via.returncode, _normalised(via.stdout)) == (0, _normalised(direct.stdout)), via.stderr


@pytest.mark.skipif(shutil.which("ctr") is None, reason="ctr (from the containerd package) not installed")
def test_ctr_errors_come_back_unchanged(containerd_socket: str, proxy: ProxyProcess) -> None:
    args = ("-n", "k8s.io", "images", "rm", "localhost/no-such-image:1")
    direct, via = _ctr(containerd_socket, *args), _ctr(proxy.listen, *args)
    # ctr stamps its log lines (time="..."): the two calls may straddle a second, so the stamp is left out.
    def last_line(out: subprocess.CompletedProcess) -> list[str]:
        return [re.sub(r'^time="[^"]*" ', "", line) for line in out.stderr.splitlines()[-1:]]
    assert (via.returncode, last_line(via)) == (direct.returncode, last_line(direct))
    assert "not found" in last_line(direct)[0]  # ctr warns and exits 0


@pytest.mark.skipif(shutil.which("ctr") is None, reason="ctr (from the containerd package) not installed")
def test_ctr_streams_a_whole_image_through_the_proxy(containerd_socket: str, proxy: ProxyProcess, tmp_path) -> None:
    # Export reads every blob through the Content.Read server stream: ~1 MB, many DATA frames and
    # window updates from a grpc-go client.
    for name, sock in (("direct", containerd_socket), ("via", proxy.listen)):
        out = _ctr(sock, "-n", "k8s.io", "images", "export", str(tmp_path / f"{name}.tar"), "localhost/busybox:local")
        assert out.returncode == 0, out.stderr
    direct, via = (tmp_path / "direct.tar").read_bytes(), (tmp_path / "via.tar").read_bytes()
    assert len(via) > 500_000 and via == direct


def _connections(proxy: ProxyProcess) -> float:
    """The proxy's open kubelet connections, as its /metrics says."""
    with urllib.request.urlopen(f"http://127.0.0.1:{proxy.metrics_port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    gauge = "koord_runtimeproxy_connections "
    return next(float(line.split()[1]) for line in text.splitlines() if line.startswith(gauge))


@pytest.mark.skipif(shutil.which("ctr") is None, reason="ctr (from the containerd package) not installed")
@pytest.mark.parametrize("with_event", [True, False], ids=["after-an-event", "before-any-event"])
def test_a_drain_ends_a_grpc_go_subscription_with_unavailable_at_once(
        containerd_socket: str, tmp_path, with_event: bool) -> None:
    """``ctr events`` holds containerd's event subscription open through the proxy, as kubelet holds
    GetContainerEvents: a stopping proxy ends it at once, and grpc-go (kubelet's gRPC library) reads the end as
    the UNAVAILABLE status the proxy wrote, in both of its forms (trailers after an event, a trailers-only
    response before any)."""
    proxy = ProxyProcess(str(tmp_path / "p.sock"), containerd_socket, "--drain-timeout", "20").start()
    events = subprocess.Popen(["ctr", "-a", proxy.listen, "events"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    namespace = f"kpy-drain-{os.getpid()}-{int(with_event)}"
    try:
        # ctr connects for its Subscribe and sends it at once; no answer comes before the first event
        assert wait_for(lambda: _connections(proxy) >= 1, 30), "ctr never connected"
        time.sleep(0.3)
        if with_event:
            assert _ctr(containerd_socket, "namespaces", "create", namespace).returncode == 0
            line = events.stdout.readline()
            assert "/namespaces/create" in line, line
        started = time.monotonic()
        assert proxy.terminate(timeout_s=40) == 0
        stop_s = time.monotonic() - started
        _, err = events.communicate(timeout=10)
    finally:
        if events.poll() is None:
            events.kill()
            events.wait(5)
        _ctr(containerd_socket, "namespaces", "remove", namespace)
    assert "code = Unavailable desc = koord-runtime-proxy is restarting: subscribe again" in err, err
    assert events.returncode != 0
    assert stop_s < 5.0, f"the drain took {stop_s:.1f} s: it waited for the subscription"
