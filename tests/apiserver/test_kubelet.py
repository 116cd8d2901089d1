"""The project's kubelet (tests/support/kubelet.py) lets through what a real kubelet with webhook authentication and
authorization lets through: it asks the API server who a caller is and what it may do, with kubelet's own path
mapping, and refuses with kubelet's words."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.support.apiserver import ApiServer, Credentials, create_objects
from tests.support.kubelet import Kubelet, grant_kubelet_access, subresources_for
from tests.support.pki import cluster_ca

NODE = "node-1"
READER = "system:serviceaccount:default:kubelet-reader"


@pytest.fixture
def kubelet(server: ApiServer) -> Iterator[Kubelet]:
    with Kubelet(server, NODE) as running:
        yield running


def call(kubelet: Kubelet, path: str, token: str = "", method: str = "GET",
         credentials: Credentials | None = None) -> tuple[int, str]:
    context = ssl.create_default_context(cafile=str(cluster_ca().ca.cert))
    if credentials is not None and credentials.cert is not None:
        context.load_cert_chain(credentials.cert.cert, credentials.cert.key)
    request = urllib.request.Request(kubelet.url + path, method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def reviewed(server: ApiServer) -> list[tuple[str, str, str]]:
    """(who asked, verb, subresource) of each SubjectAccessReview the API server answered."""
    return [(r.user, r.body["spec"]["resourceAttributes"]["verb"], r.body["spec"]["resourceAttributes"]["subresource"])
            for r in server.requests("POST", r"/subjectaccessreviews$")]


def test_a_caller_without_a_good_credential_is_401(kubelet: Kubelet) -> None:
    assert call(kubelet, "/pods/") == (401, "Unauthorized")
    assert call(kubelet, "/pods/", "not-a-token") == (401, "Unauthorized")
    assert [r.status for r in kubelet.requests] == [401, 401]


def test_pods_ask_nodes_pods_then_nodes_proxy_and_refuse_with_kubelets_words(server: ApiServer,
                                                                             kubelet: Kubelet) -> None:
    token = grant_kubelet_access(server, subresources=("stats",))
    assert call(kubelet, "/pods/", token) == (403, f"Forbidden (user={READER}, verb=get, resource=nodes, "
                                                   "subresource(s)=[pods proxy])\n")
    assert reviewed(server) == [(f"system:node:{NODE}", "get", "pods"), (f"system:node:{NODE}", "get", "proxy")]
    assert [r.user for r in server.requests("POST", r"/tokenreviews$")] == [f"system:node:{NODE}"]


@pytest.mark.parametrize("granted", [("pods",), ("proxy",)])
def test_either_nodes_pods_or_nodes_proxy_reads_pods_with_the_gate_on(server: ApiServer, kubelet: Kubelet,
                                                                      granted: tuple[str, ...]) -> None:
    status, body = call(kubelet, "/pods/", grant_kubelet_access(server, subresources=granted))
    assert status == 200 and len(json.loads(body)["items"]) == 2


def test_a_kubelet_before_the_gate_asks_for_nodes_proxy_alone(server: ApiServer) -> None:
    token = grant_kubelet_access(server, subresources=("pods",))
    with Kubelet(server, NODE, fine_grained_authz=False) as old:
        assert call(old, "/pods/", token) == (403, f"Forbidden (user={READER}, verb=get, resource=nodes, "
                                                   "subresource(s)=[proxy])\n")


def test_paths_map_to_kubelets_subresources() -> None:
    assert subresources_for("/stats/summary", True) == ["stats"]
    assert subresources_for("/metrics/cadvisor", True) == ["metrics"]
    assert subresources_for("/logs/messages", True) == ["log"]
    assert subresources_for("/checkpoint/ns/pod/c", True) == ["checkpoint"]
    assert subresources_for("/exec/ns/pod/c", True) == ["proxy"]
    assert subresources_for("/healthz", True) == ["healthz", "proxy"]
    assert subresources_for("/configz", True) == ["configz", "proxy"]
    assert subresources_for("/runningpods/", True) == ["pods", "proxy"]
    assert subresources_for("/podsx", True) == ["proxy"]
    assert subresources_for("/pods", False) == ["proxy"]


def test_the_verb_follows_the_method_and_a_stats_grant_opens_nothing_else(server: ApiServer,
                                                                          kubelet: Kubelet) -> None:
    token = grant_kubelet_access(server, subresources=("stats",))
    assert call(kubelet, "/stats/summary", token) == (404, "404 page not found\n")  # allowed, not served here
    status, body = call(kubelet, "/pods/", token, method="POST")
    assert status == 403 and "verb=create" in body
    assert reviewed(server)[-2:] == [(f"system:node:{NODE}", "create", "pods"),
                                     (f"system:node:{NODE}", "create", "proxy")]


def test_a_client_certificate_of_the_cluster_ca_is_the_user_it_names(server: ApiServer, kubelet: Kubelet) -> None:
    create_objects(server, [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                             "metadata": {"name": "apiserver-kubelet-client"},
                             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                         "name": "system:kubelet-api-admin"},
                             "subjects": [{"kind": "User", "name": "kube-apiserver-kubelet-client"}]}])
    admin_client = server.client_credentials("kube-apiserver-kubelet-client", ("kubeadm:cluster-admins",))
    assert call(kubelet, "/pods/", credentials=admin_client)[0] == 200
    assert call(kubelet, "/pods/", credentials=server.client_credentials("eve"))[0] == 403
    assert [(r.client_cert_user, r.status) for r in kubelet.requests] == [
        ("kube-apiserver-kubelet-client", 200), ("eve", 403)]
    assert server.requests("POST", r"/tokenreviews$") == []  # a certificate needs no review
