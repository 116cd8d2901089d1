"""``-tls-cert-file``/``-tls-private-key-file``: koordlet's port over HTTPS with a node's serving certificate
(koordlet/servingtls.py), laid out as kubelet lays its own out: a certificate and key pair (kubelet.crt,
kubelet.key) or one PEM with both behind a symlink kubelet moves on rotation (kubelet-server-current.pem).
Certificates are made by the openssl CLI; every connection is to a loopback address."""

from __future__ import annotations

import http.client
import io
import logging
import os
import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from koordlet.config import ConfigError, parse_config
from koordlet.debug.explain import main as explain
from koordlet.metrics import MetricsServer, Reply

ENV = {"NODE_NAME": "node-1"}


def _certificate(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for localhost, 127.0.0.1 and ::1 (as kubelet's own kubelet.crt names its node)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-subj", f"/CN={name}", "-days", "1", "-keyout", str(key), "-out", str(cert),
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1"],
                   check=True, capture_output=True, timeout=30)
    return cert, key


def _served_name(port: int, ca: Path, host: str = "127.0.0.1") -> str:
    """The CN of the certificate the server presents, verified against ``ca``."""
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection((host, port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        return dict(item[0] for item in tls.getpeercert()["subject"])["commonName"]


def _https_get(port: int, path: str, ca: Path, host: str = "127.0.0.1") -> tuple[int, str]:
    connection = http.client.HTTPSConnection(host, port, timeout=5,
                                             context=ssl.create_default_context(cafile=str(ca)))
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    directory = tmp_path / "pki"
    directory.mkdir()
    return directory


def _server(cert: Path, key: Path) -> MetricsServer:
    server = MetricsServer(CollectorRegistry(), "127.0.0.1", 0, include_default=False, tls=(str(cert), str(key)))
    server.start()
    return server


@pytest.fixture
def running(pki: Path) -> Iterator[tuple[MetricsServer, Path]]:
    cert, key = _certificate(pki, "kubelet")
    server = _server(cert, key)
    try:
        yield server, cert
    finally:
        server.stop()


def test_the_port_serves_https_with_the_given_certificate_and_key(running: tuple[MetricsServer, Path]) -> None:
    server, cert = running
    assert _https_get(server.port, "/healthz", cert) == (200, "ok\n")
    assert _served_name(server.port, cert) == "kubelet"


def test_plain_http_to_the_https_port_fails_that_request_alone_without_a_traceback(
        running: tuple[MetricsServer, Path], capfd: pytest.CaptureFixture[str]) -> None:
    server, cert = running
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as plain:
        plain.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        try:
            answer = plain.recv(4096)
        except ConnectionResetError:  # the handshake failed and the server closed at once
            answer = b""
    assert not answer.startswith(b"HTTP/")  # no plain answer: the bytes were taken for a TLS ClientHello
    assert _https_get(server.port, "/healthz", cert) == (200, "ok\n")
    assert "Traceback" not in capfd.readouterr().err


def test_a_rotated_certificate_behind_kubelets_symlink_is_served_from_the_next_connection(pki: Path) -> None:
    """kubelet-server-current.pem: certificate and key in one file, a symlink kubelet points at each new one."""
    first, second = (b"".join(path.read_bytes() for path in _certificate(pki, name)) for name in ("first", "second"))
    (pki / "kubelet-server-2026-01.pem").write_bytes(first)
    current = pki / "kubelet-server-current.pem"
    current.symlink_to("kubelet-server-2026-01.pem")
    server = _server(current, current)
    try:
        assert _served_name(server.port, pki / "first.crt") == "first"
        (pki / "kubelet-server-2026-02.pem").write_bytes(second)
        (pki / "next.pem").symlink_to("kubelet-server-2026-02.pem")
        os.replace(pki / "next.pem", current)  # what kubelet's certificate manager does: one rename
        assert _served_name(server.port, pki / "second.crt") == "second"
        assert server.certificate is not None and server.certificate.loads == 2
    finally:
        server.stop()


def test_a_certificate_that_does_not_load_keeps_the_last_good_one_and_is_logged_once(
        pki: Path, caplog: pytest.LogCaptureFixture) -> None:
    cert, key = _certificate(pki, "kubelet")
    good = cert.read_bytes()
    ca = pki / "ca.crt"
    ca.write_bytes(good)
    server = _server(cert, key)
    try:
        cert.write_bytes(good[: len(good) // 2])  # kubelet between its two writes
        with caplog.at_level(logging.WARNING, logger="koordlet.servingtls"):
            for _ in range(3):
                assert _served_name(server.port, ca) == "kubelet"
        warnings = [r.getMessage() for r in caplog.records if r.name == "koordlet.servingtls"]
        assert len(warnings) == 1 and "does not load" in warnings[0] and "serving the previous one" in warnings[0]
        cert.write_bytes(good)
        assert _served_name(server.port, cert) == "kubelet"
    finally:
        server.stop()


def test_a_certificate_that_does_not_load_at_start_stops_the_server_from_starting(pki: Path) -> None:
    cert, key = _certificate(pki, "kubelet")
    cert.write_text("not a certificate\n")
    with pytest.raises(ssl.SSLError):
        MetricsServer(CollectorRegistry(), "127.0.0.1", 0, include_default=False, tls=(str(cert), str(key)))


def test_the_tls_flags_go_together_and_name_the_files() -> None:
    config = parse_config(["-tls-cert-file=/var/lib/kubelet/pki/kubelet.crt",
                           "-tls-private-key-file=/var/lib/kubelet/pki/kubelet.key"], ENV)
    assert config.serving_tls == ("/var/lib/kubelet/pki/kubelet.crt", "/var/lib/kubelet/pki/kubelet.key")
    assert parse_config([], ENV).serving_tls is None
    for half in ("-tls-cert-file=/x.crt", "-tls-private-key-file=/x.key"):
        with pytest.raises(ConfigError, match="-tls-cert-file and -tls-private-key-file go together"):
            parse_config([half], ENV)


def test_koordlet_explain_verifies_an_https_koordlet_against_its_ca_file(
        running: tuple[MetricsServer, Path], pki: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server, cert = running
    url = f"https://127.0.0.1:{server.port}"
    server.route("/debug/pods/default/batch-job", lambda request: Reply(404, "text/plain", b"no such pod\n"))
    assert explain(["default/batch-job", "--server", url, "--ca-file", str(cert)], stdout=io.StringIO()) == 1
    assert "404 no such pod" in capsys.readouterr().err  # the TLS connection held: koordlet's own answer came back
    other, _ = _certificate(pki, "someone-else")
    assert explain(["default/batch-job", "--server", url, "--ca-file", str(other)], stdout=io.StringIO()) == 1
    assert "CERTIFICATE_VERIFY_FAILED" in capsys.readouterr().err
