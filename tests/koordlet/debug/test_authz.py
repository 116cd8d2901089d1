"""/events and /debug/* are for callers the API server authorizes (TokenReview, then SubjectAccessReview on
nodes/proxy of the node, as kubelet asks), on the agent in-process against the project's API server; /metrics and
/healthz stay open. In local mode they answer on the loopback address only."""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from koordlet.agent.lifecycle import Koordlet
from koordlet.config import parse_config
from koordlet.debug.authz import loopback_only
from koordlet.metrics import Request
from tests.support.apiserver import ApiServer, kube_api_client
from tests.support.kubelet import Kubelet, grant_kubelet_access

NODE = "authz-node"


def get(port: int, path: str, token: str = "") -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _grant_node_proxy(server: ApiServer, user: str) -> None:
    server.seed({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                 "metadata": {"name": "node-debug"},
                 "rules": [{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}]})
    server.seed({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                 "metadata": {"name": "node-debug"},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "node-debug"},
                 "subjects": [{"kind": "User", "name": user}]})


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[ApiServer, int]]:
    """The agent in API server mode (pods from an HTTPS kubelet), /events served."""
    kubelet_dir = tempfile.mkdtemp(prefix="kdz-", dir="/tmp")
    with ApiServer() as server, kube_api_client(server) as api, Kubelet(server, NODE) as kubelet:
        token = tmp_path / "kubelet-token"
        token.write_text(grant_kubelet_access(server))
        server.seed(kubelet.node_object({"capacity": {"cpu": "4", "memory": "8Gi"},
                                         "allocatable": {"cpu": "4", "memory": "8Gi"}}))
        server.seed({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": NODE},
                     "spec": {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 45}}})
        config = parse_config(
            [f"-cgroup-root-dir={tmp_path / 'cgroup'}", f"-kubelet-token-file={token}", "-addr=127.0.0.1:0",
             f"-sys-fs-root-dir={tmp_path}", "-sys-root-dir=/sys/", f"-var-lib-kubelet-dir={kubelet_dir}",
             "-feature-gates=AuditEvents=true,AuditEventsHTTPHandler=true,NodeTopologyReport=false",
             f"-audit-log-dir={tmp_path / 'audit'}", "-enable-node-metric-report=false"],
            {"NODE_NAME": NODE})
        agent = Koordlet(config, api_client=api, extra_components=[], states_sync_timeout_s=10)
        try:
            assert agent.start()
            assert agent.metrics_server is not None
            server.add_token("alice-token", "alice", ("system:authenticated",))
            server.add_token("bob-token", "bob", ("system:authenticated",))
            _grant_node_proxy(server, "bob")
            yield server, agent.metrics_server.port
        finally:
            agent.stop(5.0)
            shutil.rmtree(kubelet_dir, ignore_errors=True)


def test_only_an_authorized_caller_reads_the_debug_endpoints_and_events(agent: tuple[ApiServer, int]) -> None:
    server, port = agent
    assert get(port, "/metrics")[0] == 200 and get(port, "/healthz")[0] == 200  # open, as before
    for path in ("/debug/nodeslo", "/debug/pods/shop/web-0", "/events"):
        status, body = get(port, path)
        assert status == 401 and "bearer token" in body, (path, body)
        assert get(port, path, "forged")[0] == 401
        status, body = get(port, path, "alice-token")
        assert status == 403 and f'user "alice" cannot get resource "nodes/proxy" of node "{NODE}"' in body
        assert get(port, path, "bob-token")[0] == 200, path
    # koordlet's reviews (the kubelet asks its own, as system:node:<node>, for koordlet's /pods)
    reviews = [r for r in server.requests("POST", r"/subjectaccessreviews$") if r.user == "kubernetes-admin"]
    assert {json.dumps(r.body["spec"]["resourceAttributes"], sort_keys=True) for r in reviews} == {json.dumps(
        {"verb": "get", "group": "", "version": "v1", "resource": "nodes", "subresource": "proxy", "name": NODE},
        sort_keys=True)}
    # cached: each token was reviewed once for the three paths
    token_reviews = [r for r in server.requests("POST", r"/tokenreviews$") if r.user == "kubernetes-admin"]
    assert len(token_reviews) == 3 and len(reviews) == 2


def test_the_nodeslo_endpoint_names_the_object_and_its_resource_version(agent: tuple[ApiServer, int]) -> None:
    server, port = agent
    status, body = get(port, "/debug/nodeslo", "bob-token")
    shown = json.loads(body)
    stored = server.get_object("nodeslos", NODE)
    assert status == 200 and stored is not None
    assert shown["source"]["source"] == "apiserver" and shown["source"]["name"] == NODE
    assert shown["source"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
    assert shown["spec"]["resourceUsedThresholdWithBE"]["cpuSuppressThresholdPercent"] == 45
    assert shown["spec"]["resourceUsedThresholdWithBE"]["memoryEvictThresholdPercent"] == 70  # a default
    status, body = get(port, "/debug/pods/shop/web-0", "bob-token")
    assert status == 200 and json.loads(body)["pod"]["name"] == "web-0"
    status, body = get(port, "/debug/pods/shop/nope", "bob-token")
    assert status == 404 and f"not on node {NODE}" in body


def test_when_the_api_server_cannot_answer_nothing_is_served_and_nothing_cached(agent: tuple[ApiServer, int]) -> None:
    server, port = agent
    server.fail_next("POST", r"/tokenreviews$", status=500)
    status, body = get(port, "/debug/nodeslo", "bob-token")
    assert status == 503 and "cannot check authorization" in body
    assert get(port, "/debug/nodeslo", "bob-token")[0] == 200


def test_local_mode_answers_only_on_the_loopback_address() -> None:
    def request(client: str) -> Request:
        return Request("/debug/nodeslo", {}, {}, client)

    assert loopback_only(request("127.0.0.1")) is None and loopback_only(request("::1")) is None
    refused = loopback_only(request("192.0.2.2"))
    assert refused is not None and refused.status == 403 and b"loopback" in refused.body
    assert loopback_only(request("not-an-address")) is not None
