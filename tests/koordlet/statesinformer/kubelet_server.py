"""A small HTTPS server that serves kubelet's ``/pods`` JSON, for tests of koordlet's kubelet pod source.

The certificates are self-signed, made with the ``openssl`` CLI (the ``cryptography`` package is not installed).
"""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

LS_UID = "5f3a1c2e-0d4b-4c6a-9e8f-1a2b3c4d5e6f"
BE_UID = "0b7c9d1e-2f3a-4b5c-8d6e-7f8091a2b3c4"


def kubelet_pod_list() -> dict:
    """Two pods as kubelet's /pods serves them (trimmed of fields koordlet does not read)."""
    return {
        "kind": "PodList", "apiVersion": "v1", "metadata": {},
        "items": [
            {
                "metadata": {"name": "web-0", "namespace": "shop", "uid": LS_UID,
                             "labels": {"koordinator.sh/qosClass": "LSR", "app": "web"},
                             "annotations": {"kubernetes.io/config.source": "api"}},
                "spec": {
                    "priority": 9500, "priorityClassName": "koord-prod", "nodeName": "node-1",
                    "initContainers": [{"name": "init", "image": "busybox",
                                        "resources": {"requests": {"cpu": "100m", "memory": "16Mi"},
                                                      "limits": {"cpu": "100m", "memory": "16Mi"}}}],
                    "containers": [{"name": "web", "image": "nginx",
                                    "resources": {"requests": {"cpu": "2", "memory": "1Gi"},
                                                  "limits": {"cpu": "2", "memory": "1Gi"}}}],
                },
                "status": {
                    "phase": "Running", "qosClass": "Guaranteed",
                    "podIP": "10.244.1.7", "podIPs": [{"ip": "10.244.1.7"}, {"ip": "fd00:10:244:1::7"}],
                    "containerStatuses": [{"name": "web", "ready": True, "restartCount": 0,
                                           "containerID": "containerd://" + "a" * 64, "image": "nginx"}],
                    "initContainerStatuses": [{"name": "init", "ready": True, "restartCount": 0,
                                               "containerID": "containerd://" + "b" * 64}],
                },
            },
            {
                "metadata": {"name": "spark-1", "namespace": "batch", "uid": BE_UID,
                             "labels": {"koordinator.sh/qosClass": "BE"}},
                "spec": {
                    "priority": 5500, "nodeName": "node-1",
                    "containers": [{"name": "executor", "image": "spark",
                                    "resources": {"requests": {"kubernetes.io/batch-cpu": "1000",
                                                               "kubernetes.io/batch-memory": "2Gi"},
                                                  "limits": {"kubernetes.io/batch-cpu": "2000",
                                                             "kubernetes.io/batch-memory": "4Gi"}}}],
                },
                "status": {"phase": "Pending", "qosClass": "BestEffort"},
            },
        ],
    }


@dataclass
class FakeKubelet:
    """Serves GET /pods/ (and GET /configz, when ``configz`` is set) over HTTPS; remembers the Authorization headers and
    peer certs it saw."""

    payload: dict = field(default_factory=kubelet_pod_list)
    configz: dict | None = None  # kubelet's KubeletConfiguration, served as {"kubeletconfig": ...}
    status: int = 200
    delay_s: float = 0.0
    authorizations: list[str] = field(default_factory=list)
    peer_subjects: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Certs:
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _self_signed(tmp: Path, name: str) -> tuple[Path, Path]:
    cert, key = tmp / f"{name}.crt", tmp / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-subj", f"/CN={name}", "-days", "1", "-keyout", str(key), "-out", str(cert),
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=30)
    return cert, key


def make_certs(tmp: Path) -> Certs:
    """A server cert for 127.0.0.1 and a client cert (CN koordlet), each self-signed; skips without openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    return Certs(*_self_signed(tmp, "kubelet"), *_self_signed(tmp, "koordlet"))


def serve(kubelet: FakeKubelet, certs: Certs, require_client_cert: bool = False) -> Iterator[str]:
    """Serve until the generator is closed; yields the base URL."""
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

        def do_GET(self) -> None:  # noqa: N802
            if kubelet.delay_s:
                threading.Event().wait(kubelet.delay_s)
            kubelet.authorizations.append(self.headers.get("Authorization", ""))
            peer = self.connection.getpeercert()
            if peer:
                kubelet.peer_subjects.append(dict(x[0] for x in peer["subject"])["commonName"])
            if self.path == "/configz" and kubelet.configz is not None:
                body, status = json.dumps({"kubeletconfig": kubelet.configz}).encode(), 200
            else:
                body = json.dumps(kubelet.payload).encode() if self.path == "/pods/" else b"{}"
                status = kubelet.status if self.path == "/pods/" else 404
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs.server_cert, certs.server_key)
    if require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(certs.client_cert)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


