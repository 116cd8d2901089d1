"""Start, stop and client wiring of the test API server."""

from __future__ import annotations

import threading
from pathlib import Path

import kubernetes.client
import kubernetes.config

from tests.support.apiserver import ApiServer, Credentials, kube_api_client, write_kubeconfig


def _handler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if "process_request" in t.name or t.name == "test-apiserver"]


def test_stop_joins_every_thread_even_with_idle_keep_alive_connections() -> None:
    before = set(_handler_threads())
    server = ApiServer().start()
    client = kube_api_client(server)  # deliberately left open until after stop()
    try:
        core = kubernetes.client.CoreV1Api(client)
        core.create_node({"metadata": {"name": "node-1"}})
        core.list_node()
        assert set(_handler_threads()) - before
        server.stop()
        assert set(_handler_threads()) - before == set()
    finally:
        server.stop()
        client.close()


def test_stop_is_idempotent_and_safe_without_start() -> None:
    ApiServer().stop()
    server = ApiServer().start()
    server.stop()
    server.stop()


def test_two_servers_listen_on_distinct_loopback_ports_over_https() -> None:
    with ApiServer() as first, ApiServer() as second:
        assert first.url.startswith("https://127.0.0.1:") and first.url != second.url


def test_written_kubeconfig_is_loadable_by_the_client_as_the_admin_or_a_token(server: ApiServer,
                                                                                tmp_path: Path) -> None:
    server.seed({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader", "namespace": "default"}})
    token = Credentials("reader", token=server.service_account_token("default", "reader"))
    for credentials, phase in ((None, "Active"), (token, None)):
        path = write_kubeconfig(server, tmp_path / "kubeconfig", credentials)
        assert path.stat().st_mode & 0o077 == 0  # it holds a key or a token
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(path), client_configuration=config)
        with kubernetes.client.ApiClient(config) as client:
            try:
                assert kubernetes.client.CoreV1Api(client).read_namespace("default").status.phase == phase
            except kubernetes.client.ApiException as refused:  # the service account may not read namespaces
                assert (phase, refused.status) == (None, 403)
