"""``-addr`` as Go's ``net.Listen("tcp", addr)`` reads and opens it (koordlet/gonet.py).

Expected values and errors are Go's own: ``net.SplitHostPort`` (src/net/ipsock.go), ``parsePort``
(src/net/port.go), ``(*Resolver).LookupPort`` and the ``services`` table (src/net/lookup.go), ``AddrError`` and
``DNSError`` texts (src/net/net.go), and ``favoriteAddrFamily`` (src/net/ipsock_posix.go: a wildcard host listens
on an AF_INET6 socket with ``IPV6_V6ONLY=0`` where the kernel maps IPv4 onto it or has no IPv4). Every connection is
made to a loopback address; the wildcard listeners take an ephemeral port and are closed at once.
"""

from __future__ import annotations

import errno
import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from koordlet import gonet
from koordlet.config import ConfigError, parse_config
from koordlet.debug.authz import loopback_only
from koordlet.metrics import MetricsServer, Reply
from tests.support import noipv6
from tests.support.waiting import wait_for

ENV = {"NODE_NAME": "node-1"}
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("addr", "host", "port"), [
    (":9316", "", 9316),
    ("0.0.0.0:9316", "0.0.0.0", 9316),
    ("[::]:9316", "::", 9316),
    ("[::1]:9316", "::1", 9316),
    ("127.0.0.1:9316", "127.0.0.1", 9316),
    ("localhost:9316", "localhost", 9316),
    ("[fe80::1%lo]:9316", "fe80::1%lo", 9316),
    ("[::ffff:127.0.0.1]:9316", "::ffff:127.0.0.1", 9316),
    (":+9316", "", 9316),  # parsePort takes a sign
    (":", "", 0),  # an empty port is port 0 (golang.org/issue/13610)
    (":0", "", 0),
    (":http", "", 80),  # Go's own services table
    (":HTTPS", "", 443),  # looked up case-insensitively
    (":ssh", "", 22),
])
def test_every_address_form_go_accepts_parses_to_its_host_and_port(addr: str, host: str, port: int) -> None:
    assert gonet.parse_listen_address(addr) == gonet.ListenAddress(host, port)


@pytest.mark.parametrize(("addr", "message"), [
    ("9316", "address 9316: missing port in address"),
    ("[::1]", "address [::1]: missing port in address"),
    ("::1:9316", "address ::1:9316: too many colons in address"),
    ("::9316", "address ::9316: too many colons in address"),
    ("[::1:9316", "address [::1:9316: missing ']' in address"),
    ("[::1]x:9316", "address [::1]x:9316: missing port in address"),
    ("[::1]:9316:1", "address [::1]:9316:1: too many colons in address"),
    ("a[b:9316", "address a[b:9316: unexpected '[' in address"),
    ("a]b:9316", "address a]b:9316: unexpected ']' in address"),
    (":70000", "address 70000: invalid port"),
    (":-1", "address -1: invalid port"),
    (":99999999999999999999", "address 99999999999999999999: invalid port"),
    (":no-such-service", "lookup tcp/no-such-service: unknown port"),
])
def test_a_bad_address_is_refused_at_start_with_gos_error(addr: str, message: str) -> None:
    with pytest.raises(gonet.AddrError) as caught:
        gonet.parse_listen_address(addr)
    assert str(caught.value) == message
    with pytest.raises(ConfigError) as refused:
        parse_config([f"-addr={addr}"], ENV)
    assert str(refused.value) == f"-addr {addr!r}: listen tcp: {message}"


def test_an_empty_addr_is_port_80_as_http_listen_and_serve_reads_it() -> None:
    assert parse_config(["-addr="], ENV).listen_address == gonet.ListenAddress("", 80)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.fixture
def serving(request: pytest.FixtureRequest) -> Iterator[MetricsServer]:
    """A MetricsServer on the host of the test's parameter (port 0), answering /whoami with the peer it saw."""
    server = MetricsServer(CollectorRegistry(), request.param, 0, include_default=False)
    server.route("/whoami", lambda req: Reply.text(200, req.client))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _v6only(server: MetricsServer) -> int:
    return server._server.socket.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY)


@pytest.mark.parametrize("serving", ["", "0.0.0.0", "::"], indirect=True, ids=[":port", "0.0.0.0:port", "[::]:port"])
def test_a_wildcard_host_listens_on_ipv4_and_ipv6_with_one_socket(serving: MetricsServer) -> None:
    assert gonet.stack() == (True, True)  # this host: IPv4, and IPv4 mapped onto IPv6 sockets
    sock = serving._server.socket
    assert (sock.family, sock.getsockname()[0], _v6only(serving)) == (socket.AF_INET6, "::", 0)
    assert _get(f"http://127.0.0.1:{serving.port}/healthz") == (200, "ok\n")
    assert _get(f"http://[::1]:{serving.port}/healthz") == (200, "ok\n")
    # An IPv4 client is seen as the IPv4 address it is, as Go's RemoteAddr shows it (not ::ffff:127.0.0.1).
    assert _get(f"http://127.0.0.1:{serving.port}/whoami") == (200, "127.0.0.1\n")
    assert _get(f"http://[::1]:{serving.port}/whoami") == (200, "::1\n")


@pytest.mark.parametrize("serving", ["::1"], indirect=True)
def test_the_ipv6_loopback_address_listens_there_alone(serving: MetricsServer) -> None:
    sock = serving._server.socket
    assert (sock.family, sock.getsockname()[0]) == (socket.AF_INET6, "::1")
    assert _get(f"http://[::1]:{serving.port}/healthz") == (200, "ok\n")


@pytest.mark.parametrize("serving", ["::ffff:127.0.0.1", "localhost"], indirect=True)
def test_an_ipv4_mapped_literal_and_a_name_take_an_ipv4_socket_as_go_does(serving: MetricsServer) -> None:
    sock = serving._server.socket
    assert (sock.family, sock.getsockname()[0]) == (socket.AF_INET, "127.0.0.1")
    assert _get(f"http://127.0.0.1:{serving.port}/healthz") == (200, "ok\n")


@pytest.mark.parametrize("serving", [""], indirect=True)
def test_local_modes_loopback_guard_passes_an_ipv4_loopback_client_of_a_dual_stack_socket(
        serving: MetricsServer) -> None:
    serving.guard("/debug", loopback_only)
    serving.route("/debug/x", lambda req: Reply.text(200, "seen"))
    assert _get(f"http://127.0.0.1:{serving.port}/debug/x") == (200, "seen\n")
    assert _get(f"http://[::1]:{serving.port}/debug/x") == (200, "seen\n")


def test_a_port_in_use_is_refused_with_gos_bind_error() -> None:
    taken = gonet.listen(gonet.ListenAddress("::1", 0))
    try:
        port = taken.getsockname()[1]
        with pytest.raises(gonet.ListenError) as caught:
            gonet.listen(gonet.ListenAddress("::1", port))
        assert caught.value.errno == errno.EADDRINUSE
        assert str(caught.value) == f"listen tcp [::1]:{port}: bind: address already in use"
    finally:
        taken.close()


def test_a_host_name_that_does_not_resolve_is_refused_naming_it() -> None:
    with pytest.raises(gonet.AddrError, match=r"^lookup no-such-host\.invalid: no such host$"):
        gonet.listen(gonet.ListenAddress("no-such-host.invalid", 0))


_WITHOUT_IPV6 = """
import json, socket
from koordlet import gonet
out = {"stack": gonet.stack()}
for addr in (":0", "0.0.0.0:0", "[::]:0"):
    try:
        sock = gonet.listen(gonet.parse_listen_address(addr))
    except OSError as err:
        out[addr] = str(err)
        continue
    client = socket.create_connection(("127.0.0.1", sock.getsockname()[1]), timeout=5)
    accepted, peer = sock.accept()
    out[addr] = [sock.family.name, sock.getsockname()[0], peer[0]]
    for s in (accepted, client, sock):
        s.close()
print(json.dumps(out))
"""


@pytest.mark.skipif(not noipv6.supported(), reason="the seccomp filter knows x86_64 and aarch64 only")
def test_without_ipv6_in_the_kernel_a_port_alone_falls_back_to_ipv4() -> None:
    """In a process whose kernel refuses AF_INET6 sockets (EAFNOSUPPORT, as a kernel without IPv6 answers:
    tests/support/noipv6.py), ``:port`` and ``0.0.0.0:port`` listen on IPv4 and ``[::]:port`` fails with Go's
    text: Go takes the wildcard's own family when the kernel does not map IPv4 onto IPv6."""
    done = noipv6.run_without_ipv6(_WITHOUT_IPV6)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["stack"] == [True, False]
    assert out[":0"] == out["0.0.0.0:0"] == ["AF_INET", "0.0.0.0", "127.0.0.1"]
    assert out["[::]:0"] == "listen tcp [::]:0: socket: address family not supported by protocol"


def _free_dual_stack_port() -> int:
    sock = gonet.listen(gonet.ListenAddress("", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


@pytest.mark.parametrize("addr", ["[::]:{port}", ":{port}"])
def test_koordlet_started_with_an_ipv6_or_a_bare_port_addr_answers_on_both_loopbacks(addr: str, tmp_path: Path) -> None:
    """The koordlet process itself, in local mode (no API server), started with Koordinator's valid ``-addr``
    forms: ``[::]:port`` used to stop it at start (its server was IPv4 only)."""
    port = _free_dual_stack_port()
    args = [str(Path(sys.executable).with_name("koordlet")), "-local-mode",
            f"-node-slo-file={tmp_path / 'slo.yaml'}", f"-cri-endpoint={tmp_path / 'no-cri.sock'}",
            f"-report-dir={tmp_path}",
            f"-cgroup-root-dir={tmp_path / 'cgroup'}", "-proc-root-dir=/proc/", "-sys-root-dir=/sys/",
            f"-runtime-hooks-addr={tmp_path / 'koordlet.sock'}", f"-runtime-hooks-config-path={tmp_path / 'hooks'}",
            "-enable-nri-runtime-hook=false", f"-var-run-root-dir={tmp_path}",
            f"-prediction-checkpoint-filepath={tmp_path / 'prediction'}",
            f"-system-config-record-file={tmp_path / 'originals.json'}", f"-audit-log-dir={tmp_path / 'audit'}",
            "-kubelet-sync-timeout=1s", f"-addr={addr.format(port=port)}"]
    log_path = tmp_path / "koordlet.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, cwd=ROOT, env={"PATH": "/usr/bin:/bin", "NODE_NAME": "node-1",
                                                     "agent_mode": "hostMode", "PYTHONPATH": str(ROOT)},
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        answered = wait_for(lambda: proc.poll() is not None or _get_or_none(f"http://[::1]:{port}/healthz"), 60)
        assert answered and proc.poll() is None, log_path.read_text()
        # Both families reach the one socket (/healthz may say 503 here: no CRI to list pods from).
        assert _get(f"http://127.0.0.1:{port}/metrics")[0] == _get(f"http://[::1]:{port}/metrics")[0] == 200
    finally:
        proc.terminate()
        proc.wait(30)
    log = log_path.read_text()
    assert f"metrics served on [::]:{port} (HTTP)" in log and "failed to start" not in log, log


def _get_or_none(url: str) -> tuple[int, str] | None:
    try:
        return _get(url)
    except OSError:
        return None
